-- The queue: one row per (queue, workflow), scored by when it is visible.
-- visible_at in the past: ready. In the future with taken_at set: leased by a
-- taker (the receipt is that visible_at). In the future without: sleeping.

CREATE TABLE sturdy.queue (
    queue        text        COLLATE "C" NOT NULL,
    workflow     text        COLLATE "C" NOT NULL,
    visible_at   timestamptz NOT NULL,
    taken_at     timestamptz,
    takes        integer     NOT NULL DEFAULT 0,
    scheduled_at timestamptz NOT NULL,
    PRIMARY KEY (queue, workflow)
);
-- take's scan: the oldest visible rows of one queue
CREATE INDEX queue_visible ON sturdy.queue (queue, visible_at);
SELECT pg_catalog.pg_extension_config_dump('sturdy.queue', '');

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

CREATE FUNCTION sturdy.schedule(workflow text, visible_at timestamptz DEFAULT now(), queue text DEFAULT 'default')
    RETURNS void
    LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_schedule';
COMMENT ON FUNCTION sturdy.schedule(text, timestamptz, text) IS
    'Make the workflow visible in queue at visible_at (upsert: lands on top of a pass in flight, so the wakeup survives its done). When visible now, NOTIFY sturdy with the queue name, delivered at commit.';

CREATE FUNCTION sturdy.take(queue text DEFAULT 'default', lease interval DEFAULT '1 minute',
                            max integer DEFAULT 1, claim boolean DEFAULT false)
    RETURNS TABLE (workflow text, receipt timestamptz, token bigint)
    LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY INVOKER ROWS 10
    AS 'MODULE_PATHNAME', 'sturdy_take';
COMMENT ON FUNCTION sturdy.take(text, interval, integer, boolean) IS
    'Lease up to max of the oldest visible rows of queue for lease (FOR UPDATE SKIP LOCKED: concurrent takers never share a row). receipt is the new visible_at. With claim, each workflow is also claimed for the same lease (token NULL where someone still holds it).';

CREATE FUNCTION sturdy.done(workflow text, receipt timestamptz, queue text DEFAULT 'default')
    RETURNS boolean
    LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_done';
COMMENT ON FUNCTION sturdy.done(text, timestamptz, text) IS
    'Remove the workflow from queue if nothing rescheduled it since take (the receipt still matches). False means it was rescheduled: it stays, and will be taken again.';

CREATE FUNCTION sturdy.wake_at(workflow text, receipt timestamptz, at timestamptz, queue text DEFAULT 'default')
    RETURNS boolean
    LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_wake_at';
COMMENT ON FUNCTION sturdy.wake_at(text, timestamptz, timestamptz, text) IS
    'Suspend the workflow until at, under the same receipt rule as done (a wakeup that landed meanwhile wins). NOTIFY when at is already past.';

CREATE FUNCTION sturdy.arrive(workflow text, step text, value jsonb, queue text DEFAULT 'default')
    RETURNS jsonb
    LANGUAGE c VOLATILE PARALLEL UNSAFE SECURITY INVOKER
    AS 'MODULE_PATHNAME', 'sturdy_arrive';
COMMENT ON FUNCTION sturdy.arrive(text, text, jsonb, text) IS
    'supply the step and schedule the workflow now, in one transaction: a value''s arrival and the workflow''s wakeup commit together. Returns the value stored.';

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
