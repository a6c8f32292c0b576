-- Checkpoints: record (fenced), supply (unfenced), load, transact.
\set VERBOSITY default
\set SHOW_CONTEXT never
\pset null '(null)'

SELECT sturdy.claim('trip-7', '10 minutes') AS token;

-- first writer wins; the loser learns the winner's value
SELECT * FROM sturdy.record('trip-7', 'flight', '{"pnr": "X1", "seats": [1, 2]}', 1);
SELECT * FROM sturdy.record('trip-7', 'flight', '{"pnr": "OTHER"}', 1);

-- jsonb caveats: numbers go through numeric, keys are reordered
SELECT * FROM sturdy.record('trip-7', 'number', '1e3', 1);
SELECT * FROM sturdy.record('trip-7', 'keys', '{"zz": 1, "a": 2}', 1);
-- JSON null is a value
SELECT * FROM sturdy.record('trip-7', 'nothing', 'null', 1);

-- a superseded pass is fenced and writes nothing
SELECT sturdy.release('trip-7', 1);
SELECT sturdy.claim('trip-7') AS token;
SELECT * FROM sturdy.record('trip-7', 'hotel', '"late write"', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM sturdy.record('no-claim', 'hotel', '"x"', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS hotel_rows FROM sturdy.checkpoints WHERE step = 'hotel';

-- supply: unfenced, first writer wins
SELECT sturdy.supply('trip-7', 'approval', '{"by": "alice"}');
SELECT sturdy.supply('trip-7', 'approval', '{"by": "mallory"}');

-- load: the history, oldest first
SELECT step, value FROM sturdy.load('trip-7');

-- transact: the effect runs once, in the caller's transaction, under the caller's search_path
CREATE SCHEMA app;
CREATE TABLE app.charges (trip text, amount numeric);
CREATE FUNCTION app.charge(arg jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO charges VALUES (arg->>'trip', (arg->>'amount')::numeric);  -- unqualified: caller's search_path
    RETURN jsonb_build_object('charged', arg->'amount');
END $$;
SET search_path = app, public;
SELECT sturdy.transact('trip-7', 2, 'charge', 'app.charge(jsonb)', '{"trip": "trip-7", "amount": 120}');
SELECT sturdy.transact('trip-7', 2, 'charge', 'app.charge(jsonb)', '{"trip": "trip-7", "amount": 999}');
SELECT * FROM app.charges;
RESET search_path;

-- a step supplied before the pass gets to it: the effect does not run
SELECT sturdy.supply('trip-7', 'refund', '"waived"');
SELECT sturdy.transact('trip-7', 2, 'refund', 'app.charge(jsonb)', '{"trip": "trip-7", "amount": -120}');
SELECT count(*) AS charges FROM app.charges;

-- fenced before the effect runs
SELECT sturdy.transact('trip-7', 1, 'late', 'app.charge(jsonb)', '{"trip": "trip-7", "amount": 1}');
\echo :LAST_ERROR_SQLSTATE

-- an effect of the wrong shape, and one that returns NULL
CREATE FUNCTION app.wrong(a text) RETURNS jsonb LANGUAGE sql AS $$ SELECT to_jsonb(a) $$;
CREATE FUNCTION app.nothing(a jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT NULL::jsonb $$;
SELECT sturdy.transact('trip-7', 2, 'x', 'app.wrong(text)');
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.transact('trip-7', 2, 'x', 'app.nothing(jsonb)');
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.transact('trip-7', 2, 'x', 'app.missing(jsonb)');
\echo :LAST_ERROR_SQLSTATE

-- bad input
SELECT * FROM sturdy.record('trip-7', NULL, '1', 2);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM sturdy.record('trip-7', 'x', NULL, 2);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM sturdy.record('trip-7', 'x', '1', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.supply('', 'x', '1');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM sturdy.load(NULL);
\echo :LAST_ERROR_SQLSTATE
-- a value jsonb cannot hold is refused before anything is written
SELECT * FROM sturdy.record('trip-7', 'x', '"nul \u0000 byte"', 2);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS x_rows FROM sturdy.checkpoints WHERE step = 'x';
