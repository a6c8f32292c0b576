//! Failing passes, the queue's part: a worker's word that its pass failed
//! (`fail`'s row, [`fail_pass`]; the SQL function is `compose`'s, which
//! fails the instance of a row that died), `retry_queue`, the policy that
//! says when a failed row is handed out again and when it is dead,
//! `redrive` of a dead row, and a row cancelled ([`cancel_row`]). A lease
//! that runs out is a failure too, counted by the take that meets it
//! (`sql.rs`, `taken_set`).
//!
//! A failure is counted on the row (`attempts`); the row becomes visible
//! again after a backoff that doubles with each failure, up to a ceiling,
//! moved by a fraction of itself (jitter, drawn from a hash of the workflow
//! and the attempt) so that rows failing together do not come back
//! together; at the queue's `max_attempts` failures it is dead:
//! `visible_at` is `'infinity'`, past every take's `visible_at <= now()`,
//! so no take ever reaches it or holds a place for it, and its error, code,
//! count and time stay on it. A row where nothing failed has all four
//! columns NULL, and nothing here runs for it.

use super::*;

/// The policy of a queue without one (`retry_queue`'s defaults): 25
/// attempts, as River and graphile-worker give a job, a backoff of a second
/// doubled each failure up to an hour, and a tenth of jitter. Twenty-five
/// failures so spaced take about 13 hours: a poison row is dead within a
/// day, and a dependency down for an afternoon does not kill what waits on
/// it.
pub(super) const DEFAULT_MAX_ATTEMPTS: i32 = 25;

/// The most `max_attempts` a policy may set: past it a row would in effect
/// never die.
const MAX_ATTEMPTS: i32 = 1_000_000;

/// The longest `backoff` or `max_backoff`, in seconds (a year): a row
/// visible later than that is better cancelled.
const MAX_BACKOFF_SECONDS: f64 = 365.0 * 86_400.0;

/// The characters of an error `fail` keeps.
const ERROR_CHARS: i32 = 1_000;

/// The queue's policy, where it has one: `max_attempts` and, in seconds,
/// `backoff` and `max_backoff`; `jitter`. Read apart from the row's update
/// so that each statement stays on the queue's shard under Citus.
static POLICY: Statement = Statement {
    sql: "SELECT max_attempts, pg_catalog.date_part('epoch', backoff), pg_catalog.date_part('epoch', max_backoff), jitter
            FROM sturdy.queue_retry WHERE queue OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

/// Record the failure of the pass (`$1` workflow, `$2` receipt, `$4`
/// queue) at `$9` under the receipt rule: one more attempt,
/// the error (`$3`, cut to `$7` characters) and code (`$6`), and the row
/// visible again at `$5`, or after the backoff from `$9` (`$10` seconds
/// doubled for each failure before, at most `$11`, moved by up to `$12` of
/// itself by a fraction drawn from the workflow and the attempt), or dead
/// (`'infinity'`) at `$8` failures; `$13` is `$9` in seconds since 1970.
/// Returns the row's new `visible_at`.
static FAIL: Statement = Statement {
    sql: "UPDATE sturdy.queue q
             SET attempts = COALESCE(q.attempts, 0) OPERATOR(pg_catalog.+) 1,
                 visible_at = CASE
                     WHEN COALESCE(q.attempts, 0) OPERATOR(pg_catalog.+) 1 OPERATOR(pg_catalog.>=) $8
                         THEN 'infinity'::pg_catalog.timestamptz
                     WHEN $5 IS NOT NULL THEN $5
                     ELSE pg_catalog.to_timestamp($13 OPERATOR(pg_catalog.+) (
                         LEAST($11, $10 OPERATOR(pg_catalog.*)
                                   pg_catalog.power(2::pg_catalog.float8, LEAST(COALESCE(q.attempts, 0), 62)::pg_catalog.float8))
                         OPERATOR(pg_catalog.*) (1::pg_catalog.float8 OPERATOR(pg_catalog.+) ($12
                             OPERATOR(pg_catalog.*) ((2::pg_catalog.float8 OPERATOR(pg_catalog.*)
                             ((pg_catalog.hashtextextended(q.workflow, COALESCE(q.attempts, 0)::pg_catalog.int8)
                               OPERATOR(pg_catalog.&) 16777215)::pg_catalog.float8 OPERATOR(pg_catalog./) 16777216::pg_catalog.float8))
                             OPERATOR(pg_catalog.-) 1::pg_catalog.float8)))))
                 END,
                 taken_at = NULL, leased_until = NULL,
                 last_error = pg_catalog.\"left\"($3, $7), last_sqlstate = $6, failed_at = $9
           WHERE q.queue OPERATOR(pg_catalog.=) $4 AND q.workflow OPERATOR(pg_catalog.=) $1
             AND q.leased_until OPERATOR(pg_catalog.=) $2
          RETURNING q.visible_at",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TEXTOID,
        pg_sys::INT4OID,
        pg_sys::INT4OID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::FLOAT8OID,
        pg_sys::FLOAT8OID,
        pg_sys::FLOAT8OID,
        pg_sys::FLOAT8OID,
    ],
    writes: true,
    generic: false,
};

