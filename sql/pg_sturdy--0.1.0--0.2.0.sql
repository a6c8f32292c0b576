-- pg_sturdy 0.1.0 -> 0.2.0: the transactional outbox, workflow instances,
-- batch chunks, the health view, take's generation and the idle epoch.
-- Every object 0.2.0 adds, in install order (drafted by
-- scripts/release_diff.py from the two versions' install scripts, then read
-- by hand); grant_usage is replaced (it grants on ALL ROUTINES: batch_all is
-- a procedure), and the revokes run again over the new objects.
\echo Use "ALTER EXTENSION pg_sturdy UPDATE TO '0.2.0'" to load this file. \quit

-- take's floor: the generation a past-dated schedule or wake_at bumps (see
-- sql/queue.sql).
CREATE SEQUENCE sturdy.queue_generation;
COMMENT ON SEQUENCE sturdy.queue_generation IS
    'Bumped by a schedule or wake_at that makes a row ready before now(): takes that see it change scan their queue from the start again.';
SELECT pg_catalog.nextval('sturdy.queue_generation');
-- the idle epoch: schedules look for waiter marks only after it moves (see
-- sql/queue.sql)
CREATE SEQUENCE sturdy.queue_idle;
COMMENT ON SEQUENCE sturdy.queue_idle IS
    'Bumped by every take that finds its queue empty and marks it in queue_waiters: schedules look for marks only after it moves.';
SELECT pg_catalog.nextval('sturdy.queue_idle');
-- take's order among rows with one visible_at, and the exact floor it allows
-- (see sql/queue.sql); the rows there get theirs as the table is rewritten.
CREATE SEQUENCE sturdy.queue_seq;
ALTER TABLE sturdy.queue
    ADD COLUMN seq bigint NOT NULL DEFAULT pg_catalog.nextval('sturdy.queue_seq'::pg_catalog.regclass);
ALTER SEQUENCE sturdy.queue_seq OWNED BY sturdy.queue.seq;
DROP INDEX sturdy.queue_visible;
CREATE INDEX queue_visible ON sturdy.queue (queue, visible_at, seq);
SELECT pg_catalog.pg_extension_config_dump('sturdy.queue_seq', '');
COMMENT ON SEQUENCE sturdy.queue_seq IS 'sturdy.queue.seq (kept by pg_dump, so new rows come after the restored ones).';
COMMENT ON COLUMN sturdy.queue.seq IS 'Arrival order, given when the row is inserted: take hands out rows with the same visible_at in this order.';
-- The lease moves out of visible_at into leased_until, which no index holds,
-- so that take's update is HOT (see sql/queue.sql). A row leased now keeps
-- its receipt (0.1.0's visible_at, now its leased_until) and is due from when
-- it was taken, which was at or after its due time: done and wake_at of a
-- pass in flight across the update still match, and the row is not handed
-- out again before its lease ends.
ALTER TABLE sturdy.queue ADD COLUMN leased_until timestamptz;
UPDATE sturdy.queue SET leased_until = visible_at, visible_at = taken_at
 WHERE taken_at IS NOT NULL AND visible_at > pg_catalog.now();
ALTER TABLE sturdy.queue SET (fillfactor = 45);
-- 'infinity' becomes a dead row's alone (failing passes, below): a row 0.1.0
-- parked there (a sleep with no deadline) sleeps at the last finite time
-- instead, where an arrive or a schedule still wakes it.
UPDATE sturdy.queue SET visible_at = '294276-12-31 23:59:59.999999+00'
 WHERE visible_at = 'infinity'::pg_catalog.timestamptz;
COMMENT ON COLUMN sturdy.queue.visible_at IS
    'When it is due: as schedule, arrive or wake_at last wrote it. take does not move it; the lease is leased_until.';
COMMENT ON COLUMN sturdy.queue.taken_at IS
    'When take last leased it; NULL once schedule, arrive or wake_at moved it since (with leased_until set: a wakeup landed on the pass, which done, finish and wake_at then answer false, leaving the row ready).';
COMMENT ON COLUMN sturdy.queue.leased_until IS
    'The lease''s end while a taker holds it: take hands it out again only after this (a lease run out is a failed pass, counted by the take or sweep that meets it). It is the receipt done, wake_at, extend and fail must match; a wakeup (schedule, arrive) keeps it, the pass''s end clears it.';
-- Priorities and keys (src/queue/priority.rs, src/queue/keyed.rs; see
-- sql/queue.sql): every row of 0.1.0 has the default priority and no key.
ALTER TABLE sturdy.queue ADD COLUMN priority integer NOT NULL DEFAULT 0, ADD COLUMN key text COLLATE "C";
CREATE INDEX queue_prioritized ON sturdy.queue (queue, priority, visible_at, seq) WHERE priority > 0;
-- The rows with a key, by key: a per-key limit's places of keys that have
-- none left go with sweep (src/queue/keyed.rs), found through this.
CREATE INDEX queue_keyed ON sturdy.queue (queue, key) WHERE key IS NOT NULL;
COMMENT ON COLUMN sturdy.queue.priority IS
    'Take hands out ready rows of a higher priority first (0, the default, last); set by schedule, kept by wake_at and arrive.';
COMMENT ON COLUMN sturdy.queue.key IS
    'The group the row belongs to for the queue''s per_key limit (a tenant, an account); NULL: not limited per key.';
-- Failing passes (src/queue/fail.rs; see sql/queue.sql): NULL until a pass
-- of the row fails.
ALTER TABLE sturdy.queue ADD COLUMN attempts integer, ADD COLUMN last_error text,
    ADD COLUMN last_sqlstate text, ADD COLUMN failed_at timestamptz;
COMMENT ON COLUMN sturdy.queue.attempts IS
    'How many of its passes failed (fail, or a lease run out); NULL: none. A take hands it out as attempt attempts + 1; a new row after done starts again.';
COMMENT ON COLUMN sturdy.queue.last_error IS 'The error its last failed pass gave (fail), at most 1,000 characters.';
COMMENT ON COLUMN sturdy.queue.last_sqlstate IS 'The SQLSTATE-like code its last failed pass gave with the error (fail''s code), if any.';
COMMENT ON COLUMN sturdy.queue.failed_at IS
    'When its last pass failed. With visible_at ''infinity'' the row is dead: it failed its queue''s max_attempts times and is never handed out again (redrive or cancel it).';
-- A job's input (schedule_many; see sql/queue.sql).
ALTER TABLE sturdy.queue ADD COLUMN input jsonb;
COMMENT ON COLUMN sturdy.queue.input IS
    'The job''s input (schedule_many''s inputs), handed out by take with each pass; NULL: none. Kept by schedule, wake_at, arrive and fail; replaced by the next schedule_many of the workflow.';

-- Failing passes: a queue's retry policy (retry_queue). A queue without a
-- row here retries as retry_queue's defaults say: 25 attempts, 1 s doubled
-- each failure up to 1 h, 10% jitter (docs/reference.md, retry_queue).
CREATE TABLE sturdy.queue_retry (
    queue        text     COLLATE "C" PRIMARY KEY,
    max_attempts integer  NOT NULL CHECK (max_attempts BETWEEN 1 AND 1000000),
    backoff      interval NOT NULL,
    max_backoff  interval NOT NULL,
    -- (NaN is above every number: the upper bound refuses it)
    jitter       float8   NOT NULL CHECK (jitter >= 0 AND jitter <= 1),
    -- a wait of no negative part, at most a year (retry_queue's bounds)
    CHECK (pg_catalog.date_part('epoch', backoff) BETWEEN 0 AND 31536000
           AND pg_catalog.date_part('year', backoff) >= 0 AND pg_catalog.date_part('month', backoff) >= 0
           AND pg_catalog.date_part('day', backoff) >= 0 AND pg_catalog.date_part('hour', backoff) >= 0
           AND pg_catalog.date_part('minute', backoff) >= 0 AND pg_catalog.date_part('second', backoff) >= 0),
    CHECK (pg_catalog.date_part('epoch', max_backoff) BETWEEN 0 AND 31536000
           AND pg_catalog.date_part('year', max_backoff) >= 0 AND pg_catalog.date_part('month', max_backoff) >= 0
           AND pg_catalog.date_part('day', max_backoff) >= 0 AND pg_catalog.date_part('hour', max_backoff) >= 0
           AND pg_catalog.date_part('minute', max_backoff) >= 0 AND pg_catalog.date_part('second', max_backoff) >= 0)
);
SELECT pg_catalog.pg_extension_config_dump('sturdy.queue_retry', '');
COMMENT ON TABLE sturdy.queue_retry IS
    'Retry policies per queue, set by retry_queue: after a failed pass the row is visible again after a backoff, and dead at max_attempts failures.';
COMMENT ON COLUMN sturdy.queue_retry.queue IS 'The queue.';
COMMENT ON COLUMN sturdy.queue_retry.max_attempts IS 'Failures after which a row is dead (never handed out again).';
COMMENT ON COLUMN sturdy.queue_retry.backoff IS 'The wait after the first failure; doubled after each one after it.';
COMMENT ON COLUMN sturdy.queue_retry.max_backoff IS 'The longest wait after a failure.';
COMMENT ON COLUMN sturdy.queue_retry.jitter IS 'Each wait is moved by up to this fraction of it, either way, at random.';
CREATE SEQUENCE sturdy.queue_priorities;
COMMENT ON SEQUENCE sturdy.queue_priorities IS
    'A signal: its relcache invalidation, sent by the commit of a transaction that scheduled a row with a priority, tells takes that knew a queue had none to look again.';
-- Flow control (src/queue/limits.rs): a queue's limits, set by limit_queue,
-- pause and resume; a queue without a row here has none, and its takes never
-- read this table (a backend keeps what it read until the table's next
-- relcache invalidation, which those three functions send). tokens and
-- refilled_at are the rate limit's bucket, written by the takes.
CREATE TABLE sturdy.queue_limits (
    queue       text        COLLATE "C" PRIMARY KEY,
    paused      boolean     NOT NULL DEFAULT false,
    -- limit_queue's bounds (NaN is above every number: the upper bounds
    -- refuse it)
    running     integer     CHECK (running BETWEEN 1 AND 10000),
    per_key     integer     CHECK (per_key BETWEEN 1 AND 1000),
    per_second  float8      CHECK (per_second > 0 AND per_second <= 1000000),
    burst       integer     CHECK (burst BETWEEN 1 AND 1000000),
    tokens      float8      CHECK (tokens >= 0 AND tokens <= burst),
    refilled_at timestamptz CHECK (pg_catalog.isfinite(refilled_at)),
    settling    boolean     NOT NULL DEFAULT false,
    CHECK ((per_second IS NULL) = (burst IS NULL))
);
SELECT pg_catalog.pg_extension_config_dump('sturdy.queue_limits', '');
COMMENT ON TABLE sturdy.queue_limits IS
    'Flow control per queue, set by limit_queue, pause and resume: take hands out at most what these leave.';
COMMENT ON COLUMN sturdy.queue_limits.queue IS 'The queue.';
COMMENT ON COLUMN sturdy.queue_limits.paused IS 'A paused queue hands out nothing; schedules, wakeups and done go on.';
COMMENT ON COLUMN sturdy.queue_limits.running IS 'At most this many of the queue''s passes at once (its places in queue_places); NULL: no limit.';
COMMENT ON COLUMN sturdy.queue_limits.per_key IS 'At most this many passes at once for one key (their places in queue_key_places); NULL: no limit.';
COMMENT ON COLUMN sturdy.queue_limits.per_second IS 'Takes a second on average (the bucket''s refill); NULL: no rate limit.';
COMMENT ON COLUMN sturdy.queue_limits.burst IS 'At most this many takes at once (the bucket''s size).';
COMMENT ON COLUMN sturdy.queue_limits.tokens IS 'What is in the bucket as of refilled_at: rows take may hand out.';
COMMENT ON COLUMN sturdy.queue_limits.refilled_at IS 'When the bucket was last refilled (a take''s now()).';
COMMENT ON COLUMN sturdy.queue_limits.settling IS 'Passes started under an earlier, higher limit still hold places past running or per_key: takes count the places held until none does.';

-- The running limit's places: one row per place; a pass holds one from its
-- take (workflow, receipt) until its done, finish or wake_at, or until its
-- lease (the receipt) runs out. Takers lock free places FOR UPDATE SKIP
-- LOCKED, so no two take one and none hands out more rows than it locked.
-- No CHECK on place (limit_queue numbers them from 1): take and done write
-- places without a statement (src/access/place.rs), which a CHECK would rule out.
CREATE TABLE sturdy.queue_places (
    queue    text        COLLATE "C" NOT NULL,
    place    integer     NOT NULL,
    workflow text        COLLATE "C",
    receipt  timestamptz,
    PRIMARY KEY (queue, place)
);
SELECT pg_catalog.pg_extension_config_dump('sturdy.queue_places', '');
COMMENT ON TABLE sturdy.queue_places IS
    'The running limit''s places: held by a pass from its take until done, finish or wake_at, or until its receipt passes.';
COMMENT ON COLUMN sturdy.queue_places.queue IS 'The limited queue.';
COMMENT ON COLUMN sturdy.queue_places.place IS 'The place, 1 to the queue''s running limit.';
COMMENT ON COLUMN sturdy.queue_places.workflow IS 'The workflow whose pass holds it; NULL when free.';
COMMENT ON COLUMN sturdy.queue_places.receipt IS 'That pass''s receipt: the place is free again once it has passed.';

-- The per-key limit's places (see sql/queue.sql).
CREATE TABLE sturdy.queue_key_places (
    queue    text        COLLATE "C" NOT NULL,
    key      text        COLLATE "C" NOT NULL,
    place    integer     NOT NULL,
    workflow text        COLLATE "C",
    receipt  timestamptz,
    PRIMARY KEY (queue, key, place)
);
-- No index on workflow: done, finish and wake_at find a pass's place by its
-- row's key (the primary key's prefix), and a place's update stays HOT.
SELECT pg_catalog.pg_extension_config_dump('sturdy.queue_key_places', '');
COMMENT ON TABLE sturdy.queue_key_places IS
    'The per_key limit''s places: per key of a limited queue, held by a pass from its take until done, finish or wake_at, or until its receipt passes.';
