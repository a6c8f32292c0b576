-- Security: SECURITY INVOKER everywhere, no SET clauses (every statement is
-- schema-qualified instead: hostile_*.sql), nothing open to PUBLIC,
-- grant_usage opens exactly the API, caller code only with the caller's rights.
\set VERBOSITY default
\set SHOW_CONTEXT never

SELECT p.proname, p.prosecdef AS definer, p.proconfig
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'sturdy' ORDER BY 1;

-- PUBLIC has nothing
SELECT count(*) AS public_execute
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'sturdy' AND has_function_privilege('public', p.oid, 'EXECUTE');
SELECT has_schema_privilege('public', 'sturdy', 'USAGE') AS public_usage;

CREATE ROLE sturdy_regress_app LOGIN;
SET ROLE sturdy_regress_app;
SELECT sturdy.claim('sec-1');
RESET ROLE;

CREATE ROLE sturdy_user NOLOGIN;
SELECT sturdy.grant_usage('sturdy_user');
GRANT sturdy_user TO sturdy_regress_app;
SET ROLE sturdy_regress_app;
SELECT sturdy.claim('sec-1') AS token;
SELECT * FROM sturdy.record('sec-1', 's', '"ok"', 1);
SELECT sturdy.grant_usage('sturdy_regress_app');
RESET ROLE;

-- grant_usage: bad input
SELECT sturdy.grant_usage(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.grant_usage('no such role');
\echo :LAST_ERROR_SQLSTATE

-- transact calls an effect only if the caller may execute it: a function
-- with EXECUTE revoked from PUBLIC, even SECURITY DEFINER, is refused with
-- 42501 before anything runs or is written
CREATE SCHEMA priv;
CREATE TABLE priv.ran (u text);
CREATE FUNCTION priv.f(a jsonb) RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER
  AS $$BEGIN INSERT INTO priv.ran VALUES (current_user); RETURN a; END$$;
REVOKE ALL ON FUNCTION priv.f(jsonb) FROM PUBLIC;
SELECT 'priv.f(jsonb)'::regprocedure::oid AS f_oid \gset
SET ROLE sturdy_regress_app;
SELECT sturdy.claim('sec-4') AS token;
-- by OID, from a role that cannot even see the schema
SELECT sturdy.transact('sec-4', 1, 's', :f_oid::oid::regprocedure, '{}');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- by name, with the schema visible but EXECUTE still revoked
GRANT USAGE ON SCHEMA priv TO sturdy_regress_app;
SET ROLE sturdy_regress_app;
SELECT sturdy.transact('sec-4', 1, 's', 'priv.f(jsonb)'::regprocedure, '{}');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT count(*) AS ran FROM priv.ran;
SELECT count(*) AS recorded FROM sturdy.checkpoints WHERE workflow = 'sec-4';
-- granted, it runs, and as a SECURITY DEFINER function runs when called directly
GRANT EXECUTE ON FUNCTION priv.f(jsonb) TO sturdy_regress_app;
SET ROLE sturdy_regress_app;
SELECT sturdy.transact('sec-4', 1, 's', 'priv.f(jsonb)'::regprocedure, '{"ok": 1}');
RESET ROLE;
SELECT u FROM priv.ran;

-- pump calls a subscriber with its caller's rights, and only if its caller
-- may execute it: otherwise the attempt fails with 42501, on record
CREATE TABLE priv.delivered (u text, id bigint);
CREATE FUNCTION priv.sub(m sturdy.outbox, attempt int) RETURNS void LANGUAGE sql
  AS 'INSERT INTO priv.delivered VALUES (current_user, m.id)';
REVOKE ALL ON FUNCTION priv.sub(sturdy.outbox, integer) FROM PUBLIC;
SELECT sturdy.subscribe('sec.e', 'priv.sub(sturdy.outbox, integer)', 2);
SET ROLE sturdy_regress_app;
-- nor may a role subscribe a function it could not call
SELECT sturdy.subscribe('sec.other', 'priv.sub(sturdy.outbox, integer)');
\echo :LAST_ERROR_SQLSTATE
SELECT deliveries FROM sturdy.emit('sec.e', '{}');
SELECT * FROM sturdy.pump(10);
RESET ROLE;
SELECT state, attempts, last_sqlstate, last_error FROM sturdy.deliveries WHERE subscriber LIKE 'priv.sub%';
GRANT EXECUTE ON FUNCTION priv.sub(sturdy.outbox, integer) TO sturdy_regress_app;
GRANT INSERT ON priv.delivered TO sturdy_regress_app;
UPDATE sturdy.deliveries SET next_attempt_at = now() WHERE subscriber LIKE 'priv.sub%';
SET ROLE sturdy_regress_app;
SELECT * FROM sturdy.pump(10);
RESET ROLE;
SELECT u FROM priv.delivered;
SELECT count(*) AS other_subscriptions FROM sturdy.subscriptions WHERE event = 'sec.other';

-- user data survives pg_dump
SELECT c.relname, c.relkind FROM pg_extension e, unnest(e.extconfig) AS cfg(oid)
  JOIN pg_class c ON c.oid = cfg.oid WHERE e.extname = 'pg_sturdy' ORDER BY 1;

REVOKE sturdy_user FROM sturdy_regress_app;
DROP OWNED BY sturdy_user, sturdy_regress_app;
DROP SCHEMA priv CASCADE;
DROP ROLE sturdy_user;
DROP ROLE sturdy_regress_app;
