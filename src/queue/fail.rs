//! Failing passes: `fail`, a worker's word that its pass failed, and
//! `retry_queue`, the policy that says when a failed row is handed out
//! again and when it is dead.
//!
//! A failure is counted on the row (`attempts`); the row becomes visible
//! again after a backoff that doubles with each failure, up to a ceiling,
//! moved by a random fraction (jitter) so that rows failing together do not
//! come back together; at the queue's `max_attempts` failures it is dead:
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
/// (`sql.rs`'s `retry_max` says 25 too.)
pub(super) const DEFAULT_MAX_ATTEMPTS: i32 = 25;

/// The most `max_attempts` a policy may set: past it a row would in effect
/// never die.
const MAX_ATTEMPTS: i32 = 1_000_000;

/// The longest `backoff` or `max_backoff`, in seconds (a year): a row
/// visible later than that is better cancelled.
const MAX_BACKOFF_SECONDS: f64 = 365.0 * 86_400.0;

/// The characters of an error `fail` keeps.
const ERROR_CHARS: i32 = 1_000;

/// Record the failure of the pass (`$1` workflow, `$2` receipt, `$4`
/// queue) under the receipt rule: one more attempt, the error (`$3`, cut
/// to its first 1,000 characters) and code (`$6`), and the row visible
/// again at `$5` or after the queue's backoff, or dead (`'infinity'`) at
/// its `max_attempts`. Returns whether it is dead and whether it is ready
/// now. The policy is read in the same statement (colocated with the queue
/// under Citus, so it stays on the queue's shard).
static FAIL: Statement = Statement {
    sql: "UPDATE sturdy.queue q
             SET attempts = COALESCE(q.attempts, 0) OPERATOR(pg_catalog.+) 1,
                 visible_at = CASE
                     WHEN COALESCE(q.attempts, 0) OPERATOR(pg_catalog.+) 1 OPERATOR(pg_catalog.>=) p.max_attempts
                         THEN 'infinity'::pg_catalog.timestamptz
                     WHEN $5 IS NOT NULL THEN $5
                     ELSE pg_catalog.now() OPERATOR(pg_catalog.+) pg_catalog.make_interval(0, 0, 0, 0, 0, 0, (
                         LEAST(p.max_secs, p.secs OPERATOR(pg_catalog.*)
                                   pg_catalog.power(2::pg_catalog.float8, LEAST(COALESCE(q.attempts, 0), 62)::pg_catalog.float8))
                         OPERATOR(pg_catalog.*) (1::pg_catalog.float8 OPERATOR(pg_catalog.+) (p.jitter
                             OPERATOR(pg_catalog.*) ((2::pg_catalog.float8 OPERATOR(pg_catalog.*) pg_catalog.random()) OPERATOR(pg_catalog.-) 1::pg_catalog.float8)))))
                 END,
                 taken_at = NULL, leased_until = NULL,
                 last_error = pg_catalog.\"left\"($3, $7), last_sqlstate = $6, failed_at = pg_catalog.now()
            FROM (SELECT COALESCE(r.max_attempts, $8) AS max_attempts,
                         pg_catalog.date_part('epoch', COALESCE(r.backoff, '1 second'::pg_catalog.interval)) AS secs,
                         pg_catalog.date_part('epoch', COALESCE(r.max_backoff, '1 hour'::pg_catalog.interval)) AS max_secs,
                         COALESCE(r.jitter, 0.1::pg_catalog.float8) AS jitter
                    FROM (SELECT) AS one
                    LEFT JOIN sturdy.queue_retry r ON r.queue OPERATOR(pg_catalog.=) $4) p
           WHERE q.queue OPERATOR(pg_catalog.=) $4 AND q.workflow OPERATOR(pg_catalog.=) $1
             AND q.leased_until OPERATOR(pg_catalog.=) $2
          RETURNING q.visible_at OPERATOR(pg_catalog.=) 'infinity'::pg_catalog.timestamptz,
                    q.visible_at OPERATOR(pg_catalog.<=) pg_catalog.now(),
                    q.visible_at OPERATOR(pg_catalog.<) pg_catalog.now()",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TEXTOID,
        pg_sys::INT4OID,
        pg_sys::INT4OID,
    ],
    writes: true,
    generic: false,
};

