-- batch under a hostile search_path (04_hostile.sql), in a fresh backend.
-- The fragments are the caller's code and resolve through the caller's path,
-- as they must (so these name pg_catalog's operators themselves); pg_sturdy's
-- own parts of the statements it builds must not reach evil's.
CREATE TABLE public.hb (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO public.hb SELECT i, 'planned' FROM generate_series(1, 25) i;
CREATE TABLE evil.batches (name text);
CREATE FUNCTION evil.current_setting(a text) RETURNS text LANGUAGE sql AS 'SELECT CASE WHEN evil.trap() THEN a END';
CREATE FUNCTION evil.cmp_int(a integer, b integer) RETURNS boolean LANGUAGE sql AS 'SELECT evil.trap()';
CREATE OPERATOR evil.> (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.cmp_int);
CREATE OPERATOR evil.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = evil.cmp_int);
\c
SET search_path = evil, pg_catalog;
SELECT done, remaining, complete
  FROM sturdy.batch('public.hb', 'status = $1', 'status OPERATOR(pg_catalog.=) $2', ARRAY['pending', 'planned'], 10);
SELECT done, remaining, complete
  FROM sturdy.batch('public.hb', 'status = $1', 'status OPERATOR(pg_catalog.=) $2', ARRAY['pending', 'planned'], 10);
SELECT sturdy.batch_start('hb-job', 'public.hb', 'status = $1', 'status OPERATOR(pg_catalog.=) $2',
                          ARRAY['done', 'pending'], 20);
SELECT done, remaining, complete FROM sturdy.batch_tick('hb-job');
SELECT done, remaining, complete FROM sturdy.batch_tick('hb-job');
SELECT (SELECT count(*) FROM evil.batches) AS evil_batches;
RESET search_path;
SELECT status, count(*) FROM public.hb GROUP BY status ORDER BY status;
SELECT name, done, remaining, chunks, complete FROM sturdy.batch_jobs;
-- Temporary types named like those batch_all declares: PostgreSQL looks in
-- the session's pg_temp first for types (not for functions), and nothing of
-- the caller's may run inside batch_all but its fragments. In a fresh
-- backend, so the procedure is compiled with the domains there.
CREATE TABLE public.hb2 (id int PRIMARY KEY, status int NOT NULL DEFAULT 1);
INSERT INTO public.hb2 SELECT i FROM generate_series(1, 10) i;
CREATE FUNCTION public.spy(x text) RETURNS boolean LANGUAGE plpgsql
  AS $$BEGIN RAISE NOTICE 'caller code ran inside batch_all: %', x; RETURN true; END$$;
\c
CREATE DOMAIN pg_temp.timestamptz AS pg_catalog.timestamptz CHECK (public.spy('timestamptz'));
CREATE DOMAIN pg_temp.record AS int CHECK (public.spy('record'));
CREATE DOMAIN pg_temp.int8 AS pg_catalog.int8 CHECK (public.spy('int8'));
CALL sturdy.batch_all('public.hb2', 'status = status + 1', 'status < 2');
SELECT count(*) AS moved FROM public.hb2 WHERE status = 2;
