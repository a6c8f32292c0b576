//! The fenced writes: `record`, `transact` and `transition` with a token.
//! Each locks the workflow's claim row `FOR UPDATE` and goes on only for the
//! current token, then writes through its capability: a checkpoint, an
//! effect and its checkpoint, an instance's move.

use pg_sturdy_macros::sql_function;
use pgrx::{IntoDatum, pg_sys};

use crate::args::{self, Name};
use crate::checkpoint;
use crate::claim;
use crate::datum::{Jsonb, Text};
use crate::error::{Error, Result};
use crate::fmgr::Args;
use crate::placement::Placed;
use crate::plan::{self, Statement, run_one};
use crate::subxact;
use crate::workflow;

/// The fenced first-writer-wins write. No row back means the fence refused
/// (no claim, or another token). The claim row is read `FOR UPDATE`: a
/// takeover in flight makes the write wait, and once it commits PostgreSQL
/// re-checks `token = $4` on the new row version, so the stale write finds no
/// row and never lands. (The seed locks in a CTE and compares outside it; same
/// outcome, but the CTE is materialized on every call: ~5% of the statement.)
/// `DO UPDATE SET value = cp.value` changes nothing but returns the stored
/// row, so a loser learns the winner's value in the same statement; `xmax = 0`
/// tells a fresh insert from that no-op update.
static RECORD: Statement = Statement {
    sql: "INSERT INTO sturdy.checkpoints AS cp (workflow, step, value, token, recorded_at)
          SELECT $1, $2, $3, $4, pg_catalog.clock_timestamp()
            FROM sturdy.claims c
           WHERE c.workflow OPERATOR(pg_catalog.=) $1 AND c.token OPERATOR(pg_catalog.=) $4
             FOR UPDATE OF c
          ON CONFLICT (workflow, step) DO UPDATE SET value = cp.value
          RETURNING cp.value, cp.xmax OPERATOR(pg_catalog.=) 0",
    args: RECORD_ARGS,
    writes: true,
    generic: false,
};

/// [`RECORD`]'s write under Citus, after the fence (`claim::fence_current`)
/// as a statement of its own: Citus cannot push an `INSERT ... SELECT`
/// with a volatile function down to the shard whole, and runs it through
/// intermediate results (six commands through the coordinator, where the
/// two routed statements are four).
static RECORD_FENCED: Placed = Placed {
    by_workflow: Statement {
        sql: "INSERT INTO sturdy.checkpoints AS cp (workflow, step, value, token, recorded_at)
              VALUES ($1, $2, $3, $4, pg_catalog.clock_timestamp())
              ON CONFLICT (workflow, step) DO UPDATE SET value = cp.value
              RETURNING cp.value, cp.xmax OPERATOR(pg_catalog.=) 0",
        args: RECORD_ARGS,
        writes: true,
        generic: false,
    },
    with_queues: Statement {
        sql:
            "INSERT INTO sturdy.checkpoints AS cp (place, workflow, step, value, token, recorded_at)
              VALUES (sturdy.workflow_place($1), $1, $2, $3, $4, pg_catalog.clock_timestamp())
              ON CONFLICT ON CONSTRAINT checkpoints_pkey DO UPDATE SET value = cp.value
              RETURNING cp.value, cp.xmax OPERATOR(pg_catalog.=) 0",
        args: RECORD_ARGS,
        writes: true,
        generic: false,
    },
};

const RECORD_ARGS: &[pg_sys::Oid] = &[
    pg_sys::TEXTOID,
    pg_sys::TEXTOID,
    pg_sys::JSONBOID,
    pg_sys::INT8OID,
];

/// Fence and existence check in one statement: lock the claim row, and read
/// the step's value if it is already recorded.
static TRANSACT_FENCE: Placed = Placed {
    by_workflow: Statement {
        sql: "SELECT c.token, cp.value
                FROM sturdy.claims c
                LEFT JOIN sturdy.checkpoints cp
                  ON cp.workflow OPERATOR(pg_catalog.=) c.workflow AND cp.step OPERATOR(pg_catalog.=) $2
               WHERE c.workflow OPERATOR(pg_catalog.=) $1
                 FOR UPDATE OF c",
        args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
    with_queues: Statement {
        sql: "SELECT c.token, cp.value
                FROM sturdy.claims c
                LEFT JOIN sturdy.checkpoints cp
                  ON cp.place OPERATOR(pg_catalog.=) c.place AND cp.workflow OPERATOR(pg_catalog.=) c.workflow
                 AND cp.step OPERATOR(pg_catalog.=) $2
               WHERE c.place OPERATOR(pg_catalog.=) sturdy.workflow_place($1)
                 AND c.workflow OPERATOR(pg_catalog.=) $1
                 FOR UPDATE OF c",
        args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
};

/// Returns its row through the call (see `plan::run_as_set`).
#[sql_function(
    "sturdy.record(workflow text, step text, value jsonb, token bigint)
     RETURNS TABLE (recorded jsonb, first boolean) VOLATILE PARALLEL UNSAFE ROWS 1",
    comment = "Fenced first-writer-wins checkpoint: the value stored after the call and whether this call stored it. Raises SD001 when token is not the current claim."
)]
fn record(
    call: &Args,
    workflow: Option<Text>,
    step: Option<Text>,
    value: Option<Jsonb>,
    token: Option<i64>,
) -> Result<()> {
    let workflow = args::name("workflow", workflow)?;
    let step = args::name("step", step)?;
    let value = args::required("value", value)?;
    let token = args::required("token", token)?;
    if let Some((recorded, first)) = record_here(workflow, step, value, token)? {
        plan::begin_result(call);
        return plan::append_row(call, &[Some(recorded), first.into_datum()]);
    }
    let args = [workflow.into(), step.into(), value.into(), token.into()];
    if crate::scaleout::distributed() {
        claim::fence_current(workflow, token)?;
        plan::run_as_set(call, RECORD_FENCED.get(), &args)?;
        return Ok(());
    }
    let rows = plan::run_as_set(call, &RECORD, &args)?;
    if rows == 0 {
        return Err(claim::fenced(workflow, token));
    }
    Ok(())
}

