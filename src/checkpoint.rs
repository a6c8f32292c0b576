//! Checkpoints: a workflow's completed steps, first writer wins.
//!
//! A step's value is written once and never overwritten. Two kinds of writer
//! meet here. A pass holding a claim writes through the fence (`record`,
//! `transact` and `finish`'s step, composed in `compose` from the claim's
//! fence and this room's operations): its write lands only while its token is
//! current. `supply` is the unfenced write for a value from outside any pass
//! (an approval, a webhook): it must not fail because a worker happens to be
//! mid-pass. Every writer learns the value stored after its call, so one that
//! lost the race carries on with the winner's.
//!
//! This room owns the table and its columns and offers the operations the
//! fenced writes are built from: [`StepRecord`] (a step inserted without a
//! statement, or kept and read where it is there), [`write_unless_there`] and
//! [`value_of`].

use pg_sturdy_macros::sql_function;
use pgrx::{IntoDatum, pg_sys};

use crate::access;
use crate::args::{self, Name};
use crate::datum::{Jsonb, Text};
use crate::error::{Error, Result};
use crate::fmgr::Args;
use crate::placement::Placed;
use crate::plan::{self, Statement, first_value, run_one};

/// The checkpoints table, for writes without a statement (see `access`):
/// its columns by position.
static CHECKPOINTS: access::Table = access::Table::new(
    c"sturdy",
    c"checkpoints",
    &[
        c"workflow",
        c"step",
        c"value",
        c"token",
        c"recorded_at",
        c"place",
    ],
);
const CP_WORKFLOW: access::Col = access::Col(0);
const CP_STEP: access::Col = access::Col(1);
const CP_VALUE: access::Col = access::Col(2);
const CP_TOKEN: access::Col = access::Col(3);
const CP_RECORDED_AT: access::Col = access::Col(4);
const CP_PLACE: access::Col = access::Col(5);

/// A step a pass records as `INSERT ... ON CONFLICT DO NOTHING` inserts it,
/// without a statement (`finish`'s step): its key and values, for
/// [`StepRecord::insert_unless_there`].
pub(crate) struct StepRecord {
    /// (place,) workflow, step: the primary key's columns (see
    /// [`placement::kept_at`](crate::placement::kept_at)).
    key: [(access::Col, pg_sys::Datum); 3],
    keys: usize,
    /// Its workflow, and whether its rows are kept by its place (the
    /// distribution value under Citus).
    workflow: Name,
    by_place: bool,
    values: [(access::Col, pg_sys::Oid, Option<pg_sys::Datum>); 3],
}

impl StepRecord {
    /// `step` = `value` of `workflow` (`w`, its `text` datum) under
    /// `token`, recorded now (the clock, as `clock_timestamp()`).
    pub(crate) fn new(
        workflow: Name,
        w: pg_sys::Datum,
        step: Name,
        value: Jsonb,
        token: i64,
    ) -> Self {
        let clock = pg_sys::TimestampTz::from(pgrx::datum::clock_timestamp());
        let step = step.into_datum().unwrap_or(w);
        let (_, place) = crate::placement::kept_at(workflow.bytes());
        let (key, keys) = match place {
            Some(place) => ([(CP_PLACE, place), (CP_WORKFLOW, w), (CP_STEP, step)], 3),
            None => ([(CP_WORKFLOW, w), (CP_STEP, step), (CP_STEP, step)], 2),
        };
        StepRecord {
            key,
            keys,
            workflow,
            by_place: place.is_some(),
            values: [
                (CP_VALUE, pg_sys::JSONBOID, value.into_datum()),
                (CP_TOKEN, pg_sys::INT8OID, token.into_datum()),
                (
                    CP_RECORDED_AT,
                    pg_sys::TIMESTAMPTZOID,
                    Some(pg_sys::Datum::from(clock)),
                ),
            ],
        }
    }

    /// Where its rows are kept (see [`placement::kept_at`](crate::placement::kept_at)).
    fn at(&self) -> &[u8] {
        if self.by_place {
            crate::scaleout::place_of(self.workflow.bytes())
        } else {
            self.workflow.bytes()
        }
    }

