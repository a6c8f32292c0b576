//! Checkpoints: a workflow's completed steps, first writer wins.
//!
//! A step's value is written once and never overwritten. `record` is the
//! fenced write of a pass holding a claim: one statement that reads the claim
//! row `FOR UPDATE`, so it queues behind any claim in flight and compares
//! tokens on the row as that claim left it; a superseded pass's write never
//! lands. `supply` is the unfenced write for a value from outside any pass (an
//! approval, a webhook): it must not fail because a worker happens to be
//! mid-pass. Both answer with the value stored after the call, so a writer
//! that lost the race carries on with the winner's.
//!
//! `transact` makes an in-database effect exactly-once: fence, return the
//! recorded value if the step is done, else run the effect and record its
//! result in the caller's transaction. `supply` is the one writer a fence does
//! not exclude; if it lands the step while the effect runs, the effect is
//! rolled back through a subtransaction and the supplied value returned.

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::claim;
use crate::error::{self, Error, Result, deliver};
use crate::spi::{self, Jsonb, Statement, first_value, run_one};

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
            FROM sturdy.claims c WHERE c.workflow = $1 AND c.token = $4
             FOR UPDATE OF c
          ON CONFLICT (workflow, step) DO UPDATE SET value = cp.value
          RETURNING cp.value, cp.xmax = 0",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::JSONBOID,
        pg_sys::INT8OID,
    ],
    writes: true,
};

static SUPPLY: Statement = Statement {
    sql: "INSERT INTO sturdy.checkpoints AS cp (workflow, step, value, token, recorded_at)
          VALUES ($1, $2, $3, NULL, pg_catalog.clock_timestamp())
          ON CONFLICT (workflow, step) DO UPDATE SET value = cp.value
          RETURNING cp.value",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::JSONBOID],
    writes: true,
};

static LOAD: Statement = Statement {
    sql: "SELECT step, value, recorded_at FROM sturdy.checkpoints
           WHERE workflow = $1 ORDER BY recorded_at, step",
    args: &[pg_sys::TEXTOID],
    writes: false,
};

// `transact` runs under the caller's search_path (its effect is caller code),
// so its statements qualify operators as well as names.

/// Fence and existence check in one statement: lock the claim row, and read
/// the step's value if it is already recorded.
static TRANSACT_FENCE: Statement = Statement {
    sql: "SELECT c.token, cp.value
            FROM sturdy.claims c
            LEFT JOIN sturdy.checkpoints cp
              ON cp.workflow OPERATOR(pg_catalog.=) c.workflow AND cp.step OPERATOR(pg_catalog.=) $2
           WHERE c.workflow OPERATOR(pg_catalog.=) $1
             FOR UPDATE OF c",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
    writes: true,
};

/// Record the effect's result unless somebody (only `supply` can) got there
/// first; no row back means they did.
static TRANSACT_WRITE: Statement = Statement {
    sql: "INSERT INTO sturdy.checkpoints (workflow, step, value, token, recorded_at)
          VALUES ($1, $2, $3, $4, pg_catalog.clock_timestamp())
          ON CONFLICT (workflow, step) DO NOTHING
          RETURNING value",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::JSONBOID,
        pg_sys::INT8OID,
    ],
    writes: true,
};

static TRANSACT_READ: Statement = Statement {
    sql: "SELECT value FROM sturdy.checkpoints
           WHERE workflow OPERATOR(pg_catalog.=) $1 AND step OPERATOR(pg_catalog.=) $2",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
    // read-write so it takes a fresh snapshot and sees the `supply` that won
    writes: true,
};

/// The fenced write, its row (`recorded`, `first`) returned as the result of
/// the `record` call `fcinfo`.
pub fn record_impl(
    fcinfo: pg_sys::FunctionCallInfo,
    workflow: Option<&str>,
    step: Option<&str>,
    value: Option<Jsonb>,
    token: Option<i64>,
) -> Result<()> {
    let workflow = error::name("workflow", workflow)?;
    let step = error::name("step", step)?;
    let value = error::required("value", value)?;
    let token = error::required("token", token)?;
    let rows = spi::run_as_set(
        fcinfo,
        &RECORD,
        &[workflow.into(), step.into(), value.into(), token.into()],
    )?;
    if rows == 0 {
        return Err(claim::fenced(workflow, token));
    }
    Ok(())
}

