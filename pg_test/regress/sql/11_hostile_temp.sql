-- The session's temporary schema, which PostgreSQL searches first for
-- relations and types (not for functions and operators) unless the
-- search_path names it: a temporary view named like each relation pg_sturdy
-- has or reads, and a temporary domain named like each type its SQL names,
-- all calling a spy. Every function of the catalog is called without them,
-- then with them in a fresh backend (plans and PL/pgSQL bodies made with
-- them there) and again in that backend (plans warm). Nothing of the
-- caller's may run inside pg_sturdy but what the caller passed: the spy
-- never runs, and every call ends as it did without them.
CREATE TABLE public.spied (what text);
-- (a notice too: a call that then fails rolls its insert back)
CREATE FUNCTION public.spy(what text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'caller code ran inside pg_sturdy: %', what;
    INSERT INTO public.spied VALUES (what);
    RETURN true;
END
$$;
CREATE TABLE public.ht (id bigserial PRIMARY KEY, status int NOT NULL DEFAULT 1);
INSERT INTO public.ht SELECT FROM generate_series(1, 10);
CREATE FUNCTION public.ht_effect(a jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT a';
CREATE FUNCTION public.ht_on_event(m sturdy.outbox, attempt integer) RETURNS void LANGUAGE sql AS 'SELECT';
CREATE TABLE public.outcomes (phase text, fn oid, call text, sqlstate text);
-- A plausible argument of type `type` for the argument named `arg`, as a
-- literal with a cast (types named with their schema, in the literals too:
-- the session's own shadow the rest).
CREATE FUNCTION public.ht_value(arg pg_catalog.text, type pg_catalog.oid) RETURNS pg_catalog.text
LANGUAGE sql AS $$
    SELECT pg_catalog.format('%L::%I.%I', CASE
        WHEN t.typname = 'text' THEN
            CASE arg WHEN 'set_clause' THEN 'status = status + 1' WHEN 'pending' THEN 'status < 2'
                     WHEN 'order_by' THEN 'id' WHEN 'from_status' THEN 'pending'
                     WHEN 'to_status' THEN 'running' WHEN 'status' THEN 'succeeded'
                     ELSE 'ht-' || arg END
        WHEN t.typname IN ('_text', 'jsonb') THEN '{}'
        WHEN t.typname = 'interval' THEN '1 minute'
        WHEN t.typname = 'timestamptz' THEN '2000-01-01 00:00:00+00'
        WHEN t.typname = '_timestamptz' THEN '{}'
        WHEN t.typname IN ('int8', 'int4', 'float8') THEN '1'
        WHEN t.typname = 'bool' THEN 'true'
        WHEN t.typname = 'regclass' THEN 'public.ht'
        WHEN t.typname = 'regprocedure' THEN
            CASE arg WHEN 'effect' THEN 'public.ht_effect(pg_catalog.jsonb)'
                     ELSE 'public.ht_on_event(sturdy.outbox, pg_catalog.int4)' END
        WHEN t.typname = 'name' THEN 'id'
    END, n.nspname, t.typname)
      FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) t.typnamespace
     WHERE t.oid OPERATOR(pg_catalog.=) type
$$;
CREATE PROCEDURE public.call_every_function(phase pg_catalog.text) LANGUAGE plpgsql AS $$
DECLARE
    f pg_catalog.record;
    call pg_catalog.text;
    state pg_catalog.text;
BEGIN
    FOR f IN SELECT p.oid, p.proname, p.prokind, p.proargtypes, p.proargnames
               FROM pg_catalog.pg_proc p
              WHERE p.pronamespace OPERATOR(pg_catalog.=) 'sturdy'::pg_catalog.regnamespace
                AND p.proname OPERATOR(pg_catalog.<>) 'grant_usage'
              ORDER BY p.oid::pg_catalog.regprocedure::pg_catalog.text LOOP
        SELECT pg_catalog.format('%s sturdy.%I(%s)', CASE f.prokind WHEN 'p' THEN 'CALL' ELSE 'SELECT' END, f.proname,
                                 pg_catalog.string_agg(public.ht_value(f.proargnames[a.n], a.t),
                                                       ', ' ORDER BY a.n))
          INTO call
          FROM pg_catalog.unnest(f.proargtypes::pg_catalog.oid[]) WITH ORDINALITY a(t, n);
        BEGIN
            EXECUTE call;
            state := '00000';
        EXCEPTION WHEN OTHERS THEN
            state := SQLSTATE;
        END;
        INSERT INTO public.outcomes VALUES (phase, f.oid, f.oid::pg_catalog.regprocedure::pg_catalog.text, state);
    END LOOP;
END
$$;
-- every phase from the same start
CREATE PROCEDURE public.ht_reset() LANGUAGE sql AS $$
    DELETE FROM sturdy.claims; DELETE FROM sturdy.checkpoints; DELETE FROM sturdy.queue;
    DELETE FROM sturdy.deliveries; DELETE FROM sturdy.outbox; DELETE FROM sturdy.subscriptions;
    DELETE FROM sturdy.instances; DELETE FROM sturdy.idempotency_keys; DELETE FROM sturdy.batches;
    SELECT pg_catalog.setval(s, 1, false)
      FROM pg_catalog.unnest(ARRAY['sturdy.instances_id_seq', 'sturdy.outbox_id_seq',
                                   'sturdy.deliveries_id_seq']::pg_catalog.regclass[]) s;
    UPDATE public.ht SET status = 1;
    -- limits through their functions, which tell every backend's cache
    SELECT sturdy.resume('ht-queue'); SELECT sturdy.limit_queue('ht-queue');
$$;
CALL public.ht_reset();
-- what pg_sturdy reads besides its own relations
CREATE TABLE public.read_relations (name text);
INSERT INTO public.read_relations
  VALUES ('pg_namespace'), ('pg_roles'), ('pg_stat_activity'), ('pg_stat_user_tables'), ('pg_class'),
         ('pg_proc'), ('pg_type'), ('pg_attribute'), ('pg_index'), ('pg_locks'), ('pg_settings'), ('pg_database');
-- what its SQL names, and their arrays
CREATE TABLE public.named_types (name text, base text);
INSERT INTO public.named_types
  VALUES ('text', 'pg_catalog.text'), ('int8', 'pg_catalog.int8'), ('int4', 'pg_catalog.int4'),
         ('int2', 'pg_catalog.int2'), ('oid', 'pg_catalog.oid'), ('regclass', 'pg_catalog.regclass'),
         ('regprocedure', 'pg_catalog.regprocedure'), ('timestamptz', 'pg_catalog.timestamptz'),
         ('jsonb', 'pg_catalog.jsonb'), ('bool', 'pg_catalog.bool'), ('float8', 'pg_catalog.float8'),
         ('numeric', 'pg_catalog.numeric'), ('name', 'pg_catalog.name'), ('tid', 'pg_catalog.tid'),
         ('xid', 'pg_catalog.xid'), ('varchar', 'pg_catalog.varchar'), ('record', 'pg_catalog.int4'),
         ('interval', 'pg_catalog.interval');
-- the calls as they end without the session's own objects
CALL public.call_every_function('plain');
CALL public.ht_reset();
\c
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT c.relname FROM pg_catalog.pg_class c
              WHERE c.relnamespace = 'sturdy'::regnamespace AND c.relkind IN ('r', 'v', 'S')
             UNION SELECT name FROM public.read_relations LOOP
        EXECUTE format('CREATE TEMP VIEW %I AS SELECT 1 AS x WHERE public.spy(%L)', r.relname, r.relname);
    END LOOP;
    FOR r IN SELECT name, base FROM public.named_types LOOP
        EXECUTE format('CREATE DOMAIN pg_temp.%I AS %s CHECK (public.spy(%L))', r.name, r.base, r.name);
    END LOOP;
END
$$;
SELECT count(*) AS temporary_views FROM pg_catalog.pg_class WHERE relnamespace = pg_my_temp_schema() AND relkind = 'v';
SELECT count(*) AS temporary_domains FROM pg_catalog.pg_type WHERE typnamespace = pg_my_temp_schema() AND typtype = 'd';
CALL public.call_every_function('cold');
CALL public.ht_reset();
CALL public.call_every_function('warm');
SELECT count(DISTINCT fn) AS functions_called, count(*) FILTER (WHERE sqlstate = '00000') AS calls_that_went_through
  FROM public.outcomes;
SELECT what AS spy_ran_for FROM public.spied;
-- every call ends as it did without them
SELECT plain.call, plain.sqlstate AS plain, other.phase, other.sqlstate
  FROM public.outcomes plain JOIN public.outcomes other USING (fn)
 WHERE plain.phase = 'plain' AND other.phase <> 'plain' AND other.sqlstate <> plain.sqlstate
 ORDER BY 1, 3;
