-- Claims as a psql user sees them. Errors show message, hint and SQLSTATE.
\set VERBOSITY default
\set SHOW_CONTEXT never
\pset null '(null)'

-- first claim: token 1; a second while held: NULL
SELECT sturdy.claim('order-1', '10 minutes', 'worker-a') AS token;
SELECT sturdy.claim('order-1', '10 minutes', 'worker-b') AS token;
SELECT workflow, token, owner, held_until > now() AS held FROM sturdy.claims;

-- renew only the current token
SELECT sturdy.renew('order-1', 1, '1 hour') > now() + interval '59 minutes' AS renewed;
SELECT sturdy.renew('order-1', 2, '1 hour') AS wrong_token;

-- release hands back early, keeps the token; the next claim gets 2
SELECT sturdy.release('order-1', 1) AS released;
SELECT sturdy.release('order-1', 1) AS released_again;
SELECT sturdy.claim('order-1', '10 milliseconds') AS token;

-- a lapsed lease is taken over with the next token
SELECT pg_sleep(0.05);
SELECT sturdy.claim('order-1', '10 minutes', 'worker-c') AS token;
SELECT sturdy.renew('order-1', 2, '1 hour') AS stale_renew;

-- fence: only the current token passes
SELECT sturdy.fence('order-1', 3);
SELECT sturdy.fence('order-1', 2);
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.fence('order-1', 9);
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.fence('never-claimed', 1);
\echo :LAST_ERROR_SQLSTATE

-- bad input: a class-22 SQLSTATE, a message naming the argument, nothing written
SELECT sturdy.claim(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.claim('');
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.claim(repeat('w', 1025));
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.claim('bad', NULL);
\echo :LAST_ERROR_SQLSTATE
-- a lease that ends before it begins, though Postgres orders it above zero
-- (it counts a month as 30 days; now() + lease adds calendar months)
SELECT sturdy.claim('bad', '-12 mons 360 days 00:00:01');
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.claim('bad', '0 seconds');
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.claim('bad', '-5 minutes');
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.claim('bad', '1 minute', '');
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.renew('order-1', NULL, '1 minute');
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.renew('order-1', 3, '0 seconds');
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.release('', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT sturdy.claim('bad', '300000 years');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS bad_rows FROM sturdy.claims WHERE workflow <> 'order-1';

-- hostile names are data
SELECT sturdy.claim($$x'); DROP TABLE sturdy.claims; --$$) AS token;
SELECT count(*) FROM sturdy.claims;
