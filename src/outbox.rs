//! The transactional outbox: an event and its deliveries commit with the
//! caller's transaction, and a pump hands each delivery to its subscriber's
//! function, in the server.
//!
//! `emit` writes one `sturdy.outbox` row and one `pending` delivery per
//! subscription of the event, in the caller's transaction: the event exists
//! exactly when the business change that caused it does. `pump` takes due
//! deliveries `FOR UPDATE SKIP LOCKED`, so any number of pumps (pg_cron jobs,
//! worker loops) share the work and none is delivered twice, and calls each
//! subscriber `f(message sturdy.outbox, attempt integer)` in its own internal
//! subtransaction. A failure rolls back that subscriber's effects only; the
//! attempt is counted outside the subtransaction, in the pump's own
//! bookkeeping, so a failing subscriber is retried (after `2^attempt`
//! seconds) and then dead-lettered instead of retried forever. A SQL
//! `SAVEPOINT` could not do this from a function; an internal subtransaction
//! is what PL/pgSQL's `EXCEPTION` block uses.
//!
//! Order: deliveries to one subscriber for one `aggregate_id` go out in emit
//! order. pump only starts a chain at its head, the oldest pending delivery
//! of that (subscriber, aggregate): a later one is not due while an earlier
//! one is pending, waiting for a retry included. Holding the head's row lock
//! holds the chain: another pump skips the locked head and sees no other
//! head for it, since the head is still pending in its snapshot. A pump that
//! delivered a head goes on down the chain in the same transaction while its
//! budget lasts, and stops at the first failure. A dead delivery no longer
//! holds its chain back; `redrive` makes it pending (and the head) again.
//!
//! Wakeups, as the queue does them: a pump that found nothing due leaves a
//! mark (`sturdy.outbox_waiters`), and the next `emit` that creates a
//! delivery, or `redrive`, removes it and sends `NOTIFY sturdy_outbox` with
//! the event name, delivered at commit. While pumps keep finding work there
//! is no mark and no notification, so a busy system never commits its emits
//! under the notification lock. Retries coming due wake nobody: a pump loop
//! waits with a timeout. (An idle pump leaving its mark while an open
//! transaction's emit is clearing the previous one waits for that
//! transaction to end, and is then notified by it.)
//!
//! Subscribers run with the rights and `search_path` of whoever calls `pump`,
//! and only if that role may execute them. Our own statements qualify every
//! name, as everywhere in pg_sturdy.

use std::cell::Cell;
use std::time::Instant;

use pg_sturdy_macros::sql_function;
use pgrx::IntoDatum;
use pgrx::pg_sys;

use crate::args::{self, Name};
use crate::datum::{Jsonb, Record, Text};
use crate::error::{Error, Result};
use crate::fmgr::Args;
use crate::plan::{self, Rows, Statement, first_value, run_one};
use crate::rescan::{Position, Rescans, START, ScanFrom, floor_after, time_param};
use crate::subxact::{self, Callable, Unfit};

/// The first characters of a failure's message kept in `last_error`.
const ERROR_CHARS: usize = 200;
/// Backoff after attempt n is 2^n seconds, n capped here (2^30 s is 34 years).
const MAX_BACKOFF_EXPONENT: i32 = 30;

static OUTBOX_TYPE: Statement = Statement {
    sql: "SELECT pg_catalog.to_regtype('sturdy.outbox')::pg_catalog.oid",
    args: &[],
    writes: false,
    generic: false,
};

static SUBSCRIBE: Statement = Statement {
    sql: "INSERT INTO sturdy.subscriptions (event, subscriber, max_attempts, created_at)
          VALUES ($1, $2, $3, pg_catalog.now())
          ON CONFLICT (event, subscriber) DO UPDATE SET max_attempts = EXCLUDED.max_attempts",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::INT4OID],
    writes: true,
    generic: false,
};