pub fn supply_impl(
    workflow: Option<&str>,
    step: Option<&str>,
    value: Option<Jsonb>,
) -> Result<Jsonb> {
    let workflow = error::name("workflow", workflow)?;
    let step = error::name("step", step)?;
    let value = error::required("value", value)?;
    run_one(
        &SUPPLY,
        &[workflow.into(), step.into(), value.into()],
        first_value::<Jsonb>,
    )?
    .ok_or(Error::Internal {
        context: "supply",
        cause: "the upsert returned no row".into(),
    })
}

/// A workflow's checkpoints, as the result of the `load` call `fcinfo`.
pub fn load_impl(fcinfo: pg_sys::FunctionCallInfo, workflow: Option<&str>) -> Result<()> {
    let workflow = error::name("workflow", workflow)?;
    spi::run_as_set(fcinfo, &LOAD, &[workflow.into()])?;
    Ok(())
}

pub fn transact_impl(
    workflow: Option<&str>,
    token: Option<i64>,
    step: Option<&str>,
    effect: Option<pg_sys::Oid>,
    arg: Option<Jsonb>,
) -> Result<Jsonb> {
    let workflow = error::name("workflow", workflow)?;
    let token = error::required("token", token)?;
    let step = error::name("step", step)?;
    let effect = error::required("effect", effect)?;
    let info = spi::proc_info(effect).ok_or_else(|| Error::EffectSignature {
        effect: format!("with OID {} (no such function)", effect.to_u32()),
    })?;
    if !info.is_jsonb_to_jsonb {
        return Err(Error::EffectSignature { effect: info.name });
    }

    let (current, recorded) = run_one(&TRANSACT_FENCE, &[workflow.into(), step.into()], |t| {
        if t.is_empty() {
            return Ok((None, None));
        }
        let (current, recorded) = t.first().get_two::<i64, Jsonb>()?;
        Ok((current, recorded))
    })?;
    claim::check_token(workflow, token, current)?;
    if let Some(recorded) = recorded {
        return Ok(recorded);
    }

    let written = spi::subtransaction(|| {
        let result =
            spi::call_jsonb_function(effect, arg).ok_or_else(|| Error::EffectReturnedNull {
                effect: info.name.clone(),
            })?;
        run_one(
            &TRANSACT_WRITE,
            &[workflow.into(), step.into(), result.into(), token.into()],
            first_value,
        )
    })?;
    if let Some(value) = written {
        return Ok(value);
    }
    // The step was recorded while the effect ran, and the effect has been
    // rolled back. The value that landed is the answer -- unless the rollback
    // took it away, which means the effect wrote the step's row itself.
    run_one(
        &TRANSACT_READ,
        &[workflow.into(), step.into()],
        first_value::<Jsonb>,
    )?
    .ok_or_else(|| Error::EffectWroteStep {
        effect: info.name,
        step: step.to_owned(),
    })
}

/// Returns its row through `fcinfo` (see `spi::run_as_set`); the SQL
/// declaration says `RETURNS TABLE (recorded jsonb, first boolean)`.
#[pg_extern(sql = false)]
fn record(
    workflow: Option<&str>,
    step: Option<&str>,
    value: Option<Jsonb>,
    token: Option<i64>,
    fcinfo: pg_sys::FunctionCallInfo,
) {
    deliver(spi::pinned(|| {
        record_impl(fcinfo, workflow, step, value, token)
    }));
}

#[pg_extern(sql = false)]
fn supply(workflow: Option<&str>, step: Option<&str>, value: Option<Jsonb>) -> Option<Jsonb> {
    deliver(spi::pinned(|| supply_impl(workflow, step, value)))
}

/// Returns its rows through `fcinfo` (see `spi::run_as_set`); the SQL
/// declaration says `RETURNS TABLE (step text, value jsonb, recorded_at timestamptz)`.
#[pg_extern(sql = false)]
fn load(workflow: Option<&str>, fcinfo: pg_sys::FunctionCallInfo) {
    deliver(spi::pinned(|| load_impl(fcinfo, workflow)));
}