thread_local! {
    /// The rows whose lease ran out that the take statements of this call
    /// met and locked (workflow, lease end), to count ([`count_lapsed`]).
    static LAPSED_MET: RefCell<Vec<(Vec<u8>, pg_sys::TimestampTz)>> = const { RefCell::new(Vec::new()) };
    /// The workflows whose rows the takes of this call found dead (their
    /// last lease ran out), for the caller to fail their instances
    /// ([`take_died`]).
    static DIED: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// Note the rows a take statement reports in columns `col` and `col + 1`:
/// locked, not leased, their lease run out (workflow, lease end).
pub(super) fn note_lapsed(r: &plan::Rows, col: usize) {
    for i in 0..r.len() {
        if let (Some(w), Some(at)) = (r.text_bytes(i, col), r.timestamptz(i, col + 1)) {
            LAPSED_MET.with(|l| l.borrow_mut().push((w.to_vec(), at)));
        }
    }
}

/// Count the failure of each row whose lease ran out that the last take
/// statement met (and holds locked), answering how many it met: as `fail`
/// counts one, from the lease's end, with the error [`LAPSED`]. A row whose backoff is over by now is
/// ready again at once, at the time its backoff ended (the statement, run
/// again, leases it as the next attempt); one whose count reaches the
/// queue's `max_attempts` is dead, its workflow kept for [`take_died`].
pub(super) fn count_lapsed(queue: Name) -> Result<usize> {
    let met = LAPSED_MET.with(|l| std::mem::take(&mut *l.borrow_mut()));
    let counted = met.len();
    for (workflow, lease_end) in met {
        let (Ok(receipt), Ok(w)) = (
            TimestampWithTimeZone::try_from(lease_end),
            args::name("workflow", Some(Text::from_bytes(&workflow))),
        ) else {
            continue;
        };
        if lapse(w, receipt, queue)? == Some(true) {
            DIED.with(|d| d.borrow_mut().push(workflow));
        }
    }
    Ok(counted)
}

/// The failure of a pass whose lease (`receipt`) ran out, counted as
/// `fail` counts one, from the lease's end, with the error [`LAPSED`]:
/// `None` where the row no longer has that lease; else whether it died.
fn lapse(workflow: Name, receipt: TimestampWithTimeZone, queue: Name) -> Result<Option<bool>> {
    fail_at(
        workflow,
        receipt,
        Some(Text::new(LAPSED)),
        queue,
        None,
        None,
        Some(receipt),
    )
}

/// The workflows whose rows the last `take` found dead, taken out: their
/// instances are the caller's to fail (`compose`'s `take`), with
/// [`LAPSED`] as the error.
pub(crate) fn take_died() -> Vec<Vec<u8>> {
    LAPSED_MET.with(|l| l.borrow_mut().clear());
    DIED.with(|d| std::mem::take(&mut *d.borrow_mut()))
}

/// The error a pass whose lease ran out leaves on its row (the take
/// statements' `taken_set` writes the same).
pub(crate) const LAPSED: &str = "the lease ran out";

/// `fail`'s part on the queue (its arguments checked by the caller,
/// `compose`'s `fail`): the failure recorded under the receipt rule, the
/// generation bumped and waiting workers woken where the row is ready at
/// once, the pass's place freed. `None` for a stale receipt (nothing
/// written); else whether the row is dead.
pub(crate) fn fail_pass(
    workflow: Name,
    receipt: TimestampWithTimeZone,
    error: Option<Text>,
    queue: Name,
    retry_at: Option<TimestampWithTimeZone>,
    code: Option<Text>,
) -> Result<Option<bool>> {
    fail_at(workflow, receipt, error, queue, retry_at, code, None)
}

/// [`fail_pass`] of a failure at `since` (`None`: now): its backoff counts
/// from then.
fn fail_at(
    workflow: Name,
    receipt: TimestampWithTimeZone,
    error: Option<Text>,
    queue: Name,
    retry_at: Option<TimestampWithTimeZone>,
    code: Option<Text>,
    since: Option<TimestampWithTimeZone>,
) -> Result<Option<bool>> {
    // the queue's policy, or the defaults
    let (max_attempts, backoff, max_backoff, jitter) = run_one(&POLICY, &[queue.into()], |t| {
        if t.is_empty() {
            return Ok(None);
        }
        let row = t.first();
        Ok(Some((
            row.get::<i32>(1)?,
            row.get::<f64>(2)?,
            row.get::<f64>(3)?,
            row.get::<f64>(4)?,
        )))
    })?
    .map_or((None, None, None, None), |p| p);
    // the failure's time, given (`$9`) and as seconds since 1970 (`$13`):
    // the retry time is `to_timestamp`'s, the one form Citus accepts in an
    // update's CASE (it refuses now() and timestamptz + interval there,
    // which are not IMMUTABLE)
    let at = since.unwrap_or_else(pgrx::datum::now);
    let epoch = pg_sys::TimestampTz::from(at) as f64 / 1e6 + 946_684_800.0;
    let outcome = run_one(
        &FAIL,
        &[
            workflow.into(),
            receipt.into(),
            error.map_or_else(plan::null::<Text>, Into::into),
            queue.into(),
            retry_at.map_or_else(plan::null::<TimestampWithTimeZone>, Into::into),
            code.map_or_else(plan::null::<Text>, Into::into),
            ERROR_CHARS.into(),
            max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS).into(),
            at.into(),
            backoff.unwrap_or(DEFAULT_BACKOFF as f64 / 1e6).into(),
            max_backoff
                .unwrap_or(DEFAULT_MAX_BACKOFF as f64 / 1e6)
                .into(),
            jitter.unwrap_or(DEFAULT_JITTER).into(),
            epoch.into(),
        ],
        |t| {
            if t.is_empty() {
                return Ok(None);
            }
            // (compared here: Citus refuses now() in an update's RETURNING)
            let Some(visible) = t.first().get_one::<TimestampWithTimeZone>()? else {
                return Ok(None);
            };
            let now = pgrx::datum::now();
            Ok(Some((!visible.is_finite(), visible <= now, visible < now)))
        },
    )?;
    // the pass ends here, whether or not its receipt still held the row (as
    // `done` and `wake_at` end it): its place goes back to the queue, after
    // the row (a lapsed pass's place is free already: its receipt passed)
    let limited = match since {
        None => ended::ended(queue, workflow, receipt)?,
        Some(_) => false,
    };
    if let Some((_, ready, past)) = outcome {
        if past {
            placed::backdated(queue.bytes())?;
        }
        if ready {
            wake_if_waited(queue)?;
        }
    }
    ended::freed(queue, limited)?;
    Ok(outcome.map(|(dead, ..)| dead))
}

