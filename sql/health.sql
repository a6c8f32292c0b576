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
  FROM sturdy.instances i
 WHERE i.status IN ('pending', 'running') AND i.updated_at < now() - interval '1 hour'
   AND NOT EXISTS (SELECT FROM sturdy.checkpoints c
                    WHERE c.workflow = i.workflow AND c.recorded_at >= now() - interval '1 hour')
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
