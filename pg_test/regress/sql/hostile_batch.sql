-- batch under a hostile search_path (hostile_setup.sql), in a fresh backend.
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