static UNSUBSCRIBE: Statement = Statement {
    sql: "DELETE FROM sturdy.subscriptions
           WHERE event OPERATOR(pg_catalog.=) $1 AND subscriber OPERATOR(pg_catalog.=) $2
          RETURNING true",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// The message, its deliveries, and whether a pump waits for them. Each
/// delivery is due from the message's creation.
static EMIT: Statement = Statement {
    sql: "WITH message AS (
              INSERT INTO sturdy.outbox (event, payload, aggregate_id, created_at)
              VALUES ($1, $2, $3, pg_catalog.now())
              RETURNING id, created_at),
          created AS (
              INSERT INTO sturdy.deliveries (outbox_id, subscriber, aggregate_id, max_attempts, next_attempt_at)
              SELECT m.id, s.subscriber, $3, s.max_attempts, m.created_at
                FROM message m, sturdy.subscriptions s
               WHERE s.event OPERATOR(pg_catalog.=) $1
              RETURNING 1)
          SELECT m.id, (SELECT pg_catalog.count(*) FROM created)::integer,
                 EXISTS (SELECT FROM created) AND EXISTS (SELECT FROM sturdy.outbox_waiters)
            FROM message m",
    args: &[pg_sys::TEXTOID, pg_sys::JSONBOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// Clear the mark and notify, if this call cleared it.
static WAKE: Statement = Statement {
    sql: "DELETE FROM sturdy.outbox_waiters RETURNING pg_catalog.pg_notify('sturdy_outbox', $1)",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

static MARK_IDLE: Statement = Statement {
    sql: "INSERT INTO sturdy.outbox_waiters (waiting, since) VALUES (true, pg_catalog.now())
          ON CONFLICT (waiting) DO NOTHING",
    args: &[],
    writes: true,
    generic: false,
};

/// The columns of a delivery to attempt, in both statements below: id, the
/// subscriber's qualified name, attempts so far, max attempts, whether it is
/// in an aggregate's chain, whether it is due, the message, where the row is
/// (we hold its lock, so it stays there until we update it), and when it was
/// due.
macro_rules! delivery_columns {
    ($d:literal) => {
        concat!(
            $d,
            ".id, ",
            $d,
            ".subscriber, ",
            $d,
            ".attempts, ",
            $d,
            ".max_attempts, ",
            $d,
            ".aggregate_id IS NOT NULL, ",
            $d,
            ".next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now(), o, ",
            $d,
            ".ctid, ",
            $d,
            ".next_attempt_at"
        )
    };
}

/// Due heads: pending, due, and the oldest pending of their (subscriber,
/// aggregate) when they have one. Locked, skipping what another pump holds.
/// Only those from `($2, $3)` on and below `($4, $5)` in the index's order
/// (`next_attempt_at`, `id`): from this backend's floor on, or below it (see
/// [`PumpFloor`]).
/// Its generic plan (the due index, in order, stopping at `max`) is the one
/// custom plans pick too; letting the plan cache choose would re-plan on
/// every call (`LIMIT $1`, as for `take`): ~5 µs a delivery at `max => 100`.
static HEADS: Statement = Statement {
    sql: concat!(
        "SELECT ",
        delivery_columns!("d"),
        "
           FROM sturdy.deliveries d
           JOIN sturdy.outbox o ON o.id OPERATOR(pg_catalog.=) d.outbox_id
          WHERE d.state OPERATOR(pg_catalog.=) 'pending'
            AND d.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now()
            AND (d.next_attempt_at, d.id) OPERATOR(pg_catalog.>=) ($2, $3)
            AND (d.next_attempt_at, d.id) OPERATOR(pg_catalog.<) ($4, $5)
            AND (d.aggregate_id IS NULL OR NOT EXISTS (
                 SELECT FROM sturdy.deliveries e
                  WHERE e.subscriber OPERATOR(pg_catalog.=) d.subscriber
                    AND e.aggregate_id OPERATOR(pg_catalog.=) d.aggregate_id
                    AND e.state OPERATOR(pg_catalog.=) 'pending'
                    AND e.id OPERATOR(pg_catalog.<) d.id))
          ORDER BY d.next_attempt_at, d.id
          LIMIT $1
            FOR UPDATE OF d SKIP LOCKED"
    ),
    args: &[
        pg_sys::INT4OID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::INT8OID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::INT8OID,
    ],
    writes: true,
    generic: true,
};

/// The next pending delivery of the chain of delivery $1, locked (waiting,
/// never skipping: skipping it would deliver the one after it out of order).
/// Returned even when not due, so the caller stops there.
static NEXT_IN_CHAIN: Statement = Statement {
    sql: concat!(
        "SELECT ",
        delivery_columns!("n"),
        "
           FROM sturdy.deliveries h
           JOIN sturdy.deliveries n
             ON n.subscriber OPERATOR(pg_catalog.=) h.subscriber
            AND n.aggregate_id OPERATOR(pg_catalog.=) h.aggregate_id
           JOIN sturdy.outbox o ON o.id OPERATOR(pg_catalog.=) n.outbox_id
          WHERE h.id OPERATOR(pg_catalog.=) $1
            AND n.state OPERATOR(pg_catalog.=) 'pending'
            AND n.id OPERATOR(pg_catalog.>) h.id
          ORDER BY n.id
          LIMIT 1
            FOR UPDATE OF n"
    ),
    args: &[pg_sys::INT8OID],
    writes: true,
    generic: true,
};

/// The pump's bookkeeping, outside every subscriber's subtransaction, in
/// one statement per kind of outcome. Deliveries that went out are found by
/// the tuple ids the pump read them at (a TID scan: it holds their locks, so
/// they have not moved), and their ids come back so that one a subscriber
/// itself updated (and so moved) is settled by id instead.
static SETTLE_DONE: Statement = Statement {
    sql: "UPDATE sturdy.deliveries
             SET state = 'done', attempts = attempts OPERATOR(pg_catalog.+) 1,
                 delivered_at = pg_catalog.now()
           WHERE ctid OPERATOR(pg_catalog.=) ANY ($1)
          RETURNING id",
    args: &[pg_sys::TIDARRAYOID],
    writes: true,
    generic: true,
};

static SETTLE_DONE_BY_ID: Statement = Statement {
    sql: "UPDATE sturdy.deliveries
             SET state = 'done', attempts = attempts OPERATOR(pg_catalog.+) 1,
                 delivered_at = pg_catalog.now()
           WHERE id OPERATOR(pg_catalog.=) ANY ($1) AND state OPERATOR(pg_catalog.=) 'pending'",
    args: &[pg_sys::INT8ARRAYOID],
    writes: true,
    generic: true,
};

/// Failed attempts: a retry's next attempt is `backoff` seconds from now (a
/// dead one keeps its time). Found through the primary key (`= ANY`):
/// joined to the arrays alone, the planner hashes them and scans the whole
/// table, history included.
static SETTLE_FAILED: Statement = Statement {
    sql: "UPDATE sturdy.deliveries d
             SET state = o.state,
                 attempts = o.attempt,
                 next_attempt_at = COALESCE(pg_catalog.now() OPERATOR(pg_catalog.+)
                                            pg_catalog.make_interval(0, 0, 0, 0, 0, 0, o.backoff),
                                            d.next_attempt_at),
                 last_error = o.error,
                 last_sqlstate = o.sqlstate
            FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),
                            pg_catalog.unnest($4), pg_catalog.unnest($5), pg_catalog.unnest($6))
                 AS o(id, state, attempt, backoff, error, sqlstate)
           WHERE d.id OPERATOR(pg_catalog.=) ANY ($1) AND d.id OPERATOR(pg_catalog.=) o.id",
    args: &[
        pg_sys::INT8ARRAYOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::INT4ARRAYOID,
        pg_sys::FLOAT8ARRAYOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::TEXTARRAYOID,
    ],
    writes: true,
    generic: true,
};

/// A subscriber's function by its qualified name (NULL if it is gone). The
/// name is fully qualified, so no `search_path` reaches it.
static RESOLVE: Statement = Statement {
    sql: "SELECT pg_catalog.to_regprocedure($1)::pg_catalog.oid",
    args: &[pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

static REDRIVE: Statement = Statement {
    sql: "UPDATE sturdy.deliveries
             SET state = 'pending', attempts = 0, next_attempt_at = pg_catalog.now(), delivered_at = NULL
           WHERE id OPERATOR(pg_catalog.=) $1 AND state OPERATOR(pg_catalog.=) 'dead'
          RETURNING EXISTS (SELECT FROM sturdy.outbox_waiters),
                    (SELECT o.event FROM sturdy.outbox o WHERE o.id OPERATOR(pg_catalog.=) outbox_id)",
    args: &[pg_sys::INT8OID],
    writes: true,
    generic: false,
};

/// The subscriber `oid` as subscribe checks it: `(sturdy.outbox, integer)`,
/// executable by the current user.
fn subscriber(oid: pg_sys::Oid, outbox_type: pg_sys::Oid, name: &str) -> Result<Callable> {
    subxact::callable(oid, &[outbox_type, pg_sys::INT4OID], None).map_err(|unfit| match unfit {
        Unfit::Missing => Error::SubscriberMissing {
            subscriber: name.into(),
        },
        Unfit::Shape(subscriber) => Error::SubscriberSignature { subscriber },
        Unfit::NotPermitted(function) => Error::NotPermitted { function },
    })
}

fn outbox_type() -> Result<pg_sys::Oid> {
    run_one(&OUTBOX_TYPE, &[], first_value::<pg_sys::Oid>)?.ok_or(Error::Internal {
        context: "outbox",
        cause: "type sturdy.outbox not found".into(),
    })
}

/// The subscriber's qualified signature, as stored.
fn subscriber_name(oid: Option<pg_sys::Oid>) -> Result<String> {
    let oid = args::required("subscriber", oid)?;
    subxact::qualified_name(oid).ok_or(Error::SubscriberMissing {
        subscriber: format!("with OID {}", oid.to_u32()),
    })
}

#[sql_function(
    "sturdy.subscribe(event text, subscriber regprocedure, max_attempts integer DEFAULT 3)
     RETURNS void VOLATILE PARALLEL UNSAFE",
    comment = "Deliver every later emit of event to subscriber, a function (message sturdy.outbox, attempt integer) whose result is ignored; a delivery that fails max_attempts times is dead. Subscribing again changes max_attempts for later emits."
)]
fn subscribe(
    event: Option<Text>,
    subscriber: Option<pg_sys::Oid>,
    max_attempts: Option<i32>,
) -> Result<()> {
    let event = args::name("event", event)?;
    let oid = args::required("subscriber", subscriber)?;
    let max_attempts = args::positive("max_attempts", max_attempts)?;
    let name = subscriber_name(Some(oid))?;
    self::subscriber(oid, outbox_type()?, &name)?;
    run_one(
        &SUBSCRIBE,
        &[event.into(), name.into(), max_attempts.into()],
        |_| Ok(()),
    )
}

#[sql_function(
    "sturdy.unsubscribe(event text, subscriber regprocedure) RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "Stop creating deliveries of event for subscriber. Deliveries already created still go out. False when there was no such subscription."
)]
fn unsubscribe(event: Option<Text>, subscriber: Option<pg_sys::Oid>) -> Result<bool> {
    let event = args::name("event", event)?;
    let name = subscriber_name(subscriber)?;
    Ok(run_one(
        &UNSUBSCRIBE,
        &[event.into(), name.into()],
        first_value::<bool>,
    )?
    .is_some())
}

