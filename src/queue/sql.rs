//! The queue's statements, as they run against the current schema (those for
//! 0.1.0's are in `schema.rs`). Each runs only where the row work cannot be
//! done without a statement (see `access`) or has no such path.

use pgrx::pg_sys;

use crate::plan::Statement;

/// Upsert the row to `visible_at`: a wakeup. A pass in flight keeps its
/// lease (the row marked woken: `taken_at` NULL, see [`WOKEN`]); a dead row
/// is left as it is. The statement a team would write, and nothing else: whether the row is ready, the
/// generation bump of a past-dated one (see `Floor`) and the wakeup are
/// decided in `schedule_at` (measured: probing the waiter mark in this
/// statement cost schedule 34k instructions a call, docs/internals.md). Run
/// only where `access` cannot do the same upsert without it.
pub(super) static SCHEDULE: Statement = Statement {
    sql: "INSERT INTO sturdy.queue AS q (queue, workflow, visible_at, taken_at, leased_until, scheduled_at)
          VALUES ($3, $1, $2, NULL, NULL, pg_catalog.now())
          ON CONFLICT (queue, workflow) DO UPDATE
             SET visible_at = EXCLUDED.visible_at, taken_at = NULL, scheduled_at = EXCLUDED.scheduled_at
           WHERE q.visible_at OPERATOR(pg_catalog.<>) 'infinity'::pg_catalog.timestamptz",
    args: &[pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// [`SCHEDULE`] placing the row: its priority (`$4`) and key (`$5`) set on
/// insert and on update.
pub(super) static SCHEDULE_PLACED: Statement = Statement {
    sql: "INSERT INTO sturdy.queue AS q (queue, workflow, visible_at, taken_at, leased_until, scheduled_at, priority, key)
          VALUES ($3, $1, $2, NULL, NULL, pg_catalog.now(), $4, $5)
          ON CONFLICT (queue, workflow) DO UPDATE
             SET visible_at = EXCLUDED.visible_at, taken_at = NULL, scheduled_at = EXCLUDED.scheduled_at,
                 priority = EXCLUDED.priority, key = EXCLUDED.key
           WHERE q.visible_at OPERATOR(pg_catalog.<>) 'infinity'::pg_catalog.timestamptz",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TEXTOID,
        pg_sys::INT4OID,
        pg_sys::TEXTOID,
    ],
    writes: true,
    generic: false,
};

/// [`SCHEDULE_PLACED`] with the job's input (`$6`, `schedule_many`), set on
/// insert and on update.
pub(super) static SCHEDULE_INPUT: Statement = Statement {
    sql: "INSERT INTO sturdy.queue AS q (queue, workflow, visible_at, taken_at, leased_until, scheduled_at, priority, key, input)
          VALUES ($3, $1, $2, NULL, NULL, pg_catalog.now(), $4, $5, $6)
          ON CONFLICT (queue, workflow) DO UPDATE
             SET visible_at = EXCLUDED.visible_at, taken_at = NULL, scheduled_at = EXCLUDED.scheduled_at,
                 priority = EXCLUDED.priority, key = EXCLUDED.key, input = EXCLUDED.input
           WHERE q.visible_at OPERATOR(pg_catalog.<>) 'infinity'::pg_catalog.timestamptz",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TEXTOID,
        pg_sys::INT4OID,
        pg_sys::TEXTOID,
        pg_sys::JSONBOID,
    ],
    writes: true,
    generic: false,
};

