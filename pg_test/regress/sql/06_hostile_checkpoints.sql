-- Every checkpoints function under a hostile search_path (04_hostile.sql),
-- in a fresh backend, so each statement is planned under that path. The
-- effect transact runs is caller code and keeps the caller's path: this one
-- uses no operator, so the traps stay shut.
\c
CREATE FUNCTION public.hostile_effect(arg jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT arg $$;
SET search_path = evil, pg_catalog;
SELECT sturdy.claim('hp-1') AS token;
SELECT * FROM sturdy.record('hp-1', 'a', '"first"', 1);
SELECT * FROM sturdy.record('hp-1', 'a', '"second"', 1);
SELECT * FROM sturdy.record('hp-1', 'b', '"stale"', 7);
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.supply('hp-1', 'c', '"supplied"');
SELECT sturdy.transact('hp-1', 1, 'd', 'public.hostile_effect(jsonb)', '{"done": true}');
SELECT sturdy.transact('hp-1', 1, 'd', 'public.hostile_effect(jsonb)', '{"again": true}');
SELECT step, value FROM sturdy.load('hp-1');
SELECT (SELECT count(*) FROM evil.checkpoints) AS evil_rows;
RESET search_path;
DROP FUNCTION public.hostile_effect(jsonb);