    fn upsert(&self) -> access::Upsert<'_> {
        access::Upsert {
            key: &self.key[..self.keys],
            set: &self.values,
            fill: &[],
            insert_only: &[],
            only_if: None,
            increment: None,
            skip_locked: false,
        }
    }

    /// The checkpoints table opened for it; `None` where `access` cannot
    /// insert it (see there).
    pub(crate) fn open(&self) -> Option<access::Opened> {
        CHECKPOINTS
            .opened(&[pg_sys::ACL_INSERT], self.at())
            .filter(|table| table.can_insert(&self.upsert(), false))
    }

    /// Inserted into `table` ([`StepRecord::open`]) unless a row with its
    /// key is there: whether it went in; `None` where it cannot be done here.
    pub(crate) fn insert_unless_there(&self, table: &access::Opened) -> Result<Option<bool>> {
        table.insert_unless_there(&self.upsert())
    }

    /// As `INSERT ... ON CONFLICT DO UPDATE SET value = cp.value` writes it
    /// (`record`'s statement): inserted, or the row there locked and kept
    /// unchanged. Its values are the insert's alone.
    fn kept(&self) -> access::Upsert<'_> {
        access::Upsert {
            key: &self.key[..self.keys],
            set: &[],
            insert_only: &self.values,
            fill: &[],
            only_if: None,
            increment: None,
            skip_locked: false,
        }
    }

    /// The checkpoints table opened for [`StepRecord::insert_or_keep`];
    /// `None` where `access` cannot do it (see there).
    pub(crate) fn open_to_keep(&self) -> Option<access::Opened> {
        CHECKPOINTS
            .opened(&[pg_sys::ACL_INSERT, pg_sys::ACL_UPDATE], self.at())
            .filter(|table| table.can_insert(&self.kept(), true))
    }

    /// Inserted into `table` ([`StepRecord::open_to_keep`]), or the row
    /// there locked and kept: the value stored after the call and whether
    /// this call stored it; `None` with nothing written where it cannot be
    /// done here.
    pub(crate) fn insert_or_keep(
        &self,
        table: &access::Opened,
    ) -> Result<Option<(pg_sys::Datum, bool)>> {
        let [(_, _, Some(value)), ..] = self.values else {
            return Ok(None);
        };
        Ok(match table.upsert_reading(&self.kept(), CP_VALUE)? {
            Some((access::Upserted::Inserted, _)) => Some((value, true)),
            Some((access::Upserted::Kept, Some(stored))) => Some((stored, false)),
            _ => None,
        })
    }
}

static SUPPLY: Placed = Placed {
    by_workflow: Statement {
        sql: "INSERT INTO sturdy.checkpoints AS cp (workflow, step, value, token, recorded_at)
              VALUES ($1, $2, $3, NULL, pg_catalog.clock_timestamp())
              ON CONFLICT (workflow, step) DO UPDATE SET value = cp.value
              RETURNING cp.value",
        args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::JSONBOID],
        writes: true,
        generic: false,
    },
    with_queues: Statement {
        sql:
            "INSERT INTO sturdy.checkpoints AS cp (place, workflow, step, value, token, recorded_at)
              VALUES (sturdy.workflow_place($1), $1, $2, $3, NULL, pg_catalog.clock_timestamp())
              ON CONFLICT ON CONSTRAINT checkpoints_pkey DO UPDATE SET value = cp.value
              RETURNING cp.value",
        args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::JSONBOID],
        writes: true,
        generic: false,
    },
};

static LOAD: Placed = Placed {
    by_workflow: Statement {
        sql: "SELECT step, value, recorded_at FROM sturdy.checkpoints
               WHERE workflow OPERATOR(pg_catalog.=) $1 ORDER BY recorded_at, step",
        args: &[pg_sys::TEXTOID],
        writes: false,
        generic: false,
    },
    with_queues: Statement {
        sql: "SELECT step, value, recorded_at FROM sturdy.checkpoints
               WHERE place OPERATOR(pg_catalog.=) sturdy.workflow_place($1)
                 AND workflow OPERATOR(pg_catalog.=) $1 ORDER BY recorded_at, step",
        args: &[pg_sys::TEXTOID],
        writes: false,
        generic: false,
    },
};

