-- A hostile search_path, for the *_hostile_* files after this one (the files
-- run in the order of their names, one database for all): schema evil, placed
-- before pg_catalog, defines its own version of every operator and function
-- pg_sturdy's statements use, each raising an error. pg_sturdy names
-- everything with its schema, so none of them may ever run, whoever's
-- search_path plans its statements.
CREATE SCHEMA evil;
CREATE FUNCTION evil.trap() RETURNS boolean LANGUAGE plpgsql AS
  $$BEGIN RAISE EXCEPTION 'evil: the caller''s search_path reached a pg_sturdy statement'; END$$;
CREATE FUNCTION evil.cmp(a text, b text) RETURNS boolean LANGUAGE sql AS 'SELECT evil.trap()';
CREATE FUNCTION evil.cmp(a bigint, b bigint) RETURNS boolean LANGUAGE sql AS 'SELECT evil.trap()';
CREATE FUNCTION evil.cmp(a xid, b integer) RETURNS boolean LANGUAGE sql AS 'SELECT evil.trap()';
CREATE FUNCTION evil.cmp(a timestamptz, b timestamptz) RETURNS boolean LANGUAGE sql AS 'SELECT evil.trap()';
CREATE FUNCTION evil.cmp(a tid, b tid) RETURNS boolean LANGUAGE sql AS 'SELECT evil.trap()';
CREATE FUNCTION evil.plus(a timestamptz, b interval) RETURNS timestamptz LANGUAGE sql
  AS 'SELECT CASE WHEN evil.trap() THEN a END';
CREATE FUNCTION evil.plus(a bigint, b integer) RETURNS bigint LANGUAGE sql AS 'SELECT CASE WHEN evil.trap() THEN a END';
CREATE FUNCTION evil.plus(a integer, b integer) RETURNS integer LANGUAGE sql AS 'SELECT CASE WHEN evil.trap() THEN a END';
CREATE OPERATOR evil.=  (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.cmp);
CREATE OPERATOR evil.=  (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.cmp);
CREATE OPERATOR evil.=  (LEFTARG = xid, RIGHTARG = integer, FUNCTION = evil.cmp);
CREATE OPERATOR evil.=  (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.cmp);
CREATE OPERATOR evil.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.cmp);
CREATE OPERATOR evil.>  (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.cmp);
CREATE OPERATOR evil.=  (LEFTARG = tid, RIGHTARG = tid, FUNCTION = evil.cmp);
CREATE OPERATOR evil.+  (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = evil.plus);
CREATE OPERATOR evil.+  (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = evil.plus);
CREATE OPERATOR evil.+  (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.plus);
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS 'SELECT CASE WHEN evil.trap() THEN NULL::timestamptz END';
CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS 'SELECT CASE WHEN evil.trap() THEN NULL::timestamptz END';
CREATE FUNCTION evil.pg_notify(a text, b text) RETURNS void LANGUAGE sql AS 'SELECT evil.trap()';
-- and for the outbox's statements
CREATE OPERATOR evil.<  (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.cmp);
CREATE OPERATOR evil.>  (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.cmp);
CREATE FUNCTION evil.to_regprocedure(a text) RETURNS regprocedure LANGUAGE sql AS 'SELECT CASE WHEN evil.trap() THEN NULL::regprocedure END';
CREATE FUNCTION evil.to_regtype(a text) RETURNS regtype LANGUAGE sql AS 'SELECT CASE WHEN evil.trap() THEN NULL::regtype END';
CREATE FUNCTION evil.make_interval(a int, b int, c int, d int, e int, f int, g double precision) RETURNS interval
  LANGUAGE sql AS 'SELECT CASE WHEN evil.trap() THEN NULL::interval END';
CREATE FUNCTION evil.unnest(a anyarray) RETURNS SETOF anyelement LANGUAGE sql AS 'SELECT CASE WHEN evil.trap() THEN a[1] END';
CREATE TABLE evil.subscriptions (event text, subscriber text, max_attempts int, created_at timestamptz);
CREATE TABLE evil.outbox (id bigint, event text, payload jsonb, aggregate_id text, created_at timestamptz);
CREATE TABLE evil.deliveries (id bigint, outbox_id bigint, subscriber text, aggregate_id text, state text, attempts int,
                              max_attempts int, next_attempt_at timestamptz, last_error text, last_sqlstate text,
                              delivered_at timestamptz);
CREATE TABLE evil.outbox_waiters (waiting boolean, since timestamptz);
CREATE TABLE evil.claims (workflow text, token bigint, held_until timestamptz, owner text, claimed_at timestamptz);
CREATE TABLE evil.checkpoints (workflow text, step text, value jsonb, token bigint, recorded_at timestamptz);
CREATE TABLE evil.queue (queue text, workflow text, visible_at timestamptz, taken_at timestamptz, takes int, scheduled_at timestamptz);
-- the traps work: under this path the plain operator and now() are evil's
SET search_path = evil, pg_catalog;
SELECT 'a'::text = 'a'::text;
SELECT now();
RESET search_path;
