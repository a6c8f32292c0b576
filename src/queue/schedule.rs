//! `schedule`, `wake_at` and `arrive`: a workflow made visible, now or later.

use super::*;

/// What a schedule says of the row besides when: its priority and key. A
/// schedule gives both, the defaults included; `arrive` and `start` leave a
/// row's own as they are (a new row gets the defaults).
#[derive(Clone, Copy)]
pub struct Placing {
    pub priority: i32,
    pub key: Option<Name>,
}

/// Make `workflow` visible in `queue` at `visible_at`, for validated
/// arguments, placed as `placing` says (`None`: as the row stands).
/// `schedule`, `arrive` and `start` all end here.
pub fn schedule_at(
    workflow: Name,
    visible_at: TimestampWithTimeZone,
    queue: Name,
    placing: Option<Placing>,
) -> Result<()> {
    // `now()` in SQL: the transaction's start
    let now = pg_sys::TimestampTz::from(pgrx::datum::now());
    let at = pg_sys::TimestampTz::from(visible_at);
    let priority = placing.map_or(0, |p| p.priority);
    let key = placing.and_then(|p| p.key).and_then(|k| k.into_datum());
    let placed = [
        (
            Q_PRIORITY,
            pg_sys::INT4OID,
            Some(pg_sys::Datum::from(priority)),
        ),
        (Q_KEY, pg_sys::TEXTOID, key),
    ];
    // [`SCHEDULE`]'s upsert without the statement, where nothing it would
    // do is skipped that way (see `access`)
    let upserted = match (queue.into_datum(), workflow.into_datum()) {
        (Some(q), Some(w)) => QUEUE.with(
            &[pg_sys::ACL_INSERT, pg_sys::ACL_UPDATE],
            queue.bytes(),
            |table| {
                let set = [
                    (
                        Q_VISIBLE_AT,
                        pg_sys::TIMESTAMPTZOID,
                        Some(pg_sys::Datum::from(at)),
                    ),
                    (Q_TAKEN_AT, pg_sys::TIMESTAMPTZOID, None),
                    (
                        Q_SCHEDULED_AT,
                        pg_sys::TIMESTAMPTZOID,
                        Some(pg_sys::Datum::from(now)),
                    ),
                    placed[0],
                    placed[1],
                ];
                // placed by the schedule, or (arrive, start) on insert only
                let (set, insert_only) = match placing {
                    Some(_) => (&set[..], &[][..]),
                    None => (&set[..3], &placed[..]),
                };
                table.upsert(&access::Upsert {
                    key: &[(Q_QUEUE, q), (Q_WORKFLOW, w)],
                    set,
                    fill: &[
                        (Q_TAKES, access::Fill::Int4(0)),
                        (Q_SEQ, access::Fill::Next(&schema::SEQUENCE)),
                    ],
                    insert_only,
                    // a dead row (`visible_at` past `LAST_FINITE`) is left as it is
                    only_if: Some((Q_VISIBLE_AT, LAST_FINITE)),
                    increment: None,
                    skip_locked: false,
                })
            },
        )?,
        _ => None,
    };
    if upserted == Some(access::Upserted::Kept) {
        // dead: only redrive (or cancel) moves it
        return Ok(());
    }
    if upserted.is_none() {
        let changed = match placing {
            Some(p) if schema::current() => run_one(
                &SCHEDULE_PLACED,
                &[
                    workflow.into(),
                    visible_at.into(),
                    queue.into(),
                    p.priority.into(),
                    p.key.map_or_else(plan::null::<Text>, Into::into),
                ],
                |t| Ok(!t.is_empty()),
            )?,
            _ => run_one(
                schema::pick(&SCHEDULE, &schema::SCHEDULE_RELEASED),
                &[workflow.into(), visible_at.into(), queue.into()],
                |t| Ok(!t.is_empty()),
            )?,
        };
        if !changed {
            return Ok(());
        }
    }
    if priority > 0 {
        priority::scheduled(queue)?;
    }
    if at < now {
        placed::backdated(queue.bytes())?;
    }
    if at <= now {
        wake_if_waited(queue)?;
    }
    Ok(())
}

/// A time a row may be made visible at: anything but `'infinity'`, which
/// is a dead row's alone (`fail.rs`): a row parked there by a schedule
/// would be taken for dead, counted, redriven and swept as one. A park
/// with no deadline is a time far ahead, which an `arrive` ends.
fn finite(arg: &'static str, at: TimestampWithTimeZone) -> Result<TimestampWithTimeZone> {
    if pg_sys::TimestampTz::from(at) > LAST_FINITE {
        return Err(Error::Invalid {
            arg,
            why: "must be a finite time: 'infinity' marks a dead row".into(),
            hint: "To sleep until an event arrives, park the workflow at a time far ahead, e.g. now() + interval '100 years': arrive or schedule wakes it sooner.",
        });
    }
    Ok(at)
}

#[sql_function(
    "sturdy.schedule(workflow text, visible_at timestamptz DEFAULT now(), queue text DEFAULT 'default',
                     priority integer DEFAULT 0, key text DEFAULT NULL)
     RETURNS void VOLATILE PARALLEL UNSAFE",
    comment = "Make the workflow visible in queue at visible_at (upsert: lands on top of a pass in flight, keeping its lease, so the wakeup survives its done; a dead row stays dead; 'infinity' is refused), at priority (take hands out higher first; 0 or above) and in the group key for the queue's per_key limit; a reschedule sets both. When visible now and a take found the queue empty since the last notification, NOTIFY sturdy with the queue name, delivered at commit."
)]
fn schedule(
    call: &Args,
    workflow: Option<Text>,
    visible_at: Option<TimestampWithTimeZone>,
    queue: Option<Text>,
    priority: Option<i32>,
    key: Option<Text>,
) -> Result<()> {
    let workflow = args::name("workflow", workflow)?;
    let visible_at = finite("visible_at", args::required("visible_at", visible_at)?)?;
    let queue = args::name("queue", queue)?;
    // (0.1.0's schedule has neither: served until ALTER EXTENSION UPDATE)
    let priority = if call.given(3) {
        args::required("priority", priority)?
    } else {
        0
    };
    if priority < 0 {
        return Err(Error::Invalid {
            arg: "priority",
            why: format!("must be 0 or above, got {priority}"),
            hint: "Priorities count up from 0, the default: give the rows that must go first a higher one (rows below the default would make every take of the queue look past them).",
        });
    }
    let key = args::optional_name("key", key)?;
    if (priority > 0 || key.is_some()) && !schema::current() {
        return Err(Error::Raised {
            code: *b"0A000",
            message: "priority and key need the extension's current schema".into(),
            detail: Some(
                "This library serves pg_sturdy 0.1.0's tables until they are updated.".into(),
            ),
            hint: Some(
                "Run ALTER EXTENSION pg_sturdy UPDATE, or schedule without priority and key."
                    .into(),
            ),
        });
    }
    schedule_at(workflow, visible_at, queue, Some(Placing { priority, key }))
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
    let at = finite("at", args::required("at", at)?)?;
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
    if moved.is_some() && at < pgrx::datum::now() && schema::current() {
        placed::backdated(queue.bytes())?;
    }
    if moved == Some(true) {
        wake(queue)?;
    }
    if moved.is_none() {
        // a wakeup landed during the pass: it wins, the row ready then
        done::end_woken(workflow, receipt, queue)?;
    }
    // the pass ends here, whether or not its receipt still held the row
    // (the row first, then its places)
    let limited = ended::ended(queue, workflow, receipt)?;
    ended::freed(queue, limited)?;
    Ok(moved.is_some())
}
