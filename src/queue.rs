//! The queue: which workflows want a pass, and when.
//!
//! One row per (queue, workflow), scored by `visible_at`: in the past means
//! due, in the future sleeping (waiting for a deadline). `take` leases the
//! oldest due rows that no one holds: it sets `leased_until`, which it hands
//! back as a *receipt*, and leaves `visible_at` alone, so the update touches
//! no indexed column and is HOT (no index entry, half the WAL; measured in
//! docs/internals.md). Everything that wants another pass — `schedule`,
//! `arrive` — writes `visible_at` unconditionally and clears the lease,
//! landing on top of a pass in flight; `done` and `wake_at` are conditional on
//! the receipt still matching, so a wakeup that arrived mid-pass is never
//! thrown away by the pass finishing.
//!
//! Takers fan out instead of queueing on the head: `FOR UPDATE SKIP LOCKED`
//! passes over rows another taker is locking. The candidate rows are chosen in
//! a `MATERIALIZED` CTE so `max` bounds what the statement leases, whatever
//! plan is chosen (a `SKIP LOCKED` sub-select rescanned on the inner side of
//! a join would lease different rows on every rescan).
//!
//! Idle workers need not poll, and busy ones pay nothing for that. PostgreSQL
//! commits a transaction that sent `NOTIFY` under one cluster-wide lock held
//! through its WAL flush, so notifying on every schedule would make a busy
//! system commit its schedules one at a time. Instead a worker says it is idle
//! by the `take` that found nothing: that take leaves a mark for its queue
//! (`sturdy.queue_waiters`) and bumps the idle epoch (`sturdy.queue_idle`, a
//! sequence). A schedule (or `arrive`, or a `wake_at` that is already due)
//! that makes a row ready removes the mark and, only if it found one, sends
//! `NOTIFY sturdy, '<queue>'`, delivered at commit (dropped with a rollback).
//! While workers keep finding work there is no mark and no notification.
//!
//! A schedule does not even look for the mark while the epoch stands where it
//! stood when this backend last found the queue unmarked ([`Unmarked`]): a
//! mark is only ever made with a bump, so a busy queue's schedule costs its
//! upsert, not a probe of another table (and the sequence is read at most
//! every quarter second of a backend's transaction starts, see [`idle`]).
//!
//! The guarantee: a schedule that starts at least a second after an empty
//! take committed wakes the workers listening on that queue; one that ran
//! concurrently with the empty take (or whose transaction had started
//! before it) may miss it, and the worker's own poll interval bounds that
//! delay (as it bounds a deadline passing, which wakes nobody).

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use pg_sturdy_macros::sql_function;
use pgrx::IntoDatum;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys;

use crate::access;
use crate::args::{self, Name};
use crate::checkpoint;
use crate::datum::{Jsonb, Text, TextArray, TidArray, TimestampArray};
use crate::error::{Error, Result};
use crate::fmgr::Args;
use crate::heads;
use crate::plan::{self, Statement, first_value, run_one};
use crate::rescan::{LEAST_DUE, Position, Rescans, START, ScanFrom, floor_after, time_param};

/// The same statement for the current schema and for 0.1.0's (see
/// [`schema`]): `$sql` is a macro that writes it for either, by
/// [`receipt`] and [`clear_lease`].
macro_rules! statements {
    ($current:ident, $released:ident, $sql:ident, $args:expr, $generic:literal) => {
        static $current: Statement = Statement {
            sql: $sql!(current),
            args: $args,
            writes: true,
            generic: $generic,
        };
        static $released: Statement = Statement {
            sql: $sql!(released),
            args: $args,
            writes: true,
            generic: $generic,
        };
    };
}

/// What a write that wants another pass sets besides `visible_at`: no lease.
macro_rules! clear_lease {
    (current) => {
        ", leased_until = NULL"
    };
    (released) => {
        ""
    };
}

