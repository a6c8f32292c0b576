-- Security: SECURITY INVOKER everywhere, search_path pinned where no caller
-- code runs (inside the C functions, see sql/claims.sql), nothing open to
-- PUBLIC, grant_usage opens exactly the API.
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

-- a hostile search_path cannot redirect pg_sturdy's own statements
CREATE SCHEMA evil;
CREATE TABLE evil.claims (workflow text, token bigint, held_until timestamptz, owner text, claimed_at timestamptz);
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT 'infinity'::timestamptz $$;
SET search_path = evil, pg_catalog;
SELECT sturdy.claim('sec-2', '1 minute') AS token;
SELECT count(*) AS evil_rows FROM evil.claims;
-- an operator that would hijack record's unqualified "=" on text if its
-- statement were ever analysed under the caller's search_path
CREATE FUNCTION evil.texteq(a text, b text) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
SELECT * FROM sturdy.record('sec-2', 's', '"mine"', 1);
SELECT * FROM sturdy.record('sec-1', 's', '"hijack"', 99);
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.fence('sec-2', 1);
SELECT sturdy.claim('sec-3') AS token;
SELECT sturdy.supply('sec-3', 's', '"supplied"');
SELECT step, value FROM sturdy.load('sec-3');
RESET search_path;
SELECT workflow, held_until < now() + interval '2 minutes' AS sane FROM sturdy.claims WHERE workflow = 'sec-2';

-- user data survives pg_dump
SELECT c.relname, c.relkind FROM pg_extension e, unnest(e.extconfig) AS cfg(oid)
  JOIN pg_class c ON c.oid = cfg.oid WHERE e.extname = 'pg_sturdy' ORDER BY 1;

REVOKE sturdy_user FROM sturdy_regress_app;
DROP OWNED BY sturdy_user, sturdy_regress_app;
DROP SCHEMA evil CASCADE;
DROP ROLE sturdy_user;
DROP ROLE sturdy_regress_app;
