//! The queue: which workflows want a pass, and when.
//!
//! One row per (queue, workflow), scored by `visible_at`: in the past means
//! ready, in the future means leased (a taker holds it) or sleeping (waiting
//! for a deadline). `take` makes the oldest ready rows invisible for a lease
//! and hands back the new `visible_at` as a *receipt*. Everything that wants
//! another pass — `schedule`, `arrive` — writes `visible_at` unconditionally,
//! landing on top of a pass in flight; `done` and `wake_at` are conditional on
//! the receipt still matching, so a wakeup that arrived mid-pass is never
//! thrown away by the pass finishing.
//!
//! Takers fan out instead of queueing on the head: `FOR UPDATE SKIP LOCKED`
//! passes over rows another taker is locking. The candidate rows are chosen in
//! a `MATERIALIZED` CTE so `max` bounds what the statement leases, whatever
//! plan is chosen (a `SKIP LOCKED` sub-select rescanned on the inner side of
//! a join would lease different rows on every rescan).
//!
//! Idle workers need not poll: a schedule that makes a workflow ready now
//! sends `NOTIFY sturdy, '<queue>'`, delivered at commit (and dropped with a
//! rollback; Postgres itself folds repeats within a transaction into one).

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::checkpoint;
use crate::error::{self, Error, Result, deliver};
use crate::spi::{self, Jsonb, Statement, run_one};

/// Upsert the row to `visible_at`, forgetting any lease on it, and notify
/// listeners when it is ready now.
static SCHEDULE: Statement = Statement {
    sql: "WITH scheduled AS (
              INSERT INTO sturdy.queue AS q (queue, workflow, visible_at, taken_at, scheduled_at)
              VALUES ($3, $1, $2, NULL, pg_catalog.now())
              ON CONFLICT (queue, workflow) DO UPDATE
                 SET visible_at = EXCLUDED.visible_at, taken_at = NULL, scheduled_at = EXCLUDED.scheduled_at
              RETURNING q.visible_at <= pg_catalog.now() AS ready)
          SELECT pg_catalog.pg_notify('sturdy', $3) FROM scheduled WHERE ready",
    args: &[pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID],
    writes: true,
};