/// A dead row's instance fails with the row's error (any instance of the
/// workflow still pending or running).
static FAIL_INSTANCE: Statement = Statement {
    sql: "UPDATE sturdy.instances
             SET status = 'failed', revision = revision OPERATOR(pg_catalog.+) 1, updated_at = pg_catalog.now(),
                 finished_at = pg_catalog.now(), last_error = COALESCE(pg_catalog.\"left\"($2, $3), last_error)
           WHERE workflow OPERATOR(pg_catalog.=) $1
             AND status OPERATOR(pg_catalog.=) ANY ('{pending,running}'::pg_catalog.text[])",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::INT4OID],
    writes: true,
    generic: false,
};

/// The workflows a take statement's rows name in column `col`: those whose
/// lease ran out for the last time (dead).
pub(super) fn died(r: &plan::Rows, col: usize) -> Vec<Vec<u8>> {
    (0..r.len())
        .filter_map(|i| r.text_bytes(i, col).map(<[u8]>::to_vec))
        .collect()
}

/// The instances of workflows whose rows a take found dead: failed, as
/// `fail` fails them, with the error their rows keep.
pub(super) fn instances_failed(dead: &[Vec<u8>]) -> Result<()> {
    for workflow in dead {
        run_one(
            &FAIL_INSTANCE,
            &[
                Text::from_bytes(workflow).into(),
                Text::new(LAPSED).into(),
                ERROR_CHARS.into(),
            ],
            |_| Ok(()),
        )?;
    }
    Ok(())
}

/// The error a pass whose lease ran out leaves on its row (the take
/// statements' `taken_set` writes the same).
const LAPSED: &str = "the lease ran out";

#[sql_function(
    "sturdy.fail(workflow text, receipt timestamptz, error text, queue text DEFAULT 'default',
                 retry_at timestamptz DEFAULT NULL, code text DEFAULT NULL)
     RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "The pass failed: under the receipt rule of done, count one more attempt, keep error (its first 1000 characters) and code, and make the row visible again at retry_at, or after the queue's backoff (retry_queue), or, at its max_attempts, dead (never handed out again; its instance failed). False, and nothing written, for a stale receipt."
)]
fn fail(
    workflow: Option<Text>,
    receipt: Option<TimestampWithTimeZone>,
    error: Option<Text>,
    queue: Option<Text>,
    retry_at: Option<TimestampWithTimeZone>,
    code: Option<Text>,
) -> Result<bool> {
    let workflow = args::name("workflow", workflow)?;
    let receipt = args::required("receipt", receipt)?;
    let queue = args::name("queue", queue)?;
    if let Some(at) = retry_at
        && !at.is_finite()
    {
        return Err(Error::Invalid {
            arg: "retry_at",
            why: format!("must be a finite time, got {at}"),
            hint: "Pass when the row should be handed out again, or NULL for the queue's backoff; cancel a row that should never run.",
        });
    }
    if let Some(c) = code
        && !(c.bytes().len() == 5
            && c.bytes()
                .iter()
                .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()))
    {
        return Err(Error::Invalid {
            arg: "code",
            why: format!(
                "must be five digits or capital letters, got {:?}",
                c.lossy()
            ),
            hint: "Pass a SQLSTATE-like code such as 40001 or the error's own, or NULL.",
        });
    }
    let error_arg = || error.map_or_else(plan::null::<Text>, Into::into);
    let outcome = run_one(
        &FAIL,
        &[
            workflow.into(),
            receipt.into(),
            error_arg(),
            queue.into(),
            retry_at.map_or_else(plan::null::<TimestampWithTimeZone>, Into::into),
            code.map_or_else(plan::null::<Text>, Into::into),
            ERROR_CHARS.into(),
            DEFAULT_MAX_ATTEMPTS.into(),
        ],
        |t| {
            if t.is_empty() {
                return Ok(None);
            }
            let row = t.first();
            Ok(Some((
                row.get::<bool>(1)?.unwrap_or(false),
                row.get::<bool>(2)?.unwrap_or(false),
                row.get::<bool>(3)?.unwrap_or(false),
            )))
        },
    )?;
    let Some((dead, ready, past)) = outcome else {
        return Ok(false);
    };
    if dead {
        run_one(
            &FAIL_INSTANCE,
            &[workflow.into(), error_arg(), ERROR_CHARS.into()],
            |_| Ok(()),
        )?;
    }
    if past {
        generation::bump();
    }
    if ready {
        wake_if_waited(queue)?;
    }
    // the pass ends here: its place goes back to the queue
    let limited = limits::ended(queue, workflow, receipt)?;
    limits::freed(queue, limited)?;
    Ok(true)
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
    let jitter = jitter.unwrap_or(0.1);
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
        && jitter == 0.1
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
        generation::bump();
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

/// The workflow's claim fenced: a token no pass was given, so every write
/// of the pass that held it is refused (SD001); the claim free to take.
static FENCE_CLAIM: Statement = Statement {
    sql: "UPDATE sturdy.claims
             SET token = token OPERATOR(pg_catalog.+) 1, held_until = LEAST(held_until, pg_catalog.now())
           WHERE workflow OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

#[sql_function(
    "sturdy.cancel(workflow text, queue text DEFAULT 'default') RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "Remove the workflow's row from queue, whether waiting, sleeping, failing, dead or in a pass: a pass under way then finds its done, finish and wake_at answering false, and its claim's token fenced (its writes raise SD001). False when there is no such row."
)]
fn cancel(workflow: Option<Text>, queue: Option<Text>) -> Result<bool> {
    let workflow = args::name("workflow", workflow)?;
    let queue = args::name("queue", queue)?;
    let leased = run_one(&CANCELLING, &[workflow.into(), queue.into()], |t| {
        if t.is_empty() {
            return Ok(None);
        }
        Ok(Some(t.first().get_one::<TimestampWithTimeZone>()?))
    })?;
    let Some(leased) = leased else {
        return Ok(false);
    };
    // (while the row is there: its key finds a pass's place)
    let limited = match leased {
        Some(receipt) => limits::ended(queue, workflow, receipt)?,
        None => false,
    };
    run_one(&CANCEL, &[workflow.into(), queue.into()], |_| Ok(()))?;
    if leased.is_some() {
        // taken since it was last scheduled: the pass that took it (running,
        // or run out but perhaps alive) writes nothing more
        run_one(&FENCE_CLAIM, &[workflow.into()], |_| Ok(()))?;
    }
    limits::freed(queue, limited)?;
    Ok(true)
}
