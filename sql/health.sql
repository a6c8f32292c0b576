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
       'Queue rows taken whose lease ran out before done: a worker died or is too slow for its lease; they are taken again.'
  FROM sturdy.queue q WHERE q.leased_until <= now()
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
SELECT 'stuck instances', pg_catalog.count(*)::text, pg_catalog.count(*) = 0,
       'Pending or running instances without progress for an hour: sturdy.stuck(''1 hour'') lists them.'
  FROM sturdy.stuck(interval '1 hour')
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
    'Is anything wrong: the oldest ready job, lapsed leases, the oldest pending delivery, dead deliveries, stuck instances, dead tuples in the busy tables and the oldest snapshot, each with ok by a documented threshold.';

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
);
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
    'What was read. queue: ready, leased, sleeping, held_back, paused, oldest_ready_seconds, ended (rows gone or rescheduled since the previous sample), rows and mark (the highest seq, for the next ended). outbox: pending, retrying, dead, oldest_pending_seconds, delivered (since the previous sample). batch: done, remaining, chunk, last_seconds, complete. instances: count. health: value, ok, meaning.';

CREATE FUNCTION sturdy.sample() RETURNS integer
    LANGUAGE sql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
AS $$
-- One sampler at a time (pg_cron beside a dashboard): the statement below
-- runs on a snapshot taken after this lock, so it sees the sample the one
-- before it committed and counts ended and delivered since that one, never
-- the same interval twice. (A transaction-level advisory lock keyed by the
-- samples table's OID: no privilege needed, nothing held past the commit.)
SELECT pg_advisory_xact_lock('sturdy.samples'::regclass::oid::int4, 0);
WITH previous AS (
    -- the last sample of each thing sampled within the hour
    SELECT DISTINCT ON (p.kind, p.name, p.subscriber) p.kind, p.name, p.subscriber, p.sampled_at, p.figures
      FROM sturdy.samples p
     WHERE p.sampled_at > now() - interval '1 hour'
     ORDER BY p.kind, p.name, p.subscriber, p.sampled_at DESC),
-- The queue's figures are read in statements over the queue's tables alone,
-- then joined with the history: under Citus (docs/scale-out.md) the queue's
-- tables are distributed and the samples are not, and no statement may join
-- the two.
stats AS MATERIALIZED (
    SELECT * FROM sturdy.queue_stats),
marks AS MATERIALIZED (
    -- the highest seq of each queue, for the next sample's ended
    SELECT x.queue, max(x.seq) AS mark FROM sturdy.queue x GROUP BY x.queue),
before AS MATERIALIZED (
    SELECT p.name AS queue, COALESCE((p.figures ->> 'mark')::bigint, 0) AS mark
      FROM previous p WHERE p.kind = 'queue'),
staying AS MATERIALIZED (
    -- of each queue's rows at the previous sample, how many are still there
    SELECT x.queue, count(*) AS n
      FROM sturdy.queue x JOIN before b ON b.queue = x.queue COLLATE "C" AND x.seq <= b.mark
     GROUP BY x.queue),
queues AS (
    -- every queue with rows, and those sampled within the hour that have none now
    SELECT COALESCE(s.queue, p.name) AS queue, s.ready, s.leased, s.sleeping, s.held_back, s.paused,
           s.oldest_ready_age, p.figures AS before
      FROM stats s
      FULL JOIN (SELECT * FROM previous WHERE kind = 'queue') p ON p.name = s.queue COLLATE "C"),
outbox AS (
    SELECT COALESCE(o.event, p.name) AS event, COALESCE(o.subscriber, p.subscriber) AS subscriber,
           o.pending, o.retrying, o.dead, o.oldest_pending_age, p.sampled_at AS since
      FROM sturdy.outbox_stats o
      FULL JOIN (SELECT * FROM previous WHERE kind = 'outbox') p
        ON p.name = o.event AND p.subscriber = o.subscriber),
written AS (
    INSERT INTO sturdy.samples (sampled_at, kind, name, subscriber, figures)
    SELECT now(), 'queue', q.queue, '',
           jsonb_build_object(
               'ready', COALESCE(q.ready, 0), 'leased', COALESCE(q.leased, 0),
               'sleeping', COALESCE(q.sleeping, 0), 'held_back', COALESCE(q.held_back, 0),
               'paused', COALESCE(q.paused, false),
               'oldest_ready_seconds', round(extract(epoch FROM q.oldest_ready_age), 3),
               'rows', COALESCE(q.ready + q.leased + q.sleeping, 0),
               'mark', m.mark,
               'ended', CASE WHEN q.before IS NOT NULL THEN
                            GREATEST(0, (q.before ->> 'rows')::bigint - COALESCE(k.n, 0))
                        END)
      FROM queues q
      LEFT JOIN marks m ON m.queue = q.queue COLLATE "C"
      LEFT JOIN staying k ON k.queue = q.queue COLLATE "C"
    UNION ALL
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
    UNION ALL
    SELECT now(), 'instances', s.status, '', jsonb_build_object('count', COALESCE(c.n, 0))
      FROM unnest(ARRAY['pending', 'running', 'succeeded', 'failed', 'cancelled']) AS s(status)
      LEFT JOIN (SELECT i.status, count(*) AS n FROM sturdy.instances i GROUP BY i.status) c
        ON c.status = s.status COLLATE "C"
    UNION ALL
    SELECT now(), 'instances', 'stuck', '',
           jsonb_build_object('count', (SELECT count(*) FROM sturdy.stuck('1 hour')))
    UNION ALL
    SELECT now(), 'health', h.signal, '', jsonb_build_object('value', h.value, 'ok', h.ok, 'meaning', h.meaning)
      FROM sturdy.health h
    ON CONFLICT (kind, name, subscriber, sampled_at) DO NOTHING
    RETURNING 1)
SELECT count(*)::integer FROM written
$$;
COMMENT ON FUNCTION sturdy.sample() IS
    'Record the dashboard''s history: one row in sturdy.samples per queue (and per queue sampled within the hour that is empty now), per outbox subscription, per named batch job running or finished within the hour, per instance status (and stuck) and per sturdy.health signal; returns how many. Call it once a minute (pg_cron, or sturdy-ui does); sweep trims the history.';
