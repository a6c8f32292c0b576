-- Checkpoints: a workflow's completed steps, first writer wins.

CREATE TABLE sturdy.checkpoints (
    workflow    text        COLLATE "C" NOT NULL,
    step        text        COLLATE "C" NOT NULL,
    value       jsonb       NOT NULL,
    token       bigint,
    recorded_at timestamptz NOT NULL,
    place       text        COLLATE "C",
    PRIMARY KEY (workflow, step)
) WITH (vacuum_truncate = false);
SELECT pg_catalog.pg_extension_config_dump('sturdy.checkpoints', '');

COMMENT ON TABLE sturdy.checkpoints IS
    'One row per completed step of a workflow. Written once (record, supply, transact), never overwritten.';
COMMENT ON COLUMN sturdy.checkpoints.workflow IS 'The workflow id.';
COMMENT ON COLUMN sturdy.checkpoints.step IS 'The step name, unique within the workflow.';
COMMENT ON COLUMN sturdy.checkpoints.value IS 'The step''s value. JSON null is a value; SQL NULL is never stored.';
COMMENT ON COLUMN sturdy.checkpoints.token IS 'The fencing token of the pass that recorded it; NULL when supplied from outside a pass.';
COMMENT ON COLUMN sturdy.checkpoints.recorded_at IS 'When it was written (clock_timestamp(), so steps of one transaction keep their order).';
COMMENT ON COLUMN sturdy.checkpoints.place IS 'Under Citus, distributed with queues (sturdy.distribute()): sturdy.workflow_place(workflow), the value the row is placed by. NULL otherwise.';