/// A step written unless it is there; no row back means it was.
static WRITE_UNLESS_THERE: Placed = Placed {
    by_workflow: Statement {
        sql: "INSERT INTO sturdy.checkpoints (workflow, step, value, token, recorded_at)
              VALUES ($1, $2, $3, $4, pg_catalog.clock_timestamp())
              ON CONFLICT (workflow, step) DO NOTHING
              RETURNING value",
        args: WRITE_ARGS,
        writes: true,
        generic: false,
    },
    with_queues: Statement {
        sql: "INSERT INTO sturdy.checkpoints (place, workflow, step, value, token, recorded_at)
              VALUES (sturdy.workflow_place($1), $1, $2, $3, $4, pg_catalog.clock_timestamp())
              ON CONFLICT ON CONSTRAINT checkpoints_pkey DO NOTHING
              RETURNING value",
        args: WRITE_ARGS,
        writes: true,
        generic: false,
    },
};

const WRITE_ARGS: &[pg_sys::Oid] = &[
    pg_sys::TEXTOID,
    pg_sys::TEXTOID,
    pg_sys::JSONBOID,
    pg_sys::INT8OID,
];

static VALUE_OF: Placed = Placed {
    by_workflow: Statement {
        sql: "SELECT value FROM sturdy.checkpoints
               WHERE workflow OPERATOR(pg_catalog.=) $1 AND step OPERATOR(pg_catalog.=) $2",
        args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
        // read-write so it takes a fresh snapshot and sees a write that won
        writes: true,
        generic: false,
    },
    with_queues: Statement {
        sql: "SELECT value FROM sturdy.checkpoints
               WHERE place OPERATOR(pg_catalog.=) sturdy.workflow_place($1)
                 AND workflow OPERATOR(pg_catalog.=) $1 AND step OPERATOR(pg_catalog.=) $2",
        args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
};

/// `step` = `value` of `workflow` under `token`, unless the step is
/// recorded: the value written, `None` where another writer got there first
/// (`transact`'s write of its effect's result).
pub(crate) fn write_unless_there(
    workflow: Name,
    step: Name,
    value: Jsonb,
    token: i64,
) -> Result<Option<Jsonb>> {
    run_one(
        WRITE_UNLESS_THERE.get(),
        &[workflow.into(), step.into(), value.into(), token.into()],
        first_value,
    )
}

/// The value recorded for `step` of `workflow`, read with a fresh snapshot.
pub(crate) fn value_of(workflow: Name, step: Name) -> Result<Option<Jsonb>> {
    run_one(
        VALUE_OF.get(),
        &[workflow.into(), step.into()],
        first_value::<Jsonb>,
    )
}

/// The unfenced first-writer-wins write, for validated arguments: the value
/// stored after the call. `supply` and `arrive` both end here.
pub fn supply_value(workflow: Name, step: Name, value: Jsonb) -> Result<Jsonb> {
    run_one(
        SUPPLY.get(),
        &[workflow.into(), step.into(), value.into()],
        first_value::<Jsonb>,
    )?
    .ok_or(Error::Internal {
        context: "supply",
        cause: "the upsert returned no row".into(),
    })
}

#[sql_function(
    "sturdy.supply(workflow text, step text, value jsonb) RETURNS jsonb VOLATILE PARALLEL UNSAFE",
    comment = "Unfenced first-writer-wins checkpoint for a value from outside any pass (an approval, a webhook). Returns the value stored after the call."
)]
fn supply(workflow: Option<Text>, step: Option<Text>, value: Option<Jsonb>) -> Result<Jsonb> {
    let workflow = args::name("workflow", workflow)?;
    let step = args::name("step", step)?;
    let value = args::required("value", value)?;
    supply_value(workflow, step, value)
}