COMMENT ON COLUMN sturdy.queue_key_places.queue IS 'The limited queue.';
COMMENT ON COLUMN sturdy.queue_key_places.key IS 'The key (sturdy.queue.key).';
COMMENT ON COLUMN sturdy.queue_key_places.place IS 'The place, 1 to the queue''s per_key limit.';
COMMENT ON COLUMN sturdy.queue_key_places.workflow IS 'The workflow whose pass holds it; NULL when free.';
COMMENT ON COLUMN sturdy.queue_key_places.receipt IS 'That pass''s receipt: the place is free again once it has passed.';

CREATE OR REPLACE VIEW sturdy.queue_stats WITH (security_invoker = true) AS
SELECT s.queue, s.ready, s.leased, s.sleeping, s.oldest_ready_age,
       COALESCE(l.paused, false) AS paused, l.running, l.per_key, l.per_second, l.burst,
       CASE WHEN l.queue IS NULL THEN 0::bigint
            WHEN l.paused THEN s.ready
            ELSE GREATEST(0::bigint,
                          s.ready - LEAST(
                              -- (a settling queue's passes may hold more places than running)
                              COALESCE(GREATEST(0::bigint, l.running::bigint
                                       - (SELECT pg_catalog.count(*) FROM sturdy.queue_places p
                                           WHERE p.queue OPERATOR(pg_catalog.=) s.queue
                                             AND p.receipt OPERATOR(pg_catalog.>) pg_catalog.now())),
                                       s.ready),
                              COALESCE(pg_catalog.floor(LEAST(l.burst::float8,
                                           COALESCE(l.tokens, l.burst::float8)
                                           OPERATOR(pg_catalog.+) (pg_catalog.date_part('epoch',
                                               pg_catalog.now() OPERATOR(pg_catalog.-) COALESCE(l.refilled_at, pg_catalog.now()))
                                           OPERATOR(pg_catalog.*) l.per_second)))::bigint,
                                       s.ready)),
                          -- per key: its ready rows past its free places
                          (SELECT COALESCE(pg_catalog.sum(GREATEST(0::bigint, r.n
                                      OPERATOR(pg_catalog.-) GREATEST(0::bigint, l.per_key::bigint
                                      OPERATOR(pg_catalog.-) (SELECT pg_catalog.count(*) FROM sturdy.queue_key_places p
                                           WHERE p.queue OPERATOR(pg_catalog.=) s.queue AND p.key OPERATOR(pg_catalog.=) r.key
                                             AND p.receipt OPERATOR(pg_catalog.>) pg_catalog.now())))), 0)::bigint
                             FROM (SELECT q.key, pg_catalog.count(*) AS n FROM sturdy.queue q
                                    WHERE q.queue OPERATOR(pg_catalog.=) s.queue AND q.key IS NOT NULL
                                      AND q.visible_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                                      AND (q.leased_until IS NULL OR q.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now())
                                    GROUP BY q.key) r
                            WHERE l.per_key IS NOT NULL))
       END AS held_back,
       s.failing, s.dead
  FROM (SELECT queue,
               count(*) FILTER (WHERE visible_at <= now() AND (leased_until IS NULL OR leased_until <= now())) AS ready,
               count(*) FILTER (WHERE leased_until > now())                                                     AS leased,
               count(*) FILTER (WHERE visible_at > now() AND visible_at < 'infinity')                           AS sleeping,
               now() - min(GREATEST(visible_at, leased_until))
                        FILTER (WHERE visible_at <= now() AND (leased_until IS NULL OR leased_until <= now()))  AS oldest_ready_age,
               count(*) FILTER (WHERE attempts > 0 AND visible_at < 'infinity')                                 AS failing,
               count(*) FILTER (WHERE visible_at = 'infinity')                                                  AS dead
          FROM sturdy.queue
         GROUP BY queue) s
  LEFT JOIN sturdy.queue_limits l ON l.queue OPERATOR(pg_catalog.=) s.queue;
COMMENT ON VIEW sturdy.queue_stats IS
    'Per queue: rows ready now, leased by a taker, sleeping until a deadline, how long the oldest ready row has waited; its limits (limit_queue, pause), and how many ready rows a limit holds back right now; rows whose last pass failed and will be retried (failing) and rows that failed max_attempts times (dead).';
-- Roles granted pg_sturdy's use under 0.1.0 call schedule, take and wake_at,
-- which now read and bump these sequences and read the queue's limits: they
-- get them as grant_usage gives them.
DO $$
DECLARE
    role name;
BEGIN
    FOR role IN
        SELECT r.rolname
          FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a, pg_catalog.pg_roles r
         WHERE n.nspname = 'sturdy' AND a.privilege_type = 'USAGE' AND a.grantee = r.oid
           AND a.grantee <> n.nspowner
    LOOP
        EXECUTE pg_catalog.format('GRANT USAGE, SELECT ON SEQUENCE sturdy.queue_generation, sturdy.queue_idle, sturdy.queue_seq, sturdy.queue_priorities TO %I',
                                  role);
        -- every take reads the queue's limits (a limited one writes them)
        -- and its retry policy (retry_queue writes that)
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON sturdy.queue_limits, sturdy.queue_places, sturdy.queue_key_places, sturdy.queue_retry TO %I',
                                  role);
    END LOOP;
END $$;

-- src/queue/schedule.rs
CREATE FUNCTION sturdy.schedule_many(workflows text[], inputs jsonb[] DEFAULT NULL, queue text DEFAULT 'default', visible_at timestamptz DEFAULT now(), priority integer DEFAULT 0, keys text[] DEFAULT NULL) RETURNS bigint VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_schedule_many';
COMMENT ON FUNCTION sturdy.schedule_many(workflows text[], inputs jsonb[], queue text, visible_at timestamptz, priority integer, keys text[]) IS
    'schedule for a batch in one call: each workflow made visible in queue at visible_at and priority, with the input (jsonb) and key at the same position of inputs and keys (NULL arrays or elements: none), which take hands out with each pass. At most 10000 a call; a dead row stays dead. Returns how many rows were scheduled.';

-- done's array form under a name of its own (src/queue.rs): two functions
-- named done whose arguments differ only in type cannot be told apart by a
-- call with untyped parameters (node-postgres, pgx, pgbench -M prepared
-- send every call so). The C function is the same.
DROP FUNCTION sturdy.done(text[], timestamptz[], text);
CREATE FUNCTION sturdy.done_many(workflows text[], receipts timestamptz[], queue text DEFAULT 'default') RETURNS bigint VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_done_many';
COMMENT ON FUNCTION sturdy.done_many(workflows text[], receipts timestamptz[], queue text) IS
    'done for a batch in one statement: removes each workflow whose receipt (same position) still matches, and returns how many were removed. NULL elements match nothing.';