/// Upsert the row to `visible_at`, forgetting any lease on it. The statement
/// a team would write, and nothing else: whether the row is ready, the
/// generation bump of a past-dated one (see [`Floor`]) and the wakeup are
/// decided in [`schedule_at`] (measured: probing the waiter mark in this
/// statement cost schedule 34k instructions a call, docs/internals.md). Run
/// only where `access` cannot do the same upsert without it.
macro_rules! schedule {
    ($schema:tt) => {
        concat!(
            "INSERT INTO sturdy.queue AS q (queue, workflow, visible_at, taken_at",
            no_lease!($schema, ", leased_until"),
            ", scheduled_at)
          VALUES ($3, $1, $2, NULL",
            no_lease!($schema, ", NULL"),
            ", pg_catalog.now())
          ON CONFLICT (queue, workflow) DO UPDATE
             SET visible_at = EXCLUDED.visible_at, taken_at = NULL",
            clear_lease!($schema),
            ", scheduled_at = EXCLUDED.scheduled_at"
        )
    };
}

/// `$sql` where the schema has a lease column (see [`clear_lease`]): an
/// inserted row names it, so that it is NULL whatever its default.
macro_rules! no_lease {
    (current, $sql:literal) => {
        $sql
    };
    (released, $sql:literal) => {
        ""
    };
}
statements!(
    SCHEDULE,
    SCHEDULE_RELEASED,
    schedule,
    &[pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID],
    false
);

/// The column that holds a taken row's receipt: `leased_until`, or in
/// 0.1.0's schema `visible_at` (see [`schema`]).
macro_rules! receipt {
    (current) => {
        "leased_until"
    };
    (released) => {
        "visible_at"
    };
}

/// Is the queue marked (a worker found it empty and waits)?
static MARKED: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM sturdy.queue_waiters w WHERE w.queue OPERATOR(pg_catalog.=) $1)",
    args: &[pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

// `take`: lease the oldest ready rows; `leased_until` is the receipt.
// With `claim`, every taken workflow is also claimed for the same lease in the
// same statement, with the claim upsert of `claim.rs` (the token is NULL
// where someone still holds the claim).
//
// The chosen rows are updated through their `ctid`s (we hold their row
// locks, so the tuple ids are stable for the statement): a TID scan whatever
// the planner believes. Joined back by key, a backlog that arrived after the
// last ANALYZE made the plan scan the queue once per row (measured: 680 ms
// instead of 1.8 ms to take 100 of 50,000).
//
// One row the TID scan cannot lease: a version written by a transaction that
// committed after the statement's snapshot was taken, and before `due`
// locked the row (a schedule or `arrive` of a ready row that leaves it
// ready). Read committed, the lock goes on to that newest version, the
// recheck finds it due, and `due` returns its `ctid`; but the update sees
// through the snapshot, which cannot see that version, so it leases nothing
// there. Measured with one row rescheduled in a loop: 354 of 5,000 takes
// came back empty holding the lock on the ready row. So every take statement
// returns each row of `due`, those `taken` missed with a NULL workflow
// (kept out of the call's result), and [`take_from`] runs the statement
// again for them: a new statement, a new snapshot, which sees the version we
// locked (and hold: nobody can move it again).
//
// A row is due when its `visible_at` and any lease's end are at or before
// `$6`: the transaction's `now()`, or the clock for the one scan that
// follows a take come up short in a transaction whose `now()` is stale
// (see [`take`]).
//
// The scan starts at a floor, the place (`$4`, `$5`) in the index's
// (visible_at, seq) order (see [`Floor`]): (`-infinity`, the least bigint)
// for a scan from the start, else this backend's floor for the queue. Each
// statement returns, after the declared columns, the rows' `visible_at` and
// `seq` (their place); a batch's also where each row's new version lives
// (see [`Leased`]). A leased row keeps its place, and the scan passes over
// it (a heap visit, no index entry to skip it by) until its lease ends or it
// is done; a take's floor is past the rows it leased itself.
//
// For batches, `LIMIT $3` makes the planner cost the generic plan for a
// tenth of the table, so the plan cache would re-plan every call (~0.15 ms);
// those two always run their generic plan (`generic: true`), the same index
// scan on (queue, visible_at, seq) a custom plan picks.

const TAKE_ARGS: &[pg_sys::Oid] = &[
    pg_sys::TEXTOID,
    pg_sys::INTERVALOID,
    pg_sys::INT8OID,
    pg_sys::TIMESTAMPTZOID,
    pg_sys::INT8OID,
    pg_sys::TIMESTAMPTZOID,
];

/// The candidate rows from the floor on: the head of every take statement,
/// followed by its `LIMIT`.
macro_rules! take_due {
    (current) => {
        "WITH due AS MATERIALIZED (
              SELECT ctid, workflow, visible_at, seq FROM sturdy.queue
               WHERE queue OPERATOR(pg_catalog.=) $1
                 AND visible_at OPERATOR(pg_catalog.<=) $6
                 AND (visible_at, seq) OPERATOR(pg_catalog.>=) ($4, $5)
                 AND (leased_until IS NULL OR leased_until OPERATOR(pg_catalog.<=) $6)
               ORDER BY visible_at, seq"
    };
    // 0.1.0's schema, before `ALTER EXTENSION pg_sturdy UPDATE`: no `seq`,
    // so the floor is a time ($5 unused), and due means due by `now()` ($6
    // unused).
    (released) => {
        "WITH due AS MATERIALIZED (
              SELECT ctid, workflow, visible_at, 0::bigint AS seq FROM sturdy.queue
               WHERE queue OPERATOR(pg_catalog.=) $1
                 AND visible_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                 AND visible_at OPERATOR(pg_catalog.>=) $4
               ORDER BY visible_at"
    };
}

/// A take statement for the current schema and one for a released one's
/// (see [`schema`]), alike but for their `due` and how they lease: `$limit`
/// ends `due`, `$lease_where` picks the rows to lease (see [`take_lease`]),
/// and the rest follows.
macro_rules! take_statements {
    ($current:ident, $released:ident, $generic:literal, $limit:literal, $lease_where:literal, $($rest:expr),+) => {
        static $current: Statement = Statement {
            sql: concat!(take_due!(current), $limit, take_lease!(current, $lease_where), $($rest),+),
            args: TAKE_ARGS,
            writes: true,
            generic: $generic,
        };
        static $released: Statement = Statement {
            sql: concat!(take_due!(released), $limit, take_lease!(released, $lease_where), $($rest),+),
            args: TAKE_ARGS,
            writes: true,
            generic: $generic,
        };
    };
}

/// The rows of `due` leased, through their `ctid`s: `$lease_where` picks
/// them (one row: `= (SELECT ctid FROM due)`, an InitPlan; a batch:
/// `= ANY (ARRAY(SELECT ctid FROM due))`). `taken` returns each one's
/// workflow, receipt and new tuple id.
macro_rules! take_lease {
    ($schema:tt, $lease_where:literal) => {
        concat!(
            "      FOR UPDATE SKIP LOCKED),
          taken AS (
              UPDATE sturdy.queue AS q
                 SET ",
            receipt!($schema),
            " = pg_catalog.now() OPERATOR(pg_catalog.+) $2, taken_at = pg_catalog.now(),
                     takes = q.takes OPERATOR(pg_catalog.+) 1
               WHERE q.ctid OPERATOR(pg_catalog.=) ",
            $lease_where,
            "
              RETURNING q.workflow, q.",
            receipt!($schema),
            " AS receipt, q.ctid AS tid)"
        )
    };
}

/// `taken` also claimed, as `claim` does.
macro_rules! take_claim {
    () => {
        ",
          claimed AS (
              INSERT INTO sturdy.claims AS held (workflow, token, held_until, owner, claimed_at)
              SELECT workflow, 1, receipt, NULL, pg_catalog.now() FROM taken
              ON CONFLICT (workflow) DO UPDATE
                 SET token = held.token OPERATOR(pg_catalog.+) 1, held_until = EXCLUDED.held_until,
                     owner = EXCLUDED.owner, claimed_at = EXCLUDED.claimed_at
               WHERE held.held_until OPERATOR(pg_catalog.<=) pg_catalog.now()
              RETURNING held.workflow, held.token)"
    };
}

take_statements!(
    TAKE_ONE,
    TAKE_ONE_RELEASED,
    false,
    " LIMIT 1",
    "(SELECT ctid FROM due)",
    "
          SELECT t.workflow, t.receipt, NULL::bigint, d.visible_at, d.seq
            FROM due d LEFT JOIN taken t ON true"
);

take_statements!(
    TAKE_ONE_CLAIM,
    TAKE_ONE_CLAIM_RELEASED,
    false,
    " LIMIT 1",
    "(SELECT ctid FROM due)",
    take_claim!(),
    "
          SELECT t.workflow, t.receipt, (SELECT token FROM claimed), d.visible_at, d.seq
            FROM due d LEFT JOIN taken t ON true"
);

take_statements!(
    TAKE_MANY,
    TAKE_MANY_RELEASED,
    true,
    " LIMIT $3",
    "ANY (ARRAY(SELECT ctid FROM due))",
    "
          SELECT t.workflow, t.receipt, NULL::bigint, d.visible_at, d.seq, t.tid
            FROM due d LEFT JOIN taken t ON t.workflow OPERATOR(pg_catalog.=) d.workflow
           ORDER BY d.visible_at, d.seq"
);

take_statements!(
    TAKE_MANY_CLAIM,
    TAKE_MANY_CLAIM_RELEASED,
    true,
    " LIMIT $3",
    "ANY (ARRAY(SELECT ctid FROM due))",
    take_claim!(),
    "
          SELECT t.workflow, t.receipt, c.token, d.visible_at, d.seq, t.tid
            FROM due d LEFT JOIN taken t ON t.workflow OPERATOR(pg_catalog.=) d.workflow
            LEFT JOIN claimed c ON c.workflow OPERATOR(pg_catalog.=) t.workflow
           ORDER BY d.visible_at, d.seq"
);

/// Wake the workers waiting on a queue: clear its mark, and notify if this
/// call cleared it (of two schedules racing here, one notifies).
static WAKE: Statement = Statement {
    sql: "DELETE FROM sturdy.queue_waiters WHERE queue OPERATOR(pg_catalog.=) $1
          RETURNING pg_catalog.pg_notify('sturdy', $1)",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// A take that found nothing: its worker is about to wait, so the next
/// schedule that makes a row ready in this queue should notify. Followed by a
/// bump of the idle epoch (see [`Unmarked`]).
static MARK_IDLE: Statement = Statement {
    sql: "INSERT INTO sturdy.queue_waiters (queue, since) VALUES ($1, pg_catalog.now())
          ON CONFLICT (queue) DO NOTHING",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// `done` for a batch: each (workflow, receipt) pair under the receipt rule.
/// How many went is SPI's count of rows processed: no `RETURNING`, so SPI
/// builds no result table (see [`DONE`]).
macro_rules! done_many {
    ($schema:tt) => {
        concat!(
            "DELETE FROM sturdy.queue q
           USING ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS d(workflow, receipt)
           WHERE q.queue OPERATOR(pg_catalog.=) $3 AND q.workflow OPERATOR(pg_catalog.=) d.workflow
             AND q.",
            receipt!($schema),
            " OPERATOR(pg_catalog.=) d.receipt"
        )
    };
}
statements!(
    DONE_MANY,
    DONE_MANY_RELEASED,
    done_many,
    &[
        pg_sys::TEXTARRAYOID,
        pg_sys::TIMESTAMPTZARRAYOID,
        pg_sys::TEXTOID,
    ],
    false
);

/// `done` for rows of this backend's last batch take, straight to where
/// their leased versions live (see [`Leased`]): `$4` holds each row's tuple
/// id, at the position of its workflow in `$1`. A row version there counts
/// only if it is still the one leased, for this workflow and receipt; a row
/// rescheduled since has moved on, and the tuple id finds its dead version.
/// The plan is a TID scan nested in the pairs, or, on a table of a few
/// pages, a scan of them. Never key descents: the workflow test is wrapped
/// in `IS TRUE` (the same test in a `WHERE`) so that the primary key cannot
/// serve it. A generic plan, kept.
macro_rules! done_leased {
    ($schema:tt) => {
        concat!(
            "DELETE FROM sturdy.queue q
           USING ROWS FROM (pg_catalog.unnest($4), pg_catalog.unnest($1)) AS d(tid, workflow)
           WHERE q.ctid OPERATOR(pg_catalog.=) d.tid AND (q.workflow OPERATOR(pg_catalog.=) d.workflow) IS TRUE
             AND q.queue OPERATOR(pg_catalog.=) $3 AND q.",
            receipt!($schema),
            " OPERATOR(pg_catalog.=) $2"
        )
    };
}
statements!(
    DONE_LEASED,
    DONE_LEASED_RELEASED,
    done_leased,
    &[
        pg_sys::TEXTARRAYOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TEXTOID,
        pg_sys::TIDARRAYOID,
    ],
    true
);

/// The queue's table, for `done` and a one-row `take` without a statement
/// (see `access`); its columns by position.
pub(crate) static QUEUE: access::Table = access::Table::new(
    c"sturdy",
    c"queue",
    &[
        c"queue",
        c"workflow",
        c"leased_until",
        c"visible_at",
        c"seq",
        c"taken_at",
        c"takes",
        c"scheduled_at",
    ],
);
pub(crate) const Q_QUEUE: access::Col = access::Col(0);
pub(crate) const Q_WORKFLOW: access::Col = access::Col(1);
pub(crate) const Q_LEASED_UNTIL: access::Col = access::Col(2);
const Q_VISIBLE_AT: access::Col = access::Col(3);
const Q_SEQ: access::Col = access::Col(4);
const Q_TAKEN_AT: access::Col = access::Col(5);
const Q_TAKES: access::Col = access::Col(6);
const Q_SCHEDULED_AT: access::Col = access::Col(7);

static LEASE_COLUMNS: access::LeaseColumns = access::LeaseColumns {
    queue: Q_QUEUE,
    visible_at: Q_VISIBLE_AT,
    seq: Q_SEQ,
    leased_until: Q_LEASED_UNTIL,
    taken_at: Q_TAKEN_AT,
    takes: Q_TAKES,
    key: Q_WORKFLOW,
};

/// Remove the row under the receipt rule. Whether it went is SPI's count of
/// rows processed: a `RETURNING` would make SPI build a result table (a
/// memory context and a copied tuple) for one bit of answer.
macro_rules! done_one {
    ($schema:tt) => {
        concat!(
            "DELETE FROM sturdy.queue
           WHERE queue OPERATOR(pg_catalog.=) $3 AND workflow OPERATOR(pg_catalog.=) $1
             AND ",
            receipt!($schema),
            " OPERATOR(pg_catalog.=) $2"
        )
    };
}
statements!(
    DONE,
    DONE_RELEASED,
    done_one,
    &[pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID],
    false
);

/// Suspend until `at` under the receipt rule; a wakeup that landed meanwhile
/// wins (it is sooner, and the deadline lives in the checkpoints anyway). An
/// `at` already due wakes idle workers as a schedule does, and one before
/// `now()` bumps take's generation.
macro_rules! wake_at {
    ($schema:tt) => {
        concat!(
            "WITH moved AS (
              UPDATE sturdy.queue SET visible_at = $3, taken_at = NULL",
            clear_lease!($schema),
            "
               WHERE queue OPERATOR(pg_catalog.=) $4 AND workflow OPERATOR(pg_catalog.=) $1
                 AND ",
            receipt!($schema),
            " OPERATOR(pg_catalog.=) $2
              RETURNING visible_at OPERATOR(pg_catalog.<=) pg_catalog.now() AS ready)
          SELECT ready AND EXISTS (SELECT FROM sturdy.queue_waiters w WHERE w.queue OPERATOR(pg_catalog.=) $4),
                 CASE WHEN $3 OPERATOR(pg_catalog.<) pg_catalog.now()
                      THEN pg_catalog.nextval(pg_catalog.to_regclass('sturdy.queue_generation')) END
            FROM moved"
        )
    };
}
statements!(
    WAKE_AT,
    WAKE_AT_RELEASED,
    wake_at,
    &[
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TEXTOID,
    ],
    false
);

/// Make `workflow` visible in `queue` at `visible_at`, for validated
/// arguments. `schedule` and `arrive` both end here.
pub fn schedule_at(workflow: Name, visible_at: TimestampWithTimeZone, queue: Name) -> Result<()> {
    // `now()` in SQL: the transaction's start
    let now = pg_sys::TimestampTz::from(pgrx::datum::now());
    let at = pg_sys::TimestampTz::from(visible_at);
    // [`SCHEDULE`]'s upsert without the statement, where nothing it would
    // do is skipped that way (see `access`)
    let upserted = match (queue.into_datum(), workflow.into_datum()) {
        (Some(q), Some(w)) => QUEUE.with(&[pg_sys::ACL_INSERT, pg_sys::ACL_UPDATE], |table| {
            table.upsert(&access::Upsert {
                key: &[(Q_QUEUE, q), (Q_WORKFLOW, w)],
                set: &[
                    (
                        Q_VISIBLE_AT,
                        pg_sys::TIMESTAMPTZOID,
                        Some(pg_sys::Datum::from(at)),
                    ),
                    (Q_TAKEN_AT, pg_sys::TIMESTAMPTZOID, None),
                    (Q_LEASED_UNTIL, pg_sys::TIMESTAMPTZOID, None),
                    (
                        Q_SCHEDULED_AT,
                        pg_sys::TIMESTAMPTZOID,
                        Some(pg_sys::Datum::from(now)),
                    ),
                ],
                fill: &[
                    (Q_TAKES, access::Fill::Int4(0)),
                    (Q_SEQ, access::Fill::Next(&schema::SEQUENCE)),
                ],
                insert_only: &[],
                only_if: None,
                increment: None,
            })
        })?,
        _ => None,
    };
    if upserted.is_none() {
        run_one(
            schema::pick(&SCHEDULE, &SCHEDULE_RELEASED),
            &[workflow.into(), visible_at.into(), queue.into()],
            |_| Ok(()),
        )?;
    }
    if at < now {
        generation::bump();
    }
    if at <= now {
        wake_if_waited(queue)?;
    }
    Ok(())
}

/// Where this backend last found a queue unmarked, by the idle epoch.
///
/// Every mark is made with a bump of `sturdy.queue_idle`, so while the epoch
/// stands where it stood when a probe found the queue unmarked, no worker can
/// have marked it since, and a schedule need not look. The bump comes before
/// the mark's commit, though: a probe that ran in between saw no mark and
/// proves nothing. So after this backend first sees an epoch, it keeps
/// probing on every ready schedule until one whose transaction started
/// [`SETTLE`] later finds the queue unmarked; only that one is trusted. A
/// mark committed more than `SETTLE` after its bump (a take inside a long
/// transaction) may be missed, and the worker's poll interval bounds the
/// delay, as for a schedule that ran concurrently with the empty take.
struct Unmarked {
    /// The epoch the entry is about.
    epoch: i64,
    /// When this backend first read that epoch (clock time).
    seen: pg_sys::TimestampTz,
    /// A probe trusted for this epoch found the queue unmarked.
    settled: bool,
}

/// How long a mark may take to commit after its bump and still be found.
const SETTLE: pg_sys::TimestampTz = 1_000_000; // µs

thread_local! {
    static UNMARKED: RefCell<HashMap<Vec<u8>, Unmarked>> = RefCell::new(HashMap::new());
}

/// A row of `queue` is ready now: wake its waiting workers, if any may wait.
fn wake_if_waited(queue: Name) -> Result<()> {
    // a schema of a released version has no epoch: always look
    let Some(epoch) = idle::read() else {
        return wake(queue);
    };
    let settled = UNMARKED.with(|u| {
        u.borrow()
            .get(queue.bytes())
            .is_some_and(|m| m.epoch == epoch && m.settled)
    });
    if settled {
        return Ok(());
    }
    if run_one(&MARKED, &[queue.into()], first_value::<bool>)? == Some(true) {
        return wake(queue);
    }
    let started = pg_sys::TimestampTz::from(pgrx::datum::now());
    let clock = pg_sys::TimestampTz::from(pgrx::datum::clock_timestamp());
    UNMARKED.with(|u| {
        let mut unmarked = u.borrow_mut();
        if unmarked.len() >= FLOORS_KEPT && !unmarked.contains_key(queue.bytes()) {
            unmarked.clear();
        }
        let m = unmarked.entry(queue.bytes().to_vec()).or_insert(Unmarked {
            epoch,
            seen: clock,
            settled: false,
        });
        if m.epoch != epoch {
            *m = Unmarked {
                epoch,
                seen: clock,
                settled: false,
            };
        }
        m.settled = started >= m.seen.saturating_add(SETTLE);
    });
    Ok(())
}

/// Clear the queue's waiter mark and notify (see [`WAKE`]).
fn wake(queue: Name) -> Result<()> {
    run_one(&WAKE, &[queue.into()], |_| Ok(()))
}

#[sql_function(
    "sturdy.schedule(workflow text, visible_at timestamptz DEFAULT now(), queue text DEFAULT 'default')
     RETURNS void VOLATILE PARALLEL UNSAFE",
    comment = "Make the workflow visible in queue at visible_at (upsert: lands on top of a pass in flight, so the wakeup survives its done). When visible now and a take found the queue empty since the last notification, NOTIFY sturdy with the queue name, delivered at commit."
)]
fn schedule(
    workflow: Option<Text>,
    visible_at: Option<TimestampWithTimeZone>,
    queue: Option<Text>,
) -> Result<()> {
    let workflow = args::name("workflow", workflow)?;
    let visible_at = args::required("visible_at", visible_at)?;
    let queue = args::name("queue", queue)?;
    schedule_at(workflow, visible_at, queue)
}

/// Where this backend's takes scan a queue from.
///
/// `take` scans `queue_visible` in `visible_at` order. Rows taken and done
/// leave index entries behind at the front of that order, and while any
/// snapshot older than their deletion lives (a forgotten `BEGIN`, a long
/// report: a pinned xmin) vacuum cannot remove them, nor can index scans mark
/// them dead, so a scan from the start walks all of them, heap visits and
/// all, on every take: measured, a 16-client churn fell to a fifth of its rate
/// within minutes (docs/benchmarks.md, the churn soak).
///
/// So each backend keeps, per queue, a floor: the place in (`visible_at`,
/// `seq`) order of the oldest row its last take found (every entry before it
/// is of a row taken, or held by another take), or where that is lower the
/// later of [`SLACK`](crate::rescan::SLACK) before that take's transaction
/// began and the oldest running transaction's start ([`floor_after`]); its
/// next take scans from there. Since `seq` makes
/// every place in the index distinct, a take never walks the entries of a
/// drained batch scheduled with one `visible_at`, however long it was. A row
/// can be ready below the floor only by being written there: a past-dated
/// schedule or `wake_at` (they bump `sturdy.queue_generation`, and a take
/// that sees it changed scans from the start), a write committed more than
/// `SLACK` after its `visible_at` while the queue moved on, or a take of it
/// rolled back; or by its lease running out with no `done` (a lease keeps
/// the row in its place). For those, a take scans from the start when it
/// comes up short, on a generation change, and on the schedule of
/// [`Rescans`] (at least every second; rate-limited once such scans get
/// costly), a schedule the backends of a server share per queue where they
/// share floors ([`heads::claim_scan`]: one of them runs the scan due, not
/// each). With a healthy vacuum every short take and every generation
/// change scans from the start, and FIFO order is exact but for a row whose
/// write committed more than `SLACK` after its `visible_at` behind a busy
/// queue (or whose take rolled back, or whose lease ran out), which waits at
/// most a second.
struct Floor {
    /// Scan from this place.
    at: Position,
    /// The generation the floor holds for (`None`: unknown, it holds for none).
    generation: Option<i64>,
    rescans: Rescans,
    /// The last scan from the start found rows below where the takes stood
    /// (left behind: see [`take`]): the next scans from the start too.
    drain: bool,
}

/// A take that comes up short more than this long (µs) after its
/// transaction began, or after its last scan by the clock began, scans
/// again by the clock before it says empty (see [`take`]): long enough
/// that others may have taken every row due by the time it judged by. A
/// take of an empty queue takes a few dozen microseconds.
const RECHECK_AFTER: pg_sys::TimestampTz = 1_000;

/// The most scans by the clock a take that came up short runs (see [`take`]).
const CLOCK_SCANS: usize = 4;

/// Queues a backend keeps floors for; past this many it forgets them all.
const FLOORS_KEPT: usize = 1024;

thread_local! {
    static FLOORS: RefCell<HashMap<Vec<u8>, Floor>> = RefCell::new(HashMap::new());
}

/// What one take statement handed out.
struct Taken {
    rows: usize,
    /// The oldest place, before the take, of the rows it locked (taken, or
    /// missed: locked but not leased, and so still ready there).
    oldest: Option<Position>,
}

/// How many times [`take_from`] runs its statement while rows come back
/// locked but not leased (see the take statements). A rerun leases every
/// row the one before missed, as it holds their locks; it can miss only rows
/// others rewrote during its own few microseconds.
const TAKE_ATTEMPTS: usize = 3;

/// The rows this backend's last batch take leased, by workflow: where each
/// one's leased version lives (its tuple id), and the receipt they share (one
/// `now()` and one lease for the whole take). An array `done` of them, the
/// batch worker's next call, goes straight to those versions
/// ([`DONE_LEASED`]) instead of descending the primary key once per row
/// (random workflow names: about three cold pages a row, docs/internals.md). A one-row take keeps its row in [`Taken1`], for the
/// single `done`, which goes to it without a statement.
///
/// Only ever a shortcut: each version is checked for its workflow, queue and
/// receipt as it is deleted, and whatever it did not remove (a row
/// rescheduled meanwhile, a table rewritten by `VACUUM FULL`, a take rolled
/// back) goes through the receipt rule by key, as any other `done` does.
struct Leased {
    queue: Vec<u8>,
    receipt: Option<pg_sys::TimestampTz>,
    rows: HashMap<Vec<u8>, pg_sys::ItemPointerData>,
}

/// The row this backend's last one-row take leased, and where its leased
/// version lives: the worker's `done` of it, its next call, deletes that
/// version straight away (`access::Opened::delete_at_if`), without the
/// primary key's pages, which for random workflow names are cold ones (a
/// done descended three pages of it, a tenth of a take and done's time at
/// one client on a core). Only ever a shortcut, as [`Leased`].
struct Taken1 {
    queue: Vec<u8>,
    workflow: Vec<u8>,
    receipt: pg_sys::TimestampTz,
    tid: pg_sys::ItemPointerData,
    /// The invalidations this backend had taken in when it leased it.
    seen: access::Invalidations,
    /// Whether it is still to be used (a `done` of it clears this, keeping
    /// the buffers).
    live: bool,
}

thread_local! {
    static LEASED: RefCell<Option<Leased>> = const { RefCell::new(None) };
    static TAKEN: RefCell<Option<Taken1>> = const { RefCell::new(None) };
    /// Array `done`s that went by tuple id, for the tests to see which way
    /// a call went (the two ways remove the same rows by design).
    #[cfg(any(test, feature = "pg_test"))]
    static BY_TID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// One-row `done`s that went to the version of the last take.
    #[cfg(any(test, feature = "pg_test"))]
    static ONE_BY_TID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Remember the rows a batch take statement leased (columns 1, 2 and 6).
fn lease_rows(queue: Name, r: &plan::Rows) {
    LEASED.with(|l| {
        let mut leased = l.borrow_mut();
        let leased = leased.get_or_insert_with(|| Leased {
            queue: queue.bytes().to_vec(),
            receipt: None,
            rows: HashMap::new(),
        });
        for i in 0..r.len() {
            let (Some(workflow), Some(receipt), Some(tid)) =
                (r.text_bytes(i, 1), r.timestamptz(i, 2), r.tid(i, 6))
            else {
                continue;
            };
            if *leased.receipt.get_or_insert(receipt) != receipt {
                continue;
            }
            leased.rows.insert(workflow.to_vec(), tid);
        }
    });
}

/// A take statement: up to `max` rows from the place `from` on, due by
/// `due`; run again while it returns rows it locked but could not lease (at
/// most [`TAKE_ATTEMPTS`] runs).
#[allow(clippy::too_many_arguments)]
fn take_from(
    call: &Args,
    stmt: &'static Statement,
    queue: Name,
    lease: Interval,
    max: i64,
    from: Position,
    due: TimestampWithTimeZone,
    batch: bool,
) -> Result<Taken> {
    let claim = std::ptr::eq(stmt, &TAKE_ONE_CLAIM);
    if (claim || std::ptr::eq(stmt, &TAKE_ONE))
        && let Some(taken) = lease_one(call, queue, lease, from, due, claim)?
    {
        return Ok(taken);
    }
    let at = time_param(from.0);
    let mut taken = Taken {
        rows: 0,
        oldest: None,
    };
    for _ in 0..TAKE_ATTEMPTS {
        let left = max - taken.rows as i64;
        let (rows, (oldest, missed)) = plan::run_as_set_then(
            call,
            stmt,
            &[
                queue.into(),
                lease.into(),
                left.into(),
                at.into(),
                from.1.into(),
                due.into(),
            ],
            |r| {
                if batch {
                    lease_rows(queue, &r);
                }
                let oldest = (0..r.len())
                    .filter_map(|i| Some((r.timestamptz(i, 4)?, r.get::<i64>(i, 5)?)))
                    .min();
                let missed = (0..r.len()).any(|i| r.text_bytes(i, 1).is_none());
                (oldest, missed)
            },
        )?;
        taken.rows += rows;
        taken.oldest = match (taken.oldest, oldest) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if !missed || taken.rows as i64 >= max {
            break;
        }
    }
    Ok(taken)
}

/// [`TAKE_ONE`]'s work without the statement (see `access`), or with
/// `claim` [`TAKE_ONE_CLAIM`]'s, the claim by [`crate::claim::claim_for`]'s
/// statement, where nothing the statement would do is skipped that way;
/// `None` where the statement must run.
fn lease_one(
    call: &Args,
    queue: Name,
    lease: Interval,
    from: Position,
    due: TimestampWithTimeZone,
    claim: bool,
) -> Result<Option<Taken>> {
    let Some(q) = queue.into_datum() else {
        return Ok(None);
    };
    plan::begin_result(call);
    // as the statement computes them: `now()` and `now() + lease`
    let now = pgrx::datum::now();
    let until = pg_sys::TimestampTz::from(args::plus(now, lease));
    let mut got = None;
    let Some(leased) = QUEUE.with(&[pg_sys::ACL_UPDATE], |table| {
        table.lease_first(
            &LEASE_COLUMNS,
            q,
            from,
            due.into(),
            until,
            now.into(),
            |row| got = Some((Text::copied(row.key), row.place, row.tid)),
        )
    })?
    else {
        return Ok(None);
    };
    let Some((workflow, place, tid)) = got.filter(|_| leased) else {
        return Ok(Some(Taken {
            rows: 0,
            oldest: None,
        }));
    };
    let workflow = args::name("workflow", Some(workflow))?;
    // (into the buffers of the last one kept: no allocation a take)
    TAKEN.with(|t| {
        let mut t = t.borrow_mut();
        let kept = t.get_or_insert_with(|| Taken1 {
            queue: Vec::new(),
            workflow: Vec::new(),
            receipt: until,
            tid,
            seen: access::Invalidations::now(),
            live: false,
        });
        kept.queue.clear();
        kept.queue.extend_from_slice(queue.bytes());
        kept.workflow.clear();
        kept.workflow.extend_from_slice(workflow.bytes());
        kept.receipt = until;
        kept.tid = tid;
        kept.seen = access::Invalidations::now();
        kept.live = true;
    });
    let token = if claim {
        crate::claim::claim_for(workflow, lease)?
    } else {
        None
    };
    plan::append_row(
        call,
        &[
            workflow.into_datum(),
            Some(pg_sys::Datum::from(until)),
            token.map(pg_sys::Datum::from),
        ],
    )?;
    Ok(Some(Taken {
        rows: 1,
        oldest: Some(place),
    }))
}

/// Returns its rows through the call (see `plan::run_as_set`).
#[sql_function(
    "sturdy.take(queue text DEFAULT 'default', lease interval DEFAULT '1 minute',
                 max integer DEFAULT 1, claim boolean DEFAULT false)
     RETURNS TABLE (workflow text, receipt timestamptz, token bigint) VOLATILE PARALLEL UNSAFE ROWS 10",
    comment = "Lease up to max of the oldest visible rows of queue for lease (FOR UPDATE SKIP LOCKED: concurrent takers never share a row). receipt is the lease's end (leased_until), which done and wake_at must match. With claim, each workflow is also claimed for the same lease (token NULL where someone still holds it). Finding nothing marks the queue as having a waiter, so the next schedule there notifies."
)]
fn take(
    call: &Args,
    queue: Option<Text>,
    lease: Option<Interval>,
    max: Option<i32>,
    claim: Option<bool>,
) -> Result<()> {
    let queue = args::name("queue", queue)?;
    let lease = args::lease("lease", lease)?;
    let max = args::positive("max", max)?;
    let claim = args::required("claim", claim)?;
    let stmt = match (max, claim, schema::current()) {
        (1, false, true) => &TAKE_ONE,
        (1, true, true) => &TAKE_ONE_CLAIM,
        (_, false, true) => &TAKE_MANY,
        (_, true, true) => &TAKE_MANY_CLAIM,
        (1, false, false) => &TAKE_ONE_RELEASED,
        (1, true, false) => &TAKE_ONE_CLAIM_RELEASED,
        (_, false, false) => &TAKE_MANY_RELEASED,
        (_, true, false) => &TAKE_MANY_CLAIM_RELEASED,
    };
    let batch = max > 1;
    if batch {
        LEASED.with(|l| *l.borrow_mut() = None);
    }
    let start = Instant::now();
    let now = pgrx::datum::now();
    // Read before any scan: a past-dated write that bumps it after this
    // point is found by the next take.
    let (installation, generation) = generation::read();
    // the floors other backends reached here (`heads`), for this generation
    let shared = installation
        .zip(generation)
        .and_then(|(oid, g)| Some((heads::Queue::new(oid, queue.bytes())?, g)));
    // From the floor, or from the start; and whether a short take may go
    // back to the start. Rate-limited, the floor holds whatever the
    // generation; otherwise only for the generation it was found under.
    // A floor goes on to the furthest another backend reached under this
    // generation, which holds as one's own would.
    //
    // A scan from the start due by the backend's own schedule is skipped
    // where another backend of the server ran one of this queue within that
    // schedule's interval (`heads::claim_scan`): one a second for the
    // server, not one a second for each of its backends. One that found a
    // row below where the takes stood leaves `drain` set: this backend's
    // next takes scan from the start too (as often as the rate limit lets
    // them), until one finds nothing left there.
    //
    // (where to start, whether a short take may go back to the start) or
    // `None`: from the start; and where a take by the floor would have
    // started (`None`: the floor holds for no generation of now)
    let (floor, stood) = FLOORS.with(|f| {
        let floors = f.borrow();
        let Some(fl) = floors.get(queue.bytes()) else {
            // This backend's first take here: from the floor another one
            // reached under this generation, where one did (it holds as
            // this backend's own would) and some backend scanned from the
            // start less than a second ago, not through the whole dead
            // front; rows left below it are the periodic scans'. Where none
            // did, this take is the periodic scan: a server whose every
            // connection takes once (a `pg_cron` job's) still scans from the
            // start once a second.
            let reached = shared.and_then(|(q, g)| Some((q, heads::read(&q, g)?)));
            let adopted = reached.filter(|(q, _)| !heads::claim_scan(q, clock(), every(LEAST_DUE)));
            return (adopted.map(|(_, at)| (at, true)), reached.map(|(_, at)| at));
        };
        let further = shared.and_then(|(q, g)| heads::read(&q, g));
        let at = further.map_or(fl.at, |f| f.max(fl.at));
        let holds = fl.generation.is_some() && fl.generation == generation;
        let floor = match fl.rescans.next(start) {
            ScanFrom::Start if holds && !fl.drain => match shared {
                Some((q, _)) if !heads::claim_scan(&q, clock(), every(fl.rescans.due())) => {
                    Some((at, true))
                }
                _ => None,
            },
            ScanFrom::Start => None,
            ScanFrom::Floor(false) => Some((at, false)),
            ScanFrom::Floor(true) if holds && !fl.drain => Some((at, true)),
            ScanFrom::Floor(true) => None,
        };
        (floor, holds.then_some(at))
    });
    let (mut taken, mut full, may_rescan) = match floor {
        Some((at, may)) => (
            take_from(call, stmt, queue, lease, max.into(), at, now, batch)?,
            None,
            may,
        ),
        None => {
            let t = take_from(call, stmt, queue, lease, max.into(), START, now, batch)?;
            (t, Some(start.elapsed()), true)
        }
    };
    if taken.rows < max as usize && full.is_none() && may_rescan {
        // Came up short from the floor: the start decides.
        let again = Instant::now();
        let left = (max as usize - taken.rows) as i64;
        let more = take_from(call, stmt, queue, lease, left, START, now, batch)?;
        full = Some(again.elapsed());
        taken = Taken {
            rows: taken.rows + more.rows,
            oldest: match (taken.oldest, more.oldest) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        };
    }
    // rows found below where the takes stood: left behind (see above)
    let drain = stood
        .zip(taken.oldest)
        .is_some_and(|(stood, oldest)| oldest < stood);
    remember(
        queue,
        &taken,
        full.map(|cost| (cost, drain)),
        stood,
        generation,
    );
    // Due means due by `now()`, the transaction's start. When the take comes
    // up short with that stale, the scans may have judged by a time gone
    // by: while they walked, the others took every row due by it, and the
    // rows scheduled since are not due by it. A scan from the start that
    // walked millions of dead entries under a pinned xmin, at 16 clients on
    // two cores, took 3.7 s of clock time (docs/internals.md, take);
    // under a dead front of a million entries a first take's scan from the
    // start took a few hundred milliseconds, and the one scan by the clock
    // that followed from its own floor, as far behind, came up empty too,
    // beside a thousand ready rows; or the
    // caller's transaction began long ago. So before the take says empty
    // it scans again by the clock, from the furthest floor (its own, or one
    // another backend reached under this generation since, which holds as
    // its own would: where the others have got to), and again, by a clock
    // read afresh, while a scan came up short but took long enough for the
    // head to move on ([`RECHECK_AFTER`]), up to [`CLOCK_SCANS`] of them. Not
    // when `now()` is stale by the lease or more: the lease counts from
    // `now()`, and would have ended before the row was handed out.
    let mut stale_since = pg_sys::TimestampTz::from(now);
    for _ in 0..CLOCK_SCANS {
        if taken.rows >= max as usize {
            break;
        }
        let clock = pgrx::datum::clock_timestamp();
        let at_clock = pg_sys::TimestampTz::from(clock);
        if at_clock - stale_since <= RECHECK_AFTER
            || i128::from(at_clock - pg_sys::TimestampTz::from(now)) >= lease.as_micros()
        {
            break;
        }
        let own = FLOORS.with(|f| f.borrow().get(queue.bytes()).map(|fl| fl.at));
        let further = shared.and_then(|(q, g)| heads::read(&q, g));
        let Some(at) = own.max(further) else {
            break;
        };
        let left = (max as usize - taken.rows) as i64;
        let more = take_from(call, stmt, queue, lease, left, at, clock, batch)?;
        remember(queue, &more, None, None, generation);
        taken.rows += more.rows;
        stale_since = at_clock;
    }
    if let Some((q, g)) = shared
        && let Some(at) = FLOORS.with(|f| {
            let floors = f.borrow();
            let fl = floors.get(queue.bytes())?;
            (fl.generation == Some(g)).then_some(fl.at)
        })
    {
        heads::offer(&q, g, at);
    }
    if taken.rows == 0 {
        run_one(&MARK_IDLE, &[queue.into()], |_| Ok(()))?;
        idle::bump();
    }
    Ok(())
}