/// Is the queue marked (a worker found it empty and waits)?
pub(super) static MARKED: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM sturdy.queue_waiters w WHERE w.queue OPERATOR(pg_catalog.=) $1)",
    args: &[pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

// `take`: lease the oldest ready rows; `leased_until` is the receipt.
// (With `claim`, each workflow leased is then claimed by `claim`'s own
// operation, for the same lease: see `take_from`.)
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

/// The `SET` of every take's `UPDATE` (target `q`, lease `$2`), which
/// leases only a row whose `leased_until` is NULL (the statement says so
/// in its `WHERE`). A row whose lease ran out is a failed pass: the
/// statement locks it and reports it (workflow, lease end) without a
/// write, and the take counts the failure (`fail::count_lapsed`) before it
/// runs again.
macro_rules! taken_set {
    () => {
        "SET leased_until = pg_catalog.now() OPERATOR(pg_catalog.+) $2, taken_at = pg_catalog.now(),
                     takes = q.takes OPERATOR(pg_catalog.+) 1"
    };
}
pub(super) use taken_set;

pub(super) const TAKE_ARGS: &[pg_sys::Oid] = &[
    pg_sys::TEXTOID,
    pg_sys::INTERVALOID,
    pg_sys::INT8OID,
    pg_sys::TIMESTAMPTZOID,
    pg_sys::INT8OID,
    pg_sys::TIMESTAMPTZOID,
];

// The two take statements: the candidate rows from the floor on (`due`),
// a `LIMIT`, the rows of `due` leased through their `ctid`s (`taken`: one
// row by `= (SELECT ctid FROM due)`, an InitPlan; a batch by `= ANY
// (ARRAY(SELECT ctid FROM due))`), and every row of `due` returned with
// what `taken` made of it (the token column NULL: see `take_from`).
//
// The UPDATE names the queue (`$1`) for Citus, which routes a statement
// by its distribution column's value (docs/scale-out.md). Compared under
// `COLLATE "default"`, which the queue's indexes (collated "C") cannot
// serve, so a plain server still reaches the row by its tuple id: without
// it the planner may take `queue_visible` for the test, and a take walked
// 500 sleeping rows of its queue (`take_stops_at_the_first_entry...`).
// Equality of text is the same under any deterministic collation. The
// other takes' UPDATEs (keyed, priority, a released schema's) do the same.
pub(super) static TAKE_ONE: Statement = Statement {
    sql: concat!("WITH due AS MATERIALIZED (
              SELECT ctid, workflow, visible_at, seq, leased_until FROM sturdy.queue
               WHERE queue OPERATOR(pg_catalog.=) $1
                 AND visible_at OPERATOR(pg_catalog.<=) $6
                 AND (visible_at, seq) OPERATOR(pg_catalog.>=) ($4, $5)
                 AND (leased_until IS NULL OR leased_until OPERATOR(pg_catalog.<=) $6)
               ORDER BY visible_at, seq
               LIMIT 1
               FOR UPDATE SKIP LOCKED),
          taken AS (
              UPDATE sturdy.queue AS q
                 ", taken_set!(), "
               WHERE q.queue OPERATOR(pg_catalog.=) $1 COLLATE \"default\" AND q.ctid OPERATOR(pg_catalog.=) (SELECT ctid FROM due)
                 AND q.leased_until IS NULL
              RETURNING q.workflow, q.leased_until AS receipt, q.ctid AS tid, COALESCE(q.attempts, 0) OPERATOR(pg_catalog.+) 1 AS attempt, q.input)
          SELECT t.workflow, t.receipt, NULL::bigint, t.attempt, t.input, d.visible_at, d.seq,
                 CASE WHEN d.leased_until IS NOT NULL THEN d.workflow END, d.leased_until
            FROM due d LEFT JOIN taken t ON true"),
    args: TAKE_ARGS,
    writes: true,
    generic: false,
};

pub(super) static TAKE_MANY: Statement = Statement {
    sql: concat!("WITH due AS MATERIALIZED (
              SELECT ctid, workflow, visible_at, seq, leased_until FROM sturdy.queue
               WHERE queue OPERATOR(pg_catalog.=) $1
                 AND visible_at OPERATOR(pg_catalog.<=) $6
                 AND (visible_at, seq) OPERATOR(pg_catalog.>=) ($4, $5)
                 AND (leased_until IS NULL OR leased_until OPERATOR(pg_catalog.<=) $6)
               ORDER BY visible_at, seq
               LIMIT $3
               FOR UPDATE SKIP LOCKED),
          taken AS (
              UPDATE sturdy.queue AS q
                 ", taken_set!(), "
               WHERE q.queue OPERATOR(pg_catalog.=) $1 COLLATE \"default\" AND q.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM due))
                 AND q.leased_until IS NULL
              RETURNING q.workflow, q.leased_until AS receipt, q.ctid AS tid, COALESCE(q.attempts, 0) OPERATOR(pg_catalog.+) 1 AS attempt, q.input)
          SELECT t.workflow, t.receipt, NULL::bigint, t.attempt, t.input, d.visible_at, d.seq, t.tid,
                 CASE WHEN d.leased_until IS NOT NULL THEN d.workflow END, d.leased_until
            FROM due d LEFT JOIN taken t ON t.workflow OPERATOR(pg_catalog.=) d.workflow
           ORDER BY d.visible_at, d.seq"),
    args: TAKE_ARGS,
    writes: true,
    generic: true,
};

/// Wake the workers waiting on a queue: clear its mark, and notify if this
/// call cleared it (of two schedules racing here, one notifies).
pub(super) static WAKE: Statement = Statement {
    sql: "DELETE FROM sturdy.queue_waiters WHERE queue OPERATOR(pg_catalog.=) $1
          RETURNING pg_catalog.pg_notify('sturdy', $2)",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// [`WAKE`] under Citus (`scaleout`), without its notice: a notice in the
/// `RETURNING` would be sent from the worker that holds the mark, where
/// nobody listens (and Citus refuses a function that is not `IMMUTABLE`
/// there anyway). The caller sends it here, with [`NOTIFY`].
pub(super) static WAKE_ROUTED: Statement = Statement {
    sql: "DELETE FROM sturdy.queue_waiters WHERE queue OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

pub(super) static NOTIFY: Statement = Statement {
    sql: "SELECT pg_catalog.pg_notify('sturdy', $1)",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// A take that found nothing: its worker is about to wait, so the next
/// schedule that makes a row ready in this queue should notify. Followed by a
/// bump of the idle epoch (see [`Unmarked`]).
pub(super) static MARK_IDLE: Statement = Statement {
    sql: "INSERT INTO sturdy.queue_waiters (queue, since) VALUES ($1, pg_catalog.now())
          ON CONFLICT (queue) DO NOTHING",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// The pairs of a `done_many` (`$1` workflows, `$2` receipts, in queue
/// `$3`), each row looked up by its key on its own (`LATERAL`, kept apart
/// by `OFFSET 0`) and reached by its tuple id, the queue compared where no
/// index serves it (as in [`DONE_LEASED`]): a plan that read the queue once
/// for all the pairs, which the planner prefers whenever it believes the
/// queue holds no more rows than the pairs, walked all of its dead entries
/// too (`crate::planner::install`). The `FROM` (or `USING`) list and the
/// `WHERE` of target `q`, to which a statement adds its own tests.
macro_rules! pairs_by_key {
    () => {
        "ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS d(workflow, receipt),
                 LATERAL (SELECT k.ctid FROM sturdy.queue k
                           WHERE k.queue OPERATOR(pg_catalog.=) $3 AND k.workflow OPERATOR(pg_catalog.=) d.workflow
                          OFFSET 0) AS k
           WHERE q.ctid OPERATOR(pg_catalog.=) k.ctid AND q.queue OPERATOR(pg_catalog.=) $3 COLLATE \"default\"
             AND (q.workflow OPERATOR(pg_catalog.=) d.workflow) IS TRUE"
    };
}
pub(super) use pairs_by_key;

/// `done` for a batch: each (workflow, receipt) pair under the receipt rule.
/// How many went is SPI's count of rows processed: no `RETURNING`, so SPI
/// builds no result table (see [`DONE`]). The pairs: [`pairs_by_key`].
pub(super) static DONE_MANY: Statement = Statement {
    sql: concat!(
        "DELETE FROM sturdy.queue q
           USING ",
        pairs_by_key!(),
        "
             AND q.leased_until OPERATOR(pg_catalog.=) d.receipt AND q.taken_at IS NOT NULL"
    ),
    args: &[
        pg_sys::TEXTARRAYOID,
        pg_sys::TIMESTAMPTZARRAYOID,
        pg_sys::TEXTOID,
    ],
    writes: true,
    generic: false,
};

/// `done` for rows of this backend's last batch take, straight to where
/// their leased versions live (see [`Leased`]): `$4` holds each row's tuple
/// id, at the position of its workflow in `$1`. A row version there counts
/// only if it is still the one leased, for this workflow and receipt; a row
/// rescheduled since has moved on, and the tuple id finds its dead version.
/// The plan is a TID scan nested in the pairs, and nothing else can serve
/// it: the workflow test is wrapped in `IS TRUE` (the same test in a
/// `WHERE`) so that the primary key cannot, and the queue is compared under
/// `COLLATE "default"` (as the takes' `UPDATE`s do) so that no index of the
/// queue can. Otherwise, once `ANALYZE` had found no live row in a queue
/// full of versions an old snapshot keeps, the plan made next hashed the
/// pairs against `queue_visible` read by queue name: every dead entry,
/// each call (`test_plans.py`). A generic plan, kept.
pub(super) static DONE_LEASED: Statement = Statement {
    sql: "DELETE FROM sturdy.queue q
           USING ROWS FROM (pg_catalog.unnest($4), pg_catalog.unnest($1)) AS d(tid, workflow)
           WHERE q.ctid OPERATOR(pg_catalog.=) d.tid AND (q.workflow OPERATOR(pg_catalog.=) d.workflow) IS TRUE
             AND q.queue OPERATOR(pg_catalog.=) $3 COLLATE \"default\" AND q.leased_until OPERATOR(pg_catalog.=) $2
             AND q.taken_at IS NOT NULL",
    args: &[pg_sys::TEXTARRAYOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID, pg_sys::TIDARRAYOID],
    writes: true,
    generic: true,
};

/// Remove the row under the receipt rule: its lease is the receipt, and no
/// wakeup landed during the pass (`taken_at` is NULL once one did, see
/// [`WOKEN`]). Whether it went is SPI's count of rows processed: a
/// `RETURNING` would make SPI build a result table (a memory context and a
/// copied tuple) for one bit of answer.
pub(super) static DONE: Statement = Statement {
    sql: "DELETE FROM sturdy.queue
           WHERE queue OPERATOR(pg_catalog.=) $3 AND workflow OPERATOR(pg_catalog.=) $1
             AND leased_until OPERATOR(pg_catalog.=) $2 AND taken_at IS NOT NULL",
    args: &[pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// A pass a wakeup landed on ends (`done`, `finish`, `wake_at` of it): a
/// wakeup (`schedule`, `arrive`) on a leased row moves `visible_at` and
/// clears `taken_at` but keeps the lease, so no second pass starts while
/// the first runs, and a pass that crashes is still a lapse to count. Its
/// end clears the lease: the row is ready at the wakeup's time. Returns
/// that time.
pub(super) static WOKEN: Statement = Statement {
    sql: "UPDATE sturdy.queue SET leased_until = NULL
           WHERE queue OPERATOR(pg_catalog.=) $3 AND workflow OPERATOR(pg_catalog.=) $1
             AND leased_until OPERATOR(pg_catalog.=) $2 AND taken_at IS NULL
          RETURNING visible_at",
    args: &[pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// [`WOKEN`] for the pairs of `done_many`.
pub(super) static WOKEN_MANY: Statement = Statement {
    sql: concat!(
        "UPDATE sturdy.queue q SET leased_until = NULL
            FROM ",
        pairs_by_key!(),
        "
             AND q.leased_until OPERATOR(pg_catalog.=) d.receipt AND q.taken_at IS NULL
          RETURNING q.visible_at"
    ),
    args: &[
        pg_sys::TEXTARRAYOID,
        pg_sys::TIMESTAMPTZARRAYOID,
        pg_sys::TEXTOID,
    ],
    writes: true,
    generic: false,
};

/// Suspend until `at` under the receipt rule; a wakeup that landed during
/// the pass wins (the row is then [`WOKEN`]'s). An
/// `at` already due wakes idle workers as a schedule does, and one before
/// `now()` bumps take's generation (the caller does, as `schedule` does:
/// Citus cannot plan a `nextval` in the statement).
pub(super) static WAKE_AT: Statement = Statement {
    sql: "WITH moved AS (
              UPDATE sturdy.queue SET visible_at = $3, taken_at = NULL, leased_until = NULL
               WHERE queue OPERATOR(pg_catalog.=) $4 AND workflow OPERATOR(pg_catalog.=) $1
                 AND leased_until OPERATOR(pg_catalog.=) $2 AND taken_at IS NOT NULL
              RETURNING 1)
          SELECT $3 OPERATOR(pg_catalog.<=) pg_catalog.now() AND EXISTS (SELECT FROM sturdy.queue_waiters w WHERE w.queue OPERATOR(pg_catalog.=) $4)
            FROM moved",
    args: &[pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};
