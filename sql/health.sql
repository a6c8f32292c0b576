-- "Is anything wrong": one row per signal an operator should watch, with the
-- threshold it is judged by. Thresholds are starting points; docs/operations.md says
-- what each number should look like.
CREATE VIEW sturdy.health WITH (security_invoker = true) AS
SELECT 'oldest ready job'::text AS signal,
       pg_catalog.to_char(COALESCE(pg_catalog.max(now() - GREATEST(q.visible_at, q.leased_until)), interval '0'), 'HH24:MI:SS') AS value,
       COALESCE(pg_catalog.max(now() - GREATEST(q.visible_at, q.leased_until)), interval '0') < interval '5 minutes' AS ok,
       'How long the oldest ready queue row has waited for a worker: growing means too few workers (or none).'::text AS meaning
  FROM sturdy.queue q WHERE q.visible_at <= now() AND (q.leased_until IS NULL OR q.leased_until <= now())
UNION ALL
SELECT 'lapsed leases', pg_catalog.count(*)::text, pg_catalog.count(*) = 0,
       'Queue rows taken whose lease ran out before done: a worker died or is too slow for its lease; each is a failed pass, retried after its backoff.'
  FROM sturdy.queue q WHERE q.leased_until <= now()
UNION ALL
SELECT 'dead workflows', pg_catalog.count(*)::text, pg_catalog.count(*) = 0,
       'Queue rows whose passes failed their queue''s max_attempts times: never handed out again. Read last_error in sturdy.queue, fix, then sturdy.redrive(workflow, queue).'
  FROM sturdy.queue q WHERE q.visible_at = 'infinity'
UNION ALL
SELECT 'oldest pending delivery',
       pg_catalog.to_char(COALESCE(pg_catalog.max(now() - o.created_at), interval '0'), 'HH24:MI:SS'),
       COALESCE(pg_catalog.max(now() - o.created_at), interval '0') < interval '5 minutes',
       'How long ago the oldest undelivered event was emitted: growing means no pump runs, or a subscriber keeps failing.'
  FROM sturdy.deliveries d JOIN sturdy.outbox o ON o.id = d.outbox_id WHERE d.state = 'pending'
UNION ALL
SELECT 'dead deliveries', pg_catalog.count(*)::text, pg_catalog.count(*) = 0,
       'Deliveries that failed max_attempts times: read last_error in sturdy.deliveries, fix, then sturdy.redrive.'
  FROM sturdy.deliveries d WHERE d.state = 'dead'
UNION ALL
SELECT 'stuck instances',
       CASE WHEN pg_catalog.count(*) > 1000 THEN 'over 1000' ELSE pg_catalog.count(*)::text END,
       pg_catalog.count(*) = 0,
       'Pending or running instances without progress for an hour: sturdy.stuck(''1 hour'') lists them.'
  FROM sturdy.stuck(interval '1 hour', 1001)
UNION ALL
SELECT 'dead tuples ' || s.relname,
       pg_catalog.round(100.0 * s.n_dead_tup / GREATEST(s.n_live_tup + s.n_dead_tup, 1), 1)::text || '%',
       s.n_dead_tup <= 0.2 * GREATEST(s.n_live_tup + s.n_dead_tup, 1000),
       'Dead row versions not yet vacuumed (an estimate from the statistics): high and growing means autovacuum is behind or a long transaction holds the xmin horizon.'
  FROM pg_catalog.pg_stat_user_tables s
 WHERE s.schemaname = 'sturdy' AND s.relname IN ('queue', 'claims', 'deliveries', 'instances', 'checkpoints')
