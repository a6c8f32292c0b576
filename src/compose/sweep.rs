//! `sweep`: what the workflows, the outbox, the queue's flow control and
//! failing passes leave behind, and the dashboard's history, a bounded
//! batch of each.

use pg_sturdy_macros::sql_function;
use pgrx::IntoDatum;
use pgrx::datum::Interval;
use pgrx::pg_sys;

use crate::datum::Text;
use crate::error::Result;
use crate::fmgr::Args;
use crate::{args, plan, queue, workflow};

/// The most rows of each kind one `sweep` deletes: a batch is meant to stay
/// short beside the workers; a backlog takes more calls.
const MAX_SWEEP: i32 = 100_000;

/// Returns its rows through the call.
#[sql_function(
    "sturdy.sweep(older_than interval DEFAULT '7 days', max integer DEFAULT 1000)
     RETURNS TABLE (kind text, deleted bigint) VOLATILE PARALLEL UNSAFE ROWS 10",
    comment = "Delete one bounded batch: at most max instances finished before now() - older_than with their checkpoints, claims and queue rows (skipping any a live pass holds), at most max outbox messages that old whose deliveries are all done, at most max expired idempotency keys, the free per_key places of at most max keys with no row left in their queue, at most max leases run out with no take to meet them counted as failed passes (lapsed: among the first max ready rows of each queue), at most max dead queue rows that died before now() - older_than, and at most max of the dashboard's samples older than a day (or than older_than, where shorter). Counts per kind; call it again (pg_cron) until the counts are zero."
)]
fn sweep(call: &Args, older_than: Option<Interval>, max: Option<i32>) -> Result<()> {
    let older_than = args::lease("older_than", older_than)?;
    let max = args::at_most(
        "max",
        args::positive("max", max)?,
        MAX_SWEEP,
        "Sweep at most 100000 rows of each kind a call, and call again (pg_cron) until the counts are zero.",
    )?;
    let mut kinds = workflow::sweep_batch(older_than, max)?.to_vec();
    kinds.push(("key_places", queue::sweep_key_places(max)?));
    let failing = queue::sweep_failing(older_than, max)?;
    if !failing.died.is_empty() {
        workflow::fail_instances(&failing.died, Some(Text::new(queue::LAPSED)))?;
    }
    kinds.push(("lapsed", failing.lapsed));
    kinds.push(("dead", failing.dead));
    kinds.push(("samples", trim_samples(older_than, max)?));
    let rows: Vec<[Option<pg_sys::Datum>; 2]> = kinds
        .iter()
        .map(|(kind, n)| [kind.into_datum(), n.into_datum()])
        .collect();
    let rows: Vec<&[Option<pg_sys::Datum>]> = rows.iter().map(|r| &r[..]).collect();
    plan::return_rows(call, &rows)
}

/// At most `$2` samples taken before `now() - least($1, 1 day)`, oldest first.
static TRIM_SAMPLES: plan::Statement = plan::Statement {
    sql: "WITH gone AS (
              DELETE FROM sturdy.samples s
               WHERE s.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(
                     SELECT o.ctid FROM sturdy.samples o
                      WHERE o.sampled_at OPERATOR(pg_catalog.<) (pg_catalog.now()
                            OPERATOR(pg_catalog.-) LEAST($1, '1 day'::pg_catalog.interval))
                      ORDER BY o.sampled_at
                      LIMIT $2))
              RETURNING 1)
          SELECT pg_catalog.count(*) FROM gone",
    args: &[pg_sys::INTERVALOID, pg_sys::INT4OID],
    writes: true,
    generic: false,
};

/// `sweep`'s batch of the dashboard's history: how many samples went.
fn trim_samples(older_than: Interval, max: i32) -> Result<i64> {
    Ok(plan::run_one(
        &TRIM_SAMPLES,
        &[older_than.into(), max.into()],
        plan::first_value::<i64>,
    )?
    .unwrap_or(0))
}