/// Wake a waiting pump, if this call's work is the first since it waited.
fn wake(event: &[u8]) -> Result<()> {
    let payload = crate::datum::notify_payload(event);
    run_one(&WAKE, &[payload.into()], |_| Ok(()))
}

/// Returns its row through the call.
#[sql_function(
    "sturdy.emit(event text, payload jsonb, aggregate_id text DEFAULT NULL)
     RETURNS TABLE (outbox bigint, deliveries integer) VOLATILE PARALLEL UNSAFE ROWS 1",
    comment = "Write event with payload to the outbox and one pending delivery per subscriber, in this transaction. Deliveries with the same aggregate_id go out to each subscriber in emit order. When a pump waits, NOTIFY sturdy_outbox with the event name at commit."
)]
fn emit(
    call: &Args,
    event: Option<Text>,
    payload: Option<Jsonb>,
    aggregate_id: Option<Text>,
) -> Result<()> {
    let event: Name = args::name("event", event)?;
    let payload = args::required("payload", payload)?;
    let aggregate_id = args::optional_name("aggregate_id", aggregate_id)?;
    let aggregate_id = aggregate_id.map_or_else(plan::null::<Text>, Into::into);
    let (id, deliveries, waiting) =
        run_one(&EMIT, &[event.into(), payload.into(), aggregate_id], |t| {
            Ok(t.first().get_three::<i64, i32, bool>()?)
        })?;
    if waiting == Some(true) {
        wake(event.bytes())?;
    }
    plan::return_row(call, &[id.into_datum(), deliveries.into_datum()])
}

/// One delivery to attempt, read from [`HEADS`] or [`NEXT_IN_CHAIN`].
struct Due {
    id: i64,
    subscriber: String,
    attempts: i32,
    max_attempts: i32,
    chained: bool,
    due: bool,
    message: Record,
    ctid: pg_sys::ItemPointerData,
    due_at: pg_sys::TimestampTz,
}