-- take gains `wake` (src/compose/take.rs): a worker that polls because it
-- cannot LISTEN asks for no NOTIFY; and `attempt` in its result (failing
-- passes). A function's arguments cannot be added
-- in place, so take is made again, and every role that could execute it is
-- granted it again (carried in a setting local to this transaction).
DO $$
BEGIN
    PERFORM pg_catalog.set_config('pg_sturdy_update.take_grantees', pg_catalog.string_agg(r.rolname, ' '), true)
       FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a, pg_catalog.pg_roles r
      WHERE p.oid = 'sturdy.take(text, interval, integer, boolean)'::pg_catalog.regprocedure
        AND a.privilege_type = 'EXECUTE' AND a.grantee = r.oid AND a.grantee <> p.proowner;
END $$;
DROP FUNCTION sturdy.take(text, interval, integer, boolean);
CREATE FUNCTION sturdy.take(queue text DEFAULT 'default', lease interval DEFAULT '1 minute', max integer DEFAULT 1, claim boolean DEFAULT false, wake boolean DEFAULT true) RETURNS TABLE (workflow text, receipt timestamptz, token bigint, attempt integer, input jsonb) VOLATILE PARALLEL UNSAFE ROWS 10
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_take';
COMMENT ON FUNCTION sturdy.take(queue text, lease interval, max integer, claim boolean, wake boolean) IS
    'Lease up to max of the oldest visible rows of queue for lease (FOR UPDATE SKIP LOCKED: concurrent takers never share a row). receipt is the lease''s end (leased_until), which done and wake_at must match. With claim, each workflow is also claimed for the same lease (token NULL where someone still holds it). attempt says which attempt this pass is: 1, or one more than the passes of the row that failed (fail, retry_queue); input is the job''s input (schedule_many), NULL for none. Finding nothing marks the queue as having a waiter, so the next schedule there notifies; with wake false (a worker that polls and cannot LISTEN, as behind PgBouncer in transaction mode) it marks nothing.';
REVOKE ALL ON FUNCTION sturdy.take(text, interval, integer, boolean, boolean) FROM PUBLIC;
DO $$
DECLARE
    role text;
BEGIN
    FOREACH role IN ARRAY pg_catalog.string_to_array(
            pg_catalog.current_setting('pg_sturdy_update.take_grantees', true), ' ') LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION sturdy.take(text, interval, integer, boolean, boolean) TO %I',
                                  role);
    END LOOP;
END $$;

-- schedule gains `priority` and `key` (src/queue/schedule.rs), made again as
-- take is above, and granted again to every role that could execute it.
DO $$
BEGIN
    PERFORM pg_catalog.set_config('pg_sturdy_update.schedule_grantees', pg_catalog.string_agg(r.rolname, ' '), true)
       FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a, pg_catalog.pg_roles r
      WHERE p.oid = 'sturdy.schedule(text, timestamptz, text)'::pg_catalog.regprocedure
        AND a.privilege_type = 'EXECUTE' AND a.grantee = r.oid AND a.grantee <> p.proowner;
END $$;
DROP FUNCTION sturdy.schedule(text, timestamptz, text);
CREATE FUNCTION sturdy.schedule(workflow text, visible_at timestamptz DEFAULT now(), queue text DEFAULT 'default', priority integer DEFAULT 0, key text DEFAULT NULL) RETURNS void VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_schedule';
COMMENT ON FUNCTION sturdy.schedule(workflow text, visible_at timestamptz, queue text, priority integer, key text) IS
    'Make the workflow visible in queue at visible_at (upsert: lands on top of a pass in flight, keeping its lease, so the wakeup survives its done; a dead row stays dead; ''infinity'' is refused), at priority (take hands out higher first; 0 or above) and in the group key for the queue''s per_key limit; a reschedule sets both. When visible now and a take found the queue empty since the last notification, NOTIFY sturdy with the queue name, delivered at commit.';
REVOKE ALL ON FUNCTION sturdy.schedule(text, timestamptz, text, integer, text) FROM PUBLIC;
DO $$
DECLARE
    role text;
BEGIN
    FOREACH role IN ARRAY pg_catalog.string_to_array(
            pg_catalog.current_setting('pg_sturdy_update.schedule_grantees', true), ' ') LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION sturdy.schedule(text, timestamptz, text, integer, text) TO %I',
                                  role);
    END LOOP;
END $$;

-- Failing passes (src/queue/fail.rs).
CREATE FUNCTION sturdy.fail(workflow text, receipt timestamptz, error text, queue text DEFAULT 'default', retry_at timestamptz DEFAULT NULL, code text DEFAULT NULL) RETURNS boolean VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_fail';
COMMENT ON FUNCTION sturdy.fail(workflow text, receipt timestamptz, error text, queue text, retry_at timestamptz, code text) IS
    'The pass failed: under the receipt rule of done, count one more attempt, keep error (its first 1000 characters) and code, and make the row visible again at retry_at, or after the queue''s backoff (retry_queue), or, at its max_attempts, dead (never handed out again; its instance failed). The pass is over: the workflow''s claim is fenced (the failed pass''s writes raise SD001; the retry claims at once). False for a stale receipt: nothing counted, and the place the receipt held freed, as done frees it.';
CREATE FUNCTION sturdy.retry_queue(queue text, max_attempts integer DEFAULT 25, backoff interval DEFAULT '1 second', max_backoff interval DEFAULT '1 hour', jitter float8 DEFAULT 0.1) RETURNS void VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_retry_queue';
COMMENT ON FUNCTION sturdy.retry_queue(queue text, max_attempts integer, backoff interval, max_backoff interval, jitter float8) IS
    'Set how the queue retries a failed pass: visible again after backoff doubled for each failure before it, at most max_backoff, moved by up to jitter of itself either way; dead at max_attempts failures. A NULL argument is its default (25, 1 second, 1 hour, 0.1), which a queue without a policy has.';

CREATE FUNCTION sturdy.redrive(workflow text, queue text) RETURNS boolean VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_redrive_workflow';
COMMENT ON FUNCTION sturdy.redrive(workflow text, queue text) IS
    'Make a dead row of queue (one that failed its max_attempts times) ready now, its attempts reset; its last error stays on the row. False when it is not dead (or not there). The outbox''s redrive(delivery) is the one with one argument.';
CREATE FUNCTION sturdy.cancel(workflow text, queue text DEFAULT 'default') RETURNS boolean VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_cancel';
COMMENT ON FUNCTION sturdy.cancel(workflow text, queue text) IS
    'Remove the workflow''s row from queue, whether waiting, sleeping, failing, dead or in a pass, and fence the workflow''s claim: any pass still running (its writes raise SD001; its done and wake_at answer false) and every place it holds in the queue''s limits is free at once. False, and nothing done, when there is no such row.';

CREATE FUNCTION sturdy.extend(workflow text, receipt timestamptz, lease interval, queue text DEFAULT 'default') RETURNS timestamptz VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_extend';
COMMENT ON FUNCTION sturdy.extend(workflow text, receipt timestamptz, lease interval, queue text) IS
    'Keep a pass''s row for lease from now: where the receipt still matches and has not passed, the row''s lease (and any place a running or per_key limit holds for the pass) ends at now() + lease, returned as the pass''s new receipt for done, finish, wake_at, fail and the next extend. NULL, and nothing written, for a stale receipt, a lease that ran out by the clock, or a place of the pass that a take reused meanwhile.';

-- Flow control (src/queue/limits.rs).
CREATE FUNCTION sturdy.limit_queue(queue text, running integer DEFAULT NULL, per_key integer DEFAULT NULL, per_second float8 DEFAULT NULL, burst integer DEFAULT NULL) RETURNS void VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_limit_queue';
COMMENT ON FUNCTION sturdy.limit_queue(queue text, running integer, per_key integer, per_second float8, burst integer) IS
    'Set the queue''s limits; a NULL clears that limit. running (at most 10000): at most this many of its rows leased at once; per_key (at most 1000): at most this many leased at once for one key (schedule''s key; rows without one are not limited by it); per_second (at most 1000000) with burst (at most 1000000): at most burst takes at once and per_second on average (burst defaults to one second''s worth). Passes already running count against a new limit until they end. A take over a limit hands out fewer rows, never an error.';
CREATE FUNCTION sturdy.pause(queue text) RETURNS boolean VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_pause';
COMMENT ON FUNCTION sturdy.pause(queue text) IS
    'Pause the queue: take hands out nothing from it until resume; schedules, wakeups and done go on. False when it was paused already.';
CREATE FUNCTION sturdy.resume(queue text) RETURNS boolean VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_resume';
COMMENT ON FUNCTION sturdy.resume(queue text) IS
    'Resume a paused queue, and wake its listening workers at commit. False when it was not paused.';
CREATE FUNCTION sturdy.queue_changed(queue text) RETURNS void VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_queue_changed';
COMMENT ON FUNCTION sturdy.queue_changed(queue text) IS
    'Under Citus: the queue''s limits, its pause or its prioritized rows changed, so this node''s sessions read them again at their next take. limit_queue, pause, resume and a prioritized schedule call it on the node that holds the queue (sturdy.distribute() delegates it there); a call of your own only costs the next takes a read.';
CREATE FUNCTION sturdy.workflow_place(workflow text) RETURNS text IMMUTABLE PARALLEL SAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_workflow_place';
COMMENT ON FUNCTION sturdy.workflow_place(workflow text) IS
    'The value the workflow''s claim and checkpoints are placed by under Citus, distributed with queues (sturdy.distribute()): its name up to the first /, or the whole name where it has none or starts with one. orders/77 is kept on the node of queue orders. The same on every server.';
ALTER TABLE sturdy.claims ADD COLUMN place text COLLATE "C";
COMMENT ON COLUMN sturdy.claims.place IS 'Under Citus, distributed with queues (sturdy.distribute()): sturdy.workflow_place(workflow), the value the row is placed by. NULL otherwise.';
ALTER TABLE sturdy.checkpoints ADD COLUMN place text COLLATE "C";
COMMENT ON COLUMN sturdy.checkpoints.place IS 'Under Citus, distributed with queues (sturdy.distribute()): sturdy.workflow_place(workflow), the value the row is placed by. NULL otherwise.';
CREATE FUNCTION sturdy.queue_backdated(queue text) RETURNS void VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_queue_backdated';
COMMENT ON FUNCTION sturdy.queue_backdated(queue text) IS
    'Under Citus: a row of the queue was made ready before now (a past-dated schedule, wake_at or retry, a redrive), so this node''s takes of the queue look from its start at their next take, not from where they stood. Those calls make it on the node that holds the queue (sturdy.distribute() delegates it there); a call of your own only costs the next takes a scan from the start.';

