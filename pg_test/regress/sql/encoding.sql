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
\c :regress_db
DROP DATABASE sturdy_sql_ascii;
