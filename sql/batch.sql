-- Batch chunks: the progress of each batch, so that a chunk starts where the
-- last one stopped (keyset on the key column) and a job can be ticked from
-- pg_cron. Named jobs are registered by sturdy.batch_start; a plain
-- sturdy.batch call keeps its own row under a name derived from its
-- arguments, deleted when it completes.

CREATE TABLE sturdy.batches (
    name           text        COLLATE "C" PRIMARY KEY,
    named          boolean     NOT NULL,
    target         regclass    NOT NULL,
    set_clause     text        NOT NULL,
    pending        text        NOT NULL,
    args           text[]      NOT NULL,
    chunk          integer     NOT NULL CHECK (chunk > 0),
    key            name        NOT NULL,
    order_by       text,
    target_seconds float8      CHECK (target_seconds > 0),
    cursor         text,
    pass           integer     NOT NULL DEFAULT 1,
    remaining      bigint,
    done           bigint      NOT NULL DEFAULT 0,
    chunks         bigint      NOT NULL DEFAULT 0,
    seconds        float8      NOT NULL DEFAULT 0,
    last_seconds   float8,
    started_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz
) WITH (vacuum_truncate = false);
SELECT pg_catalog.pg_extension_config_dump('sturdy.batches', '');
COMMENT ON TABLE sturdy.batches IS
    'Batch progress: named jobs (sturdy.batch_start, ticked by sturdy.batch_tick) and the running state of plain sturdy.batch calls.';
COMMENT ON COLUMN sturdy.batches.name IS 'The job name; for a plain sturdy.batch call, batch: and a hash of its arguments.';
COMMENT ON COLUMN sturdy.batches.named IS 'A job registered by batch_start (kept when finished) rather than a plain batch call''s state.';
COMMENT ON COLUMN sturdy.batches.target IS 'The table updated.';
COMMENT ON COLUMN sturdy.batches.set_clause IS 'The SET list (caller-written SQL).';
COMMENT ON COLUMN sturdy.batches.pending IS 'The predicate of rows still to do (caller-written SQL), placed in the chunk''s selection and in the UPDATE''s guard.';
COMMENT ON COLUMN sturdy.batches.args IS 'The values bound to $1..$n in the fragments.';
COMMENT ON COLUMN sturdy.batches.chunk IS 'Rows per chunk: fixed for batch, adapted by batch_tick to target_seconds.';
COMMENT ON COLUMN sturdy.batches.key IS 'The key column chunks advance on.';
COMMENT ON COLUMN sturdy.batches.order_by IS 'An order other than the key (then every chunk scans from the start: see docs/reference.md).';
COMMENT ON COLUMN sturdy.batches.target_seconds IS 'How long a tick''s chunk should take; NULL: a fifth of statement_timeout, or 1 s without one.';
COMMENT ON COLUMN sturdy.batches.cursor IS 'The last key of the pass so far, as text; NULL at the start of a pass.';
COMMENT ON COLUMN sturdy.batches.pass IS 'Passes over the key range: a pass that ends with rows still pending (made pending behind the cursor) starts another.';
COMMENT ON COLUMN sturdy.batches.remaining IS 'Rows still pending: counted exactly at the start and end of each pass, carried forward (minus each chunk''s rows) in between.';
COMMENT ON COLUMN sturdy.batches.done IS 'Rows updated so far.';
COMMENT ON COLUMN sturdy.batches.chunks IS 'Chunks run so far.';
COMMENT ON COLUMN sturdy.batches.seconds IS 'Time spent in chunks so far.';
COMMENT ON COLUMN sturdy.batches.last_seconds IS 'How long the last chunk took.';
COMMENT ON COLUMN sturdy.batches.started_at IS 'When the job was registered or the batch''s first chunk ran.';
COMMENT ON COLUMN sturdy.batches.updated_at IS 'When the last chunk ran.';
COMMENT ON COLUMN sturdy.batches.finished_at IS 'When a chunk found nothing pending (an exact count of zero).';

CREATE VIEW sturdy.batch_jobs WITH (security_invoker = true) AS
SELECT name, target, pass, done, remaining, chunk, chunks,
       (done / NULLIF(seconds, 0))::bigint                                           AS rows_per_second,
       CASE WHEN finished_at IS NULL AND done > 0 AND remaining IS NOT NULL
            THEN pg_catalog.make_interval(secs => remaining * seconds / done) END     AS eta,
       last_seconds, started_at, updated_at, finished_at,
       finished_at IS NOT NULL                                                      AS complete
  FROM sturdy.batches
 WHERE named;
COMMENT ON VIEW sturdy.batch_jobs IS
    'Named batch jobs: rows done and remaining, the current chunk size, rows per second over the chunks so far, and an ETA at that rate.';

-- Run chunks of sturdy.batch, committing after each, until the batch is
-- complete or the budget is spent.
CREATE PROCEDURE sturdy.batch_all(
    target regclass, set_clause text, pending text, args text[] DEFAULT '{}', chunk integer DEFAULT 1000,
    key name DEFAULT 'id', order_by text DEFAULT NULL, budget interval DEFAULT NULL,
    INOUT done bigint DEFAULT NULL, INOUT remaining bigint DEFAULT NULL, INOUT chunks integer DEFAULT NULL,
    INOUT complete boolean DEFAULT NULL)
LANGUAGE plpgsql SECURITY INVOKER
AS $$
DECLARE
    r pg_catalog.record;
    started pg_catalog.timestamptz := pg_catalog.clock_timestamp();
BEGIN
    done := 0;
    chunks := 0;
    LOOP
        SELECT * INTO r FROM sturdy.batch(target, set_clause, pending, args, chunk, key, order_by);
        done := done OPERATOR(pg_catalog.+) r.done;
        chunks := chunks OPERATOR(pg_catalog.+) 1;
        remaining := r.remaining;
        complete := r.complete;
        COMMIT;
        EXIT WHEN complete OR (budget IS NOT NULL AND
                               pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) started OPERATOR(pg_catalog.>=) budget);
    END LOOP;
END
$$;
COMMENT ON PROCEDURE sturdy.batch_all(regclass, text, text, text[], integer, name, text, interval, bigint, bigint, integer, boolean) IS
    'CALL it: chunks of sturdy.batch, each committed, until complete or budget (an interval) is spent; returns the rows done, remaining, the chunks run and whether it completed. Not inside a transaction block.';
