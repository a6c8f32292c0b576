//! `done` and `done_many`: a taken row removed under the receipt rule.

use super::*;

#[sql_function(
    "sturdy.done(workflow text, receipt timestamptz, queue text DEFAULT 'default')
     RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "Remove the workflow from queue if nothing rescheduled it since take (the receipt still matches). False means it was rescheduled: it stays, and will be taken again."
)]
pub(super) fn done(
    workflow: Option<Text>,
    receipt: Option<TimestampWithTimeZone>,
    queue: Option<Text>,
) -> Result<bool> {
    let workflow = args::name("workflow", workflow)?;
    let receipt = args::required("receipt", receipt)?;
    let queue = args::name("queue", queue)?;
    // the row, then its places (what finds them read first)
    let ending = ended::ending(queue, workflow, receipt)?;
    let removed = remove(workflow, receipt, queue)?;
    let limited = ending.free(queue, workflow, receipt)?;
    ended::freed(queue, limited)?;
    Ok(removed)
}

/// `done`'s end of the pass's row: removed where the receipt holds it and
/// no wakeup landed during the pass (whether it went); where one did, the
/// row stays, its lease cleared, ready at the wakeup's time ([`WOKEN`]).
/// `finish` ends its row here too.
pub(crate) fn remove(workflow: Name, receipt: TimestampWithTimeZone, queue: Name) -> Result<bool> {
    if remove_taken(workflow, receipt, queue)? {
        return Ok(true);
    }
    end_woken(workflow, receipt, queue)?;
    Ok(false)
}

/// The lease of a pass that a wakeup landed on cleared, for the pass's end
/// (`done`, `finish`, `wake_at`): the row is ready at the wakeup's time,
/// and a take that passed that time looks from the start again. Whether
/// the receipt held such a row.
pub(super) fn end_woken(
    workflow: Name,
    receipt: TimestampWithTimeZone,
    queue: Name,
) -> Result<bool> {
    if !schema::current() {
        return Ok(false); // 0.1.0's wakeup replaced the lease
    }
    let visible = run_one(
        &WOKEN,
        &[workflow.into(), receipt.into(), queue.into()],
        first_value::<TimestampWithTimeZone>,
    )?;
    let Some(visible) = visible else {
        return Ok(false);
    };
    let now = pgrx::datum::now();
    if visible < now {
        placed::backdated(queue.bytes())?;
    }
    if visible <= now {
        wake_if_waited(queue)?;
    }
    Ok(true)
}

/// [`DONE`]'s delete: whether the row went.
fn remove_taken(workflow: Name, receipt: TimestampWithTimeZone, queue: Name) -> Result<bool> {
    // [`DONE`]'s work, without the statement, where nothing it would do is
    // skipped that way (see `access`)
    if let (Some(q), Some(w)) = (queue.into_datum(), workflow.into_datum())
        && let Some(done) = QUEUE.with(&[pg_sys::ACL_DELETE], queue.bytes(), |table| {
            delete_done(table, queue, workflow, (q, w), receipt.into())
        })?
    {
        return Ok(done);
    }
    run_one(
        schema::pick(&DONE, &schema::DONE_RELEASED),
        &[workflow.into(), receipt.into(), queue.into()],
        |t| Ok(!t.is_empty()),
    )
}

/// `done`'s delete of `workflow`'s row in `queue` (their datums `qw`) on the
/// queue table opened for it: straight to the version this backend's last
/// take wrote where that is the row and the receipt (see [`Taken1`]), else
/// by key ([`access::Opened::delete_if`], `None` where that cannot be done
/// here).
pub(super) fn delete_done(
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
        && table.delete_at_if(tid, seen, &key, (Q_LEASED_UNTIL, receipt), Q_TAKEN_AT)? == Some(true)
    {
        #[cfg(any(test, feature = "pg_test"))]
        ONE_BY_TID.with(|n| n.set(n.get() + 1));
        return Ok(Some(true));
    }
    table.delete_if(&key, (Q_LEASED_UNTIL, receipt), Q_TAKEN_AT)
}

#[sql_function(
    "sturdy.done_many(workflows text[], receipts timestamptz[], queue text DEFAULT 'default')
     RETURNS bigint VOLATILE PARALLEL UNSAFE",
    comment = "done for a batch in one statement: removes each workflow whose receipt (same position) still matches, and returns how many were removed. NULL elements match nothing."
)]
pub(super) fn done_many(
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
    if pairs > i64::from(args::MAX_BATCH) {
        return Err(Error::Invalid {
            arg: "workflows",
            why: format!("has {pairs} elements, more than {}", args::MAX_BATCH),
            hint: "Pass at most 10000 workflows a call (as many as a take hands out), and call again for more.",
        });
    }
    if pairs == 0 {
        return Ok(0);
    }
    // the rows, then their places (what finds them read first)
    let ending = ended::ending_many(queue, workflows)?;
    let removed = remove_many(workflows, receipts, queue, pairs)?;
    if removed < pairs && schema::current() {
        // passes a wakeup landed on: their rows stay, ready
        let woken = plan::run_rows(
            &WOKEN_MANY,
            &[workflows.into(), receipts.into(), queue.into()],
            |r| Ok((0..r.len()).filter_map(|i| r.timestamptz(i, 1)).min()),
        )?;
        if let Some(earliest) = woken {
            let now = pg_sys::TimestampTz::from(pgrx::datum::now());
            if earliest < now {
                placed::backdated(queue.bytes())?;
            }
            if earliest <= now {
                wake_if_waited(queue)?;
            }
        }
    }
    let limited = ending.free_many(queue, workflows, receipts)?;
    ended::freed(queue, limited)?;
    Ok(removed)
}

/// `done_many`'s removal of the `pairs` rows.
fn remove_many(
    workflows: TextArray,
    receipts: TimestampArray,
    queue: Name,
    pairs: i64,
) -> Result<i64> {
    let leased = match leased_tids(workflows, receipts, queue) {
        Some((receipt, tids)) => {
            #[cfg(any(test, feature = "pg_test"))]
            BY_TID.with(|n| n.set(n.get() + 1));
            plan::run_generic(
                schema::pick(&DONE_LEASED, &schema::DONE_LEASED_RELEASED),
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
        schema::pick(&DONE_MANY, &schema::DONE_MANY_RELEASED),
        &[workflows.into(), receipts.into(), queue.into()],
        |t| Ok(t.len() as i64),
    )?;
    Ok(leased + by_key)
}

/// When every pair is a row of this backend's last batch take, in `queue`,
/// with that take's receipt: the receipt, and each row's tuple id at its
/// workflow's position (see [`Leased`]).
pub(super) fn leased_tids(
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