UNION ALL
SELECT 'oldest snapshot',
       COALESCE(pg_catalog.to_char(pg_catalog.max(now() - a.xact_start), 'HH24:MI:SS'), '-')
           || ' (' || COALESCE(pg_catalog.max(pg_catalog.age(a.backend_xmin)), 0) || ' transactions)',
       COALESCE(pg_catalog.max(now() - a.xact_start) < interval '5 minutes', true)
           AND COALESCE(pg_catalog.max(pg_catalog.age(a.backend_xmin)), 0) < 10000000,
       'The oldest open transaction of this database holding a snapshot (its age; the time only where pg_stat_activity shows it to you): vacuum removes nothing deleted after it began, so the tables grow. Find it in pg_stat_activity, end it, and set idle_in_transaction_session_timeout.'
  FROM pg_catalog.pg_stat_activity a
 WHERE a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database() AND a.backend_xmin IS NOT NULL
   AND a.pid <> pg_catalog.pg_backend_pid();
COMMENT ON VIEW sturdy.health IS
    'Is anything wrong: the oldest ready job, lapsed leases, dead workflows, the oldest pending delivery, dead deliveries, stuck instances, dead tuples in the busy tables and the oldest snapshot, each with ok by a documented threshold.';

-- The operator dashboard's history (sturdy-ui, docs/dashboard.md): what
-- sturdy.sample() read, one row per queue, per outbox subscription and per
-- named batch job at each call (pg_cron or sturdy-ui call it once a
-- minute). Pages read it instead of counting the live tables: a count kept
-- once a minute. sweep trims it: samples older than a day go (or older than
-- its older_than, where that is shorter).
CREATE TABLE sturdy.samples (
    sampled_at timestamptz NOT NULL,
    kind       text        COLLATE "C" NOT NULL CHECK (kind IN ('queue', 'outbox', 'batch', 'instances', 'health')),
    name       text        COLLATE "C" NOT NULL,
    subscriber text        NOT NULL DEFAULT '',
    figures    jsonb       NOT NULL,
    PRIMARY KEY (kind, name, subscriber, sampled_at)
) WITH (vacuum_truncate = false);
-- sweep's trim, oldest first
CREATE INDEX samples_sampled_at ON sturdy.samples (sampled_at);
SELECT pg_catalog.pg_extension_config_dump('sturdy.samples', '');
COMMENT ON TABLE sturdy.samples IS
    'The dashboard''s history: one row per queue, outbox subscription, named batch job, instance status and health signal per sturdy.sample() call; sweep removes rows older than a day.';
COMMENT ON COLUMN sturdy.samples.sampled_at IS 'The sampling transaction''s now().';
COMMENT ON COLUMN sturdy.samples.kind IS 'queue, outbox (a subscription: name is the event), batch (a named batch job), instances (name: a status, or stuck) or health (name: a signal of sturdy.health).';
COMMENT ON COLUMN sturdy.samples.name IS 'The queue, the event, or the batch job''s name.';
COMMENT ON COLUMN sturdy.samples.subscriber IS 'The subscriber of an outbox sample; empty for the other kinds.';
COMMENT ON COLUMN sturdy.samples.figures IS
    'What was read. queue: ready, leased, sleeping, held_back, paused, oldest_ready_seconds, failing, dead, ended (rows gone or rescheduled since the previous sample; NULL where estimated), rows and mark (the highest seq, for the next ended), estimated (past 10,000 rows a part, the planner''s estimate). outbox: pending, retrying, dead, oldest_pending_seconds, delivered (since the previous sample). batch: done, remaining, chunk, last_seconds, complete. instances: count. health: value, ok, meaning.';

CREATE FUNCTION sturdy.sample() RETURNS integer
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    -- (the health view's plan costs the branches it never runs, enough for
    -- JIT: compiling it took 0.7 s of a 0.75 s sample at 10M queue rows)
    SET jit = off
