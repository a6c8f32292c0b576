//! Setting a queue's limits: `limit_queue`, `pause` and `resume` (what the
//! limits do to a take is `limits.rs`).
//!
//! `limit_queue` makes the queue's places anew from the passes in flight,
//! each holding one, so a pass that started before the change counts
//! against the new limit until it ends: lowered then raised again, the
//! limit still counts the passes running. Where more passes run than a new
//! limit allows, some hold places past it: the queue is *settling*
//! (`sturdy.queue_limits.settling`), and its takes go one at a time and
//! count the places held (`limits::settle`) until none past the limit is
//! held; then the places past it go and the takes go by the places alone.
//!
//! What it cannot see: a take under way on a queue that had no limit, in a
//! transaction still open when `limit_queue` commits, leased without a
//! place and is not counted (a take that holds a place, or makes a key's
//! places, is waited for). Set a limit before the workers start, or pause
//! the queue first.

use super::limits::changed;
use super::*;

/// Set the queue's limits row: `$2..$5`; the bucket starts full when the
/// rate changes. No row is left for a queue with no limit and not paused.
static SET_LIMITS: Statement = Statement {
    sql: "INSERT INTO sturdy.queue_limits AS l (queue, running, per_second, burst, tokens, refilled_at, per_key)
          VALUES ($1, $2, $3, $4, $4, pg_catalog.now(), $5)
          ON CONFLICT (queue) DO UPDATE
             SET running = EXCLUDED.running, per_second = EXCLUDED.per_second, burst = EXCLUDED.burst,
                 per_key = EXCLUDED.per_key,
                 tokens = CASE WHEN COALESCE(l.per_second, 0) OPERATOR(pg_catalog.=) COALESCE(EXCLUDED.per_second, 0)
                                AND COALESCE(l.burst, 0) OPERATOR(pg_catalog.=) COALESCE(EXCLUDED.burst, 0)
                               THEN l.tokens ELSE EXCLUDED.tokens END,
                 refilled_at = CASE WHEN COALESCE(l.per_second, 0) OPERATOR(pg_catalog.=) COALESCE(EXCLUDED.per_second, 0)
                                     AND COALESCE(l.burst, 0) OPERATOR(pg_catalog.=) COALESCE(EXCLUDED.burst, 0)
                                    THEN l.refilled_at ELSE EXCLUDED.refilled_at END",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::INT4OID,
        pg_sys::FLOAT8OID,
        pg_sys::INT4OID,
        pg_sys::INT4OID,
    ],
    writes: true,
    generic: false,
};

