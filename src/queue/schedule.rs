//! `schedule`, `wake_at` and `arrive`: a workflow made visible, now or later.

use super::*;

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
            schema::pick(&SCHEDULE, &schema::SCHEDULE_RELEASED),
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
        schema::pick(&WAKE_AT, &schema::WAKE_AT_RELEASED),
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
    // the pass ends here, whether or not its receipt still held the row
    limits::ended(queue, workflow, receipt)?;
    Ok(moved.is_some())
}
