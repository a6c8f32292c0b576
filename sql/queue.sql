-- The queue: one row per (queue, workflow), scored by when it is visible.
-- visible_at in the past: ready. In the future with taken_at set: leased by a
-- taker (the receipt is that visible_at). In the future without: sleeping.

-- seq orders rows that share a visible_at (a schedule of many in one
-- transaction) and makes every place in take's index a point a floor can
-- name (src/queue.rs, `Floor`). From a sequence of its own, kept by pg_dump.
CREATE SEQUENCE sturdy.queue_seq;
CREATE TABLE sturdy.queue (
    queue        text        COLLATE "C" NOT NULL,
    workflow     text        COLLATE "C" NOT NULL,
    visible_at   timestamptz NOT NULL,
    taken_at     timestamptz,
    takes        integer     NOT NULL DEFAULT 0,
    scheduled_at timestamptz NOT NULL,
    seq          bigint      NOT NULL DEFAULT pg_catalog.nextval('sturdy.queue_seq'::pg_catalog.regclass),
    PRIMARY KEY (queue, workflow)
);
ALTER SEQUENCE sturdy.queue_seq OWNED BY sturdy.queue.seq;
-- take's scan: the oldest visible rows of one queue, in (visible_at, seq)
-- order, so that a take from its floor starts at the exact row its last take
-- reached: entries of rows taken and done before it (left until vacuum, and
-- kept by a pinned xmin) are never walked, even among thousands scheduled in
-- one transaction with one visible_at (measured in bench/README.md).
CREATE INDEX queue_visible ON sturdy.queue (queue, visible_at, seq);
SELECT pg_catalog.pg_extension_config_dump('sturdy.queue', '');
SELECT pg_catalog.pg_extension_config_dump('sturdy.queue_seq', '');
COMMENT ON SEQUENCE sturdy.queue_seq IS 'sturdy.queue.seq (kept by pg_dump, so new rows come after the restored ones).';

-- take's floor (src/queue.rs): each backend remembers, per queue, how far its
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
    'When take may hand it out. For a taken row this is the lease end, and the receipt done and wake_at must match.';
COMMENT ON COLUMN sturdy.queue.taken_at IS
    'When take last leased it; NULL once schedule, arrive or wake_at moved it since (then a future visible_at is sleep, not a lease).';
COMMENT ON COLUMN sturdy.queue.takes IS 'How many times take has handed it out (a row taken again and again is a workflow that keeps failing).';
COMMENT ON COLUMN sturdy.queue.scheduled_at IS 'When schedule or arrive last wrote it.';
COMMENT ON COLUMN sturdy.queue.seq IS 'Arrival order, given when the row is inserted: take hands out rows with the same visible_at in this order.';

-- Which queues have a worker waiting: a take that found nothing leaves a mark,
-- and the next schedule that makes a row ready there removes it and sends the
-- one NOTIFY. No mark, no NOTIFY: a busy system never commits under the
-- notification lock. Unlogged and not kept by pg_dump: it is a hint about
-- sessions that exist now, and after a crash or a restore workers poll.
CREATE UNLOGGED TABLE sturdy.queue_waiters (
    queue text        COLLATE "C" PRIMARY KEY,
    since timestamptz NOT NULL
);
COMMENT ON TABLE sturdy.queue_waiters IS
    'Queues with an idle worker: set by a take that found nothing, cleared (with one NOTIFY sturdy) by the next schedule, arrive or due wake_at there.';
COMMENT ON COLUMN sturdy.queue_waiters.queue IS 'The queue a worker found empty.';
COMMENT ON COLUMN sturdy.queue_waiters.since IS 'When the first take found it empty since the last notification.';

-- The idle epoch (src/queue.rs, `Unmarked`): bumped by every take that found
-- its queue empty and marked it in queue_waiters. A schedule that makes a row
-- ready looks for the mark only while this has moved since its backend last
-- found the queue unmarked, so a busy queue's schedules never probe
-- queue_waiters. A sequence: not transactional, no dead tuples.
CREATE SEQUENCE sturdy.queue_idle;
COMMENT ON SEQUENCE sturdy.queue_idle IS
    'Bumped by every take that finds its queue empty and marks it in queue_waiters: schedules look for marks only after it moves.';
SELECT pg_catalog.nextval('sturdy.queue_idle');

CREATE VIEW sturdy.queue_stats WITH (security_invoker = true) AS
SELECT queue,
       count(*) FILTER (WHERE visible_at <= now())                          AS ready,
       count(*) FILTER (WHERE visible_at > now() AND taken_at IS NOT NULL)  AS leased,
       count(*) FILTER (WHERE visible_at > now() AND taken_at IS NULL)      AS sleeping,
       now() - min(visible_at) FILTER (WHERE visible_at <= now())           AS oldest_ready_age
  FROM sturdy.queue
 GROUP BY queue;
COMMENT ON VIEW sturdy.queue_stats IS
    'Per queue: rows ready now, leased by a taker, sleeping until a deadline, and how long the oldest ready row has waited.';