/// `clock_timestamp()` in µs, as [`heads::claim_scan`] reads the time.
fn clock() -> pg_sys::TimestampTz {
    pg_sys::TimestampTz::from(pgrx::datum::clock_timestamp())
}

/// A schedule's interval in µs, as [`heads::claim_scan`] reads it.
fn every(due: Duration) -> i64 {
    due.as_micros().try_into().unwrap_or(i64::MAX)
}

/// Keep the queue's floor after a take: the oldest row it took, or lower
/// where a transaction still to commit may write below it ([`floor_after`]; after
/// a scan from the start, which holds for `generation`; never lower than the
/// floor after one from the floor). `full`: what a scan from the start in
/// it cost, and whether it found rows left below the floor (`drain`);
/// `from`, where it started by a floor, which for a backend's first take
/// here is another backend's.
fn remember(
    queue: Name,
    taken: &Taken,
    full: Option<(Duration, bool)>,
    from: Option<Position>,
    generation: Option<i64>,
) {
    FLOORS.with(|f| {
        let mut floors = f.borrow_mut();
        let now = pg_sys::TimestampTz::from(pgrx::datum::now());
        // (the activity sample only where a floor is kept)
        let found = || floor_after(taken.oldest, now, crate::activity::running_since());
        match (floors.get_mut(queue.bytes()), full) {
            (Some(fl), None) => {
                if taken.oldest.is_some() {
                    fl.at = fl.at.max(found());
                }
            }
            (Some(fl), Some((cost, drain))) => {
                fl.at = found();
                fl.generation = generation;
                fl.rescans.again(cost);
                fl.drain = drain;
            }
            (None, Some((cost, drain))) => {
                if floors.len() >= FLOORS_KEPT {
                    floors.clear();
                }
                floors.insert(
                    queue.bytes().to_vec(),
                    Floor {
                        at: found(),
                        generation,
                        rescans: Rescans::first(cost),
                        drain,
                    },
                );
            }
            (None, None) => {
                // by the floor another backend reached: kept as this one's,
                // its first scan from the start due a second from now
                // (costing nothing, until one is measured)
                let Some(from) = from else {
                    return;
                };
                if floors.len() >= FLOORS_KEPT {
                    floors.clear();
                }
                floors.insert(
                    queue.bytes().to_vec(),
                    Floor {
                        at: if taken.oldest.is_some() {
                            from.max(found())
                        } else {
                            from
                        },
                        generation,
                        rescans: Rescans::first(Duration::ZERO),
                        drain: false,
                    },
                );
            }
        }
    });
}

