-- The queue: one row per (queue, workflow), scored by when it is visible.
-- visible_at in the past: ready, unless leased_until is still in the future
-- (a taker holds it; the receipt is that leased_until). visible_at in the
-- future: sleeping.

-- seq orders rows that share a visible_at (a schedule of many in one
-- transaction) and makes every place in take's index a point a floor can
-- name (src/queue/floor.rs, `Floor`). From a sequence of its own, kept by pg_dump.
CREATE SEQUENCE sturdy.queue_seq;
CREATE TABLE sturdy.queue (
    queue        text        COLLATE "C" NOT NULL,
    workflow     text        COLLATE "C" NOT NULL,
    visible_at   timestamptz NOT NULL,
    taken_at     timestamptz,
    takes        integer     NOT NULL DEFAULT 0,
    scheduled_at timestamptz NOT NULL,
    seq          bigint      NOT NULL DEFAULT pg_catalog.nextval('sturdy.queue_seq'::pg_catalog.regclass),
    leased_until timestamptz,
    priority     integer     NOT NULL DEFAULT 0,
    key          text        COLLATE "C",
    -- Failing passes (src/queue/fail.rs): all NULL until a pass fails, so
    -- a queue where nothing fails writes and reads none of them (NULLs
    -- cost a bit each in the row's null bitmap, which it already has).
    attempts      integer,
    last_error    text,
    last_sqlstate text,
    failed_at     timestamptz,
    -- A job's input (schedule_many): NULL, and so free, for a queue of names
    input         jsonb,
    PRIMARY KEY (queue, workflow)
) WITH (fillfactor = 45, vacuum_truncate = false);
ALTER SEQUENCE sturdy.queue_seq OWNED BY sturdy.queue.seq;
-- vacuum_truncate = false, here and on every table of the schema: a vacuum
-- that finds empty pages at a table's end cuts them off under an ACCESS
-- EXCLUSIVE lock, and every take, done or claim of the table waits behind it
-- (on a standby, its queries of the table are cancelled or hold up replay).
-- These tables are emptied and filled again all day; the pages would only
-- be added back. An explicit VACUUM (TRUNCATE) still gives them back
-- (docs/operations.md, "Empty pages are kept").
-- take's scan: the oldest visible rows of one queue, in (visible_at, seq)
-- order, so that a take from its floor starts at the exact row its last take
-- reached: entries of rows taken and done before it (left until vacuum, and
-- kept by a pinned xmin) are never walked, even among thousands scheduled in
-- one transaction with one visible_at (docs/internals.md, Tables).
--
-- A lease is written to leased_until, which no index holds, and never moves
-- visible_at: take's update is HOT (no new entry in either index, the new
-- version on the same page), half the WAL of an update that re-indexes the
-- row, and a leased row stays where it was in take's order, to be taken
-- first again if its lease runs out. Over half of every page is left free
-- for that: rows scheduled together sit together, a batch take leases all of
-- a page's rows at once, and a leased version is 16 bytes longer than a
-- scheduled one (taken_at and leased_until no longer NULL); at 45 a page of
-- rows just scheduled takes all their leases, in the scheduling transaction
-- too, where nothing can be pruned (src/queue/tests.rs). Measured: batches
-- of 100 1.6x-2.3x those of the indexed lease, 1 to 16 clients, both commit
-- regimes; one-row takes even (docs/internals.md, Tables).
CREATE INDEX queue_visible ON sturdy.queue (queue, visible_at, seq);
-- Priorities (src/queue/priority.rs): the rows scheduled with a priority
-- above the default, level by level, so a take hands them out first by
-- descending the levels that exist (one probe each) and reading each
-- level's ready rows in take's order. Partial: a queue without priorities
-- writes no entry here, and its takes never read it.
CREATE INDEX queue_prioritized ON sturdy.queue (queue, priority, visible_at, seq) WHERE priority > 0;
-- The rows with a key, by key: a per-key limit's places of keys that have
-- none left go with sweep (src/queue/keyed.rs), found through this.
CREATE INDEX queue_keyed ON sturdy.queue (queue, key) WHERE key IS NOT NULL;
SELECT pg_catalog.pg_extension_config_dump('sturdy.queue', '');
SELECT pg_catalog.pg_extension_config_dump('sturdy.queue_seq', '');
COMMENT ON SEQUENCE sturdy.queue_seq IS 'sturdy.queue.seq (kept by pg_dump, so new rows come after the restored ones).';

