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
) WITH (vacuum_truncate = false);
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
) WITH (vacuum_truncate = false);
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
) WITH (vacuum_truncate = false);
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
) WITH (vacuum_truncate = false);
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