/// Lease the oldest ready rows; the new `visible_at` is the receipt. With
/// `claim`, also claim every taken workflow for the same lease in the same
/// statement (`claim.rs`'s upsert; the token is NULL where someone still holds
/// the claim).
///
/// The chosen rows are updated through their `ctid`s (we hold their row
/// locks, so the tuple ids are stable for the statement): a TID scan whatever
/// the planner believes. Joined back by key, a backlog that arrived after the
/// last ANALYZE made the plan scan the queue once per row (measured: 680 ms
/// instead of 1.8 ms to take 100 of 50,000).
///
/// Two shapes. For `max => 1`, a worker's usual call, the row is picked by an
/// uncorrelated scalar subquery (an InitPlan: evaluated once, like the
/// materialized CTE) and updated through its `ctid`: the smallest plan, and a
/// generic one. For batches the `LIMIT $3` parameter makes the generic plan's
/// estimate assume a big batch, so the plan cache re-plans per call; that
/// cost (~0.15 ms, measured) is spread over the batch.
macro_rules! take_sql {
    (one, claim = false) => {
        concat!(take_sql!(@one), " SELECT workflow, visible_at, NULL::bigint FROM taken")
    };
    (one, claim = true) => {
        concat!(take_sql!(@one), ", claimed AS (", take_sql!(@claim), ")
          SELECT t.workflow, t.visible_at, (SELECT token FROM claimed) FROM taken t")
    };
    (many, claim = false) => {
        concat!(take_sql!(@many), "
          SELECT t.workflow, t.visible_at, NULL::bigint
            FROM taken t JOIN due d ON d.workflow = t.workflow
           ORDER BY d.visible_at")
    };
    (many, claim = true) => {
        concat!(take_sql!(@many), ", claimed AS (", take_sql!(@claim), ")
          SELECT t.workflow, t.visible_at, c.token
            FROM taken t JOIN due d ON d.workflow = t.workflow
            LEFT JOIN claimed c ON c.workflow = t.workflow
           ORDER BY d.visible_at")
    };
    (@lease) => {
        "UPDATE sturdy.queue AS q
            SET visible_at = pg_catalog.now() + $2, taken_at = pg_catalog.now(), takes = q.takes + 1"
    };
    (@one) => {
        concat!("WITH taken AS (", take_sql!(@lease), "
             WHERE q.ctid = (SELECT ctid FROM sturdy.queue
                              WHERE queue = $1 AND visible_at <= pg_catalog.now()
                              ORDER BY visible_at
                              LIMIT 1
                              FOR UPDATE SKIP LOCKED)
            RETURNING q.workflow, q.visible_at)")
    };
    (@many) => {
        concat!("WITH due AS MATERIALIZED (
              SELECT ctid, workflow, visible_at FROM sturdy.queue
               WHERE queue = $1 AND visible_at <= pg_catalog.now()
               ORDER BY visible_at
               LIMIT $3
               FOR UPDATE SKIP LOCKED),
          taken AS (", take_sql!(@lease), "
             WHERE q.ctid = ANY (ARRAY(SELECT ctid FROM due))
            RETURNING q.workflow, q.visible_at)")
    };
    (@claim) => {
        crate::claim::claim_upsert_sql!("SELECT workflow, 1, pg_catalog.now() + $2, NULL, pg_catalog.now() FROM taken")
    };
}

const TAKE_ARGS: &[pg_sys::Oid] = &[pg_sys::TEXTOID, pg_sys::INTERVALOID, pg_sys::INT8OID];
static TAKE_ONE: Statement = Statement {
    sql: take_sql!(one, claim = false),
    args: TAKE_ARGS,
    writes: true,
};
static TAKE_ONE_CLAIM: Statement = Statement {
    sql: take_sql!(one, claim = true),
    args: TAKE_ARGS,
    writes: true,
};
static TAKE_MANY: Statement = Statement {
    sql: take_sql!(many, claim = false),
    args: TAKE_ARGS,
    writes: true,
};
static TAKE_MANY_CLAIM: Statement = Statement {
    sql: take_sql!(many, claim = true),
    args: TAKE_ARGS,
    writes: true,
};

static DONE: Statement = Statement {
    sql: "DELETE FROM sturdy.queue WHERE queue = $3 AND workflow = $1 AND visible_at = $2 RETURNING true",
    args: &[pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID],
    writes: true,
};

/// Suspend until `at` under the receipt rule; a wakeup that landed meanwhile
/// wins (it is sooner, and the deadline lives in the checkpoints anyway).
static WAKE_AT: Statement = Statement {
    sql: "WITH woken AS (
              UPDATE sturdy.queue SET visible_at = $3, taken_at = NULL
               WHERE queue = $4 AND workflow = $1 AND visible_at = $2
              RETURNING visible_at <= pg_catalog.now() AS ready)
          SELECT ready, CASE WHEN ready THEN pg_catalog.pg_notify('sturdy', $4) END FROM woken",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TEXTOID,
    ],
    writes: true,
};

fn queue_name(v: Option<&str>) -> Result<&str> {
    error::name("queue", v)
}

pub fn schedule_impl(
    workflow: Option<&str>,
    visible_at: Option<TimestampWithTimeZone>,
    queue: Option<&str>,
) -> Result<()> {
    let workflow = error::name("workflow", workflow)?;
    let visible_at = error::required("visible_at", visible_at)?;
    let queue = queue_name(queue)?;
    run_one(
        &SCHEDULE,
        &[workflow.into(), visible_at.into(), queue.into()],
        |_| Ok(()),
    )
}

/// Lease rows and return them as the result of the `take` call `fcinfo`.
pub fn take_impl(
    fcinfo: pg_sys::FunctionCallInfo,
    queue: Option<&str>,
    lease: Option<Interval>,
    max: Option<i32>,
    claim: Option<bool>,
) -> Result<()> {
    let queue = queue_name(queue)?;
    let lease = error::lease("lease", lease)?;
    let max = error::required("max", max)?;
    if max <= 0 {
        return Err(Error::NotPositive {
            arg: "max",
            got: max.to_string(),
        });
    }
    let claim = error::required("claim", claim)?;
    let stmt = match (max, claim) {
        (1, false) => &TAKE_ONE,
        (1, true) => &TAKE_ONE_CLAIM,
        (_, false) => &TAKE_MANY,
        (_, true) => &TAKE_MANY_CLAIM,
    };
    spi::run_as_set(
        fcinfo,
        stmt,
        &[queue.into(), lease.into(), i64::from(max).into()],
    )?;
    Ok(())
}

pub fn done_impl(
    workflow: Option<&str>,
    receipt: Option<TimestampWithTimeZone>,
    queue: Option<&str>,
) -> Result<bool> {
    let workflow = error::name("workflow", workflow)?;
    let receipt = error::required("receipt", receipt)?;
    let queue = queue_name(queue)?;
    run_one(
        &DONE,
        &[workflow.into(), receipt.into(), queue.into()],
        |t| Ok(!t.is_empty()),
    )
}

pub fn wake_at_impl(
    workflow: Option<&str>,
    receipt: Option<TimestampWithTimeZone>,
    at: Option<TimestampWithTimeZone>,
    queue: Option<&str>,
) -> Result<bool> {
    let workflow = error::name("workflow", workflow)?;
    let receipt = error::required("receipt", receipt)?;
    let at = error::required("at", at)?;
    let queue = queue_name(queue)?;
    run_one(
        &WAKE_AT,
        &[workflow.into(), receipt.into(), at.into(), queue.into()],
        |t| Ok(!t.is_empty()),
    )
}

/// A value's arrival and the workflow's wakeup, in one transaction: supply the
/// step, then schedule the workflow now.
pub fn arrive_impl(
    workflow: Option<&str>,
    step: Option<&str>,
    value: Option<Jsonb>,
    queue: Option<&str>,
) -> Result<Jsonb> {
    // Validate everything before writing anything.
    error::name("workflow", workflow)?;
    error::name("step", step)?;
    error::required("value", value)?;
    queue_name(queue)?;
    let stored = checkpoint::supply_impl(workflow, step, value)?;
    schedule_impl(workflow, Some(pgrx::datum::now()), queue)?;
    Ok(stored)
}

#[pg_extern(sql = false)]
fn schedule(
    workflow: Option<&str>,
    visible_at: Option<TimestampWithTimeZone>,
    queue: Option<&str>,
) {
    deliver(spi::pinned(|| schedule_impl(workflow, visible_at, queue)));
}

/// Returns its rows through `fcinfo` (see `spi::run_as_set`); the SQL
/// declaration says `RETURNS TABLE (workflow text, receipt timestamptz, token bigint)`.
#[pg_extern(sql = false)]
fn take(
    queue: Option<&str>,
    lease: Option<Interval>,
    max: Option<i32>,
    claim: Option<bool>,
    fcinfo: pg_sys::FunctionCallInfo,
) {
    deliver(spi::pinned(|| take_impl(fcinfo, queue, lease, max, claim)));
}

#[pg_extern(sql = false)]
fn done(
    workflow: Option<&str>,
    receipt: Option<TimestampWithTimeZone>,
    queue: Option<&str>,
) -> Option<bool> {
    deliver(spi::pinned(|| done_impl(workflow, receipt, queue)))
}

#[pg_extern(sql = false)]
fn wake_at(
    workflow: Option<&str>,
    receipt: Option<TimestampWithTimeZone>,
    at: Option<TimestampWithTimeZone>,
    queue: Option<&str>,
) -> Option<bool> {
    deliver(spi::pinned(|| wake_at_impl(workflow, receipt, at, queue)))
}

#[pg_extern(sql = false)]
fn arrive(
    workflow: Option<&str>,
    step: Option<&str>,
    value: Option<Jsonb>,
    queue: Option<&str>,
) -> Option<Jsonb> {
    deliver(spi::pinned(|| arrive_impl(workflow, step, value, queue)))
}

crate::entry_points! {
    sturdy_schedule, pg_finfo_sturdy_schedule => schedule_wrapper;
    sturdy_take, pg_finfo_sturdy_take => take_wrapper;
    sturdy_done, pg_finfo_sturdy_done => done_wrapper;
    sturdy_wake_at, pg_finfo_sturdy_wake_at => wake_at_wrapper;
    sturdy_arrive, pg_finfo_sturdy_arrive => arrive_wrapper;
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{count, sqlstate_of};
    use pgrx::prelude::*;

    fn one<T: pgrx::FromDatum + pgrx::IntoDatum>(sql: &str) -> Option<T> {
        Spi::get_one::<T>(sql).unwrap()
    }

    #[pg_test]
    fn take_leases_the_oldest_ready_rows_up_to_max() {
        Spi::run(
            "SELECT sturdy.schedule('w3', now() - interval '1 minute');
             SELECT sturdy.schedule('w1', now() - interval '3 minutes');
             SELECT sturdy.schedule('w2', now() - interval '2 minutes');
             SELECT sturdy.schedule('later', now() + interval '1 hour');",
        )
        .unwrap();
        let taken = one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take(max => 2)");
        assert_eq!(taken.as_deref(), Some("w1,w2"));
        let taken = one::<String>("SELECT string_agg(workflow, ',') FROM sturdy.take(max => 10)");
        assert_eq!(
            taken.as_deref(),
            Some("w3"),
            "leased and sleeping rows are not taken"
        );
        assert_eq!(one::<i64>("SELECT count(*) FROM sturdy.take()"), Some(0));
        let receipt_is_lease_end = one::<bool>(
            "SELECT visible_at = now() + interval '1 minute' FROM sturdy.queue WHERE workflow = 'w1'",
        );
        assert_eq!(receipt_is_lease_end, Some(true));
    }

    /// take hands its rows over in materialize mode: the same rows in the
    /// select list as in FROM, and none is lost or repeated.
    #[pg_test]
    fn take_returns_rows_in_the_select_list_too() {
        Spi::run(
            "SELECT sturdy.schedule('s' || i, now() - i * interval '1 second') FROM generate_series(1, 5) i",
        )
        .unwrap();
        let taken = one::<String>(
            "SELECT string_agg((t).workflow, ',') FROM (SELECT sturdy.take(max => 3, claim => true) t) x",
        );
        assert_eq!(taken.as_deref(), Some("s5,s4,s3"));
        let tokens = one::<i64>(
            "SELECT sum(t)::bigint FROM (SELECT (sturdy.take(max => 5, claim => true)).token t) x",
        );
        assert_eq!(tokens, Some(2), "s2 and s1, each claimed with token 1");
        assert_eq!(one::<i64>("SELECT count(*) FROM sturdy.claims"), Some(5));
    }

    #[pg_test]
    fn queues_are_separate() {
        Spi::run("SELECT sturdy.schedule('a', now(), 'emails'); SELECT sturdy.schedule('a', now(), 'reports');").unwrap();
        assert_eq!(
            count("sturdy.queue"),
            2,
            "one workflow may wait in several queues"
        );
        assert_eq!(
            one::<String>("SELECT workflow FROM sturdy.take('emails')").as_deref(),
            Some("a")
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take('emails')"),
            Some(0)
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take('reports')"),
            Some(1)
        );
    }

    #[pg_test]
    fn done_needs_the_current_receipt() {
        Spi::run("SELECT sturdy.schedule('d1', now() - interval '1 second')").unwrap();
        Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take()").unwrap();
        assert_eq!(
            one::<bool>("SELECT sturdy.done(workflow, receipt - interval '1 us') FROM t"),
            Some(false)
        );
        assert_eq!(
            one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t"),
            Some(true)
        );
        assert_eq!(count("sturdy.queue"), 0);
        assert_eq!(
            one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t"),
            Some(false)
        );
    }

    #[pg_test]
    fn a_schedule_during_a_pass_survives_done() {
        Spi::run("SELECT sturdy.schedule('d2', now() - interval '1 second')").unwrap();
        Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take()").unwrap();
        Spi::run("SELECT sturdy.schedule('d2')").unwrap();
        assert_eq!(
            one::<bool>("SELECT sturdy.done(workflow, receipt) FROM t"),
            Some(false)
        );
        assert_eq!(
            one::<bool>("SELECT visible_at <= now() FROM sturdy.queue WHERE workflow = 'd2'"),
            Some(true)
        );
    }

    #[pg_test]
    fn wake_at_suspends_under_the_receipt_rule() {
        Spi::run("SELECT sturdy.schedule('s1', now() - interval '1 second')").unwrap();
        Spi::run("CREATE TEMP TABLE t AS SELECT * FROM sturdy.take()").unwrap();
        assert_eq!(
            one::<bool>(
                "SELECT sturdy.wake_at(workflow, receipt, now() + interval '1 day') FROM t"
            ),
            Some(true)
        );
        let sleeping = one::<String>(
            "SELECT format('%s/%s/%s', ready, leased, sleeping) FROM sturdy.queue_stats",
        );
        assert_eq!(sleeping.as_deref(), Some("0/0/1"));
        // the receipt is spent: a second wake_at with it changes nothing
        assert_eq!(
            one::<bool>("SELECT sturdy.wake_at(workflow, receipt, now()) FROM t"),
            Some(false)
        );
    }

    #[pg_test]
    fn take_with_claim_claims_each_row_for_the_lease() {
        Spi::run(
            "SELECT sturdy.schedule('c1', now() - interval '2 seconds');
             SELECT sturdy.schedule('c2', now() - interval '1 second');
             SELECT sturdy.claim('c2', '1 hour', 'someone');",
        )
        .unwrap();
        let rows = one::<String>(
            "SELECT string_agg(workflow || ':' || coalesce(token::text, 'held'), ',') FROM sturdy.take(max => 5, claim => true)",
        );
        assert_eq!(rows.as_deref(), Some("c1:1,c2:held"));
        let held = one::<bool>(
            "SELECT held_until = now() + interval '1 minute' FROM sturdy.claims WHERE workflow = 'c1'",
        );
        assert_eq!(held, Some(true));
    }

    #[pg_test]
    fn take_one_with_claim_claims_it_or_says_it_is_held() {
        Spi::run(
            "SELECT sturdy.schedule('o1', now() - interval '2 seconds');
             SELECT sturdy.schedule('o2', now() - interval '1 second');
             SELECT sturdy.claim('o2', '1 hour', 'someone');",
        )
        .unwrap();
        let first = one::<String>(
            "SELECT workflow || ':' || coalesce(token::text, 'held') FROM sturdy.take(claim => true)",
        );
        assert_eq!(first.as_deref(), Some("o1:1"));
        let second = one::<String>(
            "SELECT workflow || ':' || coalesce(token::text, 'held') FROM sturdy.take(claim => true)",
        );
        assert_eq!(
            second.as_deref(),
            Some("o2:held"),
            "still taken (leased), but not claimed"
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.take(claim => true)"),
            Some(0)
        );
        let leased = one::<i64>("SELECT count(*) FROM sturdy.queue WHERE taken_at IS NOT NULL");
        assert_eq!(leased, Some(2));
    }

    #[pg_test]
    fn arrive_supplies_and_schedules_together() {
        let v =
            one::<String>("SELECT sturdy.arrive('a1', 'approval', '\"yes\"', 'approvals')::text");
        assert_eq!(v.as_deref(), Some("\"yes\""));
        assert_eq!(
            one::<String>("SELECT workflow FROM sturdy.take('approvals')").as_deref(),
            Some("a1")
        );
        let again =
            one::<String>("SELECT sturdy.arrive('a1', 'approval', '\"no\"', 'approvals')::text");
        assert_eq!(
            again.as_deref(),
            Some("\"yes\""),
            "first writer wins, and the wakeup still lands"
        );
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.queue_stats WHERE ready = 1"),
            Some(1)
        );
    }

    #[pg_test]
    fn queue_stats_tells_ready_leased_and_sleeping_apart() {
        Spi::run(
            "SELECT sturdy.schedule('r1', now() - interval '10 seconds', 'q');
             SELECT sturdy.schedule('r2', now() - interval '5 seconds', 'q');
             SELECT sturdy.schedule('s1', now() + interval '1 hour', 'q');
             SELECT sturdy.take('q');",
        )
        .unwrap();
        let stats = one::<String>(
            "SELECT format('%s/%s/%s/%s', ready, leased, sleeping, oldest_ready_age) FROM sturdy.queue_stats WHERE queue = 'q'",
        );
        assert_eq!(stats.as_deref(), Some("1/1/1/00:00:05"));
    }

    #[pg_test]
    fn queue_bad_arguments_are_refused_and_write_nothing() {
        for (sql, state) in [
            ("SELECT sturdy.schedule(NULL)", "22004"),
            ("SELECT sturdy.schedule('')", "22023"),
            ("SELECT sturdy.schedule('w', NULL)", "22004"),
            ("SELECT sturdy.schedule('w', now(), '')", "22023"),
            ("SELECT sturdy.schedule('w', now(), NULL)", "22004"),
            ("SELECT * FROM sturdy.take('')", "22023"),
            ("SELECT * FROM sturdy.take('q', '0 s')", "22023"),
            ("SELECT * FROM sturdy.take('q', NULL)", "22004"),
            ("SELECT * FROM sturdy.take('q', '1 minute', 0)", "22023"),
            ("SELECT * FROM sturdy.take('q', '1 minute', -3)", "22023"),
            ("SELECT * FROM sturdy.take('q', '1 minute', NULL)", "22004"),
            (
                "SELECT * FROM sturdy.take('q', '1 minute', 1, NULL)",
                "22004",
            ),
            ("SELECT sturdy.done('w', NULL)", "22004"),
            ("SELECT sturdy.done('', now())", "22023"),
            ("SELECT sturdy.wake_at('w', now(), NULL)", "22004"),
            ("SELECT sturdy.wake_at('w', NULL, now())", "22004"),
            ("SELECT sturdy.arrive('w', 's', NULL)", "22004"),
            ("SELECT sturdy.arrive('w', '', '1')", "22023"),
            ("SELECT sturdy.arrive('w', 's', '1', '')", "22023"),
        ] {
            assert_eq!(sqlstate_of(sql), state, "{sql}");
        }
        assert_eq!(count("sturdy.queue"), 0);
        assert_eq!(count("sturdy.checkpoints"), 0);
    }
}
