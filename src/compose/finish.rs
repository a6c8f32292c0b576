//! `finish`: the fence of `claim`, a step of `checkpoint`, the row of
//! `queue` and the instance of `workflow`, in one call.

use pg_sturdy_macros::sql_function;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::{IntoDatum, pg_sys};

use crate::args::{self, Name};
use crate::checkpoint;
use crate::claim;
use crate::datum::{Jsonb, Text};
use crate::error::{Error, Result};
use crate::plan::{Statement, first_value, null, run_one};
use crate::queue;
use crate::workflow::{self, TERMINAL, parse_status};

/// `finish`'s claim part in one statement, before its row and places
/// (`finish`: claim, row, places, the lock order of every call on a pass).
/// `fence` locks the claim row (a takeover
/// in flight makes it wait, and it then reads the new token) and `inst` the
/// instance when a status is asked for; `go` has its one row only when the
/// token is current and the instance may move, and every write is
/// conditioned on it, so a refused finish writes nothing. Then the step
/// (first writer wins), the move and the release. Returns the current
/// token and the instance's status, for the error when refused. (`$3` and
/// `$7`, the receipt and the queue, are the row's, ended after.)
///
/// The release finds the claim by key, not by the tuple id `fence` locked:
/// when `fence` waited for a concurrent write to the claim (a `renew` from
/// the worker's heartbeat), it locked a version this statement's snapshot
/// cannot see, which a TID scan would skip and leave the claim held; by key,
/// the update goes through the version it sees to the one that replaced it.
///
/// One statement per shape of call (`$moves`: a status is given; `$records`:
/// a step is), because the executor starts every part of a plan on every
/// call, whether its rows come or not: a pass that moves no instance would
/// still open `sturdy.instances` and all its indexes for the `inst` and
/// `moved` parts (measured by instruction count, docs/internals.md). Every
/// shape takes the same eight arguments, some unused.
macro_rules! finish {
    ($moves:tt, $records:tt) => {
        concat!(
            "WITH fence AS MATERIALIZED (
              SELECT c.token FROM sturdy.claims c
               WHERE c.workflow OPERATOR(pg_catalog.=) $1 FOR UPDATE),",
            finish_part!(inst, $moves),
            finish_part!(go, $moves),
            finish_part!(recorded, $records),
            finish_part!(moved, $moves),
            "
          released AS (
              UPDATE sturdy.claims SET held_until = pg_catalog.now()
               WHERE workflow OPERATOR(pg_catalog.=) $1 AND token OPERATOR(pg_catalog.=) $2
                 AND held_until OPERATOR(pg_catalog.>) pg_catalog.now() AND EXISTS (SELECT FROM go)
              RETURNING 1)
          SELECT (SELECT token FROM fence), ",
            finish_part!(status, $moves)
        )
    };
}