fn read_due(rows: Rows) -> Result<Vec<Due>> {
    let missing = |what: &str| Error::Internal {
        context: "pump",
        cause: format!("a delivery row without {what}"),
    };
    (0..rows.len())
        .map(|i| {
            Ok(Due {
                id: rows.get::<i64>(i, 1).ok_or_else(|| missing("id"))?,
                subscriber: rows
                    .get::<String>(i, 2)
                    .ok_or_else(|| missing("subscriber"))?,
                attempts: rows.get::<i32>(i, 3).ok_or_else(|| missing("attempts"))?,
                max_attempts: rows
                    .get::<i32>(i, 4)
                    .ok_or_else(|| missing("max_attempts"))?,
                chained: rows.get::<bool>(i, 5).unwrap_or(false),
                due: rows.get::<bool>(i, 6).unwrap_or(false),
                message: rows.get::<Record>(i, 7).ok_or_else(|| missing("message"))?,
                ctid: rows
                    .get::<pg_sys::ItemPointerData>(i, 8)
                    .ok_or_else(|| missing("ctid"))?,
                due_at: rows
                    .timestamptz(i, 9)
                    .ok_or_else(|| missing("next_attempt_at"))?,
            })
        })
        .collect()
}

/// One pump call: the subscribers it has looked up, and the outcome of every
/// attempt, settled together at the end.
#[derive(Default)]
struct Pump {
    outbox_type: pg_sys::Oid,
    /// By qualified name: the function, or why it cannot be called.
    subscribers: Vec<(String, Result<Callable>)>,
    /// Deliveries that went out: where they are, and their ids.
    done_at: Vec<pg_sys::ItemPointerData>,
    done_ids: Vec<i64>,
    /// Failed attempts, one entry per array.
    failed: Failed,
    delivered: i32,
    retrying: i32,
    dead: i32,
}

/// The failed attempts of one pump call, as [`SETTLE_FAILED`]'s arrays.
#[derive(Default)]
struct Failed {
    ids: Vec<i64>,
    states: Vec<String>,
    attempts: Vec<i32>,
    backoffs: Vec<Option<f64>>,
    errors: Vec<String>,
    sqlstates: Vec<String>,
}

impl Pump {
    /// Attempt one delivery; true when the subscriber succeeded. An error
    /// returned here is not the subscriber's failure but the pump's (a query
    /// cancel or a shutdown inside the subscriber): it ends the pump.
    fn attempt(&mut self, d: &Due) -> Result<bool> {
        let attempt = d.attempts.saturating_add(1);
        let at = match self
            .subscribers
            .iter()
            .position(|(name, _)| *name == d.subscriber)
        {
            Some(at) => at,
            None => {
                let looked_up = self.look_up(&d.subscriber);
                self.subscribers.push((d.subscriber.clone(), looked_up));
                self.subscribers.len() - 1
            }
        };
        let outcome = match &mut self.subscribers[at].1 {
            Err(e) => Err(e.clone()),
            Ok(f) => subxact::subtransaction(|| {
                f.call(&[Some(d.message.0), attempt.into_datum()]);
                Ok(Some(()))
            })
            .map(|_| ()),
        };
        match outcome {
            Ok(()) => {
                self.done_at.push(d.ctid);
                self.done_ids.push(d.id);
                self.delivered += 1;
                Ok(true)
            }
            // Operator intervention (a cancel, a statement timeout, a
            // shutdown) is not the subscriber failing: stop the pump.
            Err(e) if e.sqlstate().starts_with(b"57") => Err(e),
            Err(e) => {
                let dead = attempt >= d.max_attempts;
                let f = &mut self.failed;
                f.ids.push(d.id);
                f.attempts.push(attempt);
                f.states.push(if dead { "dead" } else { "pending" }.into());
                f.backoffs
                    .push((!dead).then(|| 2f64.powi(attempt.min(MAX_BACKOFF_EXPONENT))));
                f.errors
                    .push(e.to_string().chars().take(ERROR_CHARS).collect());
                f.sqlstates
                    .push(String::from_utf8_lossy(&e.sqlstate()).into_owned());
                if dead {
                    self.dead += 1;
                } else {
                    self.retrying += 1;
                }
                Ok(false)
            }
        }
    }

    /// The subscriber named `name`, checked for a call by the current user.
    fn look_up(&self, name: &str) -> Result<Callable> {
        match run_one(&RESOLVE, &[name.into()], first_value::<pg_sys::Oid>)? {
            None => Err(Error::SubscriberMissing {
                subscriber: name.into(),
            }),
            Some(oid) => subscriber(oid, self.outbox_type, name),
        }
    }

    fn settle(self) -> Result<()> {
        if !self.done_at.is_empty() {
            let settled = plan::run_generic(&SETTLE_DONE, &[self.done_at.into()], |rows| {
                Ok((0..rows.len())
                    .filter_map(|i| rows.get::<i64>(i, 1))
                    .collect::<std::collections::HashSet<i64>>())
            })?;
            if settled.len() < self.done_ids.len() {
                let moved: Vec<i64> = self
                    .done_ids
                    .into_iter()
                    .filter(|id| !settled.contains(id))
                    .collect();
                plan::run_generic(&SETTLE_DONE_BY_ID, &[moved.into()], |_| Ok(()))?;
            }
        }
        let f = self.failed;
        if !f.ids.is_empty() {
            plan::run_generic(
                &SETTLE_FAILED,
                &[
                    f.ids.into(),
                    f.states.into(),
                    f.attempts.into(),
                    f.backoffs.into(),
                    f.errors.into(),
                    f.sqlstates.into(),
                ],
                |_| Ok(()),
            )?;
        }
        Ok(())
    }
}

/// Where this backend's pumps scan the due index from.
///
/// `deliveries_due` is in (`next_attempt_at`, `id`) order, and every delivery
/// settled leaves its entry at the front of it until vacuum removes it (the
/// row no longer matches the index's predicate, but its old version's entry
/// stays): a scan from the start walks all of them, on every call. Measured
/// draining 200,000 deliveries 100 a call: 8 µs a delivery at first, 12 µs
/// at the end (docs/internals.md, pump). So, as `take` does for its queues, each
/// backend keeps a floor and scans from there, and [`crate::rescan`] says
/// when it scans from the start instead. The floor is the oldest head its
/// last call found (whatever is below it is settled, or held by another
/// pump), or lower where an emit still to commit may write below it (the
/// later of [`SLACK`](crate::rescan::SLACK) before that call's transaction
/// began and the oldest running transaction's start:
/// [`crate::rescan::floor_after`]).
///
/// A delivery is due below the floor only when written there: an emit or a
/// `redrive` committed more than `SLACK` after its transaction began, a head
/// another pump held and rolled back, a chain's next delivery whose head was
/// retried past it, or an `UPDATE` of `next_attempt_at` by hand. The scan
/// below the floor that follows a call that came up short finds those, and
/// so do the scans from the start, at least every second: they wait at most
/// about a second, and only while pumps keep finding full batches above them.
#[derive(Clone, Copy)]
struct PumpFloor {
    /// Scan from this (`next_attempt_at`, `id`).
    at: Position,
    rescans: Rescans,
}

