-- A steady state with history: 100,000 finished workflows, each with a
-- released claim and three checkpoints, in pg_sturdy's tables and in the
-- seed's tables alike; then ANALYZE, so no plan is made on an empty table.
CREATE EXTENSION pg_sturdy;
CREATE SCHEMA seed;
CREATE TABLE seed.workflow_checkpoint (workflow text NOT NULL, step text NOT NULL, value jsonb NOT NULL,
                                       PRIMARY KEY (workflow, step));
CREATE TABLE seed.workflow_claim (workflow text PRIMARY KEY, token bigint NOT NULL, held_until timestamptz NOT NULL);

INSERT INTO sturdy.claims (workflow, token, held_until, owner, claimed_at)
SELECT 'hist-' || i, 1 + i % 3, now() - interval '1 hour', 'history', now() - interval '2 hours'
  FROM generate_series(1, 100000) i;
INSERT INTO sturdy.checkpoints (workflow, step, value, token, recorded_at)
SELECT 'hist-' || i, 'step-' || s, jsonb_build_object('n', i, 's', s), 1, now() - interval '2 hours'
  FROM generate_series(1, 100000) i, generate_series(1, 3) s;
INSERT INTO seed.workflow_claim SELECT workflow, token, held_until FROM sturdy.claims;
INSERT INTO seed.workflow_checkpoint SELECT workflow, step, value FROM sturdy.checkpoints;
VACUUM ANALYZE sturdy.claims, sturdy.checkpoints, seed.workflow_claim, seed.workflow_checkpoint;

-- The same two statements inside PL/pgSQL functions (bench/plpgsql_pass.sql),
-- in their cheapest form: no SET search_path clause.
CREATE FUNCTION seed.claim(w text, lease interval) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE t bigint;
BEGIN
    INSERT INTO seed.workflow_claim AS held (workflow, token, held_until)
    VALUES (w, 1, now() + lease)
    ON CONFLICT (workflow) DO UPDATE
        SET token = held.token + 1, held_until = now() + lease
        WHERE held.held_until <= now()
    RETURNING token INTO t;
    RETURN t;
END $$;
CREATE FUNCTION seed.record(w text, s text, v jsonb, tok bigint, OUT recorded jsonb, OUT first boolean)
LANGUAGE plpgsql AS $$
BEGIN
    WITH fence AS (SELECT token FROM seed.workflow_claim WHERE workflow = w FOR UPDATE)
    INSERT INTO seed.workflow_checkpoint AS r (workflow, step, value)
    SELECT w, s, v FROM fence WHERE fence.token <= tok
    ON CONFLICT (workflow, step) DO UPDATE SET value = r.value
    RETURNING r.value, r.value = v INTO recorded, first;
END $$;

-- The queue: tables of the seed's shape, a trivial-write table, and history
-- (100,000 rows sleeping far in the future in another queue of each).
CREATE TABLE seed.workflow_queue (namespace text NOT NULL, workflow text NOT NULL, visible_at timestamptz NOT NULL,
                                  PRIMARY KEY (namespace, workflow));
CREATE INDEX workflow_queue_visible_at ON seed.workflow_queue (namespace, visible_at);
CREATE TABLE bench_counter (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
INSERT INTO bench_counter (id) SELECT generate_series(1, 10000);
INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)
SELECT 'history', 'hist-' || i, now() + interval '10 years', now() FROM generate_series(1, 100000) i;
INSERT INTO seed.workflow_queue SELECT 'history', workflow, visible_at FROM sturdy.queue;
VACUUM ANALYZE sturdy.queue, seed.workflow_queue, bench_counter;
