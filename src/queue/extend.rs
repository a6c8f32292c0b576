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
    // pass): where a place of the pass is not there to move, a take that
    // found the old receipt passed by its clock holds it now, and the pass
    // is over; its row goes back to the receipt it had
    if !move_places(queue, workflow, receipt, renewed)? {
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
/// `$4` (`extend`).
static MOVE_PLACE: [Statement; 2] = [
    Statement {
        sql: "UPDATE sturdy.queue_places SET receipt = $4
               WHERE queue OPERATOR(pg_catalog.=) $1 AND workflow OPERATOR(pg_catalog.=) $2
                 AND receipt OPERATOR(pg_catalog.=) $3",
        args: &[
            pg_sys::TEXTOID,
            pg_sys::TEXTOID,
            pg_sys::TIMESTAMPTZOID,
            pg_sys::TIMESTAMPTZOID,
        ],
        writes: true,
        generic: false,
    },
    // (by the key of the pass's row, as FREE_PLACE finds it)
    Statement {
        sql: "UPDATE sturdy.queue_key_places SET receipt = $4
               WHERE queue OPERATOR(pg_catalog.=) $1
                 AND key OPERATOR(pg_catalog.=) (SELECT q.key FROM sturdy.queue q
                                                  WHERE q.queue OPERATOR(pg_catalog.=) $1
                                                    AND q.workflow OPERATOR(pg_catalog.=) $2)
                 AND workflow OPERATOR(pg_catalog.=) $2 AND receipt OPERATOR(pg_catalog.=) $3",
        args: &[
            pg_sys::TEXTOID,
            pg_sys::TEXTOID,
            pg_sys::TIMESTAMPTZOID,
            pg_sys::TIMESTAMPTZOID,
        ],
        writes: true,
        generic: false,
    },
];

/// A pass of `workflow` with `receipt` kept longer (`extend`): its places
/// of a running or per-key limit take its new receipt, so the limit counts
/// the pass until then, not until the old receipt passes. (A place this
/// backend's take wrote and remembers by the old receipt is then found by
/// statement when the pass ends: `limits::free_placed` matches receipts.)
///
/// Whether every place the pass holds moved. One not found is looked for
/// once more, by a statement of its own: a `limit_queue` that made the
/// queue's places anew while this waited for their locks holds the pass in
/// a new row, which the first statement's snapshot could not see.
fn move_places(
    queue: Name,
    workflow: Name,
    receipt: TimestampWithTimeZone,
    renewed: TimestampWithTimeZone,
) -> Result<bool> {
    let set = limits::of(queue)?;
    let mut done: Vec<usize> = Vec::new();
    for held in set.iter().flat_map(limits::Limits::held) {
        let mut moved = false;
        for _ in 0..2 {
            moved = run_one(
                &MOVE_PLACE[held],
                &[
                    queue.into(),
                    workflow.into(),
                    receipt.into(),
                    renewed.into(),
                ],
                |t| Ok(!t.is_empty()),
            )?;
            if moved {
                break;
            }
        }
        if !moved {
            // (the places moved before it go back with the row)
            for held in done {
                run_one(
                    &MOVE_PLACE[held],
                    &[
                        queue.into(),
                        workflow.into(),
                        renewed.into(),
                        receipt.into(),
                    ],
                    |_| Ok(()),
                )?;
            }
            return Ok(false);
        }
        done.push(held);
    }
    Ok(true)
}