-- take's floor (src/queue/floor.rs): each backend remembers, per queue, how far its
-- takes have got, and scans from there instead of from the oldest entry of
-- queue_visible, so index entries of rows long taken and deleted, which a
-- pinned xmin keeps from vacuum, are not walked by every take. A write that
-- makes a row ready in the past (schedule or wake_at before now()) bumps
-- this generation, and a take that sees it changed scans from the start.
-- A sequence because it is not transactional and leaves no dead tuples.
CREATE SEQUENCE sturdy.queue_generation;
COMMENT ON SEQUENCE sturdy.queue_generation IS
    'Bumped by a schedule or wake_at that makes a row ready before now(): takes that see it change scan their queue from the start again.';
-- called once, so its value is never NULL (pg_sequence_last_value)
SELECT pg_catalog.nextval('sturdy.queue_generation');

COMMENT ON TABLE sturdy.queue IS
    'Workflows waiting for a pass: one row per (queue, workflow), visible from visible_at.';
COMMENT ON COLUMN sturdy.queue.queue IS 'The queue name; a workflow may wait in several queues, once in each.';
COMMENT ON COLUMN sturdy.queue.workflow IS 'The workflow id.';
COMMENT ON COLUMN sturdy.queue.visible_at IS
    'When it is due: as schedule, arrive or wake_at last wrote it. take does not move it; the lease is leased_until.';
COMMENT ON COLUMN sturdy.queue.taken_at IS
    'When take last leased it; NULL once schedule, arrive or wake_at moved it since (with leased_until set: a wakeup landed on the pass, which done, finish and wake_at then answer false, leaving the row ready).';
COMMENT ON COLUMN sturdy.queue.leased_until IS
    'The lease''s end while a taker holds it: take hands it out again only after this (a lease run out is a failed pass, counted by the take or sweep that meets it). It is the receipt done, wake_at, extend and fail must match; a wakeup (schedule, arrive) keeps it, the pass''s end clears it.';
COMMENT ON COLUMN sturdy.queue.takes IS 'How many times take has handed it out (a row taken again and again is a workflow that keeps failing).';
COMMENT ON COLUMN sturdy.queue.scheduled_at IS 'When schedule or arrive last wrote it.';
COMMENT ON COLUMN sturdy.queue.seq IS 'Arrival order, given when the row is inserted: take hands out rows with the same visible_at in this order.';
COMMENT ON COLUMN sturdy.queue.priority IS
    'Take hands out ready rows of a higher priority first (0, the default, last); set by schedule, kept by wake_at and arrive.';
COMMENT ON COLUMN sturdy.queue.key IS
    'The group the row belongs to for the queue''s per_key limit (a tenant, an account); NULL: not limited per key.';
COMMENT ON COLUMN sturdy.queue.attempts IS
    'How many of its passes failed (fail, or a lease run out); NULL: none. A take hands it out as attempt attempts + 1; a new row after done starts again.';
COMMENT ON COLUMN sturdy.queue.last_error IS 'The error its last failed pass gave (fail), at most 1,000 characters.';
COMMENT ON COLUMN sturdy.queue.last_sqlstate IS 'The SQLSTATE-like code its last failed pass gave with the error (fail''s code), if any.';
COMMENT ON COLUMN sturdy.queue.failed_at IS
    'When its last pass failed. With visible_at ''infinity'' the row is dead: it failed its queue''s max_attempts times and is never handed out again (redrive or cancel it).';

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
) WITH (vacuum_truncate = false);
SELECT pg_catalog.pg_extension_config_dump('sturdy.queue_retry', '');
COMMENT ON TABLE sturdy.queue_retry IS
    'Retry policies per queue, set by retry_queue: after a failed pass the row is visible again after a backoff, and dead at max_attempts failures.';
