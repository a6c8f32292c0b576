-- The public surface, as the catalog sees it: every function's arguments
-- (with defaults), result, volatility, strictness, parallel safety, security,
-- configuration, privileges and comment, and every table kept by pg_dump.
-- Any change to what users can call shows up here in review.
\pset format unaligned
\pset fieldsep ' | '
\pset footer off
SELECT p.oid::regprocedure AS function,
       pg_get_function_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result,
       l.lanname AS language,
       p.provolatile AS volatility, p.proisstrict AS strict, p.proparallel AS parallel,
       p.prosecdef AS security_definer, p.proconfig AS config, p.prorows AS rows,
       p.proacl AS acl,
       obj_description(p.oid, 'pg_proc') AS comment
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
 WHERE p.pronamespace = 'sturdy'::regnamespace
 ORDER BY p.oid::regprocedure::text;

SELECT c.oid::regclass AS kept_by_pg_dump, c.relkind, e.cond AS filter
  FROM pg_extension x,
       unnest(x.extconfig, x.extcondition) AS e(rel, cond)
  JOIN pg_class c ON c.oid = e.rel
 WHERE x.extname = 'pg_sturdy'
 ORDER BY 1;

SELECT c.oid::regclass AS relation, c.relkind, c.relacl AS acl,
       obj_description(c.oid, 'pg_class') AS comment
  FROM pg_class c
 WHERE c.relnamespace = 'sturdy'::regnamespace AND c.relkind IN ('r', 'v', 'S')
 ORDER BY 1;

-- Every function callable with untyped parameters, as node-postgres, pgx and
-- pgbench -M prepared bind them, at every argument count it takes: none
-- is ambiguous with another of its name (42725), whatever is added later.
CREATE FUNCTION pg_temp.untyped_failures() RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    f record;
    k int;
BEGIN
    FOR f IN SELECT p.oid, p.proname, p.pronargs, p.pronargdefaults
               FROM pg_proc p
              WHERE p.pronamespace = 'sturdy'::regnamespace AND p.prokind = 'f'
              ORDER BY p.oid::regprocedure::text LOOP
        FOR k IN f.pronargs - f.pronargdefaults .. f.pronargs LOOP
            BEGIN
                EXECUTE format('PREPARE untyped AS SELECT sturdy.%I(%s)', f.proname,
                               (SELECT string_agg('$' || i, ', ') FROM generate_series(1, k) i));
                DEALLOCATE untyped;
            EXCEPTION WHEN OTHERS THEN
                RETURN NEXT format('%s with %s untyped parameters: %s %s', f.oid::regprocedure, k, SQLSTATE, SQLERRM);
            END;
        END LOOP;
    END LOOP;
END
$$;
SELECT count(*) AS functions FROM pg_proc WHERE pronamespace = 'sturdy'::regnamespace AND prokind = 'f';
SELECT * FROM pg_temp.untyped_failures() AS not_callable_untyped;