/// Returns its rows through the call (see `plan::run_as_set`).
#[sql_function(
    "sturdy.load(workflow text) RETURNS TABLE (step text, value jsonb, recorded_at timestamptz)
     STABLE PARALLEL UNSAFE",
    comment = "A workflow's recorded steps, oldest first."
)]
fn load(call: &Args, workflow: Option<Text>) -> Result<()> {
    let workflow = args::name("workflow", workflow)?;
    plan::run_as_set(call, LOAD.get(), &[workflow.into()])?;
    Ok(())
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::testing::{count, error_of, sqlstate_of};
    use pgrx::prelude::*;

    fn text(sql: &str) -> Option<String> {
        Spi::get_one::<String>(sql).unwrap()
    }

    /// `record` through `access` (no statement) and through its statement
    /// where a table asks for more (a trigger): the same answers, the same
    /// rows, the same refusals, a large value kept whole.
    #[pg_test]
    fn record_writes_without_a_statement_and_with_one_where_a_trigger_must_fire() {
        let served = crate::access::served;
        let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(20_000));
        for through_statement in [false, true] {
            let w = if through_statement { "rt" } else { "ra" };
            Spi::run(&format!("SELECT sturdy.claim('{w}')")).unwrap();
            let before = served();
            let record = |step: &str, value: &str, token: i64| {
                text(&format!(
                    "SELECT format('%s %s', md5(recorded::text), first)
                       FROM sturdy.record('{w}', '{step}', '{value}', {token})"
                ))
            };
            let md5 = |value: &str| text(&format!("SELECT md5('{value}'::jsonb::text)")).unwrap();
            assert_eq!(
                record("s", "{\"a\": 1}", 1),
                Some(format!("{} t", md5("{\"a\": 1}")))
            );
            assert_eq!(
                record("s", "{\"a\": 2}", 1),
                Some(format!("{} f", md5("{\"a\": 1}"))),
                "{w}: the first value stays, and is handed back"
            );
            assert_eq!(record("big", &big, 1), Some(format!("{} t", md5(&big))));
            assert_eq!(
                record("big", "1", 1),
                Some(format!("{} f", md5(&big))),
                "{w}: a stored value that was toasted comes back whole"
            );
            assert_eq!(
                sqlstate_of(&format!(
                    "SELECT * FROM sturdy.record('{w}', 'late', '1', 2)"
                )),
                "SD001",
                "{w}: a stale token"
            );
            assert_eq!(
                count(&format!("sturdy.checkpoints WHERE workflow = '{w}'")),
                2,
                "{w}: nothing written by the refused call"
            );
            assert_eq!(
                served() == before,
                through_statement,
                "{w}: served here only without the trigger"
            );
            if !through_statement {
                crate::testing::trigger_noop("sturdy.checkpoints", "INSERT");
            }
        }
    }

    /// A record that inserts before it looks (among new steps: at most four
    /// of its backend's last 32 records found a checkpoint, access/insert.rs) and
    /// meets the step's checkpoint there keeps the first value and hands it
    /// back whole, as a look would.
    #[pg_test]
    fn a_record_among_new_steps_keeps_the_first_value_there() {
        let blind = || crate::access::INSERTED_FIRST.with(|n| n.get());
        let big = format!("{{\"pad\": \"{}\"}}", "y".repeat(20_000));
        Spi::run("SELECT sturdy.claim('rb')").unwrap();
        let record = |step: &str, value: &str| {
            text(&format!(
                "SELECT format('%s %s', md5(recorded::text), first)
                   FROM sturdy.record('rb', '{step}', '{value}', 1)"
            ))
        };
        let md5 = |value: &str| text(&format!("SELECT md5('{value}'::jsonb::text)")).unwrap();
        record("s", &big);
        // 28 new steps: whatever came before, at most four of the last 32 found one
        for i in 0..28 {
            assert_eq!(
                record(&format!("s{i}"), "2"),
                Some(format!("{} t", md5("2")))
            );
        }
        let (tried, missed) = blind();
        assert_eq!(
            record("s", "3"),
            Some(format!("{} f", md5(&big))),
            "the first value, toasted, handed back whole"
        );
        assert_eq!(
            blind(),
            (tried + 1, missed + 1),
            "inserted first, met the checkpoint"
        );
        assert_eq!(count("sturdy.checkpoints WHERE workflow = 'rb'"), 29);
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

    /// Whatever an effect raises reaches the caller as raised: pg_sturdy's own
    /// SQLSTATEs from a nested call, PL/pgSQL's P0001, a user-defined code,
    /// with message, detail and hint; and the effect's writes are undone.
    #[pg_test]
    fn transact_passes_every_sqlstate_an_effect_raises_through() {
        Spi::run(
            "CREATE TABLE pg_temp.effects (n int);
             SELECT sturdy.claim('other', '1 hour'), sturdy.claim('w', '1 hour');
             CREATE FUNCTION pg_temp.fences(a jsonb) RETURNS jsonb LANGUAGE plpgsql AS
               $$BEGIN INSERT INTO pg_temp.effects VALUES (1); PERFORM sturdy.fence('other', 999); RETURN a; END$$;
             CREATE FUNCTION pg_temp.stale(a jsonb) RETURNS jsonb LANGUAGE plpgsql AS
               $$BEGIN PERFORM sturdy.record('other', 's', '1', 7); RETURN a; END$$;
             CREATE FUNCTION pg_temp.bad_arg(a jsonb) RETURNS jsonb LANGUAGE plpgsql AS
               $$BEGIN PERFORM sturdy.claim(''); RETURN a; END$$;
             CREATE FUNCTION pg_temp.plain(a jsonb) RETURNS jsonb LANGUAGE plpgsql AS
               $$BEGIN RAISE EXCEPTION 'plain'; END$$;
             CREATE FUNCTION pg_temp.custom(a jsonb) RETURNS jsonb LANGUAGE plpgsql AS
               $$BEGIN INSERT INTO pg_temp.effects VALUES (1);
                 RAISE EXCEPTION 'custom' USING ERRCODE = 'AB123', DETAIL = 'the detail', HINT = 'the hint'; END$$;
             CREATE FUNCTION pg_temp.caught_then_raised(a jsonb) RETURNS jsonb LANGUAGE plpgsql AS
               $$BEGIN
                 BEGIN RAISE EXCEPTION 'first' USING ERRCODE = 'AB001'; EXCEPTION WHEN OTHERS THEN NULL; END;
                 RAISE EXCEPTION 'second' USING ERRCODE = 'AB002';
               END$$;",
        )
        .unwrap();
        let call = |f: &str| {
            error_of(&format!(
                "SELECT sturdy.transact('w', 1, 's', 'pg_temp.{f}(jsonb)', '{{}}')"
            ))
        };
        assert!(
            call("fences")
                .starts_with("SD001 | workflow \"other\" is fenced: token 999 was never issued")
        );
        assert!(call("stale").starts_with("SD001 | workflow \"other\" is fenced: token 7"));
        assert_eq!(
            call("bad_arg"),
            "22023 | workflow must not be empty | Pass a non-empty workflow."
        );
        assert_eq!(call("plain"), "P0001 | plain");
        assert_eq!(call("custom"), "AB123 | custom | the detail | the hint");
        assert_eq!(call("caught_then_raised"), "AB002 | second");
        assert_eq!(count("pg_temp.effects"), 0);
        assert_eq!(count("sturdy.checkpoints"), 0);
    }

    #[pg_test]
    fn transact_refuses_an_effect_the_caller_may_not_execute() {
        Spi::run(
            "CREATE ROLE sturdy_t_app NOLOGIN;
             SELECT sturdy.grant_usage('sturdy_t_app');
             CREATE TABLE pg_temp.ran (u text);
             GRANT INSERT ON pg_temp.ran TO sturdy_t_app;
             CREATE FUNCTION pg_temp.secret(a jsonb) RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER
               AS $$BEGIN INSERT INTO pg_temp.ran VALUES (current_user); RETURN a; END$$;
             REVOKE ALL ON FUNCTION pg_temp.secret(jsonb) FROM PUBLIC;
             SELECT sturdy.claim('w');",
        )
        .unwrap();
        // define the probe while still superuser, then call as the role
        assert_eq!(sqlstate_of("SELECT 1"), "00000");
        Spi::run("SET LOCAL ROLE sturdy_t_app").unwrap();
        let refused =
            error_of("SELECT sturdy.transact('w', 1, 's', 'pg_temp.secret(jsonb)', '{}')");
        Spi::run("RESET ROLE").unwrap();
        assert!(
            refused.starts_with("42501 | permission denied for function pg_temp"),
            "{refused}"
        );
        assert_eq!(count("pg_temp.ran"), 0);
        assert_eq!(count("sturdy.checkpoints"), 0);
    }
}