AS $$
-- Its cost follows the queues and what is due in them, not the tables'
-- size (docs/benchmarks.md, "sample() at scale"): every figure is counted
-- row by row up to `cap` rows, through the index a take walks, and past
-- that estimated by the planner from the table's statistics (under Citus,
-- where the planner's estimate of a distributed table is not the table's,
-- counted on the queue's shard). A queue's sample says which it is
-- ("estimated").
DECLARE
    cap CONSTANT integer := 10000;
    distributed boolean := false;
    names text[];
    q text;
    before jsonb;
    l sturdy.queue_limits;
    total bigint; mark bigint; staying bigint;
    due bigint; leased bigint; lapsed bigint; sleeping bigint; oldest timestamptz;
    ready bigint; held bigint; free_places bigint; tokens bigint; per_key_held bigint;
    failing bigint; dead bigint; all_dead bigint := 0;
    estimated boolean;
    live bigint; finished bigint;
    statuses jsonb := '{}';
    stalled bigint;
    worst_wait interval := interval '0';
    all_lapsed bigint := 0;
    written integer := 0;
    n integer;
    plan json;
    st text;
BEGIN
    -- One sampler at a time (pg_cron beside a dashboard): each statement
    -- below runs on a snapshot taken after this lock, so it sees the sample
    -- the one before it committed and counts ended and delivered since that
    -- one, never the same interval twice. (A transaction-level advisory lock
    -- keyed by the samples table's OID: no privilege needed, nothing held
    -- past the commit.)
    PERFORM pg_advisory_xact_lock('sturdy.samples'::regclass::oid::int4, 0);
    -- one sample a transaction: a second call writes nothing
    IF EXISTS (SELECT FROM sturdy.samples p WHERE p.sampled_at = now()) THEN
        RETURN 0;
    END IF;
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                                 WHERE logicalrelid OPERATOR(pg_catalog.=) ''sturdy.queue''::pg_catalog.regclass)'
           INTO distributed;
    END IF;

    -- The queues: each name in the queue table, one index probe a name
    -- (not a scan of the rows), and each sampled within the hour (one that
    -- has emptied since is sampled with zeros).
    names := ARRAY(SELECT DISTINCT p.name FROM sturdy.samples p
                    WHERE p.kind = 'queue' AND p.sampled_at > now() - interval '1 hour');
    q := (SELECT min(x.queue) FROM sturdy.queue x);
    WHILE q IS NOT NULL LOOP
        IF NOT q = ANY (names) THEN
            names := names || q;
        END IF;
        q := (SELECT min(x.queue) FROM sturdy.queue x WHERE x.queue > q);
    END LOOP;

    FOREACH q IN ARRAY names LOOP
        before := (SELECT p.figures FROM sturdy.samples p
                    WHERE p.kind = 'queue' AND p.name = q AND p.subscriber = ''
                      AND p.sampled_at > now() - interval '1 hour'
                    ORDER BY p.sampled_at DESC LIMIT 1);
        -- its rows, up to cap + 1: all of them, with the highest seq (the
        -- next sample's mark) and those the previous sample counted (each
        -- bounded read in the order of take's index, so that the planner
        -- walks it rather than the table, where a queue's rows are few)
        SELECT count(*), max(r.seq), count(*) FILTER (WHERE r.seq <= (before ->> 'mark')::bigint),
               count(*) FILTER (WHERE r.attempts > 0 AND r.visible_at < 'infinity'),
               count(*) FILTER (WHERE r.visible_at = 'infinity')
          INTO total, mark, staying, failing, dead
          FROM (SELECT x.seq, x.attempts, x.visible_at FROM sturdy.queue x WHERE x.queue = q
                 ORDER BY x.visible_at, x.seq LIMIT cap + 1) r;
        estimated := total > cap;
        -- its due rows in take's order, up to cap + 1: the leases are there
        -- (takes lease from the front), and the row waiting longest
        SELECT count(*), count(*) FILTER (WHERE d.leased_until > now()),
               count(*) FILTER (WHERE d.leased_until <= now()),
               min(GREATEST(d.visible_at, d.leased_until))
                   FILTER (WHERE d.leased_until IS NULL OR d.leased_until <= now())
          INTO due, leased, lapsed, oldest
          FROM (SELECT x.visible_at, x.leased_until FROM sturdy.queue x
                 WHERE x.queue = q AND x.visible_at <= now()
                 ORDER BY x.visible_at, x.seq LIMIT cap + 1) d;
        IF NOT estimated THEN
            sleeping := total - due - dead;
        ELSE
            -- (failing: among the rows read; dead: the rows at 'infinity',
            -- the end of take's index, counted up to cap + 1)
            mark := NULL;
            dead := (SELECT count(*) FROM (SELECT FROM sturdy.queue x
                                            WHERE x.queue = q AND x.visible_at = 'infinity'
                                            LIMIT cap + 1) s);
            sleeping := (SELECT count(*) FROM (SELECT FROM sturdy.queue x
                                                WHERE x.queue = q AND x.visible_at > now() AND x.visible_at < 'infinity'
                                                ORDER BY x.visible_at, x.seq LIMIT cap + 1) s);
            IF sleeping > cap OR due > cap THEN
                IF distributed THEN
                    -- the queue's shard counts them (a router query)
                    SELECT count(*) FILTER (WHERE x.visible_at > now() AND x.visible_at < 'infinity'),
                           count(*) FILTER (WHERE x.visible_at <= now())
                      INTO sleeping, due
                      FROM sturdy.queue x WHERE x.queue = q;
                ELSE
                    EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM sturdy.queue x
                              WHERE x.queue OPERATOR(pg_catalog.=) $1 AND x.visible_at OPERATOR(pg_catalog.>) $2
                                AND x.visible_at OPERATOR(pg_catalog.<) ''infinity'''
                       INTO plan USING q, now();
                    sleeping := GREATEST(sleeping, (plan -> 0 -> 'Plan' ->> 'Plan Rows')::float8::bigint);
                    EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM sturdy.queue x
                              WHERE x.queue OPERATOR(pg_catalog.=) $1 AND x.visible_at OPERATOR(pg_catalog.<=) $2'
                       INTO plan USING q, now();
                    due := GREATEST(due, (plan -> 0 -> 'Plan' ->> 'Plan Rows')::float8::bigint);
                END IF;
            END IF;
            total := due + sleeping + dead;
        END IF;
        ready := due - leased;
        worst_wait := GREATEST(worst_wait, now() - oldest);
        all_lapsed := all_lapsed + lapsed;
        all_dead := all_dead + dead;

        -- held back by its limits, as queue_stats says (per key: among the
        -- due rows read above)
        l := NULL;
        SELECT * INTO l FROM sturdy.queue_limits x WHERE x.queue = q;
        IF l.queue IS NULL THEN
            held := 0;
        ELSIF l.paused THEN
            held := ready;
        ELSE
            free_places := GREATEST(0, l.running - (SELECT count(*) FROM sturdy.queue_places p
                                                     WHERE p.queue = q AND p.receipt > now()));
            tokens := floor(LEAST(l.burst::float8, COALESCE(l.tokens, l.burst::float8)
                                  + date_part('epoch', now() - COALESCE(l.refilled_at, now())) * l.per_second));
            per_key_held := 0;
            IF l.per_key IS NOT NULL THEN
                per_key_held := (
                    SELECT COALESCE(sum(GREATEST(0, r.n - GREATEST(0, l.per_key
                               - (SELECT count(*) FROM sturdy.queue_key_places p
                                   WHERE p.queue = q AND p.key = r.key AND p.receipt > now())))), 0)
                      FROM (SELECT d.key, count(*) AS n
                              FROM (SELECT x.key, x.leased_until FROM sturdy.queue x
                                     WHERE x.queue = q AND x.visible_at <= now()
                                     ORDER BY x.visible_at, x.seq LIMIT cap + 1) d
                             WHERE d.key IS NOT NULL AND (d.leased_until IS NULL OR d.leased_until <= now())
                             GROUP BY d.key) r);
            END IF;
            held := GREATEST(0, ready - LEAST(COALESCE(free_places, ready), COALESCE(tokens, ready)), per_key_held);
        END IF;

        INSERT INTO sturdy.samples (sampled_at, kind, name, subscriber, figures)
        VALUES (now(), 'queue', q, '',
                jsonb_build_object(
                    'ready', ready, 'leased', leased, 'sleeping', sleeping, 'held_back', held,
                    'paused', COALESCE(l.paused, false),
                    'oldest_ready_seconds', round(extract(epoch FROM now() - oldest), 3),
                    'rows', total, 'mark', mark, 'estimated', estimated,
                    'failing', failing, 'dead', dead,
                    -- rows gone since the previous sample: counted when both
                    -- samples counted every row
                    'ended', CASE WHEN before IS NOT NULL AND NOT estimated
                                       AND NOT COALESCE((before ->> 'estimated')::boolean, false) THEN
                                      GREATEST(0, (before ->> 'rows')::bigint - staying)
                                 END));
        written := written + 1;
    END LOOP;

    -- The outbox's subscriptions and the named batch jobs, from their views.
    WITH previous AS (
        SELECT DISTINCT ON (p.name, p.subscriber) p.name, p.subscriber, p.sampled_at
          FROM sturdy.samples p
         WHERE p.kind = 'outbox' AND p.sampled_at > now() - interval '1 hour'
         ORDER BY p.name, p.subscriber, p.sampled_at DESC),
    outbox AS (
        SELECT COALESCE(o.event, p.name) AS event, COALESCE(o.subscriber, p.subscriber) AS subscriber,
               o.pending, o.retrying, o.dead, o.oldest_pending_age, p.sampled_at AS since
          FROM sturdy.outbox_stats o
          FULL JOIN previous p ON p.name = o.event AND p.subscriber = o.subscriber),
    rows AS (
        INSERT INTO sturdy.samples (sampled_at, kind, name, subscriber, figures)
        SELECT now(), 'outbox', o.event, o.subscriber,
               jsonb_build_object(
                   'pending', COALESCE(o.pending, 0), 'retrying', COALESCE(o.retrying, 0),
                   'dead', COALESCE(o.dead, 0),
                   'oldest_pending_seconds', round(extract(epoch FROM o.oldest_pending_age), 3),
                   'delivered', CASE WHEN o.since IS NOT NULL THEN
                                    (SELECT count(*) FROM sturdy.deliveries d JOIN sturdy.outbox m ON m.id = d.outbox_id
                                      WHERE m.event = o.event AND d.subscriber = o.subscriber
                                        AND d.state = 'done' AND d.delivered_at > o.since)
                                END)
          FROM outbox o
        UNION ALL
        SELECT now(), 'batch', b.name, '',
               jsonb_build_object('done', b.done, 'remaining', b.remaining, 'chunk', b.chunk,
                                  'last_seconds', b.last_seconds, 'complete', b.complete)
          FROM sturdy.batch_jobs b
         WHERE NOT b.complete OR b.finished_at > now() - interval '1 hour'
        RETURNING 1)
    SELECT count(*) INTO n FROM rows;
    written := written + n;

    -- The instances by status: the live ones (pending, running) through
    -- the index stuck walks, the finished ones through sweep's; each part
    -- counted up to cap + 1 rows, and estimated past it.
    SELECT count(*), count(*) FILTER (WHERE i.status = 'pending'), count(*) FILTER (WHERE i.status = 'running')
      INTO live, total, due
      FROM (SELECT x.status FROM sturdy.instances x
             WHERE x.status = ANY ('{pending,running}'::text[]) ORDER BY x.updated_at, x.id LIMIT cap + 1) i;
    statuses := jsonb_build_object('pending', total, 'running', due);
    SELECT count(*), count(*) FILTER (WHERE i.status = 'succeeded'), count(*) FILTER (WHERE i.status = 'failed'),
           count(*) FILTER (WHERE i.status = 'cancelled')
      INTO finished, total, due, sleeping
      FROM (SELECT x.status FROM sturdy.instances x
             WHERE x.finished_at IS NOT NULL ORDER BY x.finished_at LIMIT cap + 1) i;
    statuses := statuses || jsonb_build_object('succeeded', total, 'failed', due, 'cancelled', sleeping);
    FOREACH st IN ARRAY ARRAY['pending', 'running', 'succeeded', 'failed', 'cancelled'] LOOP
        estimated := CASE WHEN st IN ('pending', 'running') THEN live ELSE finished END > cap;
        total := (statuses ->> st)::bigint;
        IF estimated THEN
            EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM sturdy.instances x WHERE x.status OPERATOR(pg_catalog.=) $1'
               INTO plan USING st;
            total := GREATEST(total, (plan -> 0 -> 'Plan' ->> 'Plan Rows')::float8::bigint);
        END IF;
        INSERT INTO sturdy.samples (sampled_at, kind, name, subscriber, figures)
        VALUES (now(), 'instances', st, '', jsonb_build_object('count', total, 'estimated', estimated));
    END LOOP;
    -- stuck: counted up to 1,000, as the health view counts them (stuck
    -- walks only as far as the first 1,001)
    stalled := (SELECT count(*) FROM sturdy.stuck('1 hour', 1001));
    INSERT INTO sturdy.samples (sampled_at, kind, name, subscriber, figures)
    VALUES (now(), 'instances', 'stuck', '', jsonb_build_object('count', LEAST(stalled, 1000), 'more', stalled > 1000));
    written := written + 6;

    -- The health signals: the two about the queue from the figures read
    -- above (the view counts every queue row for them), the rest from the
    -- view, whose queue branches a constant filter leaves unplanned.
    INSERT INTO sturdy.samples (sampled_at, kind, name, subscriber, figures)
    VALUES (now(), 'health', 'oldest ready job', '',
            jsonb_build_object('value', to_char(worst_wait, 'HH24:MI:SS'), 'ok', worst_wait < interval '5 minutes',
                               'meaning', 'How long the oldest ready queue row has waited for a worker: growing means too few workers (or none).')),
           (now(), 'health', 'lapsed leases', '',
            jsonb_build_object('value', all_lapsed::text, 'ok', all_lapsed = 0,
                               'meaning', 'Queue rows taken whose lease ran out before done: a worker died or is too slow for its lease; each is a failed pass, retried after its backoff.')),
           (now(), 'health', 'dead workflows', '',
            jsonb_build_object('value', all_dead::text, 'ok', all_dead = 0,
                               'meaning', 'Queue rows whose passes failed their queue''s max_attempts times: never handed out again. Read last_error in sturdy.queue, fix, then sturdy.redrive(workflow, queue).'));
    WITH rows AS (
        INSERT INTO sturdy.samples (sampled_at, kind, name, subscriber, figures)
        SELECT now(), 'health', h.signal, '', jsonb_build_object('value', h.value, 'ok', h.ok, 'meaning', h.meaning)
          FROM sturdy.health h
         WHERE h.signal NOT IN ('oldest ready job', 'lapsed leases', 'dead workflows')
        RETURNING 1)
    SELECT count(*) INTO n FROM rows;
    RETURN written + 3 + n;
END
$$;
COMMENT ON FUNCTION sturdy.sample() IS
    'Record the dashboard''s history: one row in sturdy.samples per queue (and per queue sampled within the hour that is empty now), per outbox subscription, per named batch job running or finished within the hour, per instance status (and stuck) and per sturdy.health signal; returns how many. Call it once a minute (pg_cron, or sturdy-ui does); sweep trims the history.';
