-- Every queue function under a hostile search_path (04_hostile.sql), in a
-- fresh backend, so each statement is planned under that path.
\c
SET search_path = evil, pg_catalog;
SELECT sturdy.schedule('hq-1', queue => 'hq');
SELECT sturdy.schedule('hq-2', queue => 'hq');
SELECT sturdy.schedule('hq-3', queue => 'hq');
SELECT workflow, token FROM sturdy.take('hq', claim => true);
SELECT receipt AS r2 FROM sturdy.take('hq') \gset
SELECT sturdy.done('hq-2', :'r2'::pg_catalog.timestamptz, 'hq') AS done;
SELECT workflow, token FROM sturdy.take('hq', max => 5, claim => true);
SELECT workflow FROM sturdy.take('hq', max => 5);
SELECT sturdy.schedule('hq-4', queue => 'hq');
SELECT receipt AS r4 FROM sturdy.take('hq') \gset
SELECT sturdy.wake_at('hq-4', :'r4', pg_catalog.now(), 'hq') AS woken;
SELECT sturdy.arrive('hq-5', 'approval', '"yes"', 'hq');
SELECT array_agg(workflow) AS ws, array_agg(receipt) AS rs FROM sturdy.take('hq', max => 5) \gset
SELECT sturdy.done_many(:'ws'::pg_catalog.text[], :'rs'::pg_catalog.timestamptz[], 'hq') AS done_batch;
SELECT count(*) AS empty_take FROM sturdy.take('hq');
SELECT sturdy.schedule('hq-6', queue => 'hq');
SELECT (SELECT count(*) FROM evil.queue) AS evil_rows;
RESET search_path;
SELECT queue, ready, leased, sleeping FROM sturdy.queue_stats WHERE queue = 'hq';
