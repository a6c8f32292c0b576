//! `take`: the queue's lease, and with `claim` the claim of each workflow
//! leased, for the same lease.
//!
//! `wake => false` is for a worker that polls because it cannot `LISTEN`
//! (behind a pooler in transaction mode): its empty take leaves no mark, so
//! no schedule sends a `NOTIFY` (a commit serialised with every other
//! notifying commit) on behalf of a worker that cannot hear it.

use pg_sturdy_macros::sql_function;
use pgrx::datum::Interval;

use crate::args;
use crate::claim;
use crate::datum::Text;
use crate::error::Result;
use crate::fmgr::Args;
use crate::queue;
use crate::workflow;

/// Returns its rows through the call (see `plan::run_as_set`).
#[sql_function(
    "sturdy.take(queue text DEFAULT 'default', lease interval DEFAULT '1 minute',
                 max integer DEFAULT 1, claim boolean DEFAULT false, wake boolean DEFAULT true)
     RETURNS TABLE (workflow text, receipt timestamptz, token bigint, attempt integer, input jsonb) VOLATILE PARALLEL UNSAFE ROWS 10",
    comment = "Lease up to max of the oldest visible rows of queue for lease (FOR UPDATE SKIP LOCKED: concurrent takers never share a row). receipt is the lease's end (leased_until), which done and wake_at must match. With claim, each workflow is also claimed for the same lease (token NULL where someone still holds it). attempt says which attempt this pass is: 1, or one more than the passes of the row that failed (fail, retry_queue); input is the job's input (schedule_many), NULL for none. Finding nothing marks the queue as having a waiter, so the next schedule there notifies; with wake false (a worker that polls and cannot LISTEN, as behind PgBouncer in transaction mode) it marks nothing."
)]
fn take(
    call: &Args,
    queue: Option<Text>,
    lease: Option<Interval>,
    max: Option<i32>,
    claim: Option<bool>,
    wake: Option<bool>,
) -> Result<()> {
    let queue = args::name("queue", queue)?;
    let lease = args::lease("lease", lease)?;
    let max = args::at_most(
        "max",
        args::positive("max", max)?,
        args::MAX_BATCH,
        "Take at most 10000 rows a call (100 makes a good batch), and call again for more.",
    )?;
    let claim = args::required("claim", claim)?;
    // (0.1.0's take has no `wake`: served until ALTER EXTENSION UPDATE)
    let wake = if call.given(4) {
        args::required("wake", wake)?
    } else {
        true
    };
    let claim: Option<queue::Claim> = claim.then_some(claim::claim_for);
    // (none left over from a take that raised)
    queue::take_died();
    queue::take(call, queue, lease, max, claim, wake)?;
    // rows whose last lease ran out, met by the take: their instances fail
    let died = queue::take_died();
    if !died.is_empty() {
        workflow::fail_instances(&died, Some(Text::new(queue::LAPSED)))?;
    }
    Ok(())
}
