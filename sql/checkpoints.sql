-- Checkpoints: a workflow's completed steps, first writer wins.

CREATE TABLE sturdy.checkpoints (
    workflow    text        COLLATE "C" NOT NULL,
    step        text        COLLATE "C" NOT NULL,
    value       jsonb       NOT NULL,
    token       bigint,
    recorded_at timestamptz NOT NULL,
    PRIMARY KEY (workflow, step)
);
SELECT pg_catalog.pg_extension_config_dump('sturdy.checkpoints', '');

COMMENT ON TABLE sturdy.checkpoints IS
    'One row per completed step of a workflow. Written once (record, supply, transact), never overwritten.';
COMMENT ON COLUMN sturdy.checkpoints.workflow IS 'The workflow id.';
COMMENT ON COLUMN sturdy.checkpoints.step IS 'The step name, unique within the workflow.';
COMMENT ON COLUMN sturdy.checkpoints.value IS 'The step''s value. JSON null is a value; SQL NULL is never stored.';
COMMENT ON COLUMN sturdy.checkpoints.token IS 'The fencing token of the pass that recorded it; NULL when supplied from outside a pass.';
COMMENT ON COLUMN sturdy.checkpoints.recorded_at IS 'When it was written (clock_timestamp(), so steps of one transaction keep their order).';

CREATE FUNCTION sturdy.record(workflow text, step text, value jsonb, token bigint)
    RETURNS TABLE (recorded jsonb, first boolean)
    LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY INVOKER ROWS 1
    AS 'MODULE_PATHNAME', 'sturdy_record';
COMMENT ON FUNCTION sturdy.record(text, text, jsonb, bigint) IS
    'Fenced first-writer-wins checkpoint: the value stored after the call and whether this call stored it. Raises SD001 when token is not the current claim.';

CREATE FUNCTION sturdy.supply(workflow text, step text, value jsonb)
    RETURNS jsonb
    LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_supply';
COMMENT ON FUNCTION sturdy.supply(text, text, jsonb) IS
    'Unfenced first-writer-wins checkpoint for a value from outside any pass (an approval, a webhook). Returns the value stored after the call.';

CREATE FUNCTION sturdy.load(workflow text)
    RETURNS TABLE (step text, value jsonb, recorded_at timestamptz)
    LANGUAGE c STABLE PARALLEL UNSAFE SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_load';
COMMENT ON FUNCTION sturdy.load(text) IS
    'A workflow''s recorded steps, oldest first.';

-- Not pinned: the effect is caller code and runs under the caller's own
-- search_path. Every statement transact itself runs qualifies its tables,
-- functions and operators.
CREATE FUNCTION sturdy.transact(workflow text, token bigint, step text, effect regprocedure, arg jsonb DEFAULT NULL)
    RETURNS jsonb
    LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_transact';
COMMENT ON FUNCTION sturdy.transact(text, bigint, text, regprocedure, jsonb) IS
    'Exactly-once in-database effect: fence, return the step if recorded, else call effect(arg) (jsonb -> jsonb) and record its result in this transaction. If supply lands the step meanwhile, the effect is rolled back and the supplied value returned.';