/// After every row.
const END: Position = (pg_sys::TimestampTz::MAX, i64::MAX);

thread_local! {
    static FLOOR: Cell<Option<PumpFloor>> = const { Cell::new(None) };
}

/// Due heads from `from` on and below `below`, at most `max`, locked.
fn heads_in(max: i32, from: Position, below: Position) -> Result<Vec<Due>> {
    plan::run_generic(
        &HEADS,
        &[
            max.into(),
            time_param(from.0).into(),
            from.1.into(),
            time_param(below.0).into(),
            below.1.into(),
        ],
        read_due,
    )
}

/// Up to `max` due heads, locked: from this backend's floor, then below it
/// when that came up short and may; or from the start. Keeps the floor.
fn due_heads(max: i32) -> Result<Vec<Due>> {
    let start = Instant::now();
    let floor = FLOOR.with(Cell::get);
    let (heads, full) = match floor.map(|f| (f.at, f.rescans.next(start))) {
        Some((at, ScanFrom::Floor(may_rescan))) => {
            let mut heads = heads_in(max, at, END)?;
            let mut full = None;
            if heads.len() < max as usize && may_rescan {
                let again = Instant::now();
                heads.extend(heads_in(max - heads.len() as i32, START, at)?);
                full = Some(again.elapsed());
            }
            (heads, full)
        }
        _ => (heads_in(max, START, END)?, Some(start.elapsed())),
    };
    let now = pg_sys::TimestampTz::from(pgrx::datum::now());
    let found = floor_after(
        heads.iter().map(|d| (d.due_at, d.id)).min(),
        now,
        crate::activity::running_since(),
    );
    let kept = match (floor, full) {
        (Some(mut f), None) => {
            if !heads.is_empty() {
                f.at = f.at.max(found);
            }
            f
        }
        (Some(mut f), Some(cost)) => {
            f.at = found;
            f.rescans.again(cost);
            f
        }
        (None, cost) => PumpFloor {
            at: found,
            rescans: Rescans::first(cost.unwrap_or_default()),
        },
    };
    FLOOR.with(|f| f.set(Some(kept)));
    Ok(heads)
}

/// Returns its row through the call.
#[sql_function(
    "sturdy.pump(max integer DEFAULT 50)
     RETURNS TABLE (seen integer, delivered integer, retrying integer, dead_letter integer)
     VOLATILE PARALLEL UNSAFE ROWS 1",
    comment = "Deliver up to max due deliveries (SKIP LOCKED: pumps share the work), each subscriber in its own subtransaction, with the caller's rights and search_path. A failure rolls back that subscriber's effects, keeps the error and its SQLSTATE, and retries after 2^attempt seconds, or marks the delivery dead at max_attempts. Per aggregate_id and subscriber, in emit order."
)]
fn pump(call: &Args, max: Option<i32>) -> Result<()> {
    let max = args::at_most(
        "max",
        args::positive("max", max)?,
        args::MAX_BATCH,
        "Pump at most 10000 deliveries a call, and call again for more.",
    )?;
    let heads = due_heads(max)?;
    if heads.is_empty() {
        run_one(&MARK_IDLE, &[], |_| Ok(()))?;
        let zero = Some(pg_sys::Datum::from(0i32));
        return plan::return_row(call, &[zero; 4]);
    }
    let mut pump = Pump {
        outbox_type: outbox_type()?,
        ..Pump::default()
    };
    // Heads first, each followed down its chain while the budget left over
    // by the heads lasts.
    let mut spare = max as usize - heads.len();
    for head in heads {
        let mut current = head;
        while pump.attempt(&current)? && current.chained && spare > 0 {
            match plan::run_generic(&NEXT_IN_CHAIN, &[current.id.into()], read_due)?.pop() {
                Some(next) if next.due => {
                    spare -= 1;
                    current = next;
                }
                _ => break,
            }
        }
    }
    let seen = pump.delivered + pump.retrying + pump.dead;
    let counts = [seen, pump.delivered, pump.retrying, pump.dead].map(IntoDatum::into_datum);
    pump.settle()?;
    plan::return_row(call, &counts)
}