/// Set the queue's policy; none is kept where it is the default.
static SET_RETRY: Statement = Statement {
    sql: "INSERT INTO sturdy.queue_retry AS r (queue, max_attempts, backoff, max_backoff, jitter)
          VALUES ($1, $2, $3, $4, $5)
          ON CONFLICT (queue) DO UPDATE
             SET max_attempts = EXCLUDED.max_attempts, backoff = EXCLUDED.backoff,
                 max_backoff = EXCLUDED.max_backoff, jitter = EXCLUDED.jitter",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::INT4OID,
        pg_sys::INTERVALOID,
        pg_sys::INTERVALOID,
        pg_sys::FLOAT8OID,
    ],
    writes: true,
    generic: false,
};

static CLEAR_RETRY: Statement = Statement {
    sql: "DELETE FROM sturdy.queue_retry WHERE queue OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

#[sql_function(
    "sturdy.retry_queue(queue text, max_attempts integer DEFAULT 25, backoff interval DEFAULT '1 second',
                        max_backoff interval DEFAULT '1 hour', jitter float8 DEFAULT 0.1)
     RETURNS void VOLATILE PARALLEL UNSAFE",
    comment = "Set how the queue retries a failed pass: visible again after backoff doubled for each failure before it, at most max_backoff, moved by up to jitter of itself either way; dead at max_attempts failures. A NULL argument is its default (25, 1 second, 1 hour, 0.1), which a queue without a policy has."
)]
fn retry_queue(
    queue: Option<Text>,
    max_attempts: Option<i32>,
    backoff: Option<Interval>,
    max_backoff: Option<Interval>,
    jitter: Option<f64>,
) -> Result<()> {
    let queue = args::name("queue", queue)?;
    let max_attempts = args::at_most(
        "max_attempts",
        args::positive(
            "max_attempts",
            Some(max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS)),
        )?,
        MAX_ATTEMPTS,
        "Pass how many failures make a row dead, e.g. 25.",
    )?;
    let backoff = wait("backoff", backoff, DEFAULT_BACKOFF)?;
    let max_backoff = wait("max_backoff", max_backoff, DEFAULT_MAX_BACKOFF)?;
    let jitter = jitter.unwrap_or(DEFAULT_JITTER);
    if !(0.0..=1.0).contains(&jitter) {
        return Err(Error::Invalid {
            arg: "jitter",
            why: format!("must be from 0 to 1, got {jitter}"),
            hint: "Pass the fraction of each wait it may move either way at random, e.g. 0.1 (0: none).",
        });
    }
    let parts = |v: Interval| (v.months(), v.days(), v.micros());
    if max_attempts == DEFAULT_MAX_ATTEMPTS
        && parts(backoff) == (0, 0, DEFAULT_BACKOFF)
        && parts(max_backoff) == (0, 0, DEFAULT_MAX_BACKOFF)
        && jitter == DEFAULT_JITTER
    {
        return run_one(&CLEAR_RETRY, &[queue.into()], |_| Ok(()));
    }
    run_one(
        &SET_RETRY,
        &[
            queue.into(),
            max_attempts.into(),
            backoff.into(),
            max_backoff.into(),
            jitter.into(),
        ],
        |_| Ok(()),
    )
}

