//! `extend`: a pass that needs longer than its lease keeps its row. The
//! lease is the receipt, so a longer one is a new receipt, handed back; the
//! places a running or per-key limit holds for the pass move with it, so a
//! limit still counts the pass while it runs. Without it a long pass would
//! see its lease run out, which counts as a failure (`fail.rs`), and its row
//! taken again beside it.

use super::*;

/// The row's lease moved to `$4` where its receipt is still `$2` and has
/// not passed by the clock (`$5`): a lease that ran out is a failed pass,
/// which a take may be counting at this moment, and takes judge it by
/// their own `now()` or clock, later than this transaction's start.
/// `leased_until` is in no index: HOT.
static EXTEND: Statement = Statement {
    sql: "UPDATE sturdy.queue SET leased_until = $4
           WHERE queue OPERATOR(pg_catalog.=) $3 AND workflow OPERATOR(pg_catalog.=) $1
             AND leased_until OPERATOR(pg_catalog.=) $2 AND leased_until OPERATOR(pg_catalog.>) $5",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TIMESTAMPTZOID,
    ],
    writes: true,
    generic: false,
};

#[sql_function(
    "sturdy.extend(workflow text, receipt timestamptz, lease interval, queue text DEFAULT 'default')
     RETURNS timestamptz VOLATILE PARALLEL UNSAFE",
    comment = "Keep a pass's row for lease from now: where the receipt still matches and has not passed, the row's lease (and any place a running or per_key limit holds for the pass) ends at now() + lease, returned as the pass's new receipt for done, finish, wake_at, fail and the next extend. NULL, and nothing written, for a stale receipt, a lease that ran out by the clock, or a place of the pass that a take reused meanwhile."
)]
fn extend(
    workflow: Option<Text>,
    receipt: Option<TimestampWithTimeZone>,
    lease: Option<Interval>,
    queue: Option<Text>,
) -> Result<Option<TimestampWithTimeZone>> {
    let workflow = args::name("workflow", workflow)?;
    let receipt = args::required("receipt", receipt)?;
    let lease = args::lease("lease", lease)?;
    let queue = args::name("queue", queue)?;
    let now = pgrx::datum::now();
    // as take computes a receipt: now() + lease in the session's time zone
    let renewed = args::plus(now, lease);
    // (no RETURNING: the count of rows processed says it)
    let kept = run_one(
        &EXTEND,
        &[
            workflow.into(),
            receipt.into(),
            queue.into(),
            renewed.into(),
            pgrx::datum::clock_timestamp().into(),
        ],
        |t| Ok(!t.is_empty()),
    )?;
    if !kept {
        return Ok(None);
    }
    // the row first, then its places (the lock order of every call on a
    // pass), then the clock again: a take frees a place whose receipt
    // passed by its `now()`, never later than the clock, so with the
    // receipt still ahead of the clock once every place is moved (and
    // locked) no take has found one of them free, and none will. Past it,
    // a take may hold one now, or be counting the lapse: the pass is over,
    // and its row and places go back to the receipt they had.
    let moved = move_places(queue, workflow, receipt, renewed)?;
    if receipt <= pgrx::datum::clock_timestamp() {
        for held in moved {
            run_one(
                MOVE_BACK[held],
                &[
                    queue.into(),
                    workflow.into(),
                    renewed.into(),
                    receipt.into(),
                ],
                |_| Ok(()),
            )?;
        }
        run_one(
            &EXTEND,
            &[
                workflow.into(),
                renewed.into(),
                queue.into(),
                receipt.into(),
                TimestampWithTimeZone::negative_infinity().into(),
            ],
            |_| Ok(()),
        )?;
        return Ok(None);
    }
    Ok(Some(renewed))
}

/// A pass's places (`$2` workflow, `$3` receipt) given its new receipt
/// `$4` (`extend`): for each limit, the statements that look for it, in
/// turn (see [`move_places`]).
static MOVE_PLACE: [&[&Statement]; 2] = [
    &[&MOVE_RUNNING, &MOVE_RUNNING],
    &[&MOVE_KEYED, &MOVE_KEYED, &MOVE_KEYED_WOKEN],
];