#[sql_function(
    "sturdy.redrive(delivery bigint) RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "Make a dead delivery pending again, due now, with its attempts reset. False when it is not dead (or does not exist)."
)]
fn redrive(delivery: Option<i64>) -> Result<bool> {
    let delivery = args::required("delivery", delivery)?;
    let redriven = run_one(&REDRIVE, &[delivery.into()], |t| {
        if t.is_empty() {
            return Ok(None);
        }
        Ok(Some(t.first().get_two::<bool, String>()?))
    })?;
    match redriven {
        None => Ok(false),
        Some((waiting, event)) => {
            if waiting == Some(true) {
                wake(event.as_deref().unwrap_or_default().as_bytes())?;
            }
            Ok(true)
        }
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::testing::{count, error_of, sqlstate_of};
    use pgrx::prelude::*;

    fn text(sql: &str) -> Option<String> {
        Spi::get_one::<String>(sql).unwrap()
    }

    /// Subscribers that write what they got into `public.got`: `ok` always
    /// succeeds, `flaky` fails (after writing) until `public.fixed` says it
    /// may succeed, raising a custom SQLSTATE and a long message.
    fn subscribers() {
        Spi::run(
            "CREATE TABLE public.got (n serial, sub text, outbox bigint, attempt int, payload jsonb);
             CREATE TABLE public.fixed (yes boolean);
             CREATE FUNCTION public.ok(m sturdy.outbox, attempt int) RETURNS void LANGUAGE sql
               AS $$ INSERT INTO public.got (sub, outbox, attempt, payload) VALUES ('ok', m.id, attempt, m.payload) $$;
             CREATE FUNCTION public.flaky(m sturdy.outbox, attempt int) RETURNS void LANGUAGE plpgsql AS $$
             BEGIN
               INSERT INTO public.got (sub, outbox, attempt, payload) VALUES ('flaky', m.id, attempt, m.payload);
               IF NOT EXISTS (SELECT FROM public.fixed) THEN
                 RAISE EXCEPTION 'flaky: %', repeat('x', 300) USING ERRCODE = 'AB123';
               END IF;
             END $$;",
        )
        .unwrap();
    }

    /// Make every pending delivery due now (the test runs in one
    /// transaction, so `now()` never moves past a backoff).
    fn make_due() {
        Spi::run(
            "UPDATE sturdy.deliveries SET next_attempt_at = now() - interval '1 second' WHERE state = 'pending'",
        )
        .unwrap();
    }

    fn pump(max: i32) -> String {
        text(&format!("SELECT format('%s/%s/%s/%s', seen, delivered, retrying, dead_letter) FROM sturdy.pump({max})")).unwrap()
    }

    #[pg_test]
    fn emit_writes_one_delivery_per_subscriber_and_pump_delivers_each_once() {
        subscribers();
        Spi::run(
            "SELECT sturdy.subscribe('order.placed', 'public.ok(sturdy.outbox, integer)');
             INSERT INTO public.fixed VALUES (true);
             SELECT sturdy.subscribe('order.placed', 'public.flaky(sturdy.outbox, integer)', 5)",
        )
        .unwrap();
        assert_eq!(
            text(
                "SELECT string_agg(subscriber || ' ' || max_attempts, ', ' ORDER BY subscriber) FROM sturdy.subscriptions"
            )
            .as_deref(),
            Some("public.flaky(sturdy.outbox,integer) 5, public.ok(sturdy.outbox,integer) 3")
        );
        let emitted = text(
            "SELECT format('%s %s', outbox = currval('sturdy.outbox_id_seq'), deliveries)
               FROM sturdy.emit('order.placed', '{\"id\": 7}')",
        );
        assert_eq!(emitted.as_deref(), Some("t 2"));
        let first = Spi::get_one::<i64>("SELECT currval('sturdy.outbox_id_seq')")
            .unwrap()
            .unwrap();
        assert_eq!(
            text(
                "SELECT format('%s %s', outbox, deliveries) FROM sturdy.emit('nobody.listens', '1')"
            )
            .as_deref(),
            Some(format!("{} 0", first + 1).as_str())
        );
        assert_eq!(pump(10), "2/2/0/0");
        assert_eq!(pump(10), "0/0/0/0");
        assert_eq!(
            text(&format!(
                "SELECT string_agg(sub || ':' || (outbox - {first}) || ':' || attempt || ':' || payload, ',' ORDER BY sub)
                   FROM public.got"
            ))
            .as_deref(),
            Some("flaky:0:1:{\"id\": 7},ok:0:1:{\"id\": 7}")
        );
        assert_eq!(
            text(
                "SELECT string_agg(DISTINCT format('%s %s %s', state, attempts, delivered_at = now()), ',') FROM sturdy.deliveries"
            )
            .as_deref(),
            Some("done 1 t")
        );
    }

    /// pump scans from its floor, the oldest head its last call found (exact
    /// for a backlog due long ago), not from the start: a delivery made due
    /// below it behind the pump's back waits while pumps find full batches
    /// above it, and is delivered by the scan below the floor that follows a
    /// short call, or by the scan from the start a second later.
    #[pg_test]
    fn pump_scans_from_its_floor_and_finds_what_is_due_below_it() {
        subscribers();
        Spi::run("SELECT sturdy.subscribe('floor', 'public.ok(sturdy.outbox, integer)')").unwrap();
        let emit = |n: i32, due: &str| {
            Spi::run(&format!(
                "SELECT sturdy.emit('floor', to_jsonb(i)) FROM generate_series(1, {n}) i;
                 UPDATE sturdy.deliveries SET next_attempt_at = now() - interval '{due}' WHERE state = 'pending'"
            ))
            .unwrap();
        };
        let got = || {
            text("SELECT string_agg(payload::text, ',' ORDER BY n) FROM public.got")
                .unwrap_or_default()
        };
        // due an hour ago: the floor is the head delivered, exactly
        emit(5, "1 hour");
        assert_eq!(pump(1), "1/1/0/0");
        // the newest delivery made due below the floor, behind pump's back
        let hide = |due: &str| {
            Spi::run(&format!(
                "UPDATE sturdy.deliveries SET next_attempt_at = now() - interval '{due}'
                  WHERE id = (SELECT max(id) FROM sturdy.deliveries WHERE state = 'pending')"
            ))
            .unwrap();
        };
        hide("2 hours");
        assert_eq!(pump(1), "1/1/0/0");
        assert_eq!(got(), "1,2", "the oldest due (5) is below the floor");
        // a short call goes on below its floor
        assert_eq!(pump(10), "3/3/0/0");
        assert_eq!(got(), "1,2,3,4,5");
        // a second later, the next call scans from the start: oldest first
        Spi::run("TRUNCATE public.got").unwrap();
        emit(3, "30 minutes");
        hide("3 hours");
        assert_eq!(pump(1), "1/1/0/0");
        assert_eq!(got(), "1", "from the floor, in emit order");
        Spi::run("SELECT pg_sleep(1.1)").unwrap();
        assert_eq!(pump(1), "1/1/0/0");
        assert_eq!(got(), "1,3", "from the start: the one due longest ago");
        assert_eq!(pump(10), "1/1/0/0");
        assert_eq!(count("sturdy.deliveries WHERE state = 'pending'"), 0);
    }

    /// The seed's rule: the subscriber's effects roll back, the attempt still
    /// counts; retry after 2^attempt seconds; dead at max_attempts; the error
    /// kept (200 characters) with its own SQLSTATE; another subscriber's
    /// delivery unaffected; redrive brings a dead one back.
    #[pg_test]
    fn a_failing_subscriber_is_retried_with_backoff_then_dead_and_redriven() {
        subscribers();
        Spi::run(
            "SELECT sturdy.subscribe('e', 'public.ok(sturdy.outbox, integer)');
             SELECT sturdy.subscribe('e', 'public.flaky(sturdy.outbox, integer)', 3);
             SELECT sturdy.emit('e', '{}')",
        )
        .unwrap();
        assert_eq!(pump(10), "2/1/1/0");
        assert_eq!(
            text("SELECT string_agg(sub, ',') FROM public.got").as_deref(),
            Some("ok"),
            "the failed attempt's insert was rolled back"
        );
        let flaky = "FROM sturdy.deliveries WHERE subscriber LIKE 'public.flaky%'";
        assert_eq!(
            text(&format!(
                "SELECT format('%s %s %s %s %s', state, attempts, next_attempt_at - now(), last_sqlstate, length(last_error)) {flaky}"
            ))
            .as_deref(),
            Some("pending 1 00:00:02 AB123 200")
        );
        assert!(
            text(&format!("SELECT last_error {flaky}"))
                .unwrap()
                .starts_with("flaky: xxx")
        );
        assert_eq!(pump(10), "0/0/0/0", "not due before its backoff");
        make_due();
        assert_eq!(pump(10), "1/0/1/0");
        assert_eq!(
            text(&format!(
                "SELECT format('%s %s', attempts, next_attempt_at - now()) {flaky}"
            ))
            .as_deref(),
            Some("2 00:00:04")
        );
        make_due();
        assert_eq!(pump(10), "1/0/0/1");
        assert_eq!(
            text(&format!("SELECT format('%s %s', state, attempts) {flaky}")).as_deref(),
            Some("dead 3")
        );
        make_due();
        assert_eq!(pump(10), "0/0/0/0", "dead is not retried");
        assert_eq!(
            text(
                "SELECT format('%s %s %s %s %s', pending, retrying, done, dead, oldest_pending_age IS NULL)
                   FROM sturdy.outbox_stats WHERE subscriber LIKE 'public.flaky%'"
            )
            .as_deref(),
            Some("0 0 0 1 t")
        );

        let id = Spi::get_one::<i64>(&format!("SELECT id {flaky}"))
            .unwrap()
            .unwrap();
        Spi::run("INSERT INTO public.fixed VALUES (true)").unwrap();
        assert_eq!(
            Spi::get_one::<bool>(&format!("SELECT sturdy.redrive({id})")).unwrap(),
            Some(true)
        );
        assert_eq!(
            Spi::get_one::<bool>(&format!("SELECT sturdy.redrive({id})")).unwrap(),
            Some(false),
            "only a dead delivery is redriven"
        );
        assert_eq!(pump(10), "1/1/0/0");
        assert_eq!(
            text(&format!(
                "SELECT format('%s %s %s', state, attempts, last_sqlstate) {flaky}"
            ))
            .as_deref(),
            Some("done 1 AB123"),
            "the last failure stays on record after the success"
        );
        assert_eq!(
            Spi::get_one::<bool>("SELECT sturdy.redrive(123456)").unwrap(),
            Some(false)
        );
    }

    /// One subscriber, one aggregate: emit order, across a retry; a second
    /// aggregate and unordered messages are not held back by it.
    #[pg_test]
    fn deliveries_for_one_aggregate_go_in_emit_order_across_a_retry() {
        subscribers();
        Spi::run(
            "SELECT sturdy.subscribe('e', 'public.flaky(sturdy.outbox, integer)', 10);
             SELECT sturdy.emit('e', to_jsonb(i), 'A') FROM generate_series(1, 3) i;
             SELECT sturdy.emit('e', '\"b\"', 'B');
             SELECT sturdy.emit('e', '\"none\"')",
        )
        .unwrap();
        // every head fails: A's first, B's only and the unordered one
        assert_eq!(pump(10), "3/0/3/0");
        make_due();
        Spi::run("INSERT INTO public.fixed VALUES (true); DELETE FROM public.got").unwrap();
        // A's head delivered, then its chain followed in the same pump
        assert_eq!(pump(10), "5/5/0/0");
        assert_eq!(
            text("SELECT string_agg(payload::text, ',' ORDER BY n) FROM public.got WHERE payload::text LIKE '_'")
                .as_deref(),
            Some("1,2,3")
        );
    }

    /// A later delivery of an aggregate waits while an earlier one waits for
    /// its retry; the chain's budget is what max leaves after the heads.
    #[pg_test]
    fn a_later_delivery_waits_for_an_earlier_retry_and_max_bounds_a_chain() {
        subscribers();
        Spi::run(
            "SELECT sturdy.subscribe('e', 'public.flaky(sturdy.outbox, integer)');
             SELECT sturdy.emit('e', to_jsonb(i), 'A') FROM generate_series(1, 4) i",
        )
        .unwrap();
        assert_eq!(pump(10), "1/0/1/0");
        make_due();
        Spi::run("UPDATE sturdy.deliveries SET next_attempt_at = now() + interval '1 hour' WHERE attempts = 1")
            .unwrap();
        assert_eq!(pump(10), "0/0/0/0", "2..4 wait behind 1's retry");
        Spi::run("INSERT INTO public.fixed VALUES (true); DELETE FROM public.got").unwrap();
        make_due();
        assert_eq!(pump(2), "2/2/0/0");
        assert_eq!(pump(1), "1/1/0/0");
        assert_eq!(pump(5), "1/1/0/0");
        assert_eq!(
            text("SELECT string_agg(payload::text, ',' ORDER BY n) FROM public.got").as_deref(),
            Some("1,2,3,4")
        );
    }

    /// Settling finds a delivery by where the pump read it; one whose
    /// subscriber updated the delivery row itself has moved, and is settled
    /// by id instead: done once, its attempt counted once.
    #[pg_test]
    fn a_subscriber_that_updates_its_own_delivery_row_is_still_settled_once() {
        Spi::run(
            "CREATE FUNCTION public.touchy(m sturdy.outbox, attempt int) RETURNS void LANGUAGE sql
               AS $$ UPDATE sturdy.deliveries SET last_error = 'touched' WHERE outbox_id = m.id $$;
             SELECT sturdy.subscribe('t', 'public.touchy(sturdy.outbox, integer)');
             SELECT sturdy.emit('t', '1'); SELECT sturdy.emit('t', '2');",
        )
        .unwrap();
        assert_eq!(pump(10), "2/2/0/0");
        assert_eq!(pump(10), "0/0/0/0");
        assert_eq!(
            text("SELECT string_agg(format('%s %s %s', state, attempts, last_error), ',') FROM sturdy.deliveries")
                .as_deref(),
            Some("done 1 touched,done 1 touched")
        );
    }

    #[pg_test]
    fn a_dropped_subscriber_is_a_recorded_failure_and_unsubscribe_stops_new_deliveries() {
        subscribers();
        Spi::run(
            "SELECT sturdy.subscribe('e', 'public.ok(sturdy.outbox, integer)', 1);
             SELECT sturdy.emit('e', '1');",
        )
        .unwrap();
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT sturdy.unsubscribe('e', 'public.ok(sturdy.outbox, integer)')"
            )
            .unwrap(),
            Some(true)
        );
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT sturdy.unsubscribe('e', 'public.ok(sturdy.outbox, integer)')"
            )
            .unwrap(),
            Some(false)
        );
        assert_eq!(
            text("SELECT format('%s', deliveries) FROM sturdy.emit('e', '2')").as_deref(),
            Some("0")
        );
        Spi::run("DROP FUNCTION public.ok(sturdy.outbox, integer)").unwrap();
        assert_eq!(
            pump(10),
            "1/0/0/1",
            "the delivery made before unsubscribe still goes out"
        );
        assert_eq!(
            text("SELECT format('%s %s', last_sqlstate, last_error) FROM sturdy.deliveries")
                .as_deref(),
            Some("42883 subscriber function public.ok(sturdy.outbox,integer) does not exist")
        );
    }

    #[pg_test]
    fn bad_input_gets_a_clear_error_and_writes_nothing() {
        subscribers();
        Spi::run(
            "CREATE FUNCTION public.wrong(m jsonb) RETURNS void LANGUAGE sql AS 'SELECT';
             CREATE PROCEDURE public.proc(m sturdy.outbox, attempt int) LANGUAGE sql AS 'SELECT';",
        )
        .unwrap();
        let ok = "'public.ok(sturdy.outbox, integer)'";
        for (sql, state) in [
            (
                "SELECT sturdy.subscribe('e', 'public.wrong(jsonb)')".to_owned(),
                "22023",
            ),
            (
                "SELECT sturdy.subscribe('e', 'public.proc(sturdy.outbox, integer)')".into(),
                "22023",
            ),
            (
                "SELECT sturdy.subscribe('e', 'pg_catalog.now()')".into(),
                "22023",
            ),
            (
                "SELECT sturdy.subscribe('e', 999999::oid::regprocedure)".into(),
                "42883",
            ),
            (format!("SELECT sturdy.subscribe('', {ok})"), "22023"),
            (format!("SELECT sturdy.subscribe(NULL, {ok})"), "22004"),
            ("SELECT sturdy.subscribe('e', NULL)".into(), "22004"),
            (format!("SELECT sturdy.subscribe('e', {ok}, 0)"), "22023"),
            (format!("SELECT sturdy.subscribe('e', {ok}, NULL)"), "22004"),
            (format!("SELECT sturdy.unsubscribe('', {ok})"), "22023"),
            ("SELECT sturdy.emit('', '1')".into(), "22023"),
            ("SELECT sturdy.emit(NULL, '1')".into(), "22004"),
            ("SELECT sturdy.emit('e', NULL)".into(), "22004"),
            ("SELECT sturdy.emit('e', '1', '')".into(), "22023"),
            ("SELECT sturdy.emit('e', '\"\\u0000\"')".into(), "22P05"),
            ("SELECT sturdy.pump(0)".into(), "22023"),
            ("SELECT sturdy.pump(-1)".into(), "22023"),
            ("SELECT sturdy.pump(NULL)".into(), "22004"),
            ("SELECT sturdy.redrive(NULL)".into(), "22004"),
        ] {
            assert_eq!(sqlstate_of(&sql), state, "{sql}");
        }
        assert!(
            error_of("SELECT sturdy.subscribe('e', 'public.wrong(jsonb)')")
                .contains("must be a plain function taking (sturdy.outbox, integer)")
        );
        assert_eq!(count("sturdy.subscriptions"), 0);
        assert_eq!(count("sturdy.outbox"), 0);
        assert_eq!(count("sturdy.deliveries"), 0);
    }

    /// The wakeup mark: set by a pump that found nothing, cleared by the next
    /// emit with deliveries (which sends the NOTIFY), not by one without.
    #[pg_test]
    fn an_empty_pump_leaves_the_mark_and_the_next_emit_clears_it() {
        subscribers();
        Spi::run("SELECT sturdy.subscribe('e', 'public.ok(sturdy.outbox, integer)')").unwrap();
        assert_eq!(pump(5), "0/0/0/0");
        assert_eq!(count("sturdy.outbox_waiters"), 1);
        Spi::run("SELECT sturdy.emit('nobody', '1')").unwrap();
        assert_eq!(count("sturdy.outbox_waiters"), 1);
        Spi::run("SELECT sturdy.emit('e', '1')").unwrap();
        assert_eq!(count("sturdy.outbox_waiters"), 0);
    }
}
