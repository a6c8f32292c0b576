-- Every workflow function under a hostile search_path (04_hostile.sql), in
-- a fresh backend, so each statement is planned under that path.
CREATE TABLE evil.instances (id bigint, process text, business_key text, workflow text, queue text, status text,
                             revision bigint, variables jsonb, last_error text, created_at timestamptz,
                             updated_at timestamptz, finished_at timestamptz);
CREATE TABLE evil.idempotency_keys (process text, key text, instance bigint, created_at timestamptz, expires_at timestamptz);
CREATE FUNCTION evil.nextval(a regclass) RETURNS bigint LANGUAGE sql AS 'SELECT CASE WHEN evil.trap() THEN 0::bigint END';
CREATE FUNCTION evil.max(a timestamptz) RETURNS timestamptz LANGUAGE sql AS 'SELECT CASE WHEN evil.trap() THEN a END';
CREATE OPERATOR evil.- (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = evil.plus);
CREATE OPERATOR evil.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.cmp);
\c
SET search_path = evil, pg_catalog;
SELECT sturdy.start('hw', 'bk-1', '{"a": 1}', queue => 'hwq') AS first \gset
SELECT sturdy.start('hw', 'bk-1', idempotency_key => 'key-1', queue => 'hwq') AS keyed \gset
SELECT sturdy.start('hw', 'bk-1', idempotency_key => 'key-1', queue => 'hwq') OPERATOR(pg_catalog.=) :keyed AS same_again;
SELECT process, status, revision FROM sturdy.status('bk-1');
SELECT sturdy.transition(:first, 'pending', 'running', expected_revision => 1);
SELECT workflow, receipt, token FROM sturdy.take('hwq', claim => true) \gset
SELECT sturdy.finish(:'workflow', :token, :'receipt', 'final', '"ok"', 'succeeded', 'hwq') AS finished;
SELECT count(*) AS stuck FROM sturdy.stuck('1 hour');
SELECT kind, deleted FROM sturdy.sweep('1 day', 10);
SELECT (SELECT count(*) FROM evil.instances) AS evil_instances, (SELECT count(*) FROM evil.idempotency_keys) AS evil_keys;
RESET search_path;
SELECT process, business_key, status, revision FROM sturdy.instances ORDER BY id;
