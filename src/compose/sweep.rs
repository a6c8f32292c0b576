//! `sweep`: what the workflows, the outbox and the queue's flow control
//! leave behind, a bounded batch of each.

use pg_sturdy_macros::sql_function;
use pgrx::IntoDatum;
use pgrx::datum::Interval;
use pgrx::pg_sys;

use crate::error::Result;
use crate::fmgr::Args;
use crate::{args, plan, queue, workflow};

/// Returns its rows through the call.
#[sql_function(
    "sturdy.sweep(older_than interval DEFAULT '7 days', max integer DEFAULT 1000)
     RETURNS TABLE (kind text, deleted bigint) VOLATILE PARALLEL UNSAFE ROWS 7",
    comment = "Delete one bounded batch: at most max instances finished before now() - older_than with their checkpoints, claims and queue rows (skipping any a live pass holds), at most max outbox messages that old whose deliveries are all done, at most max expired idempotency keys, and the free per_key places of at most max keys with no row left in their queue. Counts per kind; call it again (pg_cron) until the counts are zero."
)]
fn sweep(call: &Args, older_than: Option<Interval>, max: Option<i32>) -> Result<()> {
    let older_than = args::lease("older_than", older_than)?;
    let max = args::positive("max", max)?;
    let mut kinds = workflow::sweep_batch(older_than, max)?.to_vec();
    kinds.push(("key_places", queue::sweep_key_places(max)?));
    let rows: Vec<[Option<pg_sys::Datum>; 2]> = kinds
        .iter()
        .map(|(kind, n)| [kind.into_datum(), n.into_datum()])
        .collect();
    let rows: Vec<&[Option<pg_sys::Datum>]> = rows.iter().map(|r| &r[..]).collect();
    plan::return_rows(call, &rows)
}