/// `retry_queue`'s default jitter: a tenth.
const DEFAULT_JITTER: f64 = 0.1;

/// `retry_queue`'s default waits, in µs: a second and an hour.
const DEFAULT_BACKOFF: i64 = 1_000_000;
const DEFAULT_MAX_BACKOFF: i64 = 3_600_000_000;

/// A wait of a policy (`default` µs where NULL): zero or more, at most a
/// year.
fn wait(arg: &'static str, v: Option<Interval>, default: i64) -> Result<Interval> {
    let v = match v {
        Some(v) => v,
        None => Interval::new(0, 0, default).map_err(|e| Error::Internal {
            context: "retry_queue",
            cause: e.to_string(),
        })?,
    };
    // (an infinite interval, PostgreSQL 17 on, has every field at its
    // extreme; the seconds below are then far out of range)
    let seconds = f64::from(v.months()) * 30.0 * 86_400.0
        + f64::from(v.days()) * 86_400.0
        + v.micros() as f64 / 1e6;
    if v.months() < 0
        || v.days() < 0
        || v.micros() < 0
        || !(0.0..=MAX_BACKOFF_SECONDS).contains(&seconds)
    {
        return Err(Error::Invalid {
            arg,
            why: format!("must be from 0 to a year, with no negative part, got {v}"),
            hint: "Pass a wait such as '1 second' or '10 minutes'.",
        });
    }
    Ok(v)
}

/// A dead row made ready now, its count forgotten (its last error and
/// time kept: what it died of).
static REDRIVE: Statement = Statement {
    sql: "UPDATE sturdy.queue
             SET visible_at = pg_catalog.now(), attempts = NULL, leased_until = NULL, taken_at = NULL
           WHERE queue OPERATOR(pg_catalog.=) $2 AND workflow OPERATOR(pg_catalog.=) $1
             AND visible_at OPERATOR(pg_catalog.=) 'infinity'::pg_catalog.timestamptz",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

#[sql_function(
    "sturdy.redrive(workflow text, queue text) RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "Make a dead row of queue (one that failed its max_attempts times) ready now, its attempts reset; its last error stays on the row. False when it is not dead (or not there). The outbox's redrive(delivery) is the one with one argument."
)]
fn redrive_workflow(workflow: Option<Text>, queue: Option<Text>) -> Result<bool> {
    let workflow = args::name("workflow", workflow)?;
    let queue = args::name("queue", queue)?;
    // (no RETURNING: the count of rows processed says it)
    let redriven = run_one(&REDRIVE, &[workflow.into(), queue.into()], |t| {
        Ok(!t.is_empty())
    })?;
    if redriven {
        // ready at its old place in take's order: takes whose floor is past
        // it look from the start again
        placed::backdated(queue.bytes())?;
        wake_if_waited(queue)?;
    }
    Ok(redriven)
}