#[pg_extern(sql = false)]
fn transact(
    workflow: Option<&str>,
    token: Option<i64>,
    step: Option<&str>,
    effect: Option<pg_sys::Oid>,
    arg: Option<Jsonb>,
) -> Option<Jsonb> {
    deliver(transact_impl(workflow, token, step, effect, arg))
}

crate::entry_points! {
    sturdy_record, pg_finfo_sturdy_record => record_wrapper;
    sturdy_supply, pg_finfo_sturdy_supply => supply_wrapper;
    sturdy_load, pg_finfo_sturdy_load => load_wrapper;
    sturdy_transact, pg_finfo_sturdy_transact => transact_wrapper;
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{count, sqlstate_of};
    use pgrx::prelude::*;

    fn text(sql: &str) -> Option<String> {
        Spi::get_one::<String>(sql).unwrap()
    }

    #[pg_test]
    fn record_is_first_writer_wins_and_says_who_won() {
        Spi::run("SELECT sturdy.claim('r1')").unwrap();
        let first = text(
            "SELECT format('%s %s', recorded, first) FROM sturdy.record('r1', 's', '{\"a\": 1}', 1)",
        );
        assert_eq!(first.as_deref(), Some("{\"a\": 1} t"));
        let again = text(
            "SELECT format('%s %s', recorded, first) FROM sturdy.record('r1', 's', '{\"a\": 2}', 1)",
        );
        assert_eq!(again.as_deref(), Some("{\"a\": 1} f"));
        // a retry with the same value is still not this call's write
        let same = text(
            "SELECT format('%s %s', recorded, first) FROM sturdy.record('r1', 's', '{\"a\": 1}', 1)",
        );
        assert_eq!(same.as_deref(), Some("{\"a\": 1} f"));
        assert_eq!(count("sturdy.checkpoints"), 1);
    }

    /// record and load hand their rows over in materialize mode: one row (or
    /// the set) wherever a set-returning function may stand.
    #[pg_test]
    fn record_and_load_return_rows_in_from_and_in_the_select_list() {
        Spi::run("SELECT sturdy.claim('r5')").unwrap();
        assert_eq!(
            text("SELECT sturdy.record('r5', 'a', '1', 1)::text").as_deref(),
            Some("(1,t)")
        );
        assert_eq!(
            text("SELECT (sturdy.record('r5', 'a', '2', 1)).recorded::text").as_deref(),
            Some("1")
        );
        assert_eq!(
            text(
                "SELECT string_agg(r.recorded::text || r.first, ',')
                   FROM (VALUES ('b'), ('c')) s(step),
                        LATERAL sturdy.record('r5', s.step, to_jsonb(s.step), 1) r"
            )
            .as_deref(),
            Some("\"b\"true,\"c\"true")
        );
        assert_eq!(
            text("SELECT string_agg(step, ',' ORDER BY step) FROM sturdy.load('r5')").as_deref(),
            Some("a,b,c")
        );
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM (SELECT sturdy.load('r5')) l").unwrap(),
            Some(3)
        );
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM sturdy.load('none')").unwrap(),
            Some(0)
        );
    }

    #[pg_test]
    fn record_through_a_superseded_token_is_fenced_and_writes_nothing() {
        Spi::run("SELECT sturdy.claim('r2')").unwrap();
        Spi::run("UPDATE sturdy.claims SET held_until = now() WHERE workflow = 'r2'").unwrap();
        assert_eq!(
            Spi::get_one::<i64>("SELECT sturdy.claim('r2')").unwrap(),
            Some(2)
        );
        assert_eq!(
            sqlstate_of("SELECT * FROM sturdy.record('r2', 's', '1', 1)"),
            "SD001"
        );
        assert_eq!(
            sqlstate_of("SELECT * FROM sturdy.record('nobody', 's', '1', 1)"),
            "SD001"
        );
        assert_eq!(count("sturdy.checkpoints"), 0);
    }

    #[pg_test]
    fn supply_is_unfenced_and_never_overwrites() {
        assert_eq!(
            text("SELECT sturdy.supply('r3', 'approval', '\"yes\"')::text").as_deref(),
            Some("\"yes\"")
        );
        assert_eq!(
            text("SELECT sturdy.supply('r3', 'approval', '\"no\"')::text").as_deref(),
            Some("\"yes\"")
        );
        // JSON null is a value, distinct from no value
        assert_eq!(
            text("SELECT sturdy.supply('r3', 'n', 'null')::text").as_deref(),
            Some("null")
        );
        assert_eq!(count("sturdy.checkpoints"), 2);
    }

    #[pg_test]
    fn load_returns_the_history_in_order() {
        Spi::run("SELECT sturdy.claim('r4')").unwrap();
        Spi::run("SELECT sturdy.record('r4', 'b-first', '1', 1)").unwrap();
        Spi::run("SELECT sturdy.record('r4', 'a-second', '2', 1)").unwrap();
        let steps =
            text("SELECT string_agg(step || '=' || value::text, ',') FROM sturdy.load('r4')");
        assert_eq!(steps.as_deref(), Some("b-first=1,a-second=2"));
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM sturdy.load('none')").unwrap(),
            Some(0)
        );
    }

    #[pg_test]
    fn big_values_round_trip() {
        Spi::run("SELECT sturdy.claim('big')").unwrap();
        let n = Spi::get_one::<i32>(
            "SELECT length(recorded->>'s') FROM sturdy.record('big', 's',
                jsonb_build_object('s', repeat('x', 3000000)), 1)",
        )
        .unwrap();
        assert_eq!(n, Some(3_000_000));
        let n = Spi::get_one::<i32>("SELECT length(value->>'s') FROM sturdy.load('big')").unwrap();
        assert_eq!(n, Some(3_000_000));
    }

    fn make_effect() {
        Spi::run(
            "CREATE TABLE pg_temp.effects (n int);
             CREATE FUNCTION pg_temp.bump(arg jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO pg_temp.effects VALUES (1);
                   RETURN jsonb_build_object('got', arg, 'n', (SELECT count(*) FROM pg_temp.effects)); END $$;",
        )
        .unwrap();
    }

    #[pg_test]
    fn transact_runs_the_effect_once_and_records_it() {
        make_effect();
        Spi::run("SELECT sturdy.claim('t1')").unwrap();
        let v = text(
            "SELECT sturdy.transact('t1', 1, 'charge', 'pg_temp.bump(jsonb)', '{\"x\": 5}')::text",
        );
        assert_eq!(v.as_deref(), Some("{\"n\": 1, \"got\": {\"x\": 5}}"));
        let again = text(
            "SELECT sturdy.transact('t1', 1, 'charge', 'pg_temp.bump(jsonb)', '{\"x\": 6}')::text",
        );
        assert_eq!(again, v, "a replay returns the recorded value");
        assert_eq!(count("pg_temp.effects"), 1, "and does not run the effect");
    }

    #[pg_test]
    fn transact_after_supply_returns_the_supplied_value_without_the_effect() {
        make_effect();
        Spi::run("SELECT sturdy.claim('t2')").unwrap();
        Spi::run("SELECT sturdy.supply('t2', 'charge', '\"manual\"')").unwrap();
        let v = text("SELECT sturdy.transact('t2', 1, 'charge', 'pg_temp.bump(jsonb)')::text");
        assert_eq!(v.as_deref(), Some("\"manual\""));
        assert_eq!(count("pg_temp.effects"), 0);
    }

    #[pg_test]
    fn transact_refuses_an_effect_that_writes_its_own_step() {
        Spi::run(
            "CREATE FUNCTION pg_temp.selfish(arg jsonb) RETURNS jsonb LANGUAGE sql AS $$
               SELECT sturdy.supply('t4', 'step', '\"from inside\"') $$;",
        )
        .unwrap();
        Spi::run("SELECT sturdy.claim('t4')").unwrap();
        assert_eq!(
            sqlstate_of("SELECT sturdy.transact('t4', 1, 'step', 'pg_temp.selfish(jsonb)')"),
            "22023"
        );
        assert_eq!(count("sturdy.checkpoints"), 0);
    }

    #[pg_test]
    fn transact_is_fenced_before_the_effect_runs() {
        make_effect();
        Spi::run("SELECT sturdy.claim('t5')").unwrap();
        assert_eq!(
            sqlstate_of("SELECT sturdy.transact('t5', 9, 's', 'pg_temp.bump(jsonb)')"),
            "SD001"
        );
        assert_eq!(count("pg_temp.effects"), 0);
    }

    #[pg_test]
    fn transact_passes_effect_errors_through_and_undoes_them() {
        Spi::run(
            "CREATE TABLE pg_temp.effects (n int);
             CREATE FUNCTION pg_temp.fails(arg jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO pg_temp.effects VALUES (1); RAISE unique_violation USING MESSAGE = 'boom'; END $$;",
        )
        .unwrap();
        Spi::run("SELECT sturdy.claim('t6')").unwrap();
        assert_eq!(
            sqlstate_of("SELECT sturdy.transact('t6', 1, 's', 'pg_temp.fails(jsonb)')"),
            "23505"
        );
        assert_eq!(count("pg_temp.effects"), 0);
        assert_eq!(count("sturdy.checkpoints"), 0);
    }

    #[pg_test]
    fn transact_refuses_bad_effects_and_null_results() {
        Spi::run("SELECT sturdy.claim('t7')").unwrap();
        Spi::run(
            "CREATE FUNCTION pg_temp.two(a jsonb, b jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT a';
             CREATE FUNCTION pg_temp.texty(a jsonb) RETURNS text LANGUAGE sql AS 'SELECT a::text';
             CREATE FUNCTION pg_temp.many(a jsonb) RETURNS SETOF jsonb LANGUAGE sql AS 'SELECT a';
             CREATE FUNCTION pg_temp.nothing(a jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT NULL::jsonb';",
        )
        .unwrap();
        for (sql, state) in [
            (
                "SELECT sturdy.transact('t7', 1, 's', 'pg_temp.two(jsonb,jsonb)')",
                "22023",
            ),
            (
                "SELECT sturdy.transact('t7', 1, 's', 'pg_temp.texty(jsonb)')",
                "22023",
            ),
            (
                "SELECT sturdy.transact('t7', 1, 's', 'pg_temp.many(jsonb)')",
                "22023",
            ),
            (
                "SELECT sturdy.transact('t7', 1, 's', 0::regprocedure)",
                "22023",
            ),
            (
                "SELECT sturdy.transact('t7', 1, 's', 'pg_temp.nothing(jsonb)')",
                "22004",
            ),
            ("SELECT sturdy.transact('t7', 1, 's', NULL)", "22004"),
            (
                "SELECT sturdy.transact('t7', 1, '', 'pg_temp.nothing(jsonb)')",
                "22023",
            ),
        ] {
            assert_eq!(sqlstate_of(sql), state, "{sql}");
        }
        assert_eq!(count("sturdy.checkpoints"), 0);
    }

    #[pg_test]
    fn checkpoint_bad_arguments_are_refused_and_write_nothing() {
        Spi::run("SELECT sturdy.claim('b')").unwrap();
        for (sql, state) in [
            ("SELECT * FROM sturdy.record(NULL, 's', '1', 1)", "22004"),
            ("SELECT * FROM sturdy.record('b', '', '1', 1)", "22023"),
            ("SELECT * FROM sturdy.record('b', 's', NULL, 1)", "22004"),
            ("SELECT * FROM sturdy.record('b', 's', '1', NULL)", "22004"),
            (
                "SELECT * FROM sturdy.record('b', repeat('s', 2000), '1', 1)",
                "22023",
            ),
            ("SELECT sturdy.supply('b', 's', NULL)", "22004"),
            ("SELECT sturdy.supply('', 's', '1')", "22023"),
            ("SELECT * FROM sturdy.load(NULL)", "22004"),
            (
                "SELECT * FROM sturdy.record('b', 's', '\"\\u0000\"', 1)",
                "22P05",
            ),
        ] {
            assert_eq!(sqlstate_of(sql), state, "{sql}");
        }
        assert_eq!(count("sturdy.checkpoints"), 0);
    }
}
