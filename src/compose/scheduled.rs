//! A write and its workflow's schedule, in one transaction: `start` (an
//! instance created and its workflow scheduled on its queue) and `arrive`
//! (a value supplied and its workflow woken).

use pg_sturdy_macros::sql_function;

use crate::args;
use crate::checkpoint;
use crate::datum::{Jsonb, Text};
use crate::error::Result;
use crate::queue;
use crate::workflow;

#[sql_function(
    "sturdy.start(process text, business_key text, variables jsonb DEFAULT '{}',
                  idempotency_key text DEFAULT NULL, queue text DEFAULT NULL)
     RETURNS bigint VOLATILE PARALLEL UNSAFE",
    comment = "Start a pending instance of process for business_key and schedule its workflow (process/id) on queue (default: the process name), in this transaction. With an idempotency_key (per process), a start while the key lives (sturdy.idempotency_ttl) returns the first instance's id instead, also when two race."
)]
fn start(
    process: Option<Text>,
    business_key: Option<Text>,
    variables: Option<Jsonb>,
    idempotency_key: Option<Text>,
    queue: Option<Text>,
) -> Result<i64> {
    let started =
        workflow::start_instance(process, business_key, variables, idempotency_key, queue)?;
    if let Some((workflow, queue)) = &started.created {
        queue::schedule_at(
            args::name("workflow", Some(Text::from_bytes(workflow)))?,
            pgrx::datum::now(),
            args::name("queue", Some(Text::from_bytes(queue)))?,
            None,
        )?;
    }
    Ok(started.id)
}

/// A value's arrival and the workflow's wakeup, in one transaction: supply the
/// step, then schedule the workflow now.
#[sql_function(
    "sturdy.arrive(workflow text, step text, value jsonb, queue text DEFAULT 'default')
     RETURNS jsonb VOLATILE PARALLEL UNSAFE",
    comment = "supply the step and schedule the workflow now, in one transaction: a value's arrival and the workflow's wakeup commit together. Returns the value stored."
)]
fn arrive(
    workflow: Option<Text>,
    step: Option<Text>,
    value: Option<Jsonb>,
    queue: Option<Text>,
) -> Result<Jsonb> {
    let workflow = args::name("workflow", workflow)?;
    let step = args::name("step", step)?;
    let value = args::required("value", value)?;
    let queue = args::name("queue", queue)?;
    // the step, then the row: the lock order of every call on a pass
    // (docs/internals.md, "Lock order"); a dead row stays dead, the value
    // recorded all the same
    let stored = checkpoint::supply_value(workflow, step, value)?;
    queue::schedule_at(workflow, pgrx::datum::now(), queue, None)?;
    Ok(stored)
}
