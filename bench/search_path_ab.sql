-- The search-path choice, measured in-server: the same C function called
-- 20,000 times a round, as shipped (no pin: every statement schema-qualified)
-- and declared again with SET search_path = pg_catalog (the GUC nest level a
-- pin costs: save, set and restore the setting on every call). renew of a
-- workflow that does not exist runs its statement and writes nothing, so the
-- per-call cost is what is left. Rounds alternate; µs per call.
\set QUIET on
SET client_min_messages = notice;
CREATE SCHEMA IF NOT EXISTS bench_ab;
CREATE OR REPLACE FUNCTION bench_ab.renew_pinned(workflow text, token bigint, lease interval)
    RETURNS timestamptz LANGUAGE c VOLATILE SET search_path = pg_catalog
    AS '$libdir/pg_sturdy', 'sturdy_renew';
DO $$
DECLARE
    t0 timestamptz;
    n constant int := 20000;
    plain float8[] := '{}';
    pinned float8[] := '{}';
BEGIN
    PERFORM sturdy.renew('warm-up', 1, '1 minute'), bench_ab.renew_pinned('warm-up', 1, '1 minute');
    FOR round IN 1..6 LOOP
        t0 := clock_timestamp();
        FOR i IN 1..n LOOP PERFORM sturdy.renew('none', 1, '1 minute'); END LOOP;
        plain := plain || extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
        t0 := clock_timestamp();
        FOR i IN 1..n LOOP PERFORM bench_ab.renew_pinned('none', 1, '1 minute'); END LOOP;
        pinned := pinned || extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
    END LOOP;
    RAISE NOTICE 'search path: no pin (as shipped) % us/call, SET search_path (GUC nest level) % us/call, median of 6 rounds of %',
        (SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY x)::numeric, 2) FROM unnest(plain) x),
        (SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY x)::numeric, 2) FROM unnest(pinned) x), n;
END $$;
SET client_min_messages = warning;
DROP SCHEMA bench_ab CASCADE;