COMMENT ON COLUMN sturdy.queue_retry.queue IS 'The queue.';
COMMENT ON COLUMN sturdy.queue_retry.max_attempts IS 'Failures after which a row is dead (never handed out again).';
COMMENT ON COLUMN sturdy.queue_retry.backoff IS 'The wait after the first failure; doubled after each one after it.';
COMMENT ON COLUMN sturdy.queue_retry.max_backoff IS 'The longest wait after a failure.';
COMMENT ON COLUMN sturdy.queue_retry.jitter IS 'Each wait is moved by up to this fraction of it, either way, at random.';

-- A signal, never advanced: a transaction that schedules a row with a
-- priority sends a relcache invalidation of this relation, delivered to
-- every backend after its commit, and a backend that found a queue without
-- prioritized rows looks again once it has taken that in
-- (src/queue/priority.rs). A relation nothing else reads or writes, so the
-- invalidation costs the backends nothing else.
CREATE SEQUENCE sturdy.queue_priorities;
COMMENT ON SEQUENCE sturdy.queue_priorities IS
    'A signal: its relcache invalidation, sent by the commit of a transaction that scheduled a row with a priority, tells takes that knew a queue had none to look again.';

-- Which queues have a worker waiting: a take that found nothing leaves a mark,
-- and the next schedule that makes a row ready there removes it and sends the
-- one NOTIFY. No mark, no NOTIFY: a busy system never commits under the
-- notification lock. Unlogged and not kept by pg_dump: it is a hint about
-- sessions that exist now, and after a crash or a restore workers poll.
CREATE UNLOGGED TABLE sturdy.queue_waiters (
    queue text        COLLATE "C" PRIMARY KEY,
    since timestamptz NOT NULL
) WITH (vacuum_truncate = false);
COMMENT ON TABLE sturdy.queue_waiters IS
    'Queues with an idle worker: set by a take that found nothing, cleared (with one NOTIFY sturdy) by the next schedule, arrive or due wake_at there.';
COMMENT ON COLUMN sturdy.queue_waiters.queue IS 'The queue a worker found empty.';
COMMENT ON COLUMN sturdy.queue_waiters.since IS 'When the first take found it empty since the last notification.';

-- The idle epoch (src/queue/wakeups.rs, `Unmarked`): bumped by every take that found
-- its queue empty and marked it in queue_waiters. A schedule that makes a row
-- ready looks for the mark only while this has moved since its backend last
-- found the queue unmarked, so a busy queue's schedules never probe
-- queue_waiters. A sequence: not transactional, no dead tuples.
CREATE SEQUENCE sturdy.queue_idle;
COMMENT ON SEQUENCE sturdy.queue_idle IS
    'Bumped by every take that finds its queue empty and marks it in queue_waiters: schedules look for marks only after it moves.';
SELECT pg_catalog.nextval('sturdy.queue_idle');

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
) WITH (vacuum_truncate = false);
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
) WITH (vacuum_truncate = false);
SELECT pg_catalog.pg_extension_config_dump('sturdy.queue_places', '');
COMMENT ON TABLE sturdy.queue_places IS
    'The running limit''s places: held by a pass from its take until done, finish or wake_at, or until its receipt passes.';
COMMENT ON COLUMN sturdy.queue_places.queue IS 'The limited queue.';
COMMENT ON COLUMN sturdy.queue_places.place IS 'The place, 1 to the queue''s running limit.';
COMMENT ON COLUMN sturdy.queue_places.workflow IS 'The workflow whose pass holds it; NULL when free.';
COMMENT ON COLUMN sturdy.queue_places.receipt IS 'That pass''s receipt: the place is free again once it has passed.';

-- The per-key limit's places: per_key rows for each key of a limited
-- queue, made on demand (by limit_queue for the keys there, by a take for a
-- key it meets without places); held and freed as queue_places are. Free
-- places of keys with no row left in the queue go with sweep.
CREATE TABLE sturdy.queue_key_places (
    queue    text        COLLATE "C" NOT NULL,
    key      text        COLLATE "C" NOT NULL,
    place    integer     NOT NULL,
    workflow text        COLLATE "C",
    receipt  timestamptz,
    PRIMARY KEY (queue, key, place)
) WITH (vacuum_truncate = false);
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

CREATE VIEW sturdy.queue_stats WITH (security_invoker = true) AS
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
