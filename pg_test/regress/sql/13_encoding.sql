-- Names are passed through as the server holds them, never converted to
-- UTF-8 strings: in a SQL_ASCII database any bytes are a name, and a message
-- that quotes one replaces what is not UTF-8.
\set VERBOSITY default
\set regress_db :DBNAME
\set SHOW_CONTEXT never
CREATE DATABASE sturdy_sql_ascii ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C';
\c sturdy_sql_ascii
CREATE EXTENSION pg_sturdy;
SELECT sturdy.claim(E'w\xff') AS token;
SELECT * FROM sturdy.record(E'w\xff', E's\xfe', '1', 1);
SELECT sturdy.supply(E'w\xff', E'\x80', '2');
SELECT length(step) AS step_bytes, value FROM sturdy.load(E'w\xff');
SELECT sturdy.schedule(E'w\xff', queue => E'q\xfe');
SELECT length(workflow) AS workflow_bytes, token FROM sturdy.take(E'q\xfe', claim => true);
SELECT sturdy.arrive(E'w\xff', E'a\xfd', '3', E'q\xfe');
SELECT sturdy.claim(E'\xff', '1 minute', E'owner\xff') AS token;
SELECT sturdy.fence(E'x\xff', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT octet_length(workflow) AS bytes, token, octet_length(owner) AS owner_bytes FROM sturdy.claims ORDER BY 1;
-- an instance's workflow and queue names are made from its process
SELECT sturdy.start(E'p\xff', E'k\xfe') AS instance;
SELECT octet_length(workflow) AS workflow_bytes, octet_length(queue) AS queue_bytes FROM sturdy.queue WHERE queue = E'p\xff';
SELECT sturdy.claim(workflow) AS token FROM sturdy.instances;
SELECT sturdy.transition(id, 'pending', 'running', token => 1) FROM sturdy.instances;
SELECT octet_length(process) AS process_bytes, status FROM sturdy.status(E'k\xfe');
-- a named batch job's name is read back from its row
CREATE TABLE public.t (id bigserial PRIMARY KEY, status int NOT NULL DEFAULT 1);
INSERT INTO public.t SELECT FROM generate_series(1, 10);
SELECT sturdy.batch_start(E'job\xff', 'public.t', 'status = status + 1', 'status < 2');
SELECT done, remaining, complete FROM sturdy.batch_tick(E'job\xff');
SELECT done, remaining, complete FROM sturdy.batch_tick(E'job\xff');
-- a text key that is not UTF-8: the next chunk cannot be bound from it
CREATE TABLE public.tk (id text PRIMARY KEY, status int NOT NULL DEFAULT 1);
INSERT INTO public.tk VALUES (E'a\xfe', 1), ('b', 1);
SELECT sturdy.batch_start('tk-job', 'public.tk', 'status = status + 1', 'status < 2', chunk => 1);
SELECT done, remaining, complete FROM sturdy.batch_tick('tk-job');
SELECT done, remaining, complete FROM sturdy.batch_tick('tk-job');
\echo :LAST_ERROR_SQLSTATE
-- Every function of the catalog, called once for each of its text
-- arguments with bytes that are not UTF-8 there (bound as a parameter; the
-- other arguments plausible): whatever it answers, never XX000 (an
-- internal error). Made from pg_proc, so a function added later is called
-- too.
CREATE TABLE public.t2 (id bigserial PRIMARY KEY, status int NOT NULL DEFAULT 1);
CREATE FUNCTION public.effect(a jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT a';
CREATE FUNCTION public.on_event(m sturdy.outbox, attempt integer) RETURNS void LANGUAGE sql AS 'SELECT';
CREATE FUNCTION pg_temp.value_for(arg text, type regtype) RETURNS text LANGUAGE sql AS $$
    SELECT CASE
        WHEN type = 'text'::regtype THEN
            CASE arg WHEN 'set_clause' THEN 'status = status + 1' WHEN 'pending' THEN 'status < 2'
                     WHEN 'order_by' THEN 'id' WHEN 'from_status' THEN 'pending'
                     WHEN 'to_status' THEN 'running' WHEN 'status' THEN 'succeeded'
                     ELSE 'x' END
        WHEN type = 'text[]'::regtype THEN '{}'
        WHEN type = 'jsonb'::regtype THEN '{}'
        WHEN type = 'interval'::regtype THEN '1 minute'
        WHEN type = 'timestamptz'::regtype THEN now()::text
        WHEN type = 'timestamptz[]'::regtype THEN '{' || now()::text || '}'
        WHEN type IN ('bigint'::regtype, 'integer'::regtype, 'double precision'::regtype) THEN '1'
        WHEN type = 'boolean'::regtype THEN 'false'
        WHEN type = 'regclass'::regtype THEN 'public.t2'
        WHEN type = 'regprocedure'::regtype THEN
            CASE arg WHEN 'effect' THEN 'public.effect(jsonb)' ELSE 'public.on_event(sturdy.outbox, integer)' END
        WHEN type = 'name'::regtype THEN 'id'
    END
$$;
CREATE TEMP TABLE odd_calls (function text, odd_argument text, sqlstate text);
DO $$
DECLARE
    f record;
    i int;
    args text;
    state text;
BEGIN
    FOR f IN SELECT p.oid, p.proname, p.prokind, p.proargnames AS names,
                    -- (proargtypes counts from 0)
                    (SELECT array_agg(t::regtype ORDER BY n) FROM unnest(p.proargtypes) WITH ORDINALITY u(t, n)) AS types
               FROM pg_proc p
              WHERE p.pronamespace = 'sturdy'::regnamespace AND p.proname <> 'grant_usage'
              ORDER BY p.oid::regprocedure::text LOOP
        FOR i IN 1 .. coalesce(array_length(f.types, 1), 0) LOOP
            CONTINUE WHEN f.types[i] NOT IN ('text'::regtype, 'text[]'::regtype);
            SELECT string_agg(CASE WHEN j = i THEN '$1'
                                   ELSE coalesce(quote_literal(pg_temp.value_for(f.names[j], f.types[j])), 'NULL')
                                        || '::' || f.types[j]::text END, ', ' ORDER BY j)
              INTO args FROM generate_series(1, array_length(f.types, 1)) j;
            BEGIN
                IF f.types[i] = 'text'::regtype THEN
                    EXECUTE format('%s sturdy.%I(%s)', CASE f.prokind WHEN 'p' THEN 'CALL' ELSE 'SELECT' END,
                                   f.proname, args) USING E'\xff'::text;
                ELSE
                    EXECUTE format('%s sturdy.%I(%s)', CASE f.prokind WHEN 'p' THEN 'CALL' ELSE 'SELECT' END,
                                   f.proname, args) USING ARRAY[E'\xff']::text[];
                END IF;
                state := '00000';
            EXCEPTION WHEN OTHERS THEN
                state := SQLSTATE;
            END;
            INSERT INTO odd_calls VALUES (f.oid::regprocedure::text, f.names[i], state);
        END LOOP;
    END LOOP;
END
$$;
SELECT count(DISTINCT function) = (SELECT count(*) FROM pg_proc p
                                    WHERE p.pronamespace = 'sturdy'::regnamespace AND p.proname <> 'grant_usage'
                                      AND p.proargtypes::oid[] && ARRAY['text'::regtype, 'text[]'::regtype]::oid[])
         AS every_function_with_text_called,
       count(*) >= 50 AS calls_at_least_50
  FROM odd_calls;
SELECT function, odd_argument FROM odd_calls WHERE sqlstate = 'XX000' ORDER BY 1, 2;
\c :regress_db
DROP DATABASE sturdy_sql_ascii;