/// The places of a queue, all locked: `limit_queue` waits for the takes
/// under way that hold one (they lock a place before they lease), and a
/// take that starts meanwhile finds none free.
static LOCK_PLACES: [Statement; 2] = [
    Statement {
        sql: "SELECT FROM sturdy.queue_places WHERE queue OPERATOR(pg_catalog.=) $1 FOR UPDATE",
        args: &[pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
    Statement {
        sql: "SELECT FROM sturdy.queue_key_places WHERE queue OPERATOR(pg_catalog.=) $1 FOR UPDATE",
        args: &[pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
];

/// The queue's passes in flight: its leased rows (workflow, receipt, key),
/// read on a snapshot of now (see [`limit_queue`]); the latest receipt
/// first, for the first places: the places past a lowered limit then
/// hold the passes that end first, and the queue settles soonest.
static IN_FLIGHT: Statement = Statement {
    sql: "SELECT workflow, leased_until, key FROM sturdy.queue
           WHERE queue OPERATOR(pg_catalog.=) $1 AND leased_until OPERATOR(pg_catalog.>) pg_catalog.now()
           ORDER BY leased_until DESC, workflow",
    args: &[pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

static CLEAR_PLACES: [Statement; 2] = [
    Statement {
        sql: "DELETE FROM sturdy.queue_places WHERE queue OPERATOR(pg_catalog.=) $1",
        args: &[pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
    Statement {
        sql: "DELETE FROM sturdy.queue_key_places WHERE queue OPERATOR(pg_catalog.=) $1",
        args: &[pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
];

/// The running limit's places, `$2` (NULL: none) or as many as the passes
/// in flight (`$3`, `$4`) where they are more, each pass holding one.
static MAKE_RUNNING_PLACES: Statement = Statement {
    sql: "INSERT INTO sturdy.queue_places (queue, place, workflow, receipt)
          SELECT $1, g, p.workflow, p.receipt
            FROM pg_catalog.generate_series(1, GREATEST($2, pg_catalog.cardinality($3))) g
            LEFT JOIN ROWS FROM (pg_catalog.unnest($3), pg_catalog.unnest($4)) WITH ORDINALITY
                      AS p(workflow, receipt, n) ON p.n OPERATOR(pg_catalog.=) g
           WHERE $2 IS NOT NULL
          ON CONFLICT (queue, place) DO UPDATE SET workflow = EXCLUDED.workflow, receipt = EXCLUDED.receipt",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::INT4OID,
        pg_sys::TEXTARRAYOID,
        pg_sys::TIMESTAMPTZARRAYOID,
    ],
    writes: true,
    generic: false,
};

/// Each key's places, `$2` (NULL: none) or as many as its passes in flight
/// (`$3`, `$4`, `$5`) where they are more, each pass holding one; for the
/// keys of the passes and of the queue's rows. A place a take made for a
/// new key while this call waited, which a repeatable-read caller's
/// snapshot could not see to clear, is written over (there: `40001`, the
/// caller's to retry, never `23505`).
static MAKE_KEY_PLACES: Statement = Statement {
    sql: "WITH passes AS (
              SELECT p.workflow, p.receipt, p.key COLLATE \"C\" AS key,
                     pg_catalog.row_number() OVER (PARTITION BY p.key COLLATE \"C\"
                                                   ORDER BY p.receipt DESC, p.workflow) AS n
                FROM ROWS FROM (pg_catalog.unnest($3), pg_catalog.unnest($4), pg_catalog.unnest($5))
                     AS p(workflow, receipt, key)
               WHERE p.key IS NOT NULL),
          keys AS (
              SELECT k.key, pg_catalog.max(k.n)::pg_catalog.int4 AS n FROM (
                  SELECT key, n FROM passes
                  UNION ALL
                  SELECT q.key COLLATE \"C\", 0 FROM sturdy.queue q
                   WHERE q.queue OPERATOR(pg_catalog.=) $1 AND q.key IS NOT NULL) k
               GROUP BY k.key)
          INSERT INTO sturdy.queue_key_places (queue, key, place, workflow, receipt)
          SELECT $1, k.key, g, p.workflow, p.receipt
            FROM keys k
           CROSS JOIN LATERAL pg_catalog.generate_series(1, GREATEST($2, k.n)) g
            LEFT JOIN passes p ON p.key OPERATOR(pg_catalog.=) k.key AND p.n OPERATOR(pg_catalog.=) g
           WHERE $2 IS NOT NULL
          ON CONFLICT (queue, key, place) DO UPDATE SET workflow = EXCLUDED.workflow, receipt = EXCLUDED.receipt",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::INT4OID,
        pg_sys::TEXTARRAYOID,
        pg_sys::TIMESTAMPTZARRAYOID,
        pg_sys::TEXTARRAYOID,
    ],
    writes: true,
    generic: false,
};

static SET_SETTLING: Statement = Statement {
    sql: "UPDATE sturdy.queue_limits SET settling = $2 WHERE queue OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::TEXTOID, pg_sys::BOOLOID],
    writes: true,
    generic: false,
};

/// A limits row with nothing in it goes.
static DROP_EMPTY: Statement = Statement {
    sql: "DELETE FROM sturdy.queue_limits
           WHERE queue OPERATOR(pg_catalog.=) $1 AND NOT paused AND running IS NULL AND per_key IS NULL
             AND per_second IS NULL",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// Whether it was not paused before.
static PAUSE: Statement = Statement {
    sql: "INSERT INTO sturdy.queue_limits AS l (queue, paused) VALUES ($1, true)
          ON CONFLICT (queue) DO UPDATE SET paused = true WHERE NOT l.paused
          RETURNING true",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// Whether it was paused before.
static RESUME: Statement = Statement {
    sql: "UPDATE sturdy.queue_limits SET paused = false
           WHERE queue OPERATOR(pg_catalog.=) $1 AND paused
          RETURNING true",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

static NOTIFY_RESUMED: Statement = Statement {
    sql: "SELECT pg_catalog.pg_notify('sturdy', $1)",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// The most places of the running limit: each is a row `limit_queue`
/// writes and a take may read; more passes at once than this are more
/// than one server's connections can hold, so a larger limit is no limit.
pub(crate) const MAX_RUNNING: i32 = 10_000;
/// The most places of one key: each key of the queue gets this many rows.
pub(crate) const MAX_PER_KEY: i32 = 1_000;
/// The fastest rate, in takes a second: far above what one server takes,
/// and small enough that a refill after any pause stays a finite number.
pub(crate) const MAX_PER_SECOND: f64 = 1_000_000.0;
/// The largest bucket.
pub(crate) const MAX_BURST: i32 = 1_000_000;

#[sql_function(
    "sturdy.limit_queue(queue text, running integer DEFAULT NULL, per_key integer DEFAULT NULL,
                        per_second float8 DEFAULT NULL, burst integer DEFAULT NULL)
     RETURNS void VOLATILE PARALLEL UNSAFE",
    comment = "Set the queue's limits; a NULL clears that limit. running (at most 10000): at most this many of its rows leased at once; per_key (at most 1000): at most this many leased at once for one key (schedule's key; rows without one are not limited by it); per_second (at most 1000000) with burst (at most 1000000): at most burst takes at once and per_second on average (burst defaults to one second's worth). Passes already running count against a new limit until they end. A take over a limit hands out fewer rows, never an error."
)]
fn limit_queue(
    queue: Option<Text>,
    running: Option<i32>,
    per_key: Option<i32>,
    per_second: Option<f64>,
    burst: Option<i32>,
) -> Result<()> {
    let queue = args::name("queue", queue)?;
    let running = running
        .map(|n| {
            args::at_most(
                "running",
                args::positive("running", Some(n))?,
                MAX_RUNNING,
                "Pass at most 10000 passes at once, or NULL for no running limit.",
            )
        })
        .transpose()?;
    let per_key = per_key
        .map(|n| {
            args::at_most(
                "per_key",
                args::positive("per_key", Some(n))?,
                MAX_PER_KEY,
                "Pass at most 1000 passes at once per key, or NULL for no per-key limit.",
            )
        })
        .transpose()?;
    if let Some(rate) = per_second
        && !(rate.is_finite() && rate > 0.0 && rate <= MAX_PER_SECOND)
    {
        return Err(Error::Invalid {
            arg: "per_second",
            why: format!("must be a number above zero and at most 1000000, got {rate}"),
            hint: "Pass takes per second on average, e.g. 200 (or 0.5 for one every two seconds).",
        });
    }
    let burst = match (per_second, burst) {
        (None, Some(_)) => {
            return Err(Error::Invalid {
                arg: "burst",
                why: "is the rate limit's bucket and needs per_second".into(),
                hint: "Pass per_second with burst, or neither.",
            });
        }
        (Some(_), Some(b)) => Some(args::at_most(
            "burst",
            args::positive("burst", Some(b))?,
            MAX_BURST,
            "Pass at most 1000000 takes at once, or leave burst out for one second's worth.",
        )?),
        // one second's worth, at least one take
        (Some(rate), None) => Some(rate.ceil().clamp(1.0, f64::from(MAX_BURST)) as i32),
        (None, None) => None,
    };
    let opt_i32 = |v: Option<i32>| v.map_or_else(plan::null::<i32>, Into::into);
    // The places are made anew from the passes in flight, each holding one:
    // a pass that started before the change counts against the new limit
    // until it ends. The takes under way that hold places are waited for
    // first (before the limits row is locked: such a take may still make a
    // new key's places, reading that row `FOR SHARE`); then the leased rows
    // are read on a snapshot of now, which sees them (a repeatable-read
    // caller's would not).
    for lock in &LOCK_PLACES {
        run_one(lock, &[queue.into()], |_| Ok(()))?;
    }
    run_one(
        &SET_LIMITS,
        &[
            queue.into(),
            opt_i32(running),
            per_second.map_or_else(plan::null::<f64>, Into::into),
            opt_i32(burst),
            opt_i32(per_key),
        ],
        |_| Ok(()),
    )?;
    // (copied out as bytes: SPI's memory goes when its connection closes)
    let passes: Vec<(Vec<u8>, pg_sys::TimestampTz, Option<Vec<u8>>)> =
        plan::run_at_latest(&IN_FLIGHT, &[queue.into()], |r| {
            Ok((0..r.len())
                .filter_map(|i| {
                    Some((
                        r.text_bytes(i, 1)?.to_vec(),
                        r.timestamptz(i, 2)?,
                        r.text_bytes(i, 3).map(<[u8]>::to_vec),
                    ))
                })
                .collect())
        })?;
    let settling = running.is_some_and(|n| passes.len() > n as usize)
        || per_key.is_some_and(|n| {
            let mut each: HashMap<&[u8], usize> = HashMap::new();
            for key in passes.iter().filter_map(|p| p.2.as_deref()) {
                *each.entry(key).or_default() += 1;
            }
            each.values().any(|&k| k > n as usize)
        });
    let workflows: Vec<Option<Text>> = passes
        .iter()
        .map(|p| Some(Text::from_bytes(&p.0)))
        .collect();
    let receipts: Vec<Option<TimestampWithTimeZone>> = passes
        .iter()
        .map(|p| TimestampWithTimeZone::try_from(p.1).ok())
        .collect();
    let keys: Vec<Option<Text>> = passes
        .iter()
        .map(|p| p.2.as_deref().map(Text::from_bytes))
        .collect();
    for clear in &CLEAR_PLACES {
        run_one(clear, &[queue.into()], |_| Ok(()))?;
    }
    run_one(
        &MAKE_RUNNING_PLACES,
        &[
            queue.into(),
            opt_i32(running),
            workflows.clone().into(),
            receipts.clone().into(),
        ],
        |_| Ok(()),
    )?;
    run_one(
        &MAKE_KEY_PLACES,
        &[
            queue.into(),
            opt_i32(per_key),
            workflows.into(),
            receipts.into(),
            keys.into(),
        ],
        |_| Ok(()),
    )?;
    run_one(&SET_SETTLING, &[queue.into(), settling.into()], |_| Ok(()))?;
    run_one(&DROP_EMPTY, &[queue.into()], |_| Ok(()))?;
    changed_by_call(queue)
}

/// A call changed `queue`'s limits or its pause: [`changed`], and under
/// Citus the queue's node told (`placed::settings_changed`).
fn changed_by_call(queue: Name) -> Result<()> {
    super::placed::settings_changed(queue.bytes())?;
    changed();
    Ok(())
}

#[sql_function(
    "sturdy.pause(queue text) RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "Pause the queue: take hands out nothing from it until resume; schedules, wakeups and done go on. False when it was paused already."
)]
fn pause(queue: Option<Text>) -> Result<bool> {
    let queue = args::name("queue", queue)?;
    let paused_now = run_one(&PAUSE, &[queue.into()], first_value::<bool>)?;
    changed_by_call(queue)?;
    Ok(paused_now.unwrap_or(false))
}

#[sql_function(
    "sturdy.resume(queue text) RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "Resume a paused queue, and wake its listening workers at commit. False when it was not paused."
)]
fn resume(queue: Option<Text>) -> Result<bool> {
    let queue = args::name("queue", queue)?;
    let was = run_one(&RESUME, &[queue.into()], first_value::<bool>)?.unwrap_or(false);
    run_one(&DROP_EMPTY, &[queue.into()], |_| Ok(()))?;
    changed_by_call(queue)?;
    if was {
        let payload = crate::datum::notify_payload(queue.bytes());
        run_one(&NOTIFY_RESUMED, &[payload.into()], |_| Ok(()))?;
    }
    Ok(was)
}

#[sql_function(
    "sturdy.queue_changed(queue text) RETURNS void VOLATILE PARALLEL UNSAFE",
    comment = "Under Citus: the queue's limits, its pause or its prioritized rows changed, so this node's sessions read them again at their next take. limit_queue, pause, resume and a prioritized schedule call it on the node that holds the queue (sturdy.distribute() delegates it there); a call of your own only costs the next takes a read."
)]
fn queue_changed(queue: Option<Text>) -> Result<()> {
    let queue = args::name("queue", queue)?;
    changed();
    super::priority::signalled(queue);
    Ok(())
}

#[sql_function(
    "sturdy.queue_backdated(queue text) RETURNS void VOLATILE PARALLEL UNSAFE",
    comment = "Under Citus: a row of the queue was made ready before now (a past-dated schedule, wake_at or retry, a redrive), so this node's takes of the queue look from its start at their next take, not from where they stood. Those calls make it on the node that holds the queue (sturdy.distribute() delegates it there); a call of your own only costs the next takes a scan from the start."
)]
fn queue_backdated(queue: Option<Text>) -> Result<()> {
    args::name("queue", queue)?;
    generation::bump_here();
    Ok(())
}
