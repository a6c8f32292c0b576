-- Workflow instances: a process started for a business key, with a status
-- that only moves by compare-and-set and never leaves a terminal one, and
-- the idempotency keys that make a start safe to retry.

CREATE SEQUENCE sturdy.instances_id_seq;
CREATE TABLE sturdy.instances (
    id           bigint      NOT NULL DEFAULT pg_catalog.nextval('sturdy.instances_id_seq'::pg_catalog.regclass) PRIMARY KEY,
    process      text        COLLATE "C" NOT NULL,
    business_key text        COLLATE "C" NOT NULL,
    workflow     text        COLLATE "C" NOT NULL UNIQUE,
    queue        text        COLLATE "C" NOT NULL,
    status       text        COLLATE "C" NOT NULL DEFAULT 'pending'
                             CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    revision     bigint      NOT NULL DEFAULT 1,
    variables    jsonb       NOT NULL CHECK (pg_catalog.jsonb_typeof(variables) = 'object'),
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    watched      boolean     NOT NULL DEFAULT false,
    CHECK ((finished_at IS NOT NULL) = (status IN ('succeeded', 'failed', 'cancelled')))
) WITH (vacuum_truncate = false);
ALTER SEQUENCE sturdy.instances_id_seq OWNED BY sturdy.instances.id;
-- status: the newest instance of a business key
CREATE INDEX instances_business_key ON sturdy.instances (business_key, id);
-- stuck: live instances by the time of their last status change
CREATE INDEX instances_live ON sturdy.instances (updated_at, id) WHERE status IN ('pending', 'running');
-- sweep: finished instances, oldest first
CREATE INDEX instances_finished ON sturdy.instances (finished_at) WHERE finished_at IS NOT NULL;
SELECT pg_catalog.pg_extension_config_dump('sturdy.instances', '');
SELECT pg_catalog.pg_extension_config_dump('sturdy.instances_id_seq', '');
COMMENT ON SEQUENCE sturdy.instances_id_seq IS 'Ids of sturdy.instances (kept by pg_dump, so ids continue after a restore).';
COMMENT ON TABLE sturdy.instances IS
    'Workflow instances: one row per sturdy.start, its status moved by sturdy.transition and sturdy.finish.';
COMMENT ON COLUMN sturdy.instances.id IS 'The instance id start returns.';
COMMENT ON COLUMN sturdy.instances.process IS 'The process (the kind of workflow) it runs.';
COMMENT ON COLUMN sturdy.instances.business_key IS 'What it is about (an order number); status looks instances up by it.';
COMMENT ON COLUMN sturdy.instances.workflow IS
    'Its workflow name, process/id: the name its claims, checkpoints and queue row use.';
COMMENT ON COLUMN sturdy.instances.queue IS 'The queue start scheduled it on.';
COMMENT ON COLUMN sturdy.instances.status IS
    'pending, running, or one of the terminal succeeded, failed, cancelled (never left).';
COMMENT ON COLUMN sturdy.instances.revision IS 'Starts at 1; every status change adds one (compare it to move safely).';
COMMENT ON COLUMN sturdy.instances.variables IS 'The JSON object it was started with.';
COMMENT ON COLUMN sturdy.instances.last_error IS 'The error given with the last transition or finish that gave one.';
COMMENT ON COLUMN sturdy.instances.created_at IS 'When start created it.';
COMMENT ON COLUMN sturdy.instances.updated_at IS 'Its last status change (start counts).';
COMMENT ON COLUMN sturdy.instances.finished_at IS 'When it reached a terminal status; sweep removes it some time after.';
COMMENT ON COLUMN sturdy.instances.watched IS
    'Someone waits for its end (sturdy.watch): its move to a terminal status sends NOTIFY sturdy_instance with its id.';

CREATE TABLE sturdy.idempotency_keys (
    process     text        COLLATE "C" NOT NULL,
    key         text        COLLATE "C" NOT NULL,
    instance    bigint      NOT NULL,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (process, key)
) WITH (vacuum_truncate = false);
-- sweep: expired keys
CREATE INDEX idempotency_keys_expiry ON sturdy.idempotency_keys (expires_at);
-- an instance's key, shown with it (sturdy-ui)
CREATE INDEX idempotency_keys_instance ON sturdy.idempotency_keys (instance);
SELECT pg_catalog.pg_extension_config_dump('sturdy.idempotency_keys', '');
COMMENT ON TABLE sturdy.idempotency_keys IS
    'Start''s idempotency keys: while a key lives, a start with it returns the instance it first created.';
COMMENT ON COLUMN sturdy.idempotency_keys.process IS 'Keys are scoped to a process.';
COMMENT ON COLUMN sturdy.idempotency_keys.key IS 'The idempotency key the caller gave.';
COMMENT ON COLUMN sturdy.idempotency_keys.instance IS 'The instance the key''s first start created.';
COMMENT ON COLUMN sturdy.idempotency_keys.created_at IS 'When the key was written (or reused after it expired).';
COMMENT ON COLUMN sturdy.idempotency_keys.expires_at IS
    'created_at + sturdy.idempotency_ttl as it was then; from this time the key may be reused.';
