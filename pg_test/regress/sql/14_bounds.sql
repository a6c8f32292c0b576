-- Every function of the catalog, called once for each of its integer
-- arguments at its type's largest value (the other arguments plausible),
-- under a statement timeout: each answers, with a result or an error of its
-- own (a class-22 error where the value is past the argument's documented
-- maximum), and none runs until it is cancelled (57014) or fails with an
-- internal error (XX000). Made from pg_proc, so a function added later is
-- called too.
SET statement_timeout = '30s';
CREATE TABLE public.t3 (id bigserial PRIMARY KEY, status int NOT NULL DEFAULT 1);
INSERT INTO public.t3 (status) SELECT 1 FROM generate_series(1, 10);
CREATE FUNCTION public.effect3(a jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT a';
CREATE FUNCTION public.on_event3(m sturdy.outbox, attempt integer) RETURNS void LANGUAGE sql AS 'SELECT';
CREATE FUNCTION pg_temp.value_for(fn text, arg text, type regtype) RETURNS text LANGUAGE sql AS $$
    SELECT CASE
        WHEN type = 'text'::regtype THEN
            CASE arg WHEN 'set_clause' THEN 'status = status + 1' WHEN 'pending' THEN 'status < 2'
                     WHEN 'order_by' THEN 'id' WHEN 'from_status' THEN 'pending'
                     WHEN 'to_status' THEN 'running' WHEN 'status' THEN 'succeeded'
                     WHEN 'queue' THEN 'bounds' WHEN 'name' THEN 'bounds-' || fn
                     ELSE 'x' END
        WHEN type = 'text[]'::regtype THEN '{}'
        WHEN type = 'jsonb'::regtype THEN '{}'
        WHEN type = 'interval'::regtype THEN '1 minute'
        WHEN type = 'timestamptz'::regtype THEN now()::text
        WHEN type = 'timestamptz[]'::regtype THEN '{' || now()::text || '}'
        -- (an instance id no earlier file made: the answers do not depend on them)
        WHEN type = 'bigint'::regtype AND arg IN ('id', 'delivery') THEN '-1'
        WHEN type IN ('bigint'::regtype, 'integer'::regtype, 'double precision'::regtype) THEN '1'
        WHEN type = 'boolean'::regtype THEN 'false'
        WHEN type = 'regclass'::regtype THEN 'public.t3'
        WHEN type = 'regprocedure'::regtype THEN
            CASE arg WHEN 'effect' THEN 'public.effect3(jsonb)' ELSE 'public.on_event3(sturdy.outbox, integer)' END
        WHEN type = 'name'::regtype THEN 'id'
    END
$$;
-- something to work on: ready rows, a claim
SELECT count(*) FROM (SELECT sturdy.schedule('b' || i, now() - interval '1 minute', 'bounds')
                        FROM generate_series(1, 20) i) s;
SELECT sturdy.claim('x') IS NOT NULL AS claimed;
CREATE TEMP TABLE big_calls (function text, argument text, sqlstate text);
DO $$
DECLARE
    f record;
    i int;
    args text;
    state text;
BEGIN
    FOR f IN SELECT p.oid, p.proname, p.prokind, p.proargnames AS names,
                    (SELECT array_agg(t::regtype ORDER BY n) FROM unnest(p.proargtypes) WITH ORDINALITY u(t, n)) AS types
               FROM pg_proc p
              WHERE p.pronamespace = 'sturdy'::regnamespace AND p.proname <> 'grant_usage'
              ORDER BY p.oid::regprocedure::text LOOP
        FOR i IN 1 .. coalesce(array_length(f.types, 1), 0) LOOP
            CONTINUE WHEN f.types[i] NOT IN ('integer'::regtype, 'bigint'::regtype);
            SELECT string_agg(CASE WHEN j = i THEN '$1::' || f.types[j]::text
                                   ELSE coalesce(quote_literal(pg_temp.value_for(f.proname, f.names[j], f.types[j])),
                                                 'NULL') || '::' || f.types[j]::text END, ', ' ORDER BY j)
              INTO args FROM generate_series(1, array_length(f.types, 1)) j;
            BEGIN
                IF f.types[i] = 'integer'::regtype THEN
                    EXECUTE format('%s sturdy.%I(%s)', CASE f.prokind WHEN 'p' THEN 'CALL' ELSE 'SELECT' END,
                                   f.proname, args) USING 2147483647;
                ELSE
                    EXECUTE format('%s sturdy.%I(%s)', CASE f.prokind WHEN 'p' THEN 'CALL' ELSE 'SELECT' END,
                                   f.proname, args) USING 9223372036854775807::bigint;
                END IF;
                state := '00000';
            EXCEPTION WHEN OTHERS THEN
                state := SQLSTATE;
            END;
            INSERT INTO big_calls VALUES (f.oid::regprocedure::text, f.names[i], state);
        END LOOP;
    END LOOP;
END
$$;
SELECT count(DISTINCT function) = (SELECT count(*) FROM pg_proc p
                                    WHERE p.pronamespace = 'sturdy'::regnamespace AND p.proname <> 'grant_usage'
                                      AND p.proargtypes::oid[] && ARRAY['integer'::regtype, 'bigint'::regtype]::oid[])
         AS every_function_with_an_integer_called
  FROM big_calls;
-- what each answered: 00 a result, 22 past the documented maximum, SD the
-- contract's own (a token never issued is fenced)
SELECT function, argument, left(sqlstate, 2) AS class FROM big_calls ORDER BY 1, 2;
SELECT function, argument, sqlstate FROM big_calls WHERE sqlstate IN ('XX000', '57014') ORDER BY 1, 2;