/// Which schema the queue's statements run against. 0.2.0 added
/// `sturdy.queue.seq` with its sequence and `leased_until` in one update;
/// where the sequence is missing (0.1.0's schema, before `ALTER EXTENSION
/// pg_sturdy UPDATE`) so are both columns, and the queue runs the statements
/// 0.1.0 ran: `visible_at` is the lease and the receipt, a floor is a time.
mod schema {
    use crate::plan::Statement;
    use crate::sequence::Sequence;

    /// Also the default of `sturdy.queue.seq`.
    pub static SEQUENCE: Sequence = Sequence::new(c"sturdy", c"queue_seq");

    pub fn current() -> bool {
        SEQUENCE.exists()
    }

    /// `now` in the current schema, else `released`.
    pub fn pick(now: &'static Statement, released: &'static Statement) -> &'static Statement {
        if current() { now } else { released }
    }
}

/// take's generation, read directly (as an SQL expression in every take
/// statement it cost take 14% in instructions; docs/internals.md). `None` in a
/// schema of a released version, which has no such sequence: there every
/// take scans from the start, as those versions did.
mod generation {
    use crate::sequence::Sequence;

    static SEQUENCE: Sequence = Sequence::new(c"sturdy", c"queue_generation");

    /// The generation, and the sequence's OID where it exists (which names
    /// this installation's queues in `heads`).
    pub fn read() -> (Option<pgrx::pg_sys::Oid>, Option<i64>) {
        match SEQUENCE.last_value_of() {
            Some((oid, value)) => (Some(oid), value),
            None => (None, None),
        }
    }

    pub fn bump() {
        SEQUENCE.advance();
    }
}

/// The idle epoch (see [`Unmarked`]); `None` in a schema of a released
/// version, where every ready schedule looks for the mark.
///
/// A read serves this backend's schedules for [`FRESH`] of transaction
/// starts (reading the sequence cost a schedule 3.4k instructions a call,
/// docs/internals.md), which keeps the promise: a schedule whose transaction
/// starts a second after an empty take committed uses a read made at most
/// `FRESH` before that start, so after the take's bump, and looks for the
/// mark it made.
mod idle {
    use std::cell::Cell;

    use pgrx::pg_sys;

    use crate::sequence::Sequence;

    static SEQUENCE: Sequence = Sequence::new(c"sturdy", c"queue_idle");

    /// How long a read serves, by transaction start: well under the second
    /// the promise allows.
    const FRESH: pg_sys::TimestampTz = 250_000; // µs

    thread_local! {
        /// The last read, and the start of the transaction that made it.
        static LAST: Cell<Option<(Option<i64>, pg_sys::TimestampTz)>> = const { Cell::new(None) };
    }

    pub fn read() -> Option<i64> {
        let started = pg_sys::TimestampTz::from(pgrx::datum::now());
        if let Some((epoch, at)) = LAST.with(Cell::get)
            && at <= started
            && started < at.saturating_add(FRESH)
        {
            return epoch;
        }
        let epoch = SEQUENCE.last_value();
        LAST.with(|l| l.set(Some((epoch, started))));
        epoch
    }

    pub fn bump() {
        SEQUENCE.advance();
        // our own mark: the next schedule here reads the epoch it made
        LAST.with(|l| l.set(None));
    }
}

#[sql_function(
    "sturdy.done(workflow text, receipt timestamptz, queue text DEFAULT 'default')
     RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "Remove the workflow from queue if nothing rescheduled it since take (the receipt still matches). False means it was rescheduled: it stays, and will be taken again."
)]
fn done(
    workflow: Option<Text>,
    receipt: Option<TimestampWithTimeZone>,
    queue: Option<Text>,
) -> Result<bool> {
    let workflow = args::name("workflow", workflow)?;
    let receipt = args::required("receipt", receipt)?;
    let queue = args::name("queue", queue)?;
    // [`DONE`]'s work, without the statement, where nothing it would do is
    // skipped that way (see `access`)
    if let (Some(q), Some(w)) = (queue.into_datum(), workflow.into_datum())
        && let Some(done) = QUEUE.with(&[pg_sys::ACL_DELETE], |table| {
            delete_done(table, queue, workflow, (q, w), receipt.into())
        })?
    {
        return Ok(done);
    }
    run_one(
        schema::pick(&DONE, &DONE_RELEASED),
        &[workflow.into(), receipt.into(), queue.into()],
        |t| Ok(!t.is_empty()),
    )
}

/// `done`'s delete of `workflow`'s row in `queue` (their datums `qw`) on the
/// queue table opened for it: straight to the version this backend's last
/// take wrote where that is the row and the receipt (see [`Taken1`]), else
/// by key ([`access::Opened::delete_if`], `None` where that cannot be done
/// here).
pub(crate) fn delete_done(
    table: &access::Opened,
    queue: Name,
    workflow: Name,
    (q, w): (pg_sys::Datum, pg_sys::Datum),
    receipt: pg_sys::TimestampTz,
) -> Result<Option<bool>> {
    let key = [(Q_QUEUE, q), (Q_WORKFLOW, w)];
    let taken = TAKEN.with(|t| {
        let mut t = t.borrow_mut();
        let kept = t.as_mut().filter(|t| {
            t.live
                && t.receipt == receipt
                && t.workflow == workflow.bytes()
                && t.queue == queue.bytes()
        })?;
        kept.live = false;
        Some((kept.tid, kept.seen))
    });
    if let Some((tid, seen)) = taken
        && table.delete_at_if(tid, seen, &key, Q_LEASED_UNTIL, receipt)? == Some(true)
    {
        #[cfg(any(test, feature = "pg_test"))]
        ONE_BY_TID.with(|n| n.set(n.get() + 1));
        return Ok(Some(true));
    }
    table.delete_if(&key, Q_LEASED_UNTIL, receipt)
}

#[sql_function(
    "sturdy.done_many(workflows text[], receipts timestamptz[], queue text DEFAULT 'default')
     RETURNS bigint VOLATILE PARALLEL UNSAFE",
    comment = "done for a batch in one statement: removes each workflow whose receipt (same position) still matches, and returns how many were removed. NULL elements match nothing."
)]
fn done_many(
    workflows: Option<TextArray>,
    receipts: Option<TimestampArray>,
    queue: Option<Text>,
) -> Result<i64> {
    let workflows = args::required("workflows", workflows)?;
    let receipts = args::required("receipts", receipts)?;
    let queue = args::name("queue", queue)?;
    let one_dimension =
        "Pass one-dimensional arrays: the workflows and, at the same positions, their receipts.";
    match (workflows.elements(), receipts.elements()) {
        (Some(w), Some(r)) if w == r => {}
        (Some(w), Some(r)) => {
            return Err(Error::Invalid {
                arg: "receipts",
                why: format!("has {r} elements and workflows {w}"),
                hint: one_dimension,
            });
        }
        (None, _) => {
            return Err(Error::Invalid {
                arg: "workflows",
                why: "must be one-dimensional".into(),
                hint: one_dimension,
            });
        }
        (_, None) => {
            return Err(Error::Invalid {
                arg: "receipts",
                why: "must be one-dimensional".into(),
                hint: one_dimension,
            });
        }
    }
    let pairs = workflows.elements().unwrap_or(0) as i64;
    if pairs == 0 {
        return Ok(0);
    }
    let leased = match leased_tids(workflows, receipts, queue) {
        Some((receipt, tids)) => {
            #[cfg(any(test, feature = "pg_test"))]
            BY_TID.with(|n| n.set(n.get() + 1));
            plan::run_generic(
                schema::pick(&DONE_LEASED, &DONE_LEASED_RELEASED),
                &[
                    workflows.into(),
                    TimestampWithTimeZone::try_from(receipt)
                        .unwrap_or(TimestampWithTimeZone::negative_infinity())
                        .into(),
                    queue.into(),
                    tids.into(),
                ],
                |r| Ok(r.len() as i64),
            )?
        }
        None => 0,
    };
    if leased == pairs {
        return Ok(leased);
    }
    let by_key = run_one(
        schema::pick(&DONE_MANY, &DONE_MANY_RELEASED),
        &[workflows.into(), receipts.into(), queue.into()],
        |t| Ok(t.len() as i64),
    )?;
    Ok(leased + by_key)
}

/// When every pair is a row of this backend's last batch take, in `queue`,
/// with that take's receipt: the receipt, and each row's tuple id at its
/// workflow's position (see [`Leased`]).
fn leased_tids(
    workflows: TextArray,
    receipts: TimestampArray,
    queue: Name,
) -> Option<(pg_sys::TimestampTz, TidArray)> {
    LEASED.with(|l| {
        let leased = l.borrow();
        let leased = leased.as_ref()?;
        let receipt = leased.receipt?;
        if leased.queue != queue.bytes() || !receipts.each().iter().all(|r| *r == Some(receipt)) {
            return None;
        }
        let tids = workflows
            .each_bytes()
            .iter()
            .map(|w| w.and_then(|w| leased.rows.get(w).copied()))
            .collect::<Option<Vec<_>>>()?;
        Some((receipt, TidArray::new(&tids)))
    })
}

#[sql_function(
    "sturdy.wake_at(workflow text, receipt timestamptz, at timestamptz, queue text DEFAULT 'default')
     RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "Suspend the workflow until at, under the same receipt rule as done (a wakeup that landed meanwhile wins). When at is already past, wakes a waiting worker as schedule does."
)]
fn wake_at(
    workflow: Option<Text>,
    receipt: Option<TimestampWithTimeZone>,
    at: Option<TimestampWithTimeZone>,
    queue: Option<Text>,
) -> Result<bool> {
    let workflow = args::name("workflow", workflow)?;
    let receipt = args::required("receipt", receipt)?;
    let at = args::required("at", at)?;
    let queue = args::name("queue", queue)?;
    let moved = run_one(
        schema::pick(&WAKE_AT, &WAKE_AT_RELEASED),
        &[workflow.into(), receipt.into(), at.into(), queue.into()],
        |t| {
            // no row: the receipt did not match; else whether a worker waits
            if t.is_empty() {
                Ok(None)
            } else {
                Ok(Some(t.first().get_one::<bool>()?.unwrap_or(false)))
            }
        },
    )?;
    if moved == Some(true) {
        wake(queue)?;
    }
    Ok(moved.is_some())
}