/// The statement that moves a place back, whichever of [`MOVE_PLACE`]'s
/// moved it.
static MOVE_BACK: [&Statement; 2] = [&MOVE_RUNNING, &MOVE_KEYED_ANY];

const MOVE_ARGS: &[pg_sys::Oid] = &[
    pg_sys::TEXTOID,
    pg_sys::TEXTOID,
    pg_sys::TIMESTAMPTZOID,
    pg_sys::TIMESTAMPTZOID,
];

static MOVE_RUNNING: Statement = Statement {
    sql: "UPDATE sturdy.queue_places SET receipt = $4
           WHERE queue OPERATOR(pg_catalog.=) $1 AND workflow OPERATOR(pg_catalog.=) $2
             AND receipt OPERATOR(pg_catalog.=) $3",
    args: MOVE_ARGS,
    writes: true,
    generic: false,
};

/// (by the key of the pass's row, as `done` finds it)
static MOVE_KEYED: Statement = Statement {
    sql: "UPDATE sturdy.queue_key_places SET receipt = $4
           WHERE queue OPERATOR(pg_catalog.=) $1
             AND key OPERATOR(pg_catalog.=) (SELECT q.key FROM sturdy.queue q
                                              WHERE q.queue OPERATOR(pg_catalog.=) $1
                                                AND q.workflow OPERATOR(pg_catalog.=) $2)
             AND workflow OPERATOR(pg_catalog.=) $2 AND receipt OPERATOR(pg_catalog.=) $3",
    args: MOVE_ARGS,
    writes: true,
    generic: false,
};

/// (by any key, where the row is woken: only a schedule changes a row's
/// key, and one during the pass wakes it, so a row that is not woken has
/// the key it was taken with, and its pass's place is under that key or
/// none; for a woken one the queue's key places are walked)
static MOVE_KEYED_WOKEN: Statement = Statement {
    sql: "UPDATE sturdy.queue_key_places SET receipt = $4
           WHERE queue OPERATOR(pg_catalog.=) $1
             AND workflow OPERATOR(pg_catalog.=) $2 AND receipt OPERATOR(pg_catalog.=) $3
             AND EXISTS (SELECT FROM sturdy.queue q
                          WHERE q.queue OPERATOR(pg_catalog.=) $1 AND q.workflow OPERATOR(pg_catalog.=) $2
                            AND q.taken_at IS NULL)",
    args: MOVE_ARGS,
    writes: true,
    generic: false,
};

/// (by any key, to move back what one of the above moved)
static MOVE_KEYED_ANY: Statement = Statement {
    sql: "UPDATE sturdy.queue_key_places SET receipt = $4
           WHERE queue OPERATOR(pg_catalog.=) $1
             AND workflow OPERATOR(pg_catalog.=) $2 AND receipt OPERATOR(pg_catalog.=) $3",
    args: MOVE_ARGS,
    writes: true,
    generic: false,
};

/// A pass of `workflow` with `receipt` kept longer (`extend`): its places
/// of a running or per-key limit take its new receipt, so the limit counts
/// the pass until then, not until the old receipt passes. (A place this
/// backend's take wrote and remembers by the old receipt is then found by
/// statement when the pass ends: `ended::free_placed` matches receipts.)
///
/// Which of them moved. One not found is looked for again, by a statement
/// of its own: a `limit_queue` that made the queue's places anew while
/// this waited for their locks holds the pass in a new row, which the
/// first statement's snapshot could not see; and a key's place by any key,
/// where a schedule gave the row another key during the pass. A pass may
/// hold none (a row without a key holds no key's place), so none found is
/// no answer by itself: the caller reads the clock after.
fn move_places(
    queue: Name,
    workflow: Name,
    from: TimestampWithTimeZone,
    to: TimestampWithTimeZone,
) -> Result<Vec<usize>> {
    let set = limits::of(queue)?;
    let mut moved = Vec::new();
    for held in set.iter().flat_map(limits::Limits::held) {
        for &stmt in MOVE_PLACE[held] {
            if run_one(
                stmt,
                &[queue.into(), workflow.into(), from.into(), to.into()],
                |t| Ok(!t.is_empty()),
            )? {
                moved.push(held);
                break;
            }
        }
    }
    Ok(moved)
}
