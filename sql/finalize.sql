-- Privileges. Nothing is open to PUBLIC: an application role is let in with
-- sturdy.grant_usage(role), usually through a group role sturdy_user.

CREATE FUNCTION sturdy.grant_usage(role name)
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF role IS NULL OR role = '' THEN
        RAISE EXCEPTION 'role must not be NULL or empty'
            USING ERRCODE = '22023', HINT = 'Pass the name of an existing role, e.g. ''sturdy_user''.';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = role) THEN
        RAISE EXCEPTION 'role % does not exist', pg_catalog.quote_ident(role)
            USING ERRCODE = '42704', HINT = 'CREATE ROLE it first.';
    END IF;
    EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA sturdy TO %I', role);
    EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA sturdy TO %I', role);
    EXECUTE pg_catalog.format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA sturdy TO %I', role);
    EXECUTE pg_catalog.format('GRANT EXECUTE ON ALL ROUTINES IN SCHEMA sturdy TO %I', role);
    EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION sturdy.grant_usage(name) FROM %I', role);
END
$$;
COMMENT ON FUNCTION sturdy.grant_usage(name) IS
    'Grant a role what an application needs to call every pg_sturdy function (schema usage, the tables, execute). Run as the extension owner; call again after ALTER EXTENSION UPDATE.';

REVOKE ALL ON ALL ROUTINES IN SCHEMA sturdy FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA sturdy FROM PUBLIC;
REVOKE ALL ON SCHEMA sturdy FROM PUBLIC;