/// A value's arrival and the workflow's wakeup, in one transaction: supply the
/// step, then schedule the workflow now.
#[sql_function(
    "sturdy.arrive(workflow text, step text, value jsonb, queue text DEFAULT 'default')
     RETURNS jsonb VOLATILE PARALLEL UNSAFE",
    comment = "supply the step and schedule the workflow now, in one transaction: a value's arrival and the workflow's wakeup commit together. Returns the value stored."
)]
fn arrive(
    workflow: Option<Text>,
    step: Option<Text>,
    value: Option<Jsonb>,
    queue: Option<Text>,
) -> Result<Jsonb> {
    let workflow = args::name("workflow", workflow)?;
    let step = args::name("step", step)?;
    let value = args::required("value", value)?;
    let queue = args::name("queue", queue)?;
    let stored = checkpoint::supply_value(workflow, step, value)?;
    schedule_at(workflow, pgrx::datum::now(), queue)?;
    Ok(stored)
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::testing::{count, sqlstate_of};
    use pgrx::prelude::*;

    fn one<T: pgrx::FromDatum + pgrx::IntoDatum>(sql: &str) -> Option<T> {
        Spi::get_one::<T>(sql).unwrap()
    }

    #[pg_test]
    fn take_leases_the_oldest_ready_rows_up_to_max() {
        Spi::run(
            "SELECT sturdy.schedule('w3', now() - interval '1 minute');
             SELECT sturdy.schedule('w1', now() - interval '3 minutes');
             SELECT sturdy.schedule('w2', now() - interval '2 minutes');
             SELECT sturdy.schedule('later', now() + interval '1 hour');",
        )
        .unwrap();
        let taken = one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take(max => 2)");
        assert_eq!(taken.as_deref(), Some("w1,w2"));
        let taken = one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take(max => 10)");
        assert_eq!(
            taken.as_deref(),
            Some("w3"),
            "leased and sleeping rows are not taken"
        );
        assert_eq!(one::<i64>("SELECT count(*) FROM sturdy.take()"), Some(0));
        let receipt_is_lease_end = one::<bool>(
            "SELECT leased_until = now() + interval '1 minute' AND visible_at = now() - interval '3 minutes'
               FROM sturdy.queue WHERE workflow = 'w1'",
        );
        assert_eq!(
            receipt_is_lease_end,
            Some(true),
            "the lease is leased_until; visible_at stays when it was due"
        );
    }

    /// take's lease writes no indexed column, so its update is HOT: no new
    /// index entry, the new version on the row's own page (sql/queue.sql's
    /// fill factor leaves the room), for a batch scheduled together as for
    /// a single row, with short workflow names and with uuid-long ones.
    #[pg_test]
    fn take_leases_by_a_hot_update() {
        Spi::run(
            "SELECT sturdy.schedule(CASE WHEN i <= 150 THEN 'hot-' || i ELSE 'order/' || gen_random_uuid() END,
                                    now() - interval '1 minute', 'hot')
               FROM generate_series(1, 300) i",
        )
        .unwrap();
        let indexes = || {
            one::<i64>(
                "SELECT pg_relation_size('sturdy.queue_visible') + pg_relation_size('sturdy.queue_pkey')",
            )
        };
        let before = indexes();
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take('hot', max => 200)"),
            Some(200)
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take('hot', claim => true)"),
            Some(1)
        );
        let updates = one::<String>(
            "SELECT n_tup_upd || ' updated, ' || n_tup_hot_upd || ' HOT'
               FROM pg_stat_xact_user_tables WHERE relid = 'sturdy.queue'::regclass",
        );
        assert_eq!(updates.as_deref(), Some("201 updated, 201 HOT"));
        let after = indexes();
        assert_eq!(before, after, "no index grew");
    }

    /// take hands its rows over in materialize mode: the same rows in the
    /// select list as in FROM, and none is lost or repeated.
    #[pg_test]
    fn take_returns_rows_in_the_select_list_too() {
        Spi::run(
            "SELECT sturdy.schedule('s' || i, now() - i * interval '1 second') FROM generate_series(1, 5) i",
        )
        .unwrap();
        let taken = one::<String>(
            "SELECT string_agg((t).workflow, ',') FROM (SELECT sturdy.take(max => 3, claim => true) t) x",
        );
        assert_eq!(taken.as_deref(), Some("s5,s4,s3"));
        let tokens = one::<i64>(
            "SELECT sum(t)::bigint FROM (SELECT (sturdy.take(max => 5, claim => true)).token t) x",
        );
        assert_eq!(tokens, Some(2), "s2 and s1, each claimed with token 1");
        assert_eq!(one::<i64>("SELECT count(*) FROM sturdy.claims"), Some(5));
    }

    /// A take that comes up short in a transaction whose now() is stale (a
    /// long scan, an old transaction) looks once more by the clock: what came
    /// due since the transaction began is taken, what is due later is not.
    #[pg_test]
    fn a_take_in_a_stale_transaction_takes_what_came_due_by_the_clock() {
        let take = || {
            one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('stale', max => 10)")
        };
        Spi::run(
            "SELECT sturdy.schedule('soon', clock_timestamp() + interval '500 milliseconds', 'stale');
             SELECT sturdy.schedule('later', clock_timestamp() + interval '1 hour', 'stale');",
        )
        .unwrap();
        assert_eq!(take(), None, "nothing is due yet, by either time");
        Spi::run("SELECT pg_sleep(0.8)").unwrap();
        assert_eq!(
            one::<bool>("SELECT min(visible_at) > now() FROM sturdy.queue WHERE queue = 'stale'"),
            Some(true),
            "by the transaction's now(), neither is due"
        );
        assert_eq!(take().as_deref(), Some("soon"));
        assert_eq!(take(), None);
        // stale by more than the lease: the lease, counted from now(), would
        // be over before the row was handed out, so not by the clock
        Spi::run("SELECT sturdy.schedule('brief', clock_timestamp(), 'stale')").unwrap();
        Spi::run("SELECT pg_sleep(0.05)").unwrap();
        assert_eq!(
            one::<String>(
                "SELECT string_agg(workflow, ',') FROM sturdy.take('stale', '100 milliseconds')"
            ),
            None
        );
        assert_eq!(
            one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('stale', '1 hour')")
                .as_deref(),
            Some("brief")
        );
    }

    /// take scans from its floor, below the oldest row it took, not from the
    /// first entry of the index; a schedule or wake_at before now() bumps the
    /// generation, and the next take scans from the start again.
    /// Rows scheduled together share a visible_at; `seq` orders them, and
    /// under a backlog ready long ago the floor is the exact row the last
    /// take got, so the next one starts there, not at the first of the batch
    /// (whose entries, taken and done, stay until vacuum).
    #[pg_test]
    fn take_goes_in_arrival_order_within_a_batch_and_its_floor_is_that_exact_row() {
        let take = |max: i32| {
            one::<String>(&format!(
                "SELECT string_agg(workflow, ',' ORDER BY receipt, workflow) FROM sturdy.take('batch', max => {max})"
            ))
        };
        Spi::run(
            "SELECT sturdy.schedule(w, now() - interval '1 hour', 'batch')
               FROM unnest(ARRAY['e', 'd', 'c', 'b', 'a']) w",
        )
        .unwrap();
        assert_eq!(
            one::<i64>("SELECT count(DISTINCT visible_at) FROM sturdy.queue WHERE queue = 'batch'"),
            Some(1)
        );
        assert_eq!(take(1).as_deref(), Some("e"), "in arrival (seq) order");
        // a row at the same visible_at placed just before the floor's row
        // (e), behind take's back: the floor is exact, so a take from it
        // does not see it
        Spi::run(
            "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at, seq)
             SELECT 'batch', 'hidden', d.visible_at, now(), e.seq - 1
               FROM sturdy.queue d, sturdy.queue e
              WHERE d.queue = 'batch' AND d.workflow = 'd' AND e.queue = 'batch' AND e.workflow = 'e'",
        )
        .unwrap();
        assert_eq!(take(1).as_deref(), Some("d"), "from the floor");
        // a take that comes up short goes on from the start
        assert_eq!(take(10).as_deref(), Some("a,b,c,hidden"));
    }

    /// A one-row take stops at the first index entry of its queue that is
    /// not yet due, without visiting its row: a queue of one ready row and
    /// 500 sleeping ones costs a take a heap visit or two, not 500 (the
    /// heap fetches counted through the index, in this transaction).
    #[pg_test]
    fn take_stops_at_the_first_entry_not_yet_due_without_visiting_it() {
        Spi::run(
            "SELECT sturdy.schedule('ready', now() - interval '1 minute', 'stops');
             SELECT sturdy.schedule('sleeps-' || i, now() + interval '1 hour', 'stops')
               FROM generate_series(1, 500) i",
        )
        .unwrap();
        let fetched = || {
            one::<i64>("SELECT pg_stat_get_xact_tuples_fetched('sturdy.queue_visible'::regclass)")
                .unwrap()
        };
        let before = fetched();
        assert_eq!(
            one::<String>("SELECT workflow FROM sturdy.take('stops')").as_deref(),
            Some("ready")
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take('stops')"),
            Some(0)
        );
        let visits = fetched() - before;
        assert!(
            visits < 20,
            "two takes visited {visits} rows: the sleeping ones were walked"
        );
    }

    /// A one-row take's scan reads a window of its queue's entries and, when
    /// that closes before a row is leased, goes on after the last one: a take
    /// from the start of a queue whose first 40 rows are leased (more than
    /// the window) gets the 41st, the one row due.
    #[pg_test]
    fn take_goes_on_past_more_leased_rows_than_its_window() {
        Spi::run(
            "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at, taken_at, takes, leased_until)
             SELECT 'window', 'held-' || i, now() - interval '1 minute', now(), now(), 1,
                    now() + interval '1 hour'
               FROM generate_series(1, 40) i;
             INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)
             VALUES ('window', 'free', now() - interval '1 minute', now())",
        )
        .unwrap();
        assert_eq!(
            one::<String>("SELECT workflow FROM sturdy.take('window')").as_deref(),
            Some("free")
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take('window')"),
            Some(0)
        );
    }

    #[pg_test]
    fn take_writes_a_free_rows_lease_at_once_and_a_held_ones_after_the_lock() {
        Spi::run(
            "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)
             VALUES ('at-once', 'mine', now() - interval '2 minutes', now()),
                    ('at-once', 'free', now() - interval '1 minute', now());
             SELECT 1 FROM sturdy.queue WHERE queue = 'at-once' AND workflow = 'mine' FOR UPDATE",
        )
        .unwrap();
        let take = || one::<String>("SELECT workflow FROM sturdy.take('at-once')");
        let before = crate::access::leased_unlocked();
        // the oldest, which this transaction holds already: leased after the
        // lock (it has it), where an update that may not wait would refuse it
        assert_eq!(take().as_deref(), Some("mine"));
        assert_eq!(crate::access::leased_unlocked(), before, "after the lock");
        assert_eq!(take().as_deref(), Some("free"));
        assert_eq!(crate::access::leased_unlocked(), before + 1, "at once");
        assert_eq!(
            one::<i64>(
                "SELECT count(*) FROM sturdy.queue
                  WHERE queue = 'at-once' AND takes = 1 AND leased_until > now()"
            ),
            Some(2)
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take('at-once')"),
            Some(0)
        );
    }

    /// Rows of the last 50 ms, and one written behind take's back 70 ms
    /// before now: a take gets the first, then the floor sits at it (every
    /// transaction running began after it: `activity`), so the next take
    /// from the floor does not walk down to the hidden row, and one that
    /// comes up short finds it from the start. Where transaction starts are
    /// not reported (`track_activities` off) the floor is `SLACK` (100 ms)
    /// before the transaction, below the hidden row, and the next take gets
    /// it.
    fn recent_floor(queue: &str) -> (Option<String>, Option<String>, Option<String>) {
        let take = |max: i32| {
            one::<String>(&format!(
                "SELECT string_agg(workflow, ',' ORDER BY receipt, workflow)
                   FROM sturdy.take('{queue}', max => {max})"
            ))
        };
        Spi::run(&format!(
            "SELECT sturdy.schedule('r' || i, now() - (60 - 10 * i) * interval '1 millisecond', '{queue}')
               FROM generate_series(1, 3) i"
        ))
        .unwrap();
        let first = take(1);
        Spi::run(&format!(
            "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)
             VALUES ('{queue}', 'hidden', now() - interval '70 milliseconds', now())"
        ))
        .unwrap();
        (first, take(1), take(10))
    }

    #[pg_test]
    fn after_a_recent_row_the_floor_is_that_row_when_no_transaction_began_before_it() {
        // past the last sample of transaction starts this backend may keep
        Spi::run("SELECT pg_sleep(0.03)").unwrap();
        let (first, next, rest) = recent_floor("recent-floor");
        assert_eq!(first.as_deref(), Some("r1"), "from the start");
        assert_eq!(
            next.as_deref(),
            Some("r2"),
            "from the floor, above 'hidden'"
        );
        assert_eq!(rest.as_deref(), Some("hidden,r3"), "short: from the start");
    }

    #[pg_test]
    fn without_transaction_starts_the_floor_is_slack_before_the_transaction() {
        Spi::run("SET LOCAL track_activities = off").unwrap();
        let (first, next, rest) = recent_floor("slack-floor");
        assert_eq!(first.as_deref(), Some("r1"), "from the start");
        assert_eq!(next.as_deref(), Some("hidden"), "from SLACK before now()");
        assert_eq!(rest.as_deref(), Some("r2,r3"));
    }

    #[pg_test]
    fn take_scans_from_its_floor_and_a_past_dated_write_goes_back_to_the_start() {
        let take = || one::<String>("SELECT workflow FROM sturdy.take('floor')");
        Spi::run(
            "SELECT sturdy.schedule('f' || i, now() - (10 - i) * interval '1 second', 'floor')
               FROM generate_series(1, 9) i",
        )
        .unwrap();
        assert_eq!(take().as_deref(), Some("f1"));
        assert_eq!(take().as_deref(), Some("f2"));
        // a row written below the floor behind take's back (no generation
        // bump): a scan from the floor does not see it
        Spi::run(
            "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)
             VALUES ('floor', 'hidden', now() - interval '1 hour', now())",
        )
        .unwrap();
        assert_eq!(take().as_deref(), Some("f3"), "scanned from the floor");
        let generation = "SELECT last_value FROM sturdy.queue_generation";
        let before = one::<i64>(generation);
        Spi::run("SELECT sturdy.schedule('now', now(), 'floor')").unwrap();
        assert_eq!(
            one::<i64>(generation),
            before,
            "a schedule for now() bumps nothing"
        );
        Spi::run("SELECT sturdy.schedule('past', now() - interval '30 minutes', 'floor')").unwrap();
        assert_ne!(
            one::<i64>(generation),
            before,
            "a past-dated schedule bumps the generation"
        );
        assert_eq!(
            take().as_deref(),
            Some("hidden"),
            "the generation changed: from the start"
        );
        assert_eq!(take().as_deref(), Some("past"));
        Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('floor')").unwrap();
        assert_eq!(
            one::<String>("SELECT workflow FROM t").as_deref(),
            Some("f4")
        );
        assert_eq!(take().as_deref(), Some("f5"));
        assert_eq!(
            one::<bool>(
                "SELECT sturdy.wake_at(workflow, receipt, now() - interval '2 hours', 'floor') FROM t"
            ),
            Some(true)
        );
        assert_eq!(
            take().as_deref(),
            Some("f4"),
            "a past-dated wake_at: from the start"
        );
        let rest =
            one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('floor', max => 10)");
        assert_eq!(rest.as_deref(), Some("f6,f7,f8,f9,now"));
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take('floor')"),
            Some(0)
        );
    }

    #[pg_test]
    fn queues_are_separate() {
        Spi::run("SELECT sturdy.schedule('a', now(), 'emails'); SELECT sturdy.schedule('a', now(), 'reports');").unwrap();
        assert_eq!(
            count("sturdy.queue"),
            2,
            "one workflow may wait in several queues"
        );
        assert_eq!(
            one::<String>("SELECT workflow FROM sturdy.take('emails')").as_deref(),
            Some("a")
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take('emails')"),
            Some(0)
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take('reports')"),
            Some(1)
        );
    }

    /// The generation's sequence is found by OID once per backend: dropped,
    /// takes scan from the start (as in a schema of a released version);
    /// re-created under a new OID, it is found again.
    #[pg_test]
    fn take_finds_its_generation_again_after_the_sequence_is_re_created() {
        let take = || one::<String>("SELECT workflow FROM sturdy.take('regen')");
        Spi::run(
            "SELECT sturdy.schedule('r' || i, now() - (10 - i) * interval '1 second', 'regen')
               FROM generate_series(1, 5) i",
        )
        .unwrap();
        assert_eq!(take().as_deref(), Some("r1"));
        Spi::run(
            "ALTER EXTENSION pg_sturdy DROP SEQUENCE sturdy.queue_generation;
             DROP SEQUENCE sturdy.queue_generation",
        )
        .unwrap();
        let hidden = "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)
                      VALUES ('regen', $1, now() - interval '1 hour', now())";
        Spi::run_with_args(hidden, &["hidden-1".into()]).unwrap();
        assert_eq!(
            take().as_deref(),
            Some("hidden-1"),
            "no generation: from the start"
        );
        Spi::run(
            "CREATE SEQUENCE sturdy.queue_generation;
             SELECT nextval('sturdy.queue_generation')",
        )
        .unwrap();
        assert_eq!(take().as_deref(), Some("r2"), "from the start");
        assert_eq!(take().as_deref(), Some("r3"), "from the floor");
        Spi::run_with_args(hidden, &["hidden-2".into()]).unwrap();
        assert_eq!(
            take().as_deref(),
            Some("r4"),
            "the new sequence is read: its generation holds, from the floor"
        );
        Spi::run("SELECT nextval('sturdy.queue_generation')").unwrap();
        assert_eq!(
            take().as_deref(),
            Some("hidden-2"),
            "a bump of the new sequence: from the start"
        );
    }

    #[pg_test]
    fn done_needs_the_current_receipt() {
        Spi::run("SELECT sturdy.schedule('d1', now() - interval '1 second')").unwrap();
        Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take()").unwrap();
        assert_eq!(
            one::<bool>("SELECT sturdy.done(workflow, receipt - interval '1 us') FROM t"),
            Some(false)
        );
        assert_eq!(
            one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t"),
            Some(true)
        );
        assert_eq!(count("sturdy.queue"), 0);
        assert_eq!(
            one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t"),
            Some(false)
        );
    }

    /// A trigger on `sturdy.queue` (an audit, a foreign key to it) that
    /// notes the workflow of each row `event` (`DELETE`, `UPDATE`) touches,
    /// as its `row` (`OLD`, `NEW`) has it, in the temporary table `noted`;
    /// dropped with `DROP TRIGGER noted ON sturdy.queue`.
    fn note_rows(event: &str, row: &str) {
        Spi::run(&format!(
            "CREATE TEMP TABLE noted (workflow text);
             CREATE FUNCTION pg_temp.note_row() RETURNS trigger LANGUAGE plpgsql AS
               $f$BEGIN INSERT INTO noted VALUES ({row}.workflow); RETURN {row}; END$f$;
             CREATE TRIGGER noted AFTER {event} ON sturdy.queue
               FOR EACH ROW EXECUTE FUNCTION pg_temp.note_row();"
        ))
        .unwrap();
    }

    #[pg_test]
    fn done_deletes_by_key_without_a_statement_and_with_one_where_a_trigger_must_fire() {
        let served = crate::access::served;
        Spi::run(
            "SELECT sturdy.schedule(w, now() - interval '1 second') FROM unnest(array['k1', 'k2', 'k3']) w;
             CREATE TEMP TABLE t AS SELECT * FROM sturdy.take(max => 3);",
        )
        .unwrap();
        let before = served();
        assert_eq!(
            one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t WHERE workflow = 'k1'"),
            Some(true)
        );
        assert_eq!(served(), before + 1, "by key, without a statement");
        assert_eq!(
            one::<bool>(
                "SELECT sturdy.done(workflow, receipt + interval '1 us') FROM t WHERE workflow = 'k2'"
            ),
            Some(false),
            "the receipt rule holds that way too"
        );
        assert_eq!(served(), before + 2);
        // a trigger on the queue (an audit, a foreign key to it) must fire:
        // the statement, which fires it
        note_rows("DELETE", "OLD");
        assert_eq!(
            one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t WHERE workflow = 'k2'"),
            Some(true)
        );
        assert_eq!(served(), before + 2, "through the statement");
        assert_eq!(
            one::<String>("SELECT string_agg(workflow, ',') FROM noted").as_deref(),
            Some("k2")
        );
        Spi::run("DROP TRIGGER noted ON sturdy.queue").unwrap();
        assert_eq!(
            one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t WHERE workflow = 'k3'"),
            Some(true)
        );
        assert_eq!(
            served(),
            before + 3,
            "without it again once the trigger is gone"
        );
        assert_eq!(count("sturdy.queue"), 0);
    }

    #[pg_test]
    fn a_one_row_take_leases_without_a_statement_and_with_one_where_a_trigger_must_fire() {
        let served = crate::access::served;
        Spi::run(
            "SELECT sturdy.schedule('t1', now() - interval '2 seconds');
             SELECT sturdy.schedule('t2', now() - interval '1 second');",
        )
        .unwrap();
        let before = served();
        assert_eq!(
            one::<String>("SELECT workflow FROM sturdy.take()").as_deref(),
            Some("t1")
        );
        assert_eq!(served(), before + 1, "leased without a statement");
        assert_eq!(
            one::<bool>(
                "SELECT leased_until = now() + interval '1 minute' AND taken_at = now() AND takes = 1
                        AND visible_at = now() - interval '2 seconds' AND scheduled_at = now()
                   FROM sturdy.queue WHERE workflow = 't1'"
            ),
            Some(true),
            "the lease written as the statement writes it, the rest kept"
        );
        note_rows("UPDATE", "NEW");
        assert_eq!(
            one::<String>("SELECT workflow FROM sturdy.take()").as_deref(),
            Some("t2")
        );
        assert_eq!(
            served(),
            before + 1,
            "through the statement, which fires the trigger"
        );
        assert_eq!(
            one::<String>("SELECT string_agg(workflow, ',') FROM noted").as_deref(),
            Some("t2")
        );
        Spi::run("DROP TRIGGER noted ON sturdy.queue").unwrap();
        assert_eq!(one::<i64>("SELECT count(*) FROM sturdy.take()"), Some(0));
        assert!(served() > before + 1, "without it again");
        Spi::run("SELECT sturdy.schedule('t3', now() - interval '1 second')").unwrap();
        assert_eq!(
            one::<String>("SELECT workflow || ':' || (token IS NULL) FROM sturdy.take()")
                .as_deref(),
            Some("t3:true"),
            "a row past the last floor, found from the start; no claim, no token"
        );
    }

    /// A schedule inserts before it looks (one descent of the primary key)
    /// once at most four of its backend's last 32 upserts into the queue
    /// found a row (access.rs, `FOUND_AT_MOST`); where its key's row is there
    /// after all, the key's check sends it to that row, which it updates as a
    /// look would have; and enough rows found turn it back to looking first.
    #[pg_test]
    fn a_schedule_among_new_keys_inserts_first_and_still_updates_the_row_there() {
        let blind = || crate::access::INSERTED_FIRST.with(|n| n.get());
        let schedule = |w: &str, hours: i32| {
            Spi::run(&format!(
                "SELECT sturdy.schedule('{w}', now() + interval '{hours} hours', 'blind')"
            ))
            .unwrap()
        };
        let new_keys = |tag: &str, n: usize| {
            for i in 0..n {
                schedule(&format!("b-{tag}-{i}"), 1);
            }
        };
        schedule("b-a", 1);
        let seq = one::<i64>("SELECT seq FROM sturdy.queue WHERE workflow = 'b-a'");
        // five rows found in a row: this backend looks first from here
        for _ in 0..5 {
            schedule("b-a", 2);
        }
        let (tried, missed) = blind();
        new_keys("look", 28);
        assert_eq!(
            blind(),
            (tried, missed),
            "while five of the last 32 found a row, each looked first"
        );
        new_keys("first", 1);
        assert_eq!(blind(), (tried + 1, missed), "four of 32: inserted first");
        for hours in 3..8 {
            schedule("b-a", hours);
        }
        assert_eq!(
            blind(),
            (tried + 6, missed + 5),
            "five inserted first, each met the row there"
        );
        assert_eq!(
            one::<String>(
                "SELECT concat_ws(':', count(*), min(visible_at - now()), min(seq))
                   FROM sturdy.queue WHERE queue = 'blind' AND workflow = 'b-a'"
            ),
            Some(format!("1:07:00:00:{}", seq.unwrap())),
            "one row, updated in place (its seq kept)"
        );
        assert_eq!(count("sturdy.queue WHERE queue = 'blind'"), 30);
        new_keys("last", 1);
        assert_eq!(
            blind(),
            (tried + 6, missed + 5),
            "five found again: looks first"
        );
    }

    #[pg_test]
    fn schedule_upserts_without_a_statement_and_with_one_where_the_table_asks_for_more() {
        let served = crate::access::served;
        let row = |w: &str| {
            one::<String>(&format!(
                "SELECT concat_ws(':', visible_at - now(), taken_at IS NULL, takes, leased_until IS NULL,
                                  scheduled_at = now(), seq)
                   FROM sturdy.queue WHERE queue = 'ups' AND workflow = '{w}'"
            ))
            .unwrap_or_default()
        };
        let before = served();
        Spi::run("SELECT sturdy.schedule('u1', now() - interval '1 second', 'ups')").unwrap();
        assert_eq!(served(), before + 1, "inserted without a statement");
        let seq = one::<i64>("SELECT last_value FROM sturdy.queue_seq").unwrap();
        assert_eq!(
            row("u1"),
            format!("-00:00:01:t:0:t:t:{seq}"),
            "the row the statement inserts: takes and seq by their defaults"
        );
        Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('ups')").unwrap();
        Spi::run("SELECT sturdy.schedule('u1', now() + interval '1 hour', 'ups')").unwrap();
        assert_eq!(served(), before + 3, "updated without a statement");
        assert_eq!(
            row("u1"),
            format!("01:00:00:t:1:t:t:{seq}"),
            "the lease gone, takes and the place's seq kept"
        );
        assert_eq!(
            one::<bool>("SELECT sturdy.done(workflow, receipt, 'ups') FROM t"),
            Some(false),
            "the wakeup outlives the pass"
        );
        // a column of the user's own with a default: the statement gives it
        Spi::run("ALTER TABLE sturdy.queue ADD COLUMN note text DEFAULT 'given'").unwrap();
        let before = served();
        Spi::run("SELECT sturdy.schedule('u2', now(), 'ups')").unwrap();
        assert_eq!(served(), before, "through the statement");
        assert_eq!(
            one::<String>("SELECT note FROM sturdy.queue WHERE workflow = 'u2'").as_deref(),
            Some("given")
        );
        // dropped, it is NULL in every new row: no statement needed
        Spi::run("ALTER TABLE sturdy.queue DROP COLUMN note").unwrap();
        Spi::run("SELECT sturdy.schedule('u3', now(), 'ups')").unwrap();
        assert_eq!(served(), before + 1, "without a statement again");
        // a default of ours changed: the statement gives the new one
        Spi::run("ALTER TABLE sturdy.queue ALTER COLUMN takes SET DEFAULT 7").unwrap();
        Spi::run("SELECT sturdy.schedule('u4', now(), 'ups')").unwrap();
        assert_eq!(served(), before + 1);
        assert_eq!(
            one::<i32>("SELECT takes FROM sturdy.queue WHERE workflow = 'u4'"),
            Some(7)
        );
        Spi::run("ALTER TABLE sturdy.queue ALTER COLUMN takes SET DEFAULT 0").unwrap();
        // a CHECK constraint or a NOT NULL on a column the row leaves NULL:
        // the statement, which enforces it
        Spi::run("ALTER TABLE sturdy.queue ADD CONSTRAINT short CHECK (length(workflow) < 4)")
            .unwrap();
        assert_eq!(
            sqlstate_of("SELECT sturdy.schedule('too long', now(), 'ups')"),
            "23514"
        );
        Spi::run("ALTER TABLE sturdy.queue DROP CONSTRAINT short").unwrap();
        Spi::run(
            "UPDATE sturdy.queue SET taken_at = now();
             ALTER TABLE sturdy.queue ALTER COLUMN taken_at SET NOT NULL",
        )
        .unwrap();
        assert_eq!(
            sqlstate_of("SELECT sturdy.schedule('u5', now(), 'ups')"),
            "23502"
        );
        Spi::run("ALTER TABLE sturdy.queue ALTER COLUMN taken_at DROP NOT NULL").unwrap();
        // another unique index: an arbiter of the statement's own choosing
        Spi::run("CREATE UNIQUE INDEX queue_seq_unique ON sturdy.queue (seq)").unwrap();
        Spi::run("SELECT sturdy.schedule('u6', now(), 'ups')").unwrap();
        Spi::run("DROP INDEX sturdy.queue_seq_unique").unwrap();
        // a trigger: the statement, which fires it
        note_rows("INSERT OR UPDATE", "NEW");
        Spi::run("SELECT sturdy.schedule('u7', now(), 'ups'); SELECT sturdy.schedule('u7', now(), 'ups');")
            .unwrap();
        assert_eq!(
            one::<String>("SELECT string_agg(workflow, ',') FROM noted").as_deref(),
            Some("u7,u7")
        );
        Spi::run("DROP TRIGGER noted ON sturdy.queue").unwrap();
        assert_eq!(served(), before + 1, "all through the statement");
        Spi::run("SELECT sturdy.schedule('u8', now(), 'ups')").unwrap();
        assert_eq!(
            served(),
            before + 2,
            "and without it once the table is ours again"
        );
        assert_eq!(
            one::<String>(
                "SELECT string_agg(workflow, ',' ORDER BY workflow) FROM sturdy.queue WHERE queue = 'ups'"
            )
            .as_deref(),
            Some("u1,u2,u3,u4,u6,u7,u8")
        );
    }

    #[pg_test]
    fn take_and_done_follow_changes_to_the_queue_table_they_do_not_know() {
        let served = crate::access::served;
        Spi::run(
            "SELECT sturdy.schedule(w, now() - interval '1 second', 'alt')
               FROM unnest(array['x1', 'x2', 'x3']) w;",
        )
        .unwrap();
        // an index with an expression: the statement, which maintains it
        Spi::run("CREATE INDEX queue_lower ON sturdy.queue (lower(workflow))").unwrap();
        let before = served();
        assert_eq!(
            one::<String>("SELECT workflow FROM sturdy.take('alt')").as_deref(),
            Some("x1")
        );
        assert_eq!(
            served(),
            before,
            "through the statement while the index is there"
        );
        Spi::run("DROP INDEX sturdy.queue_lower").unwrap();
        // a column of the user's own: kept through the lease, the row still
        // leased without a statement
        Spi::run("ALTER TABLE sturdy.queue ADD COLUMN note text DEFAULT 'kept'").unwrap();
        assert_eq!(
            one::<String>("SELECT workflow FROM sturdy.take('alt')").as_deref(),
            Some("x2")
        );
        assert_eq!(served(), before + 1, "without a statement again");
        assert_eq!(
            one::<String>(
                "SELECT string_agg(workflow || '=' || note || ':' || takes, ',' ORDER BY workflow)
                   FROM sturdy.queue WHERE queue = 'alt'"
            )
            .as_deref(),
            Some("x1=kept:1,x2=kept:1,x3=kept:0")
        );
        assert_eq!(
            one::<bool>(
                "SELECT sturdy.done(workflow, leased_until, 'alt') FROM sturdy.queue
                  WHERE queue = 'alt' AND workflow = 'x2'"
            ),
            Some(true)
        );
        assert_eq!(served(), before + 2);
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.queue WHERE queue = 'alt'"),
            Some(2)
        );
        // a table inheriting from the queue: statements reach its rows, so
        // the statements run
        Spi::run(
            "CREATE TEMP TABLE kid () INHERITS (sturdy.queue);
             INSERT INTO kid (queue, workflow, visible_at, scheduled_at)
             VALUES ('alt', 'x4', now() - interval '1 second', now());",
        )
        .unwrap();
        assert_eq!(
            one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('alt', max => 1)")
                .as_deref(),
            Some("x3")
        );
        assert_eq!(
            one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take('alt', max => 1)")
                .as_deref(),
            Some("x4"),
            "the inheriting table's row, as the statement finds it"
        );
        assert_eq!(
            one::<bool>(
                "SELECT sturdy.done(workflow, leased_until, 'alt') FROM kid WHERE workflow = 'x4'"
            ),
            Some(true)
        );
        assert_eq!(served(), before + 2, "all three through the statements");
        assert_eq!(one::<i64>("SELECT count(*) FROM kid"), Some(0));
    }

    #[pg_test]
    fn a_take_that_cannot_lease_in_place_indexes_the_new_version() {
        let served = crate::access::served;
        // rows of ~580 bytes filling fresh pages (a new, empty file: nothing
        // on them to prune): a leased version (16 bytes more) fits on none
        // of them, so the update cannot be HOT
        Spi::run(
            "CREATE EXTENSION IF NOT EXISTS amcheck;
             TRUNCATE sturdy.queue;
             ALTER TABLE sturdy.queue SET (fillfactor = 100);
             SELECT sturdy.schedule('nohot-' || lpad(i::text, 3, '0') || repeat('x', 500),
                                    now() - interval '1 second', 'nohot')
               FROM generate_series(1, 60) i;",
        )
        .unwrap();
        let first =
            "SELECT (ctid::text::point)[0] FROM sturdy.queue WHERE workflow LIKE 'nohot-001%'";
        let page = one::<f64>(first);
        let before = served();
        assert_eq!(
            one::<bool>("SELECT workflow LIKE 'nohot-001%' FROM sturdy.take('nohot')"),
            Some(true)
        );
        assert_eq!(served(), before + 1, "leased without a statement");
        assert_ne!(
            one::<f64>(first),
            page,
            "the new version went to another page"
        );
        assert_eq!(
            one::<i64>(
                "SELECT pg_stat_get_xact_tuples_updated('sturdy.queue'::regclass)
                      - pg_stat_get_xact_tuples_hot_updated('sturdy.queue'::regclass)"
            ),
            Some(1),
            "one update, not HOT"
        );
        Spi::run("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off").unwrap();
        assert_eq!(
            one::<bool>(
                "SELECT leased_until IS NOT NULL FROM sturdy.queue
                  WHERE queue = 'nohot' AND workflow = (SELECT workflow FROM sturdy.queue
                                                         WHERE workflow LIKE 'nohot-001%')"
            ),
            Some(true),
            "the primary key finds the new version"
        );
        assert_eq!(
            one::<i64>(
                "SELECT count(*) FROM sturdy.queue WHERE queue = 'nohot' AND visible_at <= now()"
            ),
            Some(60),
            "and so does take's index"
        );
        Spi::run(
            "SELECT bt_index_check('sturdy.queue_pkey', true), bt_index_check('sturdy.queue_visible', true)",
        )
        .unwrap();
        assert_eq!(
            one::<bool>(
                "SELECT sturdy.done(workflow, leased_until, 'nohot') FROM sturdy.queue
                  WHERE workflow LIKE 'nohot-001%'"
            ),
            Some(true)
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.queue WHERE queue = 'nohot'"),
            Some(59)
        );
    }

    #[pg_test]
    fn a_role_given_grant_usage_takes_and_finishes_without_statements() {
        let served = crate::access::served;
        Spi::run(
            "CREATE ROLE sturdy_test_worker;
             SELECT sturdy.grant_usage('sturdy_test_worker');
             SET LOCAL ROLE sturdy_test_worker;
             SELECT sturdy.schedule('g1', now() - interval '1 second', 'granted');",
        )
        .unwrap();
        let before = served();
        Spi::run("CREATE TEMP TABLE got AS SELECT * FROM sturdy.take('granted', claim => true)")
            .unwrap();
        let leased = served();
        assert!(leased > before, "the lease without a statement");
        assert_eq!(
            one::<bool>("SELECT sturdy.done(workflow, receipt, 'granted') FROM got"),
            Some(true)
        );
        assert_eq!(served(), leased + 1, "the delete without a statement");
        assert_eq!(
            one::<i64>("SELECT token FROM sturdy.claims WHERE workflow = 'g1'"),
            Some(1),
            "and the claim, by its statement"
        );
        Spi::run("RESET ROLE").unwrap();
    }

    #[pg_test]
    fn done_is_refused_as_its_delete_is_without_the_privilege_or_in_a_read_only_transaction() {
        Spi::run(
            "SELECT sturdy.schedule('ro', now() - interval '1 second');
             CREATE TEMP TABLE t AS SELECT * FROM sturdy.take();
             GRANT SELECT ON t TO PUBLIC;
             CREATE ROLE sturdy_test_reader;
             GRANT USAGE ON SCHEMA sturdy TO sturdy_test_reader;
             GRANT EXECUTE ON FUNCTION sturdy.done(text, timestamptz, text) TO sturdy_test_reader;
             GRANT SELECT ON sturdy.queue TO sturdy_test_reader;",
        )
        .unwrap();
        let done = "SELECT sturdy.done(workflow, receipt) FROM pg_temp.t";
        Spi::run("SET LOCAL ROLE sturdy_test_reader").unwrap();
        assert_eq!(sqlstate_of(done), "42501", "no DELETE on sturdy.queue");
        Spi::run(
            "RESET ROLE;
             REVOKE SELECT ON sturdy.queue FROM sturdy_test_reader;
             GRANT DELETE ON sturdy.queue TO sturdy_test_reader;
             SET LOCAL ROLE sturdy_test_reader;",
        )
        .unwrap();
        assert_eq!(
            sqlstate_of(done),
            "42501",
            "DELETE, but no SELECT on the columns it tests"
        );
        Spi::run("RESET ROLE").unwrap();
        Spi::run("SET LOCAL transaction_read_only = on").unwrap();
        assert_eq!(sqlstate_of(done), "25006");
        assert_eq!(count("sturdy.queue"), 1, "nothing removed");
    }

    #[pg_test]
    fn a_privilege_comes_and_goes_with_the_grant_or_the_membership_that_gives_it() {
        let served = crate::access::served;
        Spi::run(
            "SELECT sturdy.schedule(w, now() - interval '1 second') FROM unnest(array['m1', 'm2', 'm3']) w;
             CREATE TEMP TABLE t AS SELECT * FROM sturdy.take(max => 3);
             GRANT SELECT ON t TO PUBLIC;
             CREATE ROLE sturdy_test_member;
             CREATE ROLE sturdy_test_deleter;
             GRANT USAGE ON SCHEMA sturdy TO sturdy_test_member;
             GRANT EXECUTE ON FUNCTION sturdy.done(text, timestamptz, text) TO sturdy_test_member;
             GRANT SELECT ON sturdy.queue TO sturdy_test_member;
             GRANT DELETE ON sturdy.queue TO sturdy_test_deleter;",
        )
        .unwrap();
        let done = |w: &str| {
            format!("SELECT sturdy.done(workflow, receipt) FROM pg_temp.t WHERE workflow = '{w}'")
        };
        Spi::run("SET LOCAL ROLE sturdy_test_member").unwrap();
        assert_eq!(sqlstate_of(&done("m1")), "42501", "no DELETE yet");
        // a membership that gives DELETE: found at once
        Spi::run("RESET ROLE; GRANT sturdy_test_deleter TO sturdy_test_member; SET LOCAL ROLE sturdy_test_member")
            .unwrap();
        let before = served();
        assert_eq!(one::<bool>(&done("m1")), Some(true));
        assert_eq!(
            served(),
            before + 1,
            "through the access path, the privilege found"
        );
        // the membership revoked: refused again, not served by what was known
        Spi::run("RESET ROLE; REVOKE sturdy_test_deleter FROM sturdy_test_member; SET LOCAL ROLE sturdy_test_member")
            .unwrap();
        assert_eq!(sqlstate_of(&done("m2")), "42501", "the membership is gone");
        // a grant to the role itself, then its revoke
        Spi::run("RESET ROLE; GRANT DELETE ON sturdy.queue TO sturdy_test_member; SET LOCAL ROLE sturdy_test_member")
            .unwrap();
        assert_eq!(one::<bool>(&done("m2")), Some(true));
        assert_eq!(served(), before + 2);
        Spi::run("RESET ROLE; REVOKE DELETE ON sturdy.queue FROM sturdy_test_member; SET LOCAL ROLE sturdy_test_member")
            .unwrap();
        assert_eq!(sqlstate_of(&done("m3")), "42501", "the grant is gone");
        Spi::run("RESET ROLE").unwrap();
        assert_eq!(count("sturdy.queue"), 1, "m3 still queued");
    }

    #[pg_test]
    fn a_schedule_during_a_pass_survives_done() {
        Spi::run("SELECT sturdy.schedule('d2', now() - interval '1 second')").unwrap();
        Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take()").unwrap();
        Spi::run("SELECT sturdy.schedule('d2')").unwrap();
        assert_eq!(
            one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t"),
            Some(false)
        );
        assert_eq!(
            one::<bool>(
                "SELECT visible_at <= now() AND leased_until IS NULL FROM sturdy.queue WHERE workflow = 'd2'"
            ),
            Some(true),
            "ready again, the lease forgotten"
        );
    }

    #[pg_test]
    fn wake_at_suspends_under_the_receipt_rule() {
        Spi::run("SELECT sturdy.schedule('s1', now() - interval '1 second')").unwrap();
        Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take()").unwrap();
        assert_eq!(
            one::<bool>(
                "SELECT sturdy.wake_at(workflow, receipt, now() + interval '1 day') FROM t"
            ),
            Some(true)
        );
        let sleeping = one::<String>(
            "SELECT format('%s/%s/%s', ready, leased, sleeping) FROM sturdy.queue_stats",
        );
        assert_eq!(sleeping.as_deref(), Some("0/0/1"));
        // the receipt is spent: a second wake_at with it changes nothing
        assert_eq!(
            one::<bool>("SELECT sturdy.wake_at(workflow, receipt, now()) FROM t"),
            Some(false)
        );
    }

    #[pg_test]
    fn take_with_claim_claims_each_row_for_the_lease() {
        Spi::run(
            "SELECT sturdy.schedule('c1', now() - interval '2 seconds');
             SELECT sturdy.schedule('c2', now() - interval '1 second');
             SELECT sturdy.claim('c2', '1 hour', 'someone');",
        )
        .unwrap();
        let rows = one::<String>(
            "SELECT string_agg(workflow || ':' || coalesce(token::text, 'held'), ',') FROM sturdy.take(max => 5, claim => true)",
        );
        assert_eq!(rows.as_deref(), Some("c1:1,c2:held"));
        let held = one::<bool>(
            "SELECT held_until = now() + interval '1 minute' FROM sturdy.claims WHERE workflow = 'c1'",
        );
        assert_eq!(held, Some(true));
    }

    #[pg_test]
    fn take_one_with_claim_claims_it_or_says_it_is_held() {
        Spi::run(
            "SELECT sturdy.schedule('o1', now() - interval '2 seconds');
             SELECT sturdy.schedule('o2', now() - interval '1 second');
             SELECT sturdy.claim('o2', '1 hour', 'someone');",
        )
        .unwrap();
        let first = one::<String>(
            "SELECT workflow || ':' || coalesce(token::text, 'held') FROM sturdy.take(claim => true)",
        );
        assert_eq!(first.as_deref(), Some("o1:1"));
        let second = one::<String>(
            "SELECT workflow || ':' || coalesce(token::text, 'held') FROM sturdy.take(claim => true)",
        );
        assert_eq!(
            second.as_deref(),
            Some("o2:held"),
            "still taken (leased), but not claimed"
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take(claim => true)"),
            Some(0)
        );
        let leased = one::<i64>("SELECT count(*) FROM sturdy.queue WHERE taken_at IS NOT NULL");
        assert_eq!(leased, Some(2));
    }

    #[pg_test]
    fn arrive_supplies_and_schedules_together() {
        let v =
            one::<String>("SELECT sturdy.arrive('a1', 'approval', '\"yes\"', 'approvals')::text");
        assert_eq!(v.as_deref(), Some("\"yes\""));
        assert_eq!(
            one::<String>("SELECT workflow FROM sturdy.take('approvals')").as_deref(),
            Some("a1")
        );
        let again =
            one::<String>("SELECT sturdy.arrive('a1', 'approval', '\"no\"', 'approvals')::text");
        assert_eq!(
            again.as_deref(),
            Some("\"yes\""),
            "first writer wins, and the wakeup still lands"
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.queue_stats WHERE ready = 1"),
            Some(1)
        );
    }

    #[pg_test]
    fn queue_stats_tells_ready_leased_and_sleeping_apart() {
        Spi::run(
            "SELECT sturdy.schedule('r1', now() - interval '10 seconds', 'q');
             SELECT sturdy.schedule('r2', now() - interval '5 seconds', 'q');
             SELECT sturdy.schedule('s1', now() + interval '1 hour', 'q');
             SELECT sturdy.take('q');",
        )
        .unwrap();
        let stats = one::<String>(
            "SELECT format('%s/%s/%s/%s', ready, leased, sleeping, oldest_ready_age) FROM sturdy.queue_stats WHERE queue = 'q'",
        );
        assert_eq!(stats.as_deref(), Some("1/1/1/00:00:05"));
    }

    #[pg_test]
    fn queue_bad_arguments_are_refused_and_write_nothing() {
        for (sql, state) in [
            ("SELECT sturdy.schedule(NULL)", "22004"),
            ("SELECT sturdy.schedule('')", "22023"),
            ("SELECT sturdy.schedule('w', NULL)", "22004"),
            ("SELECT sturdy.schedule('w', now(), '')", "22023"),
            ("SELECT sturdy.schedule('w', now(), NULL)", "22004"),
            ("SELECT * FROM sturdy.take('')", "22023"),
            ("SELECT * FROM sturdy.take('q', '0 s')", "22023"),
            (
                "SELECT * FROM sturdy.take('q', '-12 mons 360 days 00:00:01')",
                "22023",
            ),
            ("SELECT * FROM sturdy.take('q', NULL)", "22004"),
            ("SELECT * FROM sturdy.take('q', '1 minute', 0)", "22023"),
            ("SELECT * FROM sturdy.take('q', '1 minute', -3)", "22023"),
            ("SELECT * FROM sturdy.take('q', '1 minute', NULL)", "22004"),
            (
                "SELECT * FROM sturdy.take('q', '1 minute', 1, NULL)",
                "22004",
            ),
            ("SELECT sturdy.done('w', NULL::timestamptz)", "22004"),
            ("SELECT sturdy.done('', now())", "22023"),
            ("SELECT sturdy.wake_at('w', now(), NULL)", "22004"),
            ("SELECT sturdy.wake_at('w', NULL, now())", "22004"),
            ("SELECT sturdy.arrive('w', 's', NULL)", "22004"),
            ("SELECT sturdy.arrive('w', '', '1')", "22023"),
            ("SELECT sturdy.arrive('w', 's', '1', '')", "22023"),
        ] {
            assert_eq!(sqlstate_of(sql), state, "{sql}");
        }
        assert_eq!(count("sturdy.queue"), 0);
        assert_eq!(count("sturdy.checkpoints"), 0);
    }

    #[pg_test]
    fn done_for_a_batch_removes_the_rows_whose_receipts_match() {
        Spi::run(
            "SELECT sturdy.schedule('b' || i, now() - i * interval '1 second', 'batch') FROM generate_series(1, 5) i;
             CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('batch', max => 5);
             SELECT sturdy.schedule('b3', now(), 'batch');",
        )
        .unwrap();
        // b3 was rescheduled during the pass: it stays; a NULL pair matches nothing
        let removed = one::<i64>(
            "SELECT sturdy.done_many(array_agg(workflow) || NULL::text, array_agg(receipt) || NULL::timestamptz, 'batch') FROM t",
        );
        assert_eq!(removed, Some(4));
        assert_eq!(
            one::<String>(
                "SELECT string_agg(workflow, ',') FROM sturdy.queue WHERE queue = 'batch'"
            )
            .as_deref(),
            Some("b3")
        );
        assert_eq!(
            one::<i64>("SELECT sturdy.done_many('{}', '{}', 'batch')"),
            Some(0)
        );
        // one done of each name: literals need no cast
        assert_eq!(
            one::<bool>("SELECT sturdy.done('b3', '2000-01-01', 'batch')"),
            Some(false)
        );
    }

    #[pg_test]
    fn done_for_a_batch_of_this_backends_take_removes_exactly_those_rows() {
        Spi::run(
            "SELECT sturdy.schedule('l' || i, now() - i * interval '1 second', 'leased') FROM generate_series(1, 6) i;
             CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('leased', max => 6);",
        )
        .unwrap();
        // another queue's done finds none of them
        assert_eq!(
            one::<i64>(
                "SELECT sturdy.done_many(array_agg(workflow), array_agg(receipt), 'other') FROM t"
            ),
            Some(0)
        );
        let by_tid = || super::BY_TID.with(|n| n.get());
        let before = by_tid();
        // a part of the batch, out of order, one pair twice
        let part = one::<i64>(
            "SELECT sturdy.done_many(array_agg(workflow ORDER BY workflow DESC) || 'l2'::text,
                                array_agg(receipt ORDER BY workflow DESC) || (SELECT receipt FROM t WHERE workflow = 'l2'), 'leased')
               FROM t WHERE workflow IN ('l1', 'l2', 'l5')",
        );
        assert_eq!(part, Some(3));
        assert_eq!(by_tid(), before + 1, "by tuple id");
        assert_eq!(
            one::<i64>(
                "SELECT sturdy.done_many(array_agg(workflow), array_agg(receipt), 'leased') FROM t WHERE workflow IN ('l1', 'l2')"
            ),
            Some(0),
            "already removed"
        );
        assert_eq!(by_tid(), before + 2);
        // l3's version moved without its receipt changing: its tuple id finds
        // the dead version, and the receipt rule by key removes it
        Spi::run(
            "UPDATE sturdy.queue SET takes = takes WHERE queue = 'leased' AND workflow = 'l3'",
        )
        .unwrap();
        assert_eq!(
            one::<i64>(
                "SELECT sturdy.done_many(array_agg(workflow), array_agg(receipt), 'leased') FROM t"
            ),
            Some(3),
            "l3, l4, l6"
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.queue WHERE queue = 'leased'"),
            Some(0)
        );
    }

    #[pg_test]
    fn done_for_a_batch_from_an_older_take_goes_by_key() {
        Spi::run(
            "SELECT sturdy.schedule('o' || i, now() - i * interval '1 second', 'older') FROM generate_series(1, 4) i;
             CREATE TEMP TABLE first AS SELECT * FROM sturdy.take('older', max => 2);
             CREATE TEMP TABLE second AS SELECT * FROM sturdy.take('older', max => 2);",
        )
        .unwrap();
        // this backend remembers only the second take; the first's rows go by key
        let by_tid = || super::BY_TID.with(|n| n.get());
        let before = by_tid();
        assert_eq!(
            one::<i64>(
                "SELECT sturdy.done_many(array_agg(workflow), array_agg(receipt), 'older') FROM first"
            ),
            Some(2)
        );
        let left = || {
            one::<String>(
                "SELECT string_agg(q.workflow, ',' ORDER BY q.workflow) FROM sturdy.queue q WHERE q.queue = 'older'",
            )
        };
        assert_eq!(
            left(),
            one::<String>("SELECT string_agg(workflow, ',' ORDER BY workflow) FROM second"),
            "the first take's rows went, the second's stay"
        );
        assert_eq!(
            one::<i64>(
                "SELECT sturdy.done_many(array_agg(workflow), array_agg(receipt), 'older')
                   FROM (SELECT * FROM first UNION ALL SELECT * FROM second) b"
            ),
            Some(2),
            "a mix of both takes: the second's remain"
        );
        assert_eq!(left(), None, "every row gone");
        assert_eq!(by_tid(), before, "both by key");
    }

    /// A `done` of the row this backend's last one-row take leased goes
    /// straight to the version that take wrote; with a receipt that does not
    /// match, or once the row was rescheduled or its version moved, it goes
    /// by key, and the receipt rule decides as ever.
    #[pg_test]
    fn done_after_a_take_goes_to_the_leased_version_and_by_key_otherwise() {
        let by_tid = || super::ONE_BY_TID.with(|n| n.get());
        let left = |w: &str| {
            one::<i64>(&format!(
                "SELECT count(*) FROM sturdy.queue WHERE queue = 'tid' AND workflow = '{w}'"
            ))
        };
        Spi::run(
            "SELECT sturdy.schedule('t' || i, now() - (10 - i) * interval '1 second', 'tid')
               FROM generate_series(1, 4) i",
        )
        .unwrap();
        let take = |t: &str| {
            Spi::run(&format!(
                "CREATE TEMP TABLE {t} AS SELECT * FROM sturdy.take('tid')"
            ))
            .unwrap()
        };
        let done = |t: &str, shift: &str| {
            one::<bool>(&format!(
                "SELECT sturdy.done(workflow, receipt - interval '{shift}', 'tid') FROM {t}"
            ))
        };
        let before = by_tid();
        take("a");
        assert_eq!(done("a", "0 s"), Some(true));
        assert_eq!((by_tid(), left("t1")), (before + 1, Some(0)), "t1 by tid");
        // a receipt that does not match removes nothing; the right one then
        // still goes to the version
        take("b");
        assert_eq!(done("b", "1 s"), Some(false));
        assert_eq!((by_tid(), left("t2")), (before + 1, Some(1)));
        assert_eq!(done("b", "0 s"), Some(true));
        assert_eq!((by_tid(), left("t2")), (before + 2, Some(0)), "t2 by tid");
        // rescheduled on top of the pass: the wakeup stays
        take("c");
        Spi::run("SELECT sturdy.schedule('t3', now(), 'tid')").unwrap();
        assert_eq!(done("c", "0 s"), Some(false));
        assert_eq!((by_tid(), left("t3")), (before + 2, Some(1)), "t3 kept");
        // the version moved without its receipt changing: by key, removed
        Spi::run("DELETE FROM sturdy.queue WHERE queue = 'tid' AND workflow = 't3'").unwrap();
        take("d");
        Spi::run("UPDATE sturdy.queue SET takes = takes WHERE queue = 'tid' AND workflow = 't4'")
            .unwrap();
        assert_eq!(done("d", "0 s"), Some(true));
        assert_eq!((by_tid(), left("t4")), (before + 2, Some(0)), "t4 by key");
    }

    #[pg_test]
    fn done_for_a_batch_refuses_bad_arrays_and_removes_nothing() {
        Spi::run("SELECT sturdy.schedule('x', now(), 'batch'); CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('batch');")
            .unwrap();
        for (sql, state) in [
            (
                "SELECT sturdy.done_many(NULL::text[], ARRAY[now()])",
                "22004",
            ),
            (
                "SELECT sturdy.done_many(ARRAY['x'], NULL::timestamptz[])",
                "22004",
            ),
            (
                "SELECT sturdy.done_many(ARRAY['x'], ARRAY[now()], NULL)",
                "22004",
            ),
            (
                "SELECT sturdy.done_many(ARRAY['x'], ARRAY[now()], '')",
                "22023",
            ),
            (
                "SELECT sturdy.done_many(ARRAY['x', 'y'], (SELECT array_agg(receipt) FROM t), 'batch')",
                "22023",
            ),
            (
                "SELECT sturdy.done_many(ARRAY[['x']], (SELECT array_agg(receipt) FROM t), 'batch')",
                "22023",
            ),
            (
                "SELECT sturdy.done_many(ARRAY['x'], ARRAY[[now()]], 'batch')",
                "22023",
            ),
        ] {
            assert_eq!(sqlstate_of(sql), state, "{sql}");
        }
        assert_eq!(count("sturdy.queue"), 1);
    }

    /// The wakeup rule: an empty take marks its queue as having a waiter; the
    /// next schedule that makes a row ready there clears it (and notifies);
    /// schedules for later, and schedules with no waiter, leave it alone.
    #[pg_test]
    fn an_empty_take_marks_a_waiter_and_a_ready_schedule_clears_it() {
        let marked = |q: &str| {
            one::<bool>(&format!(
                "SELECT EXISTS (SELECT FROM sturdy.queue_waiters WHERE queue = '{q}')"
            ))
        };
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take('idle', max => 3)"),
            Some(0)
        );
        assert_eq!(marked("idle"), Some(true));
        Spi::run("SELECT sturdy.schedule('later', now() + interval '1 hour', 'idle')").unwrap();
        assert_eq!(
            marked("idle"),
            Some(true),
            "a schedule for later wakes nobody"
        );
        Spi::run("SELECT sturdy.schedule('now', now(), 'idle')").unwrap();
        assert_eq!(marked("idle"), Some(false));
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take('idle')"),
            Some(1)
        );
        assert_eq!(
            marked("idle"),
            Some(false),
            "a take that found work marks nothing"
        );
        // wake_at with a deadline already due clears the mark like a schedule
        Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('idle2'); SELECT sturdy.schedule('w', now(), 'idle2')")
            .unwrap();
        Spi::run("DROP TABLE t; CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('idle2')")
            .unwrap();
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take('idle2')"),
            Some(0)
        );
        assert_eq!(marked("idle2"), Some(true));
        assert_eq!(
            one::<bool>("SELECT sturdy.wake_at(workflow, receipt, now(), 'idle2') FROM t"),
            Some(true)
        );
        assert_eq!(marked("idle2"), Some(false));
    }

    /// A row taken 2,147,483,647 times cannot be taken again: its `takes + 1`
    /// raises 22003 as the statement's would, the lease not written, with or
    /// without a statement (a trigger sends the take to its statement).
    #[pg_test]
    fn a_take_past_the_largest_takes_raises_22003_and_leases_nothing() {
        Spi::run(
            "SELECT sturdy.schedule('many', now() - interval '1 second', 'maxed');
             UPDATE sturdy.queue SET takes = 2147483647 WHERE queue = 'maxed'",
        )
        .unwrap();
        for trigger in [false, true] {
            if trigger {
                crate::testing::trigger_noop("sturdy.queue", "UPDATE");
            }
            assert_eq!(
                sqlstate_of("SELECT * FROM sturdy.take('maxed')"),
                "22003",
                "with a trigger: {trigger}"
            );
            assert_eq!(
                one::<bool>(
                    "SELECT takes = 2147483647 AND leased_until IS NULL FROM sturdy.queue WHERE queue = 'maxed'"
                ),
                Some(true),
                "nothing written (with a trigger: {trigger})"
            );
        }
        Spi::run("UPDATE sturdy.queue SET takes = 0 WHERE queue = 'maxed'").unwrap();
        assert_eq!(
            one::<String>("SELECT workflow FROM sturdy.take('maxed')").as_deref(),
            Some("many")
        );
    }
}