-- src/workflow/mod.rs:503
CREATE FUNCTION sturdy.finish(workflow text, token bigint, receipt timestamptz, step text DEFAULT NULL, value jsonb DEFAULT NULL, status text DEFAULT NULL, queue text DEFAULT 'default', error text DEFAULT NULL) RETURNS boolean VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_finish';
COMMENT ON FUNCTION sturdy.finish(workflow text, token bigint, receipt timestamptz, step text, value jsonb, status text, queue text, error text) IS
    'End a pass in one call: fenced like record (a stale token raises SD001 and nothing happens), record step = value when given, move the workflow''s instance to status when given (SD002 from a terminal status), release the claim, and remove the queue row under done''s receipt rule, whose answer it returns (false: a wakeup arrived during the pass and the row stays).';

-- src/batch.rs:506
CREATE FUNCTION sturdy.batch(target regclass, set_clause text, pending text, args text[] DEFAULT '{}', chunk integer DEFAULT 1000, key name DEFAULT 'id', order_by text DEFAULT NULL) RETURNS TABLE (done bigint, remaining bigint, seconds float8, complete boolean) VOLATILE PARALLEL UNSAFE ROWS 1
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_batch';
COMMENT ON FUNCTION sturdy.batch(target regclass, set_clause text, pending text, args text[], chunk integer, key name, order_by text) IS
    'One chunk: UPDATE target SET set_clause on up to chunk rows where pending holds, pending re-checked on each row as updated; each call goes on after the last key of the one before. set_clause, pending and order_by are caller-written SQL (never build them from request data), run with your rights and search_path; $1..$n in them are bound from args. remaining is exact at the start and end of a pass, carried forward between; complete only on an exact zero.';

-- src/batch.rs:572
CREATE FUNCTION sturdy.batch_start(name text, target regclass, set_clause text, pending text, args text[] DEFAULT '{}', chunk integer DEFAULT 1000, key name DEFAULT 'id', order_by text DEFAULT NULL, target_seconds float8 DEFAULT NULL) RETURNS void VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_batch_start';
COMMENT ON FUNCTION sturdy.batch_start(name text, target regclass, set_clause text, pending text, args text[], chunk integer, key name, order_by text, target_seconds float8) IS
    'Register a named batch job for sturdy.batch_tick (e.g. from pg_cron), checked as batch checks its arguments. chunk is the first chunk''s size; each tick then sizes the next from the measured rate to take target_seconds (default: a fifth of statement_timeout, or 1 s without one).';

-- src/batch.rs:676
CREATE FUNCTION sturdy.batch_tick(name text) RETURNS TABLE (done bigint, remaining bigint, seconds float8, complete boolean) VOLATILE PARALLEL UNSAFE ROWS 1
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_batch_tick';
COMMENT ON FUNCTION sturdy.batch_tick(name text) IS
    'Run one chunk of the named job and size the next from its measured rate. A finished job does nothing (complete); a job another tick is running returns at once with nothing done.';

-- src/outbox.rs:324
CREATE FUNCTION sturdy.unsubscribe(event text, subscriber regprocedure) RETURNS boolean VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_unsubscribe';
COMMENT ON FUNCTION sturdy.unsubscribe(event text, subscriber regprocedure) IS
    'Stop creating deliveries of event for subscriber. Deliveries already created still go out. False when there was no such subscription.';

-- src/workflow/mod.rs:450
CREATE FUNCTION sturdy.stuck(older_than interval, max integer DEFAULT NULL) RETURNS TABLE (id bigint, process text, business_key text, workflow text, status text, stalled_since timestamptz) STABLE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_stuck';
COMMENT ON FUNCTION sturdy.stuck(older_than interval, max integer) IS
    'Pending or running instances with no progress (no status change, no checkpoint of any kind) for older_than, longest stalled first; the first max of them when max is given (NULL: all).';

-- src/workflow/mod.rs:463
CREATE FUNCTION sturdy.transition(id bigint, from_status text, to_status text, expected_revision bigint DEFAULT NULL, token bigint DEFAULT NULL, error text DEFAULT NULL) RETURNS boolean VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_transition';
COMMENT ON FUNCTION sturdy.transition(id bigint, from_status text, to_status text, expected_revision bigint, token bigint, error text) IS
    'Move instance id from from_status to to_status (and from expected_revision, when given), adding one to its revision and keeping error as its last error when given. False when refused: another status or revision, a terminal status (never left), or no such instance. With a token, fenced like record: a stale token raises SD001.';

-- src/outbox.rs:302
CREATE FUNCTION sturdy.subscribe(event text, subscriber regprocedure, max_attempts integer DEFAULT 3) RETURNS void VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_subscribe';
COMMENT ON FUNCTION sturdy.subscribe(event text, subscriber regprocedure, max_attempts integer) IS
    'Deliver every later emit of event to subscriber, a function (message sturdy.outbox, attempt integer) whose result is ignored; a delivery that fails max_attempts times is dead. Subscribing again changes max_attempts for later emits.';

-- src/outbox.rs:541
CREATE FUNCTION sturdy.pump(max integer DEFAULT 50) RETURNS TABLE (seen integer, delivered integer, retrying integer, dead_letter integer) VOLATILE PARALLEL UNSAFE ROWS 1
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_pump';
COMMENT ON FUNCTION sturdy.pump(max integer) IS
    'Deliver up to max due deliveries (SKIP LOCKED: pumps share the work), each subscriber in its own subtransaction, with the caller''s rights and search_path. A failure rolls back that subscriber''s effects, keeps the error and its SQLSTATE, and retries after 2^attempt seconds, or marks the delivery dead at max_attempts. Per aggregate_id and subscriber, in emit order.';

-- src/outbox.rs:345
CREATE FUNCTION sturdy.emit(event text, payload jsonb, aggregate_id text DEFAULT NULL) RETURNS TABLE (outbox bigint, deliveries integer) VOLATILE PARALLEL UNSAFE ROWS 1
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_emit';
COMMENT ON FUNCTION sturdy.emit(event text, payload jsonb, aggregate_id text) IS
    'Write event with payload to the outbox and one pending delivery per subscriber, in this transaction. Deliveries with the same aggregate_id go out to each subscriber in emit order. When a pump waits, NOTIFY sturdy_outbox with the event name at commit.';

-- src/outbox.rs:580
CREATE FUNCTION sturdy.redrive(delivery bigint) RETURNS boolean VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_redrive';
COMMENT ON FUNCTION sturdy.redrive(delivery bigint) IS
    'Make a dead delivery pending again, due now, with its attempts reset. False when it is not dead (or does not exist).';

-- src/workflow/mod.rs:565
CREATE FUNCTION sturdy.sweep(older_than interval DEFAULT '7 days', max integer DEFAULT 1000) RETURNS TABLE (kind text, deleted bigint) VOLATILE PARALLEL UNSAFE ROWS 6
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_sweep';
COMMENT ON FUNCTION sturdy.sweep(older_than interval, max integer) IS
    'Delete one bounded batch: at most max instances finished before now() - older_than with their checkpoints, claims and queue rows (skipping any a live pass holds), at most max outbox messages that old whose deliveries are all done, and at most max expired idempotency keys. Counts per kind; call it again (pg_cron) until the counts are zero.';

-- src/lib.rs:57
-- requires:
--   queue

-- The transactional outbox: events written in the caller's transaction, and
-- one delivery per subscriber, handed to the subscriber's function by pump.
--
-- Subscribers are stored as text, the function's qualified signature
-- ('app.on_order(sturdy.outbox, integer)'), not as regprocedure: a reg*
-- column other than regclass/regtype/regrole makes pg_upgrade refuse the
-- cluster, and an OID would not survive pg_dump. pump resolves the name on
-- every call, so a function dropped and created again is found again.
--
-- Ids come from sequences of their own (not identity columns) so that
-- pg_dump keeps their positions with the data: restored, new ids continue
-- after the dumped ones.

CREATE TABLE sturdy.subscriptions (
    event        text        COLLATE "C" NOT NULL,
    subscriber   text        NOT NULL,
    max_attempts integer     NOT NULL CHECK (max_attempts > 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event, subscriber)
);
SELECT pg_catalog.pg_extension_config_dump('sturdy.subscriptions', '');
COMMENT ON TABLE sturdy.subscriptions IS
    'Who gets which event: emit creates one delivery per row for its event. Written by sturdy.subscribe and sturdy.unsubscribe.';
COMMENT ON COLUMN sturdy.subscriptions.event IS 'The event name emit is called with.';
COMMENT ON COLUMN sturdy.subscriptions.subscriber IS
    'The subscriber function''s qualified signature, e.g. app.on_order(sturdy.outbox, integer).';
COMMENT ON COLUMN sturdy.subscriptions.max_attempts IS 'Attempts before a delivery is dead; copied into each delivery at emit.';
COMMENT ON COLUMN sturdy.subscriptions.created_at IS 'When sturdy.subscribe first created the subscription.';

