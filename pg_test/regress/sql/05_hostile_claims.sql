-- Every claims function under a hostile search_path (04_hostile.sql), in a
-- fresh backend, so each statement is planned under that path.
\c
SET search_path = evil, pg_catalog;
SELECT sturdy.claim('hc-1', '1 minute', 'worker') AS token;
SELECT sturdy.claim('hc-1') AS held;
SELECT sturdy.renew('hc-1', 1, '1 hour') IS NOT NULL AS renewed;
SELECT sturdy.fence('hc-1', 1);
SELECT sturdy.fence('hc-1', 2);
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.release('hc-1', 1) AS released;
SELECT sturdy.claim('hc-1') AS token;
SELECT (SELECT count(*) FROM evil.claims) AS evil_rows;
RESET search_path;
SELECT workflow, token, owner FROM sturdy.claims WHERE workflow = 'hc-1';