/// [`RECORD`] without the statement, where `access` can do both its parts
/// as the statement does them: the claim row locked as `FOR UPDATE` locks it
/// (the fence: `SD001` unless the token is the current one), then the step
/// inserted, or the row there locked and kept (the statement's `DO UPDATE
/// SET value = cp.value` wrote it again unchanged). The value stored and
/// whether this call stored it; `None` with nothing written, the statement's
/// turn.
fn record_here(
    workflow: Name,
    step: Name,
    value: Jsonb,
    token: i64,
) -> Result<Option<(pg_sys::Datum, bool)>> {
    let Some(w) = workflow.into_datum() else {
        return Ok(None);
    };
    let record = checkpoint::StepRecord::new(workflow, w, step, value, token);
    // both tables checked before anything is locked or written
    let Some(fence) = claim::Fence::open(workflow, false) else {
        return Ok(None);
    };
    let Some(checkpoints) = record.open_to_keep() else {
        return Ok(None);
    };
    let Some((_held, current)) = fence.lock(w)? else {
        return Ok(None);
    };
    claim::check_token(workflow, token, current)?;
    // (should it fall to the statement now, that finds the claim row held
    // by us and does the rest)
    record.insert_or_keep(&checkpoints)
}

#[sql_function(
    "sturdy.transact(workflow text, token bigint, step text, effect regprocedure, arg jsonb DEFAULT NULL)
     RETURNS jsonb VOLATILE PARALLEL UNSAFE",
    comment = "Exactly-once in-database effect: fence, return the step if recorded, else call effect(arg) (jsonb -> jsonb, with the caller's rights and search_path) and record its result in this transaction. If supply lands the step meanwhile, the effect is rolled back and the supplied value returned."
)]
fn transact(
    workflow: Option<Text>,
    token: Option<i64>,
    step: Option<Text>,
    effect: Option<pg_sys::Oid>,
    arg: Option<Jsonb>,
) -> Result<Jsonb> {
    let workflow = args::name("workflow", workflow)?;
    let token = args::required("token", token)?;
    let step = args::name("step", step)?;
    let effect = args::required("effect", effect)?;
    let mut effect = subxact::callable(effect, &[pg_sys::JSONBOID], Some(pg_sys::JSONBOID))
        .map_err(|unfit| match unfit {
            subxact::Unfit::Missing => Error::EffectSignature {
                effect: format!("with OID {} (no such function)", effect.to_u32()),
            },
            subxact::Unfit::Shape(effect) => Error::EffectSignature { effect },
            subxact::Unfit::NotPermitted(function) => Error::NotPermitted { function },
        })?;

    let (current, recorded) =
        run_one(TRANSACT_FENCE.get(), &[workflow.into(), step.into()], |t| {
            if t.is_empty() {
                return Ok((None, None));
            }
            Ok(t.first().get_two::<i64, Jsonb>()?)
        })?;
    claim::check_token(workflow, token, current)?;
    if let Some(recorded) = recorded {
        return Ok(recorded);
    }

    let written = subxact::subtransaction(|| {
        let result = effect
            .call(&[arg.map(|Jsonb(d)| d)])
            .map(Jsonb)
            .ok_or_else(|| Error::EffectReturnedNull {
                effect: effect.name.clone(),
            })?;
        checkpoint::write_unless_there(workflow, step, result, token)
    })?;
    if let Some(value) = written {
        return Ok(value);
    }
    // The step was recorded while the effect ran, and the effect has been
    // rolled back. The value that landed is the answer -- unless the rollback
    // took it away, which means the effect wrote the step's row itself.
    checkpoint::value_of(workflow, step)?.ok_or_else(|| Error::EffectWroteStep {
        effect: effect.name,
        step: step.lossy(),
    })
}

#[sql_function(
    "sturdy.transition(id bigint, from_status text, to_status text, expected_revision bigint DEFAULT NULL,
                       token bigint DEFAULT NULL, error text DEFAULT NULL)
     RETURNS boolean VOLATILE PARALLEL UNSAFE",
    comment = "Move instance id from from_status to to_status (and from expected_revision, when given), adding one to its revision and keeping error as its last error when given. False when refused: another status or revision, a terminal status (never left), or no such instance. With a token, fenced like record: a stale token raises SD001."
)]
fn transition(
    id: Option<i64>,
    from_status: Option<Text>,
    to_status: Option<Text>,
    expected_revision: Option<i64>,
    token: Option<i64>,
    error: Option<Text>,
) -> Result<bool> {
    let id = args::required("id", id)?;
    let from_status = workflow::parse_status("from_status", from_status)?;
    let to_status = workflow::parse_status("to_status", to_status)?;
    if let Some(token) = token {
        let Some(workflow) = workflow::workflow_of(id)? else {
            return Ok(false);
        };
        claim::fence_current(
            args::name("workflow", Some(Text::from_bytes(&workflow)))?,
            token,
        )?;
    }
    workflow::move_instance(id, from_status, to_status, expected_revision, error)
}