/// The parts of [`finish!`] that depend on the call's shape.
macro_rules! finish_part {
    (inst, moves) => {
        "
          inst AS MATERIALIZED (
              SELECT i.status FROM sturdy.instances i WHERE i.workflow OPERATOR(pg_catalog.=) $1 FOR UPDATE),"
    };
    (go, moves) => {
        "
          go AS MATERIALIZED (
              SELECT FROM fence
               WHERE fence.token OPERATOR(pg_catalog.=) $2
                 AND NOT EXISTS (SELECT FROM inst
                                  WHERE inst.status OPERATOR(pg_catalog.=)
                                        ANY ('{succeeded,failed,cancelled}'::pg_catalog.text[]))),"
    };
    (moved, moves) => {
        concat!("
          moved AS (
              UPDATE sturdy.instances
                 SET status = $6, revision = revision OPERATOR(pg_catalog.+) 1, updated_at = pg_catalog.now(),
                     finished_at = CASE WHEN $6 OPERATOR(pg_catalog.=) ANY ('{succeeded,failed,cancelled}'::pg_catalog.text[])
                                        THEN pg_catalog.now() END,
                     last_error = COALESCE($8, last_error)
               WHERE workflow OPERATOR(pg_catalog.=) $1 AND EXISTS (SELECT FROM go)
              RETURNING ", workflow::notify_watchers!(), "),")
    };
    (status, moves) => {
        "(SELECT status FROM inst)"
    };
    (go, stays) => {
        "
          go AS MATERIALIZED (SELECT FROM fence WHERE fence.token OPERATOR(pg_catalog.=) $2),"
    };
    (status, stays) => {
        "NULL::pg_catalog.text"
    };
    (recorded, records) => {
        "
          recorded AS (
              INSERT INTO sturdy.checkpoints (workflow, step, value, token, recorded_at)
              SELECT $1, $4, $5, $2, pg_catalog.clock_timestamp() FROM go
              ON CONFLICT (workflow, step) DO NOTHING
              RETURNING 1),"
    };
    ($part:ident, $shape:ident) => {
        ""
    };
}

const FINISH_ARGS: &[pg_sys::Oid] = &[
    pg_sys::TEXTOID,
    pg_sys::INT8OID,
    pg_sys::TIMESTAMPTZOID,
    pg_sys::TEXTOID,
    pg_sys::JSONBOID,
    pg_sys::TEXTOID,
    pg_sys::TEXTOID,
    pg_sys::TEXTOID,
];

/// `finish`'s statement for one shape of call.
macro_rules! finish_statement {
    ($moves:tt, $records:tt) => {
        Statement {
            sql: finish!($moves, $records),
            args: FINISH_ARGS,
            writes: true,
            generic: false,
        }
    };
}

/// `finish`'s statement for each shape of call, by (moves, records).
static FINISH: [[Statement; 2]; 2] = [
    [
        finish_statement!(stays, bare),
        finish_statement!(stays, records),
    ],
    [
        finish_statement!(moves, bare),
        finish_statement!(moves, records),
    ],
];

/// Under Citus (`scaleout`), `finish` in steps, one statement per table,
/// each its capability's own operation but the instance's two: the claims
/// and the checkpoints are on the workflow's node, the queue row on its
/// queue's, the instance on the coordinator, and Citus plans no statement
/// that spans them. The fence comes first and locks the claim row, as
/// [`finish!`]'s does; then the instance, locked, where a status is asked
/// for; every write after both checks, so a refused finish writes nothing.
/// The whole is one transaction, which Citus commits on every node or none.
static STEP_INSTANCE: Statement = Statement {
    sql: "SELECT i.status FROM sturdy.instances i WHERE i.workflow OPERATOR(pg_catalog.=) $1 FOR UPDATE",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

static STEP_MOVE: Statement = Statement {
    sql: concat!("UPDATE sturdy.instances
             SET status = $2, revision = revision OPERATOR(pg_catalog.+) 1, updated_at = pg_catalog.now(),
                 finished_at = CASE WHEN $2 OPERATOR(pg_catalog.=) ANY ('{succeeded,failed,cancelled}'::pg_catalog.text[])
                                    THEN pg_catalog.now() END,
                 last_error = COALESCE($3, last_error)
           WHERE workflow OPERATOR(pg_catalog.=) $1
          RETURNING ", workflow::notify_watchers!()),
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// `finish`'s claim part in steps (see [`STEP_INSTANCE`]).
fn finish_in_steps(
    workflow: Name,
    token: i64,
    step: Option<(Name, Jsonb)>,
    to: Option<&'static str>,
    error: Option<Text>,
) -> Result<()> {
    claim::fence_current(workflow, token)?;
    if let Some(to) = to {
        let now: Option<String> = run_one(&STEP_INSTANCE, &[workflow.into()], first_value)?;
        if let Some(now) = now.filter(|now| TERMINAL.contains(&now.as_str())) {
            return Err(Error::Terminal {
                workflow: workflow.lossy(),
                status: now,
                to: to.into(),
            });
        }
    }
    if let Some((step, value)) = step {
        checkpoint::write_unless_there(workflow, step, value, token)?;
    }
    if let Some(to) = to {
        let error = error.map_or_else(null::<Text>, Into::into);
        run_one(&STEP_MOVE, &[workflow.into(), to.into(), error], |_| Ok(()))?;
    }
    claim::release_current(workflow, token)?;
    Ok(())
}

#[sql_function(
    "sturdy.finish(workflow text, token bigint, receipt timestamptz, step text DEFAULT NULL,
                   value jsonb DEFAULT NULL, status text DEFAULT NULL, queue text DEFAULT 'default',
                   error text DEFAULT NULL)
     RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "End a pass in one call: fenced like record (a stale token raises SD001 and nothing happens), record step = value when given, move the workflow's instance to status when given (SD002 from a terminal status), release the claim, and remove the queue row under done's receipt rule, whose answer it returns (false: a wakeup arrived during the pass and the row stays)."
)]
#[allow(clippy::too_many_arguments)]
fn finish(
    workflow: Option<Text>,
    token: Option<i64>,
    receipt: Option<TimestampWithTimeZone>,
    step: Option<Text>,
    value: Option<Jsonb>,
    status: Option<Text>,
    queue: Option<Text>,
    error: Option<Text>,
) -> Result<bool> {
    let workflow = args::name("workflow", workflow)?;
    let token = args::required("token", token)?;
    let receipt = args::required("receipt", receipt)?;
    let step = args::optional_name("step", step)?;
    if step.is_some() && value.is_none() {
        return Err(Error::Null { arg: "value" });
    }
    let to = status
        .map(|s| parse_status("status", Some(s)))
        .transpose()?;
    let queue = args::name("queue", queue)?;
    // Every call on a pass locks its claim, then its row, then its places
    // (docs/internals.md, "Lock order"): the claim's part first (a stale
    // token's SD001 before anything is written), then the row's end
    // (done's), then its places, found by what was read of the row before.
    let ending = queue::ending(queue, workflow, receipt)?;
    finish_claimed(workflow, token, step, value, to, error)?;
    let removed = queue::remove_done(workflow, receipt, queue)?;
    let limited = ending.free(queue, workflow, receipt)?;
    // last: the place freed wakes a take it held back
    queue::freed(queue, limited)?;
    Ok(removed)
}

/// `finish`'s part on the claim, the step and the instance, before the
/// pass's row and places: SD001 for a stale token, SD002 for a terminal
/// instance, with nothing written.
fn finish_claimed(
    workflow: Name,
    token: i64,
    step: Option<Name>,
    value: Option<Jsonb>,
    to: Option<&'static str>,
    error: Option<Text>,
) -> Result<()> {
    if to.is_none()
        && let Some(current) = finish_here(workflow, token, step.zip(value))?
    {
        return claim::check_token(workflow, token, current);
    }
    if crate::scaleout::distributed() {
        return finish_in_steps(workflow, token, step.zip(value), to, error);
    }
    let statement = &FINISH[usize::from(to.is_some())][usize::from(step.is_some())];
    let step = step.map_or_else(null::<Text>, Into::into);
    let value = value.map_or_else(null::<Jsonb>, Into::into);
    let to_arg = to.map_or_else(null::<Text>, Into::into);
    let error = error.map_or_else(null::<Text>, Into::into);
    let (current, instance_status) = run_one(
        statement,
        &[
            workflow.into(),
            token.into(),
            null::<TimestampWithTimeZone>(),
            step,
            value,
            to_arg,
            null::<Text>(),
            error,
        ],
        |t| Ok(t.first().get_two::<i64, String>()?),
    )?;
    claim::check_token(workflow, token, current)?;
    if let (Some(to), Some(now)) = (to, instance_status.as_deref())
        && TERMINAL.contains(&now)
    {
        return Err(Error::Terminal {
            workflow: workflow.lossy(),
            status: now.into(),
            to: to.into(),
        });
    }
    Ok(())
}

/// `finish` for a pass that leaves the instance alone (no status), without
/// its statement, where `access` can do every part of it: the claim row
/// locked (the fence), and only for the current token the step recorded
/// unless it is there, the claim released and the queue row done, as the
/// statement does them (see [`finish!`]). Each part is its capability's own
/// operation, every one opened and checked before anything is locked or
/// written. The current token and whether the row went; `None` with nothing
/// done, where the statement must do it. (A move of the instance is left to
/// the statement, which tests the table's `CHECK` constraints.)
fn finish_here(
    workflow: Name,
    token: i64,
    step: Option<(Name, Jsonb)>,
) -> Result<Option<Option<i64>>> {
    let Some(w) = workflow.into_datum() else {
        return Ok(None);
    };
    let now = pg_sys::TimestampTz::from(pgrx::datum::now());
    let record =
        step.map(|(step, value)| checkpoint::StepRecord::new(workflow, w, step, value, token));
    // every part checked before anything is locked or written
    let Some(fence) = claim::Fence::open(workflow, true) else {
        return Ok(None);
    };
    let checkpoints = match &record {
        Some(r) => match r.open() {
            Some(table) => Some(table),
            None => return Ok(None),
        },
        None => None,
    };
    let Some((held, current)) = fence.lock(w)? else {
        return Ok(None);
    };
    let Some(held) = held.filter(|_| current == Some(token)) else {
        // stale: nothing written (the caller raises)
        return Ok(Some(current));
    };
    // None of what follows should fall to the statement after the checks
    // above; if one did, the statement would find the parts done here done
    // (the step there, the claim released) and do the rest.
    if let (Some(table), Some(r)) = (&checkpoints, &record)
        && r.insert_unless_there(table)?.is_none()
    {
        return Ok(None);
    }
    if fence.release(&held, now)?.is_none() {
        return Ok(None);
    }
    drop(held);
    Ok(Some(current))
}
