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
\c :regress_db
DROP DATABASE sturdy_sql_ascii;