/// The row, locked: the lease it has, if a take leased it since it was
/// last scheduled (running, or run out).
static CANCELLING: Statement = Statement {
    sql: "SELECT leased_until FROM sturdy.queue
           WHERE queue OPERATOR(pg_catalog.=) $2 AND workflow OPERATOR(pg_catalog.=) $1
             FOR UPDATE",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// The row gone, whatever it was doing.
static CANCEL: Statement = Statement {
    sql: "DELETE FROM sturdy.queue
           WHERE queue OPERATOR(pg_catalog.=) $2 AND workflow OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// `cancel`'s part on the queue (its arguments checked by the caller,
/// `compose`'s `cancel`): the row locked and removed, whatever it was
/// doing, and every place the workflow holds there freed. `None` where
/// there is no such row; else whether it had a lease (a pass running, woken,
/// or run out and not yet counted). The caller fences the claim whenever a
/// row went: a pass whose lapse was counted may still run.
pub(crate) fn cancel_row(workflow: Name, queue: Name) -> Result<Option<bool>> {
    let leased = run_one(&CANCELLING, &[workflow.into(), queue.into()], |t| {
        if t.is_empty() {
            return Ok(None);
        }
        Ok(Some(t.first().get_one::<TimestampWithTimeZone>()?))
    })?;
    let Some(leased) = leased else {
        return Ok(None);
    };
    // every place the workflow holds in the queue, whatever its receipt:
    // a pass whose lease was counted (or moved on) may still run, and
    // holds its place until its old receipt passes (while the row is
    // there: its key finds a key's place)
    let limited = ended::abandoned(queue, workflow)?;
    run_one(&CANCEL, &[workflow.into(), queue.into()], |_| Ok(()))?;
    ended::freed(queue, limited)?;
    Ok(Some(leased.is_some()))
}

/// The first queue name after `$1` (`''`: the first of all): one probe of
/// the primary key a name, however many rows each queue has.
static NEXT_QUEUE: Statement = Statement {
    sql: "SELECT pg_catalog.min(q.queue) FROM sturdy.queue q WHERE q.queue OPERATOR(pg_catalog.>) $1",
    args: &[pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

/// Among the first `$2` ready rows of queue `$1` in take's order (where
/// the leases a take left sit), those whose lease has run out: (workflow,
/// lease end).
static LAPSED_HEAD: Statement = Statement {
    sql: "SELECT h.workflow, h.leased_until
            FROM (SELECT x.workflow, x.leased_until FROM sturdy.queue x
                   WHERE x.queue OPERATOR(pg_catalog.=) $1 AND x.visible_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                   ORDER BY x.visible_at, x.seq
                   LIMIT $2) h
           WHERE h.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now()",
    args: &[pg_sys::TEXTOID, pg_sys::INT4OID],
    writes: false,
    generic: false,
};

/// The row (`$1` queue, `$2` workflow), locked unless a taker holds it,
/// where its lease `$3` has run out and no one has counted it since.
static LOCK_LAPSED: Statement = Statement {
    sql: "SELECT 1 FROM sturdy.queue x
           WHERE x.queue OPERATOR(pg_catalog.=) $1 AND x.workflow OPERATOR(pg_catalog.=) $2
             AND x.leased_until OPERATOR(pg_catalog.=) $3 AND x.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now()
             FOR UPDATE SKIP LOCKED",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID],
    writes: true,
    generic: false,
};

/// At most `$3` dead rows of queue `$1` that died before `now() - $2`,
/// the longest dead first, skipping any another session holds.
static DEAD_OLD: Statement = Statement {
    sql: "SELECT x.workflow FROM sturdy.queue x
           WHERE x.queue OPERATOR(pg_catalog.=) $1 AND x.visible_at OPERATOR(pg_catalog.=) 'infinity'::pg_catalog.timestamptz
             AND x.failed_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) $2)
           ORDER BY x.failed_at
           LIMIT $3
             FOR UPDATE SKIP LOCKED",
    args: &[pg_sys::TEXTOID, pg_sys::INTERVALOID, pg_sys::INT4OID],
    writes: true,
    generic: false,
};

/// The dead row (`$1` queue, `$2` workflow) gone (locked by [`DEAD_OLD`]).
static DELETE_DEAD: Statement = Statement {
    sql: "DELETE FROM sturdy.queue
           WHERE queue OPERATOR(pg_catalog.=) $1 AND workflow OPERATOR(pg_catalog.=) $2
             AND visible_at OPERATOR(pg_catalog.=) 'infinity'::pg_catalog.timestamptz",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// `sweep`'s part on failing passes: how many leases that ran out it
/// counted as failures, how many dead rows it removed, and the workflows of
/// the rows that died of a counted lapse (their instances are the caller's
/// to fail, with [`LAPSED`]).
pub(crate) struct Swept {
    pub(crate) lapsed: i64,
    pub(crate) dead: i64,
    pub(crate) died: Vec<Vec<u8>>,
}

/// One bounded batch, queue by queue: among the first `max` ready rows of
/// each queue in take's order, the leases that ran out with no take to meet
/// them (the workers gone) counted as failures, as a take counts them (from
/// the lease's end, rows a taker holds left to it), and dead rows that
/// died before `now() - older_than` removed, the longest dead first. At
/// most `max` of each in all.
pub(crate) fn sweep_failing(older_than: Interval, max: i32) -> Result<Swept> {
    let mut swept = Swept {
        lapsed: 0,
        dead: 0,
        died: Vec::new(),
    };
    let mut after: Vec<u8> = Vec::new();
    while swept.lapsed < i64::from(max) || swept.dead < i64::from(max) {
        let next = run_one(&NEXT_QUEUE, &[Text::from_bytes(&after).into()], |t| {
            Ok(first_value::<Text>(t)?.map(|q| q.bytes().to_vec()))
        })?;
        let Some(name) = next else { break };
        let queue = args::name("queue", Some(Text::from_bytes(&name)))?;
        // (dead rows first: a row that dies of a lapse counted below stays
        // at least until the next call, to be seen)
        if swept.dead < i64::from(max) {
            let left = max - swept.dead as i32;
            let old: Vec<Vec<u8>> = plan::run_rows(
                &DEAD_OLD,
                &[queue.into(), older_than.into(), left.into()],
                |r| {
                    Ok((0..r.len())
                        .filter_map(|i| Some(r.text_bytes(i, 1)?.to_vec()))
                        .collect())
                },
            )?;
            for workflow in old {
                let w = Text::from_bytes(&workflow);
                // (no RETURNING: the count of rows processed says it)
                if run_one(&DELETE_DEAD, &[queue.into(), w.into()], |t| {
                    Ok(!t.is_empty())
                })? {
                    swept.dead += 1;
                }
            }
        }
        if swept.lapsed < i64::from(max) {
            let left = max - swept.lapsed as i32;
            let met: Vec<(Vec<u8>, pg_sys::TimestampTz)> =
                plan::run_rows(&LAPSED_HEAD, &[queue.into(), max.into()], |r| {
                    Ok((0..r.len())
                        .filter_map(|i| Some((r.text_bytes(i, 1)?.to_vec(), r.timestamptz(i, 2)?)))
                        .take(left as usize)
                        .collect())
                })?;
            for (workflow, lease_end) in met {
                let Ok(receipt) = TimestampWithTimeZone::try_from(lease_end) else {
                    continue;
                };
                let w = args::name("workflow", Some(Text::from_bytes(&workflow)))?;
                let locked = run_one(
                    &LOCK_LAPSED,
                    &[queue.into(), w.into(), receipt.into()],
                    |t| Ok(!t.is_empty()),
                )?;
                if !locked {
                    continue;
                }
                if let Some(dead) = lapse(w, receipt, queue)? {
                    swept.lapsed += 1;
                    if dead {
                        swept.died.push(workflow);
                    }
                }
            }
        }
        after = name;
    }
    Ok(swept)
}
