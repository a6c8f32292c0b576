//! `fail` and `cancel`: a pass's end that reaches past the queue. A row
//! that dies fails its workflow's instance; a failed pass, and a cancelled
//! row's pass if one may still run, is fenced out of its claim.

use pg_sturdy_macros::sql_function;
use pgrx::datum::TimestampWithTimeZone;

use crate::args;
use crate::claim;
use crate::datum::Text;
use crate::error::{Error, Result};
use crate::queue;
use crate::workflow;

#[sql_function(
    "sturdy.fail(workflow text, receipt timestamptz, error text, queue text DEFAULT 'default',
                 retry_at timestamptz DEFAULT NULL, code text DEFAULT NULL)
     RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "The pass failed: under the receipt rule of done, count one more attempt, keep error (its first 1000 characters) and code, and make the row visible again at retry_at, or after the queue's backoff (retry_queue), or, at its max_attempts, dead (never handed out again; its instance failed). The pass is over: the workflow's claim is fenced (the failed pass's writes raise SD001; the retry claims at once). False for a stale receipt: nothing counted, and the place the receipt held freed, as done frees it."
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
    // the claim, then the row and its places: the lock order of every call
    // on a pass (a worker's transaction writes under its claim, then ends
    // its row)
    claim::lock(workflow)?;
    match queue::fail_pass(workflow, receipt, error, queue, retry_at, code)? {
        None => Ok(false),
        Some(dead) => {
            // the pass is over: its claim (a take's with claim => true) is
            // free for the retry at once, and whatever the failed pass
            // still tries to write is refused (SD001)
            claim::fence_out(workflow)?;
            if dead {
                workflow::fail_instances(&[workflow.bytes().to_vec()], error)?;
            }
            Ok(true)
        }
    }
}

#[sql_function(
    "sturdy.cancel(workflow text, queue text DEFAULT 'default') RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "Remove the workflow's row from queue, whether waiting, sleeping, failing, dead or in a pass, and fence the workflow's claim: any pass still running (its writes raise SD001; its done and wake_at answer false) and every place it holds in the queue's limits is free at once. False, and nothing done, when there is no such row."
)]
fn cancel(workflow: Option<Text>, queue: Option<Text>) -> Result<bool> {
    let workflow = args::name("workflow", workflow)?;
    let queue = args::name("queue", queue)?;
    // the claim, then the row and its places: the lock order of every call
    // on a pass (the pass's own transaction may hold its claim, and then
    // end its row)
    claim::lock(workflow)?;
    match queue::cancel_row(workflow, queue)? {
        None => Ok(false),
        Some(_) => {
            // whatever pass may still run (leased, woken, or its lapse
            // counted with its worker alive) writes nothing more
            claim::fence_out(workflow)?;
            Ok(true)
        }
    }
}
