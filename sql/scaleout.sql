-- Scale-out on Citus (docs/scale-out.md). Citus ignores DDL inside an
-- extension script, so the extension is made distributed by a call after
-- CREATE EXTENSION, on the coordinator: sturdy.distribute().
--
-- Where each table goes:
-- - by workflow, colocated: claims, checkpoints. A claim, its checkpoints
--   and every call about one workflow's steps run on the node that holds it;
-- - by queue, colocated: queue and what limits and wakes a queue
--   (queue_limits, queue_places, queue_key_places, queue_waiters,
--   queue_retry). A take
--   addresses one shard, where FOR UPDATE SKIP LOCKED works, and its
--   limit's places are on the same node;
-- - on the coordinator, as they are: instances, idempotency_keys, outbox,
--   deliveries, subscriptions, outbox_waiters, batches, samples. A
--   transaction writes them and the distributed tables together (the
--   coordinator's commit decides, the workers' parts are prepared first);
--   no statement of ours joins the two kinds.
-- The calls about one workflow's claim and checkpoints are delegated whole
-- to the node that holds the workflow (create_distributed_function), and
-- queue_changed and queue_backdated to the node that holds the queue.

CREATE FUNCTION sturdy.distribute()
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    f record;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'sturdy.distribute() needs Citus, which is not installed in this database'
            USING ERRCODE = '0A000',
                  HINT = 'On a single server there is nothing to distribute. On a Citus cluster, run CREATE EXTENSION citus, then this, on the coordinator.';
    END IF;
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION 'sturdy.distribute() runs on the Citus coordinator, and this node is not it'
            USING ERRCODE = '0A000',
                  HINT = 'Connect to the coordinator and call it there; it distributes the tables of every node.';
    END IF;
    FOR t IN
        SELECT * FROM (VALUES
            (1, 'sturdy.claims', 'workflow', NULL),
            (2, 'sturdy.checkpoints', 'workflow', 'sturdy.claims'),
            (3, 'sturdy.queue', 'queue', NULL),
            (4, 'sturdy.queue_limits', 'queue', 'sturdy.queue'),
            (5, 'sturdy.queue_places', 'queue', 'sturdy.queue'),
            (6, 'sturdy.queue_key_places', 'queue', 'sturdy.queue'),
            (7, 'sturdy.queue_waiters', 'queue', 'sturdy.queue'),
            (8, 'sturdy.queue_retry', 'queue', 'sturdy.queue')
        ) AS placement (n, tab, by_column, colocate_with)
        WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                           WHERE p.logicalrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(placement.tab))
        ORDER BY n
    LOOP
        PERFORM pg_catalog.create_distributed_table(t.tab::regclass, t.by_column,
            colocate_with => coalesce(t.colocate_with, 'default'));
    END LOOP;
    -- Delegated whole to the node holding the workflow: calls that touch
    -- only claims and checkpoints (those running caller code do not qualify:
    -- it may reach anywhere).
    FOR f IN
        SELECT p.oid::pg_catalog.regprocedure AS fn
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'sturdy'::regnamespace
           AND p.proname IN ('claim', 'renew', 'release', 'fence', 'record', 'load')
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_dist_object o
                            WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::regclass
                              AND o.objid OPERATOR(pg_catalog.=) p.oid
                              AND o.distribution_argument_index IS NOT NULL)
    LOOP
        PERFORM pg_catalog.create_distributed_function(f.fn, '$1', colocate_with => 'sturdy.claims');
    END LOOP;
    -- Delegated to the node holding the queue even inside a transaction
    -- (force_delegation): the calls by which a change of a queue's limits,
    -- pause or prioritized rows, and a row made ready before now, reach the
    -- sessions there, in the change's transaction.
    FOR f IN SELECT p.fn FROM (VALUES ('sturdy.queue_changed(text)'::regprocedure),
                                      ('sturdy.queue_backdated(text)'::regprocedure)) AS p(fn)
              WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_dist_object o
                                 WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::regclass
                                   AND o.objid OPERATOR(pg_catalog.=) p.fn
                                   AND o.force_delegation)
    LOOP
        PERFORM pg_catalog.create_distributed_function(f.fn, '$1',
            colocate_with => 'sturdy.queue', force_delegation => true);
    END LOOP;
END
$$;
COMMENT ON FUNCTION sturdy.distribute() IS
    'On a Citus coordinator, after CREATE EXTENSION pg_sturdy on every node: distribute claims and checkpoints by workflow, the queue''s tables by queue (the rest stay on the coordinator), and delegate the per-workflow claim and checkpoint calls to the node that holds the workflow, and queue_changed and queue_backdated to the node that holds the queue. Idempotent. 0A000 without Citus. See docs/scale-out.md.';

CREATE FUNCTION sturdy.queue_node(queue text)
    RETURNS TABLE (host text, port integer)
    LANGUAGE plpgsql STABLE SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be NULL' USING ERRCODE = '22004', HINT = 'Pass a non-NULL queue.';
    ELSIF queue = '' THEN
        RAISE EXCEPTION 'queue must not be empty' USING ERRCODE = '22023', HINT = 'Pass a non-empty queue.';
    END IF;
    -- one server, or a cluster not distributed yet: no row (call where you are)
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE
        'SELECT n.nodename::pg_catalog.text, n.nodeport::pg_catalog.int4
           FROM pg_catalog.pg_dist_placement p
           JOIN pg_catalog.pg_dist_node n ON n.groupid OPERATOR(pg_catalog.=) p.groupid
          WHERE EXISTS (SELECT FROM pg_catalog.pg_dist_partition d
                         WHERE d.logicalrelid OPERATOR(pg_catalog.=) ''sturdy.queue''::pg_catalog.regclass)
            AND p.shardid OPERATOR(pg_catalog.=)
                pg_catalog.get_shard_id_for_distribution_column(''sturdy.queue''::pg_catalog.regclass, $1)
            AND n.isactive AND n.noderole OPERATOR(pg_catalog.=) ''primary'''
        USING queue;
END
$$;
COMMENT ON FUNCTION sturdy.queue_node(queue text) IS
    'Under Citus, after sturdy.distribute(): the node (host and port, as Citus knows it) that holds the queue''s shard, where a worker''s take and done on that queue cost what they cost on one server. No row on one server or before distribute(): call where you are. See docs/scale-out.md.';
