//! `schedule`, `wake_at` and `arrive`: a workflow made visible, now or later.

use super::*;

/// What a schedule says of the row besides when: its priority and key. A
/// schedule gives both, the defaults included; `arrive` and `start` leave a
/// row's own as they are (a new row gets the defaults). `input`: the job's
/// input `schedule_many` writes (`Some(None)`: NULL, none); `None` where
/// the call writes none and the row keeps its own (`schedule`).
#[derive(Clone, Copy)]
pub struct Placing {
    pub priority: i32,
    pub key: Option<Name>,
    pub input: Option<Option<Jsonb>>,
}

/// Make `workflow` visible in `queue` at `visible_at`, for validated
/// arguments, placed as `placing` says (`None`: as the row stands).
/// `schedule`, `arrive` and `start` end here (`schedule_many` upserts its
/// rows, then does [`scheduled`] once). False where the row is dead and
/// stays so.
pub fn schedule_at(
    workflow: Name,
    visible_at: TimestampWithTimeZone,
    queue: Name,
    placing: Option<Placing>,
) -> Result<bool> {
    if !upsert(workflow, visible_at, queue, placing)? {
        return Ok(false);
    }
    scheduled(queue, visible_at, placing.map_or(0, |p| p.priority))?;
    Ok(true)
}

/// The row's upsert: false where it is dead and stays so.
fn upsert(
    workflow: Name,
    visible_at: TimestampWithTimeZone,
    queue: Name,
    placing: Option<Placing>,
) -> Result<bool> {
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
        (
            Q_INPUT,
            pg_sys::JSONBOID,
            placing.and_then(|p| p.input).flatten().map(|j| j.0),
        ),
    ];
    let given_input = placing.is_some_and(|p| p.input.is_some());
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
                    placed[2],
                ];
                // placed by the schedule (the input where one is given), or
                // (arrive, start) on insert only
                let (set, insert_only) = match placing {
                    Some(_) if given_input => (&set[..], &[][..]),
                    Some(_) => (&set[..5], &[][..]),
                    None => (&set[..3], &placed[..2]),
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
        return Ok(false);
    }
    if upserted.is_none() {
        let changed = match placing {
            Some(p) if given_input => run_one(
                &SCHEDULE_INPUT,
                &[
                    workflow.into(),
                    visible_at.into(),
                    queue.into(),
                    p.priority.into(),
                    p.key.map_or_else(plan::null::<Text>, Into::into),
                    p.input
                        .flatten()
                        .map_or_else(plan::null::<Jsonb>, Into::into),
                ],
                |t| Ok(!t.is_empty()),
            )?,
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
            return Ok(false);
        }
    }
    Ok(true)
}

/// What rows made visible in `queue` at `visible_at` (with `priority`)
/// tell the rest: the priority signal, the generation bump of a past time,
/// the wakeup of a waiting worker. Once for any number of rows of one call:
/// each is a per-queue signal (under Citus a statement to the queue's node).
fn scheduled(queue: Name, visible_at: TimestampWithTimeZone, priority: i32) -> Result<()> {
    // `now()` in SQL: the transaction's start
    let now = pg_sys::TimestampTz::from(pgrx::datum::now());
    let at = pg_sys::TimestampTz::from(visible_at);
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
    schedule_at(
        workflow,
        visible_at,
        queue,
        Some(Placing {
            priority,
            key,
            input: None,
        }),
    )?;
    Ok(())
}

/// One array argument's elements, checked one-dimensional and, where
/// `len` is given, that long.
fn elements(arg: &'static str, n: Option<usize>, len: Option<usize>) -> Result<usize> {
    const SHAPE: &str = "Pass one-dimensional arrays: the workflows and, at the same positions, their inputs and keys.";
    match (n, len) {
        (None, _) => Err(Error::Invalid {
            arg,
            why: "must be one-dimensional".into(),
            hint: SHAPE,
        }),
        (Some(n), Some(len)) if n != len => Err(Error::Invalid {
            arg,
            why: format!("has {n} elements and workflows {len}"),
            hint: SHAPE,
        }),
        (Some(n), _) => Ok(n),
    }
}

#[sql_function(
    "sturdy.schedule_many(workflows text[], inputs jsonb[] DEFAULT NULL, queue text DEFAULT 'default',
                          visible_at timestamptz DEFAULT now(), priority integer DEFAULT 0, keys text[] DEFAULT NULL)
     RETURNS bigint VOLATILE PARALLEL UNSAFE",
    comment = "schedule for a batch in one call: each workflow made visible in queue at visible_at and priority, with the input (jsonb) and key at the same position of inputs and keys (NULL arrays or elements: none), which take hands out with each pass. At most 10000 a call; a dead row stays dead. Returns how many rows were scheduled."
)]
fn schedule_many(
    workflows: Option<TextArray>,
    inputs: Option<JsonbArray>,
    queue: Option<Text>,
    visible_at: Option<TimestampWithTimeZone>,
    priority: Option<i32>,
    keys: Option<TextArray>,
) -> Result<i64> {
    let workflows = args::required("workflows", workflows)?;
    let n = elements("workflows", workflows.elements(), None)?;
    if let Some(inputs) = &inputs {
        elements("inputs", inputs.elements(), Some(n))?;
    }
    if let Some(keys) = &keys {
        elements("keys", keys.elements(), Some(n))?;
    }
    if n > args::MAX_BATCH as usize {
        return Err(Error::Invalid {
            arg: "workflows",
            why: format!("has {n} elements, more than {}", args::MAX_BATCH),
            hint: "Schedule at most 10000 workflows a call (1000 makes a good batch), and call again for more.",
        });
    }
    let queue = args::name("queue", queue)?;
    let visible_at = finite("visible_at", args::required("visible_at", visible_at)?)?;
    let priority = args::required("priority", priority)?;
    if priority < 0 {
        return Err(Error::Invalid {
            arg: "priority",
            why: format!("must be 0 or above, got {priority}"),
            hint: "Priorities count up from 0, the default: give the rows that must go first a higher one.",
        });
    }
    if !schema::current() {
        return Err(Error::Raised {
            code: *b"0A000",
            message: "schedule_many needs the extension's current schema".into(),
            detail: Some(
                "This library serves pg_sturdy 0.1.0's tables until they are updated.".into(),
            ),
            hint: Some(
                "Run ALTER EXTENSION pg_sturdy UPDATE, or call schedule for each workflow.".into(),
            ),
        });
    }
    // every element checked before anything is written
    let names = workflows
        .each_bytes()
        .into_iter()
        .map(|w| args::name("workflows", w.map(Text::from_bytes)))
        .collect::<Result<Vec<Name>>>()?;
    let inputs = inputs.map_or_else(|| vec![None; n], |i| i.each());
    let keys = match keys {
        Some(keys) => keys
            .each_bytes()
            .into_iter()
            .map(|k| args::optional_name("keys", k.map(Text::from_bytes)))
            .collect::<Result<Vec<Option<Name>>>>()?,
        None => vec![None; n],
    };
    let mut count = 0;
    for ((workflow, input), key) in names.into_iter().zip(inputs).zip(keys) {
        let placing = Placing {
            priority,
            key,
            input: Some(input.map(Jsonb)),
        };
        if upsert(workflow, visible_at, queue, Some(placing))? {
            count += 1;
        }
    }
    if count > 0 {
        scheduled(queue, visible_at, priority)?;
    }
    Ok(count)
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