CREATE SEQUENCE sturdy.outbox_id_seq;
CREATE TABLE sturdy.outbox (
    id           bigint      NOT NULL DEFAULT pg_catalog.nextval('sturdy.outbox_id_seq'::pg_catalog.regclass) PRIMARY KEY,
    event        text        COLLATE "C" NOT NULL,
    payload      jsonb       NOT NULL,
    aggregate_id text        COLLATE "C",
    created_at   timestamptz NOT NULL DEFAULT now()
);
ALTER SEQUENCE sturdy.outbox_id_seq OWNED BY sturdy.outbox.id;
SELECT pg_catalog.pg_extension_config_dump('sturdy.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('sturdy.outbox_id_seq', '');
COMMENT ON SEQUENCE sturdy.outbox_id_seq IS 'Ids of sturdy.outbox (kept by pg_dump, so ids continue after a restore).';
COMMENT ON TABLE sturdy.outbox IS
    'Events, one row per sturdy.emit, written in the emitting transaction. Its row type is the message handed to subscribers.';
COMMENT ON COLUMN sturdy.outbox.id IS 'Emit order: deliveries for one aggregate go out in this order.';
COMMENT ON COLUMN sturdy.outbox.event IS 'The event name.';
COMMENT ON COLUMN sturdy.outbox.payload IS 'The event''s data, as emitted.';
COMMENT ON COLUMN sturdy.outbox.aggregate_id IS
    'What the event is about (an order id): deliveries to one subscriber for one aggregate go out in emit order. NULL: unordered.';
COMMENT ON COLUMN sturdy.outbox.created_at IS 'When the emitting transaction ran emit.';

CREATE SEQUENCE sturdy.deliveries_id_seq;
CREATE TABLE sturdy.deliveries (
    id              bigint      NOT NULL DEFAULT pg_catalog.nextval('sturdy.deliveries_id_seq'::pg_catalog.regclass) PRIMARY KEY,
    outbox_id       bigint      NOT NULL REFERENCES sturdy.outbox ON DELETE CASCADE,
    subscriber      text        NOT NULL,
    aggregate_id    text        COLLATE "C",
    state           text        COLLATE "C" NOT NULL DEFAULT 'pending'
                                CHECK (state IN ('pending', 'done', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    max_attempts    integer     NOT NULL CHECK (max_attempts > 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    last_sqlstate   text        COLLATE "C",
    delivered_at    timestamptz
);
ALTER SEQUENCE sturdy.deliveries_id_seq OWNED BY sturdy.deliveries.id;
-- pump's scan: due pending deliveries, oldest first. Done and dead rows are
-- not in it, so a long history costs pump nothing.
CREATE INDEX deliveries_due ON sturdy.deliveries (next_attempt_at, id) WHERE state = 'pending';
-- per-aggregate order: is an earlier delivery of this (subscriber, aggregate)
-- still pending?
CREATE INDEX deliveries_order ON sturdy.deliveries (subscriber, aggregate_id, id)
    WHERE state = 'pending' AND aggregate_id IS NOT NULL;
-- the foreign key's cascade, and cleanup by message
CREATE INDEX deliveries_outbox ON sturdy.deliveries (outbox_id);
-- the dead letters, page by page (sturdy-ui); few rows, if any
CREATE INDEX deliveries_dead ON sturdy.deliveries (id) WHERE state = 'dead';
SELECT pg_catalog.pg_extension_config_dump('sturdy.deliveries', '');
SELECT pg_catalog.pg_extension_config_dump('sturdy.deliveries_id_seq', '');
COMMENT ON SEQUENCE sturdy.deliveries_id_seq IS 'Ids of sturdy.deliveries (kept by pg_dump, so ids continue after a restore).';
COMMENT ON TABLE sturdy.deliveries IS
    'One row per (message, subscriber): pending until sturdy.pump delivers it (done) or gives up after max_attempts (dead).';
COMMENT ON COLUMN sturdy.deliveries.id IS 'The delivery id sturdy.redrive takes.';
COMMENT ON COLUMN sturdy.deliveries.outbox_id IS 'The message (sturdy.outbox.id).';
COMMENT ON COLUMN sturdy.deliveries.subscriber IS 'The subscriber function''s qualified signature, as subscribed.';
COMMENT ON COLUMN sturdy.deliveries.aggregate_id IS 'The message''s aggregate_id, kept here for the order check.';
COMMENT ON COLUMN sturdy.deliveries.state IS 'pending (due at next_attempt_at), done, or dead (max_attempts failed; sturdy.redrive makes it pending again).';
COMMENT ON COLUMN sturdy.deliveries.attempts IS 'Calls of the subscriber so far, failed ones included (counted even though their effects were rolled back).';
COMMENT ON COLUMN sturdy.deliveries.max_attempts IS 'Attempts before it is dead, from the subscription at emit.';
COMMENT ON COLUMN sturdy.deliveries.next_attempt_at IS 'When pump may try it: emit time at first, then 2^attempts seconds after each failure.';
COMMENT ON COLUMN sturdy.deliveries.last_error IS 'The first 200 characters of the last failure''s message (kept after a later success).';
COMMENT ON COLUMN sturdy.deliveries.last_sqlstate IS 'The last failure''s SQLSTATE, exactly as raised (custom codes included).';
COMMENT ON COLUMN sturdy.deliveries.delivered_at IS 'When the successful attempt ran (its pump''s transaction time).';

-- Whether a pump waits for work: a pump that found nothing due leaves the
-- mark, and the next emit (or redrive) that creates a due delivery removes it
-- and sends the one NOTIFY sturdy_outbox. Unlogged and not dumped, like
-- sturdy.queue_waiters.
CREATE UNLOGGED TABLE sturdy.outbox_waiters (
    waiting boolean     PRIMARY KEY DEFAULT true CHECK (waiting),
    since   timestamptz NOT NULL
);
COMMENT ON TABLE sturdy.outbox_waiters IS
    'One row while a pump waits: set by a pump that found nothing due, cleared (with one NOTIFY sturdy_outbox) by the next emit or redrive that creates due work.';
COMMENT ON COLUMN sturdy.outbox_waiters.waiting IS 'Always true: at most one row.';
COMMENT ON COLUMN sturdy.outbox_waiters.since IS 'When a pump first found nothing due since the last notification.';

CREATE VIEW sturdy.outbox_stats WITH (security_invoker = true) AS
SELECT o.event,
       d.subscriber,
       count(*) FILTER (WHERE d.state = 'pending')                      AS pending,
       count(*) FILTER (WHERE d.state = 'pending' AND d.attempts > 0)   AS retrying,
       count(*) FILTER (WHERE d.state = 'done')                         AS done,
       count(*) FILTER (WHERE d.state = 'dead')                         AS dead,
       now() - min(o.created_at) FILTER (WHERE d.state = 'pending')     AS oldest_pending_age
  FROM sturdy.deliveries d
  JOIN sturdy.outbox o ON o.id = d.outbox_id
 GROUP BY o.event, d.subscriber;
COMMENT ON VIEW sturdy.outbox_stats IS
    'Per event and subscriber: deliveries pending (of which retrying after a failure), done and dead, and how long ago the oldest pending one was emitted.';

-- src/lib.rs:58
-- requires:
--   outbox

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
);
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
);
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

-- src/lib.rs:63
-- requires:
--   workflow

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
);
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

-- src/lib.rs:64
-- requires:
--   batch

-- "Is anything wrong": one row per signal an operator should watch, with the
-- threshold it is judged by. Thresholds are starting points; docs/operations.md says
-- what each number should look like.
CREATE VIEW sturdy.health WITH (security_invoker = true) AS
SELECT 'oldest ready job'::text AS signal,
       pg_catalog.to_char(COALESCE(pg_catalog.max(now() - GREATEST(q.visible_at, q.leased_until)), interval '0'), 'HH24:MI:SS') AS value,
       COALESCE(pg_catalog.max(now() - GREATEST(q.visible_at, q.leased_until)), interval '0') < interval '5 minutes' AS ok,
       'How long the oldest ready queue row has waited for a worker: growing means too few workers (or none).'::text AS meaning
  FROM sturdy.queue q WHERE q.visible_at <= now() AND (q.leased_until IS NULL OR q.leased_until <= now())
UNION ALL
SELECT 'lapsed leases', pg_catalog.count(*)::text, pg_catalog.count(*) = 0,
       'Queue rows taken whose lease ran out before done: a worker died or is too slow for its lease; each is a failed pass, retried after its backoff.'
  FROM sturdy.queue q WHERE q.leased_until <= now()
UNION ALL
SELECT 'dead workflows', pg_catalog.count(*)::text, pg_catalog.count(*) = 0,
       'Queue rows whose passes failed their queue''s max_attempts times: never handed out again. Read last_error in sturdy.queue, fix, then sturdy.redrive(workflow, queue).'
  FROM sturdy.queue q WHERE q.visible_at = 'infinity'
UNION ALL
SELECT 'oldest pending delivery',
       pg_catalog.to_char(COALESCE(pg_catalog.max(now() - o.created_at), interval '0'), 'HH24:MI:SS'),
       COALESCE(pg_catalog.max(now() - o.created_at), interval '0') < interval '5 minutes',
       'How long ago the oldest undelivered event was emitted: growing means no pump runs, or a subscriber keeps failing.'
  FROM sturdy.deliveries d JOIN sturdy.outbox o ON o.id = d.outbox_id WHERE d.state = 'pending'
UNION ALL
SELECT 'dead deliveries', pg_catalog.count(*)::text, pg_catalog.count(*) = 0,
       'Deliveries that failed max_attempts times: read last_error in sturdy.deliveries, fix, then sturdy.redrive.'
  FROM sturdy.deliveries d WHERE d.state = 'dead'
UNION ALL
SELECT 'stuck instances',
       CASE WHEN pg_catalog.count(*) > 1000 THEN 'over 1000' ELSE pg_catalog.count(*)::text END,
       pg_catalog.count(*) = 0,
       'Pending or running instances without progress for an hour: sturdy.stuck(''1 hour'') lists them.'
  FROM sturdy.stuck(interval '1 hour', 1001)
UNION ALL
SELECT 'dead tuples ' || s.relname,
       pg_catalog.round(100.0 * s.n_dead_tup / GREATEST(s.n_live_tup + s.n_dead_tup, 1), 1)::text || '%',
       s.n_dead_tup <= 0.2 * GREATEST(s.n_live_tup + s.n_dead_tup, 1000),
       'Dead row versions not yet vacuumed (an estimate from the statistics): high and growing means autovacuum is behind or a long transaction holds the xmin horizon.'
  FROM pg_catalog.pg_stat_user_tables s
 WHERE s.schemaname = 'sturdy' AND s.relname IN ('queue', 'claims', 'deliveries', 'instances', 'checkpoints')
UNION ALL
SELECT 'oldest snapshot',
       COALESCE(pg_catalog.to_char(pg_catalog.max(now() - a.xact_start), 'HH24:MI:SS'), '-')
           || ' (' || COALESCE(pg_catalog.max(pg_catalog.age(a.backend_xmin)), 0) || ' transactions)',
       COALESCE(pg_catalog.max(now() - a.xact_start) < interval '5 minutes', true)
           AND COALESCE(pg_catalog.max(pg_catalog.age(a.backend_xmin)), 0) < 10000000,
       'The oldest open transaction of this database holding a snapshot (its age; the time only where pg_stat_activity shows it to you): vacuum removes nothing deleted after it began, so the tables grow. Find it in pg_stat_activity, end it, and set idle_in_transaction_session_timeout.'
  FROM pg_catalog.pg_stat_activity a
 WHERE a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database() AND a.backend_xmin IS NOT NULL
   AND a.pid <> pg_catalog.pg_backend_pid();
COMMENT ON VIEW sturdy.health IS
    'Is anything wrong: the oldest ready job, lapsed leases, dead workflows, the oldest pending delivery, dead deliveries, stuck instances, dead tuples in the busy tables and the oldest snapshot, each with ok by a documented threshold.';

-- The operator dashboard's history (sturdy-ui, docs/dashboard.md): what
-- sturdy.sample() read, one row per queue, per outbox subscription and per
-- named batch job at each call (pg_cron or sturdy-ui call it once a
-- minute). Pages read it instead of counting the live tables: a count kept
-- once a minute. sweep trims it: samples older than a day go (or older than
-- its older_than, where that is shorter).
CREATE TABLE sturdy.samples (
    sampled_at timestamptz NOT NULL,
    kind       text        COLLATE "C" NOT NULL CHECK (kind IN ('queue', 'outbox', 'batch', 'instances', 'health')),
    name       text        COLLATE "C" NOT NULL,
    subscriber text        NOT NULL DEFAULT '',
    figures    jsonb       NOT NULL,
    PRIMARY KEY (kind, name, subscriber, sampled_at)
);
-- sweep's trim, oldest first
CREATE INDEX samples_sampled_at ON sturdy.samples (sampled_at);
SELECT pg_catalog.pg_extension_config_dump('sturdy.samples', '');
COMMENT ON TABLE sturdy.samples IS
    'The dashboard''s history: one row per queue, outbox subscription, named batch job, instance status and health signal per sturdy.sample() call; sweep removes rows older than a day.';
COMMENT ON COLUMN sturdy.samples.sampled_at IS 'The sampling transaction''s now().';
COMMENT ON COLUMN sturdy.samples.kind IS 'queue, outbox (a subscription: name is the event), batch (a named batch job), instances (name: a status, or stuck) or health (name: a signal of sturdy.health).';
COMMENT ON COLUMN sturdy.samples.name IS 'The queue, the event, or the batch job''s name.';
COMMENT ON COLUMN sturdy.samples.subscriber IS 'The subscriber of an outbox sample; empty for the other kinds.';
COMMENT ON COLUMN sturdy.samples.figures IS
    'What was read. queue: ready, leased, sleeping, held_back, paused, oldest_ready_seconds, failing, dead, ended (rows gone or rescheduled since the previous sample; NULL where estimated), rows and mark (the highest seq, for the next ended), estimated (past 10,000 rows a part, the planner''s estimate). outbox: pending, retrying, dead, oldest_pending_seconds, delivered (since the previous sample). batch: done, remaining, chunk, last_seconds, complete. instances: count. health: value, ok, meaning.';

CREATE FUNCTION sturdy.sample() RETURNS integer
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    -- (the health view's plan costs the branches it never runs, enough for
    -- JIT: compiling it took 0.7 s of a 0.75 s sample at 10M queue rows)
    SET jit = off
AS $$
-- Its cost follows the queues and what is due in them, not the tables'
-- size (docs/benchmarks.md, "sample() at scale"): every figure is counted
-- row by row up to `cap` rows, through the index a take walks, and past
-- that estimated by the planner from the table's statistics (under Citus,
-- where the planner's estimate of a distributed table is not the table's,
-- counted on the queue's shard). A queue's sample says which it is
-- ("estimated").
DECLARE
    cap CONSTANT integer := 10000;
    distributed boolean := false;
    names text[];
    q text;
    before jsonb;
    l sturdy.queue_limits;
    total bigint; mark bigint; staying bigint;
    due bigint; leased bigint; lapsed bigint; sleeping bigint; oldest timestamptz;
    ready bigint; held bigint; free_places bigint; tokens bigint; per_key_held bigint;
    failing bigint; dead bigint; all_dead bigint := 0;
    estimated boolean;
    live bigint; finished bigint;
    statuses jsonb := '{}';
    stalled bigint;
    worst_wait interval := interval '0';
    all_lapsed bigint := 0;
    written integer := 0;
    n integer;
    plan json;
    st text;
BEGIN
    -- One sampler at a time (pg_cron beside a dashboard): each statement
    -- below runs on a snapshot taken after this lock, so it sees the sample
    -- the one before it committed and counts ended and delivered since that
    -- one, never the same interval twice. (A transaction-level advisory lock
    -- keyed by the samples table's OID: no privilege needed, nothing held
    -- past the commit.)
    PERFORM pg_advisory_xact_lock('sturdy.samples'::regclass::oid::int4, 0);
    -- one sample a transaction: a second call writes nothing
    IF EXISTS (SELECT FROM sturdy.samples p WHERE p.sampled_at = now()) THEN
        RETURN 0;
    END IF;
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                                 WHERE logicalrelid OPERATOR(pg_catalog.=) ''sturdy.queue''::pg_catalog.regclass)'
           INTO distributed;
    END IF;

    -- The queues: each name in the queue table, one index probe a name
    -- (not a scan of the rows), and each sampled within the hour (one that
    -- has emptied since is sampled with zeros).
    names := ARRAY(SELECT DISTINCT p.name FROM sturdy.samples p
                    WHERE p.kind = 'queue' AND p.sampled_at > now() - interval '1 hour');
    q := (SELECT min(x.queue) FROM sturdy.queue x);
    WHILE q IS NOT NULL LOOP
        IF NOT q = ANY (names) THEN
            names := names || q;
        END IF;
        q := (SELECT min(x.queue) FROM sturdy.queue x WHERE x.queue > q);
    END LOOP;

    FOREACH q IN ARRAY names LOOP
        before := (SELECT p.figures FROM sturdy.samples p
                    WHERE p.kind = 'queue' AND p.name = q AND p.subscriber = ''
                      AND p.sampled_at > now() - interval '1 hour'
                    ORDER BY p.sampled_at DESC LIMIT 1);
        -- its rows, up to cap + 1: all of them, with the highest seq (the
        -- next sample's mark) and those the previous sample counted (each
        -- bounded read in the order of take's index, so that the planner
        -- walks it rather than the table, where a queue's rows are few)
        SELECT count(*), max(r.seq), count(*) FILTER (WHERE r.seq <= (before ->> 'mark')::bigint),
               count(*) FILTER (WHERE r.attempts > 0 AND r.visible_at < 'infinity'),
               count(*) FILTER (WHERE r.visible_at = 'infinity')
          INTO total, mark, staying, failing, dead
          FROM (SELECT x.seq, x.attempts, x.visible_at FROM sturdy.queue x WHERE x.queue = q
                 ORDER BY x.visible_at, x.seq LIMIT cap + 1) r;
        estimated := total > cap;
        -- its due rows in take's order, up to cap + 1: the leases are there
        -- (takes lease from the front), and the row waiting longest
        SELECT count(*), count(*) FILTER (WHERE d.leased_until > now()),
               count(*) FILTER (WHERE d.leased_until <= now()),
               min(GREATEST(d.visible_at, d.leased_until))
                   FILTER (WHERE d.leased_until IS NULL OR d.leased_until <= now())
          INTO due, leased, lapsed, oldest
          FROM (SELECT x.visible_at, x.leased_until FROM sturdy.queue x
                 WHERE x.queue = q AND x.visible_at <= now()
                 ORDER BY x.visible_at, x.seq LIMIT cap + 1) d;
        IF NOT estimated THEN
            sleeping := total - due - dead;
        ELSE
            -- (failing: among the rows read; dead: the rows at 'infinity',
            -- the end of take's index, counted up to cap + 1)
            mark := NULL;
            dead := (SELECT count(*) FROM (SELECT FROM sturdy.queue x
                                            WHERE x.queue = q AND x.visible_at = 'infinity'
                                            LIMIT cap + 1) s);
            sleeping := (SELECT count(*) FROM (SELECT FROM sturdy.queue x
                                                WHERE x.queue = q AND x.visible_at > now() AND x.visible_at < 'infinity'
                                                ORDER BY x.visible_at, x.seq LIMIT cap + 1) s);
            IF sleeping > cap OR due > cap THEN
                IF distributed THEN
                    -- the queue's shard counts them (a router query)
                    SELECT count(*) FILTER (WHERE x.visible_at > now() AND x.visible_at < 'infinity'),
                           count(*) FILTER (WHERE x.visible_at <= now())
                      INTO sleeping, due
                      FROM sturdy.queue x WHERE x.queue = q;
                ELSE
                    EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM sturdy.queue x
                              WHERE x.queue OPERATOR(pg_catalog.=) $1 AND x.visible_at OPERATOR(pg_catalog.>) $2
                                AND x.visible_at OPERATOR(pg_catalog.<) ''infinity'''
                       INTO plan USING q, now();
                    sleeping := GREATEST(sleeping, (plan -> 0 -> 'Plan' ->> 'Plan Rows')::float8::bigint);
                    EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM sturdy.queue x
                              WHERE x.queue OPERATOR(pg_catalog.=) $1 AND x.visible_at OPERATOR(pg_catalog.<=) $2'
                       INTO plan USING q, now();
                    due := GREATEST(due, (plan -> 0 -> 'Plan' ->> 'Plan Rows')::float8::bigint);
                END IF;
            END IF;
            total := due + sleeping + dead;
        END IF;
        ready := due - leased;
        worst_wait := GREATEST(worst_wait, now() - oldest);
        all_lapsed := all_lapsed + lapsed;
        all_dead := all_dead + dead;

        -- held back by its limits, as queue_stats says (per key: among the
        -- due rows read above)
        l := NULL;
        SELECT * INTO l FROM sturdy.queue_limits x WHERE x.queue = q;
        IF l.queue IS NULL THEN
            held := 0;
        ELSIF l.paused THEN
            held := ready;
        ELSE
            free_places := GREATEST(0, l.running - (SELECT count(*) FROM sturdy.queue_places p
                                                     WHERE p.queue = q AND p.receipt > now()));
            tokens := floor(LEAST(l.burst::float8, COALESCE(l.tokens, l.burst::float8)
                                  + date_part('epoch', now() - COALESCE(l.refilled_at, now())) * l.per_second));
            per_key_held := 0;
            IF l.per_key IS NOT NULL THEN
                per_key_held := (
                    SELECT COALESCE(sum(GREATEST(0, r.n - GREATEST(0, l.per_key
                               - (SELECT count(*) FROM sturdy.queue_key_places p
                                   WHERE p.queue = q AND p.key = r.key AND p.receipt > now())))), 0)
                      FROM (SELECT d.key, count(*) AS n
                              FROM (SELECT x.key, x.leased_until FROM sturdy.queue x
                                     WHERE x.queue = q AND x.visible_at <= now()
                                     ORDER BY x.visible_at, x.seq LIMIT cap + 1) d
                             WHERE d.key IS NOT NULL AND (d.leased_until IS NULL OR d.leased_until <= now())
                             GROUP BY d.key) r);
            END IF;
            held := GREATEST(0, ready - LEAST(COALESCE(free_places, ready), COALESCE(tokens, ready)), per_key_held);
        END IF;

        INSERT INTO sturdy.samples (sampled_at, kind, name, subscriber, figures)
        VALUES (now(), 'queue', q, '',
                jsonb_build_object(
                    'ready', ready, 'leased', leased, 'sleeping', sleeping, 'held_back', held,
                    'paused', COALESCE(l.paused, false),
                    'oldest_ready_seconds', round(extract(epoch FROM now() - oldest), 3),
                    'rows', total, 'mark', mark, 'estimated', estimated,
                    'failing', failing, 'dead', dead,
                    -- rows gone since the previous sample: counted when both
                    -- samples counted every row
                    'ended', CASE WHEN before IS NOT NULL AND NOT estimated
                                       AND NOT COALESCE((before ->> 'estimated')::boolean, false) THEN
                                      GREATEST(0, (before ->> 'rows')::bigint - staying)
                                 END));
        written := written + 1;
    END LOOP;

    -- The outbox's subscriptions and the named batch jobs, from their views.
    WITH previous AS (
        SELECT DISTINCT ON (p.name, p.subscriber) p.name, p.subscriber, p.sampled_at
          FROM sturdy.samples p
         WHERE p.kind = 'outbox' AND p.sampled_at > now() - interval '1 hour'
         ORDER BY p.name, p.subscriber, p.sampled_at DESC),
    outbox AS (
        SELECT COALESCE(o.event, p.name) AS event, COALESCE(o.subscriber, p.subscriber) AS subscriber,
               o.pending, o.retrying, o.dead, o.oldest_pending_age, p.sampled_at AS since
          FROM sturdy.outbox_stats o
          FULL JOIN previous p ON p.name = o.event AND p.subscriber = o.subscriber),
    rows AS (
        INSERT INTO sturdy.samples (sampled_at, kind, name, subscriber, figures)
        SELECT now(), 'outbox', o.event, o.subscriber,
               jsonb_build_object(
                   'pending', COALESCE(o.pending, 0), 'retrying', COALESCE(o.retrying, 0),
                   'dead', COALESCE(o.dead, 0),
                   'oldest_pending_seconds', round(extract(epoch FROM o.oldest_pending_age), 3),
                   'delivered', CASE WHEN o.since IS NOT NULL THEN
                                    (SELECT count(*) FROM sturdy.deliveries d JOIN sturdy.outbox m ON m.id = d.outbox_id
                                      WHERE m.event = o.event AND d.subscriber = o.subscriber
                                        AND d.state = 'done' AND d.delivered_at > o.since)
                                END)
          FROM outbox o
        UNION ALL
        SELECT now(), 'batch', b.name, '',
               jsonb_build_object('done', b.done, 'remaining', b.remaining, 'chunk', b.chunk,
                                  'last_seconds', b.last_seconds, 'complete', b.complete)
          FROM sturdy.batch_jobs b
         WHERE NOT b.complete OR b.finished_at > now() - interval '1 hour'
        RETURNING 1)
    SELECT count(*) INTO n FROM rows;
    written := written + n;

    -- The instances by status: the live ones (pending, running) through
    -- the index stuck walks, the finished ones through sweep's; each part
    -- counted up to cap + 1 rows, and estimated past it.
    SELECT count(*), count(*) FILTER (WHERE i.status = 'pending'), count(*) FILTER (WHERE i.status = 'running')
      INTO live, total, due
      FROM (SELECT x.status FROM sturdy.instances x
             WHERE x.status = ANY ('{pending,running}'::text[]) ORDER BY x.updated_at, x.id LIMIT cap + 1) i;
    statuses := jsonb_build_object('pending', total, 'running', due);
    SELECT count(*), count(*) FILTER (WHERE i.status = 'succeeded'), count(*) FILTER (WHERE i.status = 'failed'),
           count(*) FILTER (WHERE i.status = 'cancelled')
      INTO finished, total, due, sleeping
      FROM (SELECT x.status FROM sturdy.instances x
             WHERE x.finished_at IS NOT NULL ORDER BY x.finished_at LIMIT cap + 1) i;
    statuses := statuses || jsonb_build_object('succeeded', total, 'failed', due, 'cancelled', sleeping);
    FOREACH st IN ARRAY ARRAY['pending', 'running', 'succeeded', 'failed', 'cancelled'] LOOP
        estimated := CASE WHEN st IN ('pending', 'running') THEN live ELSE finished END > cap;
        total := (statuses ->> st)::bigint;
        IF estimated THEN
            EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM sturdy.instances x WHERE x.status OPERATOR(pg_catalog.=) $1'
               INTO plan USING st;
            total := GREATEST(total, (plan -> 0 -> 'Plan' ->> 'Plan Rows')::float8::bigint);
        END IF;
        INSERT INTO sturdy.samples (sampled_at, kind, name, subscriber, figures)
        VALUES (now(), 'instances', st, '', jsonb_build_object('count', total, 'estimated', estimated));
    END LOOP;
    -- stuck: counted up to 1,000, as the health view counts them (stuck
    -- walks only as far as the first 1,001)
    stalled := (SELECT count(*) FROM sturdy.stuck('1 hour', 1001));
    INSERT INTO sturdy.samples (sampled_at, kind, name, subscriber, figures)
    VALUES (now(), 'instances', 'stuck', '', jsonb_build_object('count', LEAST(stalled, 1000), 'more', stalled > 1000));
    written := written + 6;

    -- The health signals: the two about the queue from the figures read
    -- above (the view counts every queue row for them), the rest from the
    -- view, whose queue branches a constant filter leaves unplanned.
    INSERT INTO sturdy.samples (sampled_at, kind, name, subscriber, figures)
    VALUES (now(), 'health', 'oldest ready job', '',
            jsonb_build_object('value', to_char(worst_wait, 'HH24:MI:SS'), 'ok', worst_wait < interval '5 minutes',
                               'meaning', 'How long the oldest ready queue row has waited for a worker: growing means too few workers (or none).')),
           (now(), 'health', 'lapsed leases', '',
            jsonb_build_object('value', all_lapsed::text, 'ok', all_lapsed = 0,
                               'meaning', 'Queue rows taken whose lease ran out before done: a worker died or is too slow for its lease; each is a failed pass, retried after its backoff.')),
           (now(), 'health', 'dead workflows', '',
            jsonb_build_object('value', all_dead::text, 'ok', all_dead = 0,
                               'meaning', 'Queue rows whose passes failed their queue''s max_attempts times: never handed out again. Read last_error in sturdy.queue, fix, then sturdy.redrive(workflow, queue).'));
    WITH rows AS (
        INSERT INTO sturdy.samples (sampled_at, kind, name, subscriber, figures)
        SELECT now(), 'health', h.signal, '', jsonb_build_object('value', h.value, 'ok', h.ok, 'meaning', h.meaning)
          FROM sturdy.health h
         WHERE h.signal NOT IN ('oldest ready job', 'lapsed leases', 'dead workflows')
        RETURNING 1)
    SELECT count(*) INTO n FROM rows;
    RETURN written + 3 + n;
END
$$;
COMMENT ON FUNCTION sturdy.sample() IS
    'Record the dashboard''s history: one row in sturdy.samples per queue (and per queue sampled within the hour that is empty now), per outbox subscription, per named batch job running or finished within the hour, per instance status (and stuck) and per sturdy.health signal; returns how many. Call it once a minute (pg_cron, or sturdy-ui does); sweep trims the history.';

-- src/workflow/watch.rs
CREATE FUNCTION sturdy.watch(id bigint) RETURNS TABLE (status text, revision bigint, last_error text) VOLATILE PARALLEL UNSAFE ROWS 1
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_watch';
COMMENT ON FUNCTION sturdy.watch(id bigint) IS
    'Ask to be told when instance id ends: marks it (if pending or running) so that its move to succeeded, failed or cancelled sends NOTIFY sturdy_instance with its id at commit; LISTEN sturdy_instance first. Returns its status, revision and last error now (no row when there is no such instance); a terminal status means there is nothing to wait for.';

-- src/workflow/mod.rs:436
CREATE FUNCTION sturdy.status(business_key text) RETURNS TABLE (id bigint, process text, workflow text, status text, revision bigint, step text, last_error text, updated_at timestamptz) STABLE PARALLEL UNSAFE ROWS 1
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_status_of';
COMMENT ON FUNCTION sturdy.status(business_key text) IS
    'The newest instance for business_key: its workflow name, status and revision, its current step (its newest checkpoint), last error, and last progress (status change or checkpoint). No row when there is none.';

-- src/workflow/mod.rs:381
CREATE FUNCTION sturdy.start(process text, business_key text, variables jsonb DEFAULT '{}', idempotency_key text DEFAULT NULL, queue text DEFAULT NULL) RETURNS bigint VOLATILE PARALLEL UNSAFE
    LANGUAGE c SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_start';
COMMENT ON FUNCTION sturdy.start(process text, business_key text, variables jsonb, idempotency_key text, queue text) IS
    'Start a pending instance of process for business_key and schedule its workflow (process/id) on queue (default: the process name), in this transaction. With an idempotency_key (per process), a start while the key lives (sturdy.idempotency_ttl) returns the first instance''s id instead, also when two race.';

-- src/lib.rs:65
-- finalize
-- Scale-out on Citus (docs/scale-out.md). Citus ignores DDL inside an
-- extension script, so the extension is made distributed by a call after
-- CREATE EXTENSION, on the coordinator: sturdy.distribute().
--
-- Where each table goes:
-- - by queue, colocated: queue and what limits and wakes a queue
--   (queue_limits, queue_places, queue_key_places, queue_waiters,
--   queue_retry). A take addresses one shard, where FOR UPDATE SKIP
--   LOCKED works, and its limit's places are on the same node;
-- - claims and checkpoints, colocated with each other: with queues (the
--   default) by place, sturdy.workflow_place(workflow), colocated with the
--   queue: workflow 'orders/77' is on the node of queue 'orders', so a pass
--   (take with claim, record, finish) is one node's transaction; or by
--   workflow (workflows_with_queues => false), spread by the whole name,
--   and the calls about one workflow's claim and checkpoints delegated
--   whole to the node that holds it (create_distributed_function). Citus
--   wants the distribution column in the primary key: by place it is
--   (place, workflow) and (place, workflow, step), unique as before since
--   the place is a function of the workflow;
-- - on the coordinator, as they are: instances, idempotency_keys, outbox,
--   deliveries, subscriptions, outbox_waiters, batches, samples. A
--   transaction writes them and the distributed tables together (the
--   coordinator's commit decides, the workers' parts are prepared first);
--   no statement of ours joins the two kinds.
-- queue_changed and queue_backdated are delegated to the node that holds
-- the queue.

CREATE FUNCTION sturdy.distribute(workflows_with_queues boolean DEFAULT true)
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t record;
    f record;
    claims_by text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'sturdy.distribute() needs Citus, which is not installed in this database'
            USING ERRCODE = '0A000',
                  HINT = 'On a single server there is nothing to distribute. On a Citus cluster, run CREATE EXTENSION citus, then this, on the coordinator.';
    END IF;
    IF NOT pg_catalog.citus_is_coordinator() THEN
        RAISE EXCEPTION 'sturdy.distribute() runs on the Citus coordinator, and this node is not it'
            USING ERRCODE = '0A000',
                  HINT = 'Connect to the coordinator and call it there; it distributes the tables of every node.';
    END IF;
    IF workflows_with_queues IS NULL THEN
        RAISE EXCEPTION 'workflows_with_queues must not be NULL'
            USING ERRCODE = '22004',
                  HINT = 'Pass true (claims and checkpoints on the node of the queue their workflow name starts with) or false (spread by the whole name).';
    END IF;
    SELECT pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) INTO claims_by
      FROM pg_catalog.pg_dist_partition p
     WHERE p.logicalrelid OPERATOR(pg_catalog.=) 'sturdy.claims'::pg_catalog.regclass;
    IF claims_by IS NOT NULL AND (claims_by OPERATOR(pg_catalog.=) 'place') IS DISTINCT FROM workflows_with_queues THEN
        RAISE EXCEPTION 'sturdy.claims is distributed by % already, and workflows_with_queues => % asks for the other placement', claims_by, workflows_with_queues
            USING ERRCODE = '55000',
                  HINT = pg_catalog.format('Call sturdy.distribute(workflows_with_queues => %s) to finish or repeat it; a placement once made is not changed (docs/scale-out.md).',
                                           claims_by OPERATOR(pg_catalog.=) 'place');
    END IF;
    IF workflows_with_queues AND claims_by IS NULL THEN
        -- the place each row is kept by, and the primary keys Citus needs
        -- it in (unique as before: the place is a function of the workflow)
        UPDATE sturdy.claims SET place = sturdy.workflow_place(workflow)
         WHERE place IS DISTINCT FROM sturdy.workflow_place(workflow);
        UPDATE sturdy.checkpoints SET place = sturdy.workflow_place(workflow)
         WHERE place IS DISTINCT FROM sturdy.workflow_place(workflow);
        ALTER TABLE sturdy.claims ALTER COLUMN place SET NOT NULL,
            DROP CONSTRAINT claims_pkey, ADD CONSTRAINT claims_pkey PRIMARY KEY (place, workflow);
        ALTER TABLE sturdy.checkpoints ALTER COLUMN place SET NOT NULL,
            DROP CONSTRAINT checkpoints_pkey, ADD CONSTRAINT checkpoints_pkey PRIMARY KEY (place, workflow, step);
    END IF;
    FOR t IN
        SELECT * FROM (VALUES
            (1, 'sturdy.queue', 'queue', NULL),
            (2, 'sturdy.queue_limits', 'queue', 'sturdy.queue'),
            (3, 'sturdy.queue_places', 'queue', 'sturdy.queue'),
            (4, 'sturdy.queue_key_places', 'queue', 'sturdy.queue'),
            (5, 'sturdy.queue_waiters', 'queue', 'sturdy.queue'),
            (6, 'sturdy.queue_retry', 'queue', 'sturdy.queue'),
            (7, 'sturdy.claims', CASE WHEN workflows_with_queues THEN 'place' ELSE 'workflow' END,
                CASE WHEN workflows_with_queues THEN 'sturdy.queue' END),
            (8, 'sturdy.checkpoints', CASE WHEN workflows_with_queues THEN 'place' ELSE 'workflow' END,
                'sturdy.claims')
        ) AS placement (n, tab, by_column, colocate_with)
        WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_dist_partition p
                           WHERE p.logicalrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(placement.tab))
        ORDER BY n
    LOOP
        PERFORM pg_catalog.create_distributed_table(t.tab::regclass, t.by_column,
            colocate_with => coalesce(t.colocate_with, 'default'));
    END LOOP;
    -- Delegated whole to the node holding the workflow, where claims are
    -- placed by it: calls that touch only claims and checkpoints (those
    -- running caller code do not qualify: it may reach anywhere). Placed
    -- by place, Citus would send a call by the hash of its workflow
    -- argument, not its place: those run where they are called, each
    -- statement routed to the place's node.
    FOR f IN
        SELECT p.oid::pg_catalog.regprocedure AS fn
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'sturdy'::regnamespace
           AND NOT workflows_with_queues
           AND p.proname IN ('claim', 'renew', 'release', 'fence', 'record', 'load')
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_dist_object o
                            WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::regclass
                              AND o.objid OPERATOR(pg_catalog.=) p.oid
                              AND o.distribution_argument_index IS NOT NULL)
    LOOP
        PERFORM pg_catalog.create_distributed_function(f.fn, '$1', colocate_with => 'sturdy.claims');
    END LOOP;
    -- Delegated to the node holding the queue even inside a transaction
    -- (force_delegation): the calls by which a change of a queue's limits,
    -- pause or prioritized rows, and a row made ready before now, reach the
    -- sessions there, in the change's transaction.
    FOR f IN SELECT p.fn FROM (VALUES ('sturdy.queue_changed(text)'::regprocedure),
                                      ('sturdy.queue_backdated(text)'::regprocedure)) AS p(fn)
              WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_dist_object o
                                 WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::regclass
                                   AND o.objid OPERATOR(pg_catalog.=) p.fn
                                   AND o.force_delegation)
    LOOP
        PERFORM pg_catalog.create_distributed_function(f.fn, '$1',
            colocate_with => 'sturdy.queue', force_delegation => true);
    END LOOP;
END
$$;
COMMENT ON FUNCTION sturdy.distribute(workflows_with_queues boolean) IS
    'On a Citus coordinator, after CREATE EXTENSION pg_sturdy on every node: distribute the queue''s tables by queue, and claims and checkpoints with queues (by sturdy.workflow_place(workflow): workflow orders/77 on the node of queue orders, so a pass is one node''s) or, with workflows_with_queues => false, by the whole workflow name (the per-workflow claim and checkpoint calls then delegated to its node); the rest stay on the coordinator. queue_changed and queue_backdated are delegated to the node that holds the queue. Idempotent; 55000 when asked for the other placement than the one made. 0A000 without Citus. See docs/scale-out.md.';

CREATE FUNCTION sturdy.queue_node(queue text)
    RETURNS TABLE (host text, port integer)
    LANGUAGE plpgsql STABLE SECURITY INVOKER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be NULL' USING ERRCODE = '22004', HINT = 'Pass a non-NULL queue.';
    ELSIF queue = '' THEN
        RAISE EXCEPTION 'queue must not be empty' USING ERRCODE = '22023', HINT = 'Pass a non-empty queue.';
    END IF;
    -- one server, or a cluster not distributed yet: no row (call where you are)
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE
        'SELECT n.nodename::pg_catalog.text, n.nodeport::pg_catalog.int4
           FROM pg_catalog.pg_dist_placement p
           JOIN pg_catalog.pg_dist_node n ON n.groupid OPERATOR(pg_catalog.=) p.groupid
          WHERE EXISTS (SELECT FROM pg_catalog.pg_dist_partition d
                         WHERE d.logicalrelid OPERATOR(pg_catalog.=) ''sturdy.queue''::pg_catalog.regclass)
            AND p.shardid OPERATOR(pg_catalog.=)
                pg_catalog.get_shard_id_for_distribution_column(''sturdy.queue''::pg_catalog.regclass, $1)
            AND n.isactive AND n.noderole OPERATOR(pg_catalog.=) ''primary'''
        USING queue;
END
$$;
COMMENT ON FUNCTION sturdy.queue_node(queue text) IS
    'Under Citus, after sturdy.distribute(): the node (host and port, as Citus knows it) that holds the queue''s shard, where a worker''s take and done on that queue cost what they cost on one server. No row on one server or before distribute(): call where you are. See docs/scale-out.md.';

-- Privileges. Nothing is open to PUBLIC: an application role is let in with
-- sturdy.grant_usage(role), usually through a group role sturdy_user.

CREATE OR REPLACE FUNCTION sturdy.grant_usage(role name)
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


-- sweep also trims the per_key limit's places of keys gone from their queue
-- and the dashboard's samples (src/compose/sweep.rs), counts leases that ran
-- out with no take to meet them and removes dead queue rows (failing
-- passes): four more kinds in its result.
ALTER FUNCTION sturdy.sweep(interval, integer) ROWS 10;
COMMENT ON FUNCTION sturdy.sweep(older_than interval, max integer) IS
    'Delete one bounded batch: at most max instances finished before now() - older_than with their checkpoints, claims and queue rows (skipping any a live pass holds), at most max outbox messages that old whose deliveries are all done, at most max expired idempotency keys, the free per_key places of at most max keys with no row left in their queue, at most max leases run out with no take to meet them counted as failed passes (lapsed: among the first max ready rows of each queue), at most max dead queue rows that died before now() - older_than, and at most max of the dashboard''s samples older than a day (or than older_than, where shorter). Counts per kind; call it again (pg_cron) until the counts are zero.';

-- Every table keeps the empty pages at its end: a vacuum's truncation would
-- take an ACCESS EXCLUSIVE lock that every take, done and claim waits behind
-- (sql/queue.sql).
ALTER TABLE sturdy.queue SET (vacuum_truncate = false);
ALTER TABLE sturdy.queue_retry SET (vacuum_truncate = false);
ALTER TABLE sturdy.queue_waiters SET (vacuum_truncate = false);
ALTER TABLE sturdy.queue_limits SET (vacuum_truncate = false);
ALTER TABLE sturdy.queue_places SET (vacuum_truncate = false);
ALTER TABLE sturdy.queue_key_places SET (vacuum_truncate = false);
ALTER TABLE sturdy.claims SET (vacuum_truncate = false);
ALTER TABLE sturdy.checkpoints SET (vacuum_truncate = false);
ALTER TABLE sturdy.subscriptions SET (vacuum_truncate = false);
ALTER TABLE sturdy.outbox SET (vacuum_truncate = false);
ALTER TABLE sturdy.deliveries SET (vacuum_truncate = false);
ALTER TABLE sturdy.outbox_waiters SET (vacuum_truncate = false);
ALTER TABLE sturdy.instances SET (vacuum_truncate = false);
ALTER TABLE sturdy.idempotency_keys SET (vacuum_truncate = false);
ALTER TABLE sturdy.batches SET (vacuum_truncate = false);
ALTER TABLE sturdy.samples SET (vacuum_truncate = false);
