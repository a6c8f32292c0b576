-- Scale-out on Citus (docs/scale-out.md). Citus ignores DDL inside an
-- extension script, so the extension is made distributed by a call after
-- CREATE EXTENSION, on the coordinator: sturdy.distribute().
--
-- Where each table goes:
-- - by queue, colocated: queue and what limits and wakes a queue
--   (queue_limits, queue_places, queue_key_places, queue_waiters,
--   queue_retry). A take addresses one shard, where FOR UPDATE SKIP
--   LOCKED works, and its limit's places are on the same node;
-- - claims and checkpoints, colocated with each other: with queues (the
--   default) by place, sturdy.workflow_place(workflow), colocated with the
--   queue: workflow 'orders/77' is on the node of queue 'orders', so a pass
--   (take with claim, record, finish) is one node's transaction; or by
--   workflow (workflows_with_queues => false), spread by the whole name,
--   and the calls about one workflow's claim and checkpoints delegated
--   whole to the node that holds it (create_distributed_function). Citus
--   wants the distribution column in the primary key: by place it is
--   (place, workflow) and (place, workflow, step), unique as before since
--   the place is a function of the workflow;
-- - on the coordinator, as they are: instances, idempotency_keys, outbox,
--   deliveries, subscriptions, outbox_waiters, batches, samples. A
--   transaction writes them and the distributed tables together (the
--   coordinator's commit decides, the workers' parts are prepared first);
--   no statement of ours joins the two kinds.
-- queue_changed and queue_backdated are delegated to the node that holds
-- the queue.

CREATE FUNCTION sturdy.distribute(workflows_with_queues boolean DEFAULT true)
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    f record;
    claims_by text;
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
    IF workflows_with_queues IS NULL THEN
        RAISE EXCEPTION 'workflows_with_queues must not be NULL'
            USING ERRCODE = '22004',
                  HINT = 'Pass true (claims and checkpoints on the node of the queue their workflow name starts with) or false (spread by the whole name).';
    END IF;
    SELECT pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) INTO claims_by
      FROM pg_catalog.pg_dist_partition p
     WHERE p.logicalrelid OPERATOR(pg_catalog.=) 'sturdy.claims'::pg_catalog.regclass;
    IF claims_by IS NOT NULL AND (claims_by OPERATOR(pg_catalog.=) 'place') IS DISTINCT FROM workflows_with_queues THEN
        RAISE EXCEPTION 'sturdy.claims is distributed by % already, and workflows_with_queues => % asks for the other placement', claims_by, workflows_with_queues
            USING ERRCODE = '55000',
                  HINT = pg_catalog.format('Call sturdy.distribute(workflows_with_queues => %s) to finish or repeat it; a placement once made is not changed (docs/scale-out.md).',
                                           claims_by OPERATOR(pg_catalog.=) 'place');
    END IF;
    IF workflows_with_queues AND claims_by IS NULL THEN
        -- the place each row is kept by, and the primary keys Citus needs
        -- it in (unique as before: the place is a function of the workflow)
        UPDATE sturdy.claims SET place = sturdy.workflow_place(workflow)
         WHERE place IS DISTINCT FROM sturdy.workflow_place(workflow);
        UPDATE sturdy.checkpoints SET place = sturdy.workflow_place(workflow)
         WHERE place IS DISTINCT FROM sturdy.workflow_place(workflow);
        ALTER TABLE sturdy.claims ALTER COLUMN place SET NOT NULL,
            DROP CONSTRAINT claims_pkey, ADD CONSTRAINT claims_pkey PRIMARY KEY (place, workflow);
        ALTER TABLE sturdy.checkpoints ALTER COLUMN place SET NOT NULL,
            DROP CONSTRAINT checkpoints_pkey, ADD CONSTRAINT checkpoints_pkey PRIMARY KEY (place, workflow, step);
    END IF;
    FOR t IN
        SELECT * FROM (VALUES
            (1, 'sturdy.queue', 'queue', NULL),
            (2, 'sturdy.queue_limits', 'queue', 'sturdy.queue'),
            (3, 'sturdy.queue_places', 'queue', 'sturdy.queue'),
            (4, 'sturdy.queue_key_places', 'queue', 'sturdy.queue'),
            (5, 'sturdy.queue_waiters', 'queue', 'sturdy.queue'),
            (6, 'sturdy.queue_retry', 'queue', 'sturdy.queue'),
            (7, 'sturdy.claims', CASE WHEN workflows_with_queues THEN 'place' ELSE 'workflow' END,
                CASE WHEN workflows_with_queues THEN 'sturdy.queue' END),
            (8, 'sturdy.checkpoints', CASE WHEN workflows_with_queues THEN 'place' ELSE 'workflow' END,
                'sturdy.claims')
        ) AS placement (n, tab, by_column, colocate_with)
        WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                           WHERE p.logicalrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(placement.tab))
        ORDER BY n
    LOOP
        PERFORM pg_catalog.create_distributed_table(t.tab::regclass, t.by_column,
            colocate_with => coalesce(t.colocate_with, 'default'));
    END LOOP;
    -- Delegated whole to the node holding the workflow, where claims are
    -- placed by it: calls that touch only claims and checkpoints (those
    -- running caller code do not qualify: it may reach anywhere). Placed
    -- by place, Citus would send a call by the hash of its workflow
    -- argument, not its place: those run where they are called, each
    -- statement routed to the place's node.
    FOR f IN
        SELECT p.oid::pg_catalog.regprocedure AS fn
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'sturdy'::regnamespace
           AND NOT workflows_with_queues
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
COMMENT ON FUNCTION sturdy.distribute(workflows_with_queues boolean) IS
    'On a Citus coordinator, after CREATE EXTENSION pg_sturdy on every node: distribute the queue''s tables by queue, and claims and checkpoints with queues (by sturdy.workflow_place(workflow): workflow orders/77 on the node of queue orders, so a pass is one node''s) or, with workflows_with_queues => false, by the whole workflow name (the per-workflow claim and checkpoint calls then delegated to its node); the rest stay on the coordinator. queue_changed and queue_backdated are delegated to the node that holds the queue. Idempotent; 55000 when asked for the other placement than the one made. 0A000 without Citus. See docs/scale-out.md.';

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
