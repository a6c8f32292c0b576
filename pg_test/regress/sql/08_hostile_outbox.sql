-- Every outbox function under a hostile search_path (04_hostile.sql), in a
-- fresh backend, so each statement is planned under that path. The
-- subscriber is caller code: it runs under the caller's path, as it must, so
-- its unqualified table name finds the caller's table (here evil's).
CREATE TABLE evil.outbox_seen (id bigint, attempt int);
CREATE FUNCTION public.hostile_sub(m sturdy.outbox, attempt int) RETURNS void LANGUAGE plpgsql
  AS $$BEGIN INSERT INTO outbox_seen VALUES (m.id, attempt); END$$;
CREATE FUNCTION public.hostile_fails(m sturdy.outbox, attempt int) RETURNS void LANGUAGE plpgsql
  AS $$BEGIN RAISE EXCEPTION 'no' USING ERRCODE = 'HO001'; END$$;
\c
SET search_path = evil, pg_catalog;
SELECT sturdy.subscribe('ho.e', 'public.hostile_sub(sturdy.outbox, integer)');
SELECT sturdy.subscribe('ho.e', 'public.hostile_fails(sturdy.outbox, integer)', 1);
SELECT * FROM sturdy.pump(10);
SELECT deliveries FROM sturdy.emit('ho.e', '{"n": 1}', 'agg');
SELECT deliveries FROM sturdy.emit('ho.e', '{"n": 2}', 'agg');
SELECT deliveries FROM sturdy.emit('ho.e', '{"n": 3}');
SELECT * FROM sturdy.pump(10);
SELECT * FROM sturdy.pump(10);
SELECT sturdy.redrive(d.id) FROM sturdy.deliveries d
 WHERE d.state OPERATOR(pg_catalog.=) 'dead' ORDER BY d.id LIMIT 1;
SELECT sturdy.unsubscribe('ho.e', 'public.hostile_fails(sturdy.outbox, integer)');
SELECT attempt FROM evil.outbox_seen ORDER BY id;
SELECT (SELECT count(*) FROM evil.deliveries) AS evil_deliveries, (SELECT count(*) FROM evil.outbox) AS evil_outbox;
RESET search_path;
SELECT event, subscriber, pending, retrying, done, dead FROM sturdy.outbox_stats ORDER BY subscriber;
SELECT state, attempts, last_sqlstate FROM sturdy.deliveries ORDER BY id;
