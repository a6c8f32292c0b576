//! Statements prepared once per backend, and their results.
//!
//! - [`Statement`]: a static SQL statement with its argument types, planned
//!   on first use in each backend and kept (`SPI_keepplan`), so a hot call
//!   never parses or plans.
//! - [`run_one`]: open an SPI connection, run one statement, read its result.
//! - [`run_as_set`]: a statement's rows as a set-returning function's result;
//!   [`return_rows`]: rows computed in Rust as that result.
//!
//! No function pins `search_path`. Instead every statement names everything
//! it uses with its schema — tables (`sturdy.claims`), functions
//! (`pg_catalog.now()`), operators (`OPERATOR(pg_catalog.=)`) and casts to
//! non-keyword types (`::pg_catalog.text`) — so no `search_path`, hostile or
//! not, can change what runs. That is both the safest choice and the cheapest
//! (measured, see docs/security.md): PostgreSQL's override search path is gone
//! from 17 on, and a GUC nest level (what a `SET search_path` clause does)
//! costs a save and restore of the setting on every call, while a statement
//! that resolves nothing through the path needs none. Caller code that
//! pg_sturdy runs (an effect) keeps the caller's path, as it must. Debug
//! builds check every statement for an unqualified name as they prepare it
//! ([`lint`]); `pg_test/regress/hostile_*.sql` call every function under a
//! path that shadows the operators and functions they use.

use std::cell::RefCell;
use std::collections::HashMap;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiTupleTable};
use pgrx::{FromDatum, IntoDatum};

use crate::error::{Error, Result};
use crate::fmgr::Args;
use crate::planner::{Custom, Ours};

/// One static SQL statement with its argument types. Declared as a `static`
/// next to the function that runs it.
pub struct Statement {
    pub sql: &'static str,
    pub args: &'static [pg_sys::Oid],
    /// Writes (or locks) rows: run read-write. Read-only statements run on the
    /// caller's snapshot, as a `STABLE` function's queries should.
    pub writes: bool,
    /// Always run the generic plan (`CURSOR_OPT_GENERIC_PLAN`), for a statement
    /// whose custom plans would never lose to it on estimates alone: `LIMIT $3`
    /// makes the planner cost a generic plan for 10% of the table, so the plan
    /// cache re-plans on every call (~0.15 ms) though the generic plan is the
    /// same index scan. Only with [`run_as_set`] and [`run_generic`], and
    /// only for writes.
    pub generic: bool,
}

thread_local! {
    // Leaked on purpose: a kept plan lives as long as the backend, and handing
    // out `&'static` lets a statement run without holding this borrow, so a
    // caller's effect may call back into pg_sturdy.
    static PLANS: RefCell<HashMap<usize, &'static OwnedPreparedStatement>> = RefCell::new(HashMap::new());
    // Generic-plan statements, kept with SPI_keepplan (pgrx's prepare takes no
    // cursor options), likewise for the backend's life.
    static GENERIC_PLANS: RefCell<HashMap<usize, usize>> = RefCell::new(HashMap::new());
    // The same statements planned custom on every run, for a database
    // distributed by Citus (`scaleout`): there a generic plan cannot be
    // routed.
    static CUSTOM_PLANS: RefCell<HashMap<usize, usize>> = RefCell::new(HashMap::new());
}

impl Statement {
    /// Debug builds refuse a statement a `search_path` could reach ([`lint`]),
    /// once per backend, as it is prepared.
    fn lint_in_debug_builds(&self) -> Result<()> {
        if cfg!(debug_assertions)
            && let Err(why) = lint(self.sql)
        {
            return Err(Error::Internal {
                context: "statement lint",
                cause: format!("{why} in: {}", self.sql),
            });
        }
        Ok(())
    }

    fn plan(&'static self, client: &SpiClient<'_>) -> Result<&'static OwnedPreparedStatement> {
        let key = self as *const Statement as usize;
        if let Some(plan) = PLANS.with(|p| p.borrow().get(&key).copied()) {
            return Ok(plan);
        }
        self.lint_in_debug_builds()?;
        let types: Vec<PgOid> = self.args.iter().map(|&oid| PgOid::from(oid)).collect();
        let prepared = if self.writes {
            client.prepare_mut(self.sql, &types)?
        } else {
            client.prepare(self.sql, &types)?
        };
        let plan: &'static OwnedPreparedStatement = Box::leak(Box::new(prepared.keep()));
        PLANS.with(|p| p.borrow_mut().insert(key, plan));
        Ok(plan)
    }

    /// The kept generic plan, prepared on first use (inside an SPI
    /// connection); under Citus a plan kept the same way that plans custom
    /// on every run.
    fn generic_plan(&'static self) -> Result<pg_sys::SPIPlanPtr> {
        let key = self as *const Statement as usize;
        let custom = crate::scaleout::distributed();
        let plans = if custom {
            &CUSTOM_PLANS
        } else {
            &GENERIC_PLANS
        };
        if let Some(plan) = plans.with(|p| p.borrow().get(&key).copied()) {
            return Ok(plan as pg_sys::SPIPlanPtr);
        }
        self.lint_in_debug_builds()?;
        let sql = std::ffi::CString::new(self.sql).map_err(|_| Error::Internal {
            context: "statement",
            cause: "a NUL byte in the SQL".into(),
        })?;
        let mut types = self.args.to_vec();
        // SAFETY: called inside an SPI connection (run_as_set opens one); the
        // plan is kept in the top memory context and never freed.
        let plan = unsafe {
            let plan = pg_sys::SPI_prepare_cursor(
                sql.as_ptr(),
                types.len() as i32,
                types.as_mut_ptr(),
                if custom {
                    pg_sys::CURSOR_OPT_CUSTOM_PLAN
                } else {
                    pg_sys::CURSOR_OPT_GENERIC_PLAN
                } as i32,
            );
            if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
                return Err(Error::Internal {
                    context: "SPI_prepare_cursor",
                    cause: format!("SPI_result {}", { pg_sys::SPI_result }),
                });
            }
            plan
        };
        plans.with(|p| p.borrow_mut().insert(key, plan as usize));
        Ok(plan)
    }

    /// Run the statement on an open SPI connection.
    pub fn run<'c>(
        &'static self,
        client: &SpiClient<'c>,
        args: &[DatumWithOid<'_>],
    ) -> Result<SpiTupleTable<'c>> {
        let plan = self.plan(client)?;
        let _custom = Custom::around(self.sql)?;
        let _planner = Ours::set();
        Ok(client.select(plan, None, args)?)
    }
}

/// The common shape: open a connection, run one statement, read its result.
pub fn run_one<R>(
    stmt: &'static Statement,
    args: &[DatumWithOid<'_>],
    read: impl FnOnce(SpiTupleTable<'_>) -> Result<R>,
) -> Result<R> {
    Spi::connect(|client| read(stmt.run(client, args)?))
}

/// Run `stmt` and make its rows the result of the set-returning function
/// `call`, in materialize mode: one call fills one
/// tuplestore, each row's values moved over as the statement produced them.
/// pgrx's value-per-call iterator costs a call per row plus one, a tuple
/// descriptor per call, and a trip of every value through Rust and back
/// (measured: `take` spent ~20 µs a call over its own statement that way).
/// The statement's columns must have the types of the function's declared
/// result columns, in order. Returns the number of rows.
pub fn run_as_set(
    call: &Args,
    stmt: &'static Statement,
    args: &[DatumWithOid<'_>],
) -> Result<usize> {
    run_as_set_filled(call, stmt, args, false, |_| ()).map(|(rows, ())| rows)
}

/// [`run_as_set`], then `then` reads the same rows (columns past the declared
/// result's included) before the connection closes. Rows whose first column
/// is NULL are `then`'s alone: the statement's word about something that is
/// not a result (`take`'s rows locked but not leased), kept out of the
/// result and its count. Called again in the same call, it appends to the
/// result.
pub fn run_as_set_then<R>(
    call: &Args,
    stmt: &'static Statement,
    args: &[DatumWithOid<'_>],
    then: impl FnOnce(Rows) -> R,
) -> Result<(usize, R)> {
    run_as_set_filled(call, stmt, args, true, then)
}

fn run_as_set_filled<R>(
    call: &Args,
    stmt: &'static Statement,
    args: &[DatumWithOid<'_>],
    skip_null_first: bool,
    then: impl FnOnce(Rows) -> R,
) -> Result<(usize, R)> {
    let fill = || {
        let rows = fill_result(call, skip_null_first)?;
        Ok((rows, then(last_rows())))
    };
    if !stmt.generic {
        return run_one(stmt, args, |_| fill());
    }
    Spi::connect(|_| {
        execute_generic(stmt, args)?;
        fill()
    })
}

/// Whether this transaction's statements all run on its first snapshot
/// (repeatable read or serializable).
pub fn on_transaction_snapshot() -> bool {
    // SAFETY: reads the transaction's isolation level, a plain global.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// Run `stmt` (a read) on a snapshot taken now, not the caller's, and read
/// its rows: for what a backend keeps past its statement under a mark it
/// took in first (`queue::limits`), which must be at least as new as the
/// mark. The caller's snapshot may be older than a change whose
/// invalidation the mark already took in (a repeatable-read transaction's,
/// or a statement's that began before the change committed): what it read
/// would be kept under the new mark for good.
pub fn run_at_latest<R>(
    stmt: &'static Statement,
    args: &[DatumWithOid<'_>],
    read: impl FnOnce(Rows) -> Result<R>,
) -> Result<R> {
    Spi::connect(|_| {
        execute_kept(stmt, args, true)?;
        read(last_rows())
    })
}

/// Run `stmt`'s kept generic plan on the open SPI connection; its rows are in
/// SPI_tuptable.
fn execute_generic(stmt: &'static Statement, args: &[DatumWithOid<'_>]) -> Result<()> {
    execute_kept(stmt, args, false)
}

/// [`execute_generic`], or with `latest` a read on a snapshot taken now.
fn execute_kept(stmt: &'static Statement, args: &[DatumWithOid<'_>], latest: bool) -> Result<()> {
    let plan = stmt.generic_plan()?;
    crate::scaleout::runs_here(stmt.sql)?;
    let values: Vec<pg_sys::Datum> = args
        .iter()
        .map(|a| {
            a.datum()
                .map_or(pg_sys::Datum::from(0), |d| d.sans_lifetime())
        })
        .collect();
    let nulls: Vec<std::ffi::c_char> = args
        .iter()
        .map(|a| if a.datum().is_some() { b' ' } else { b'n' } as _)
        .collect();
    let planner = Ours::set();
    // SAFETY: `plan` was prepared for exactly these argument types (the
    // statement's), inside the SPI connection our caller opened.
    let rc = unsafe {
        if latest {
            // read-only on a snapshot of now: SPI makes it the active one
            // for the statement (GetLatestSnapshot's is copied as pushed)
            pg_sys::SPI_execute_snapshot(
                plan,
                values.as_ptr().cast_mut(),
                nulls.as_ptr(),
                pg_sys::GetLatestSnapshot(),
                std::ptr::null_mut(),
                true,
                false,
                0,
            )
        } else {
            pg_sys::SPI_execute_plan(plan, values.as_ptr().cast_mut(), nulls.as_ptr(), false, 0)
        }
    };
    drop(planner);
    if rc < 0 {
        return Err(Error::Internal {
            context: "SPI_execute_plan",
            cause: format!("SPI error {rc}"),
        });
    }
    Ok(())
}

/// The rows of a statement run by [`run_generic`], read by position.
pub struct Rows {
    table: *mut pg_sys::SPITupleTable,
    len: usize,
}

impl Rows {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `timestamptz` in column `col` (from 1) of row `row` (from 0), read
    /// in place: `None` when NULL, out of range or of another type.
    pub fn timestamptz(&self, row: usize, col: usize) -> Option<pg_sys::TimestampTz> {
        self.value(row, col, pg_sys::TIMESTAMPTZOID)
            .map(|d| d.value() as pg_sys::TimestampTz)
    }

    /// The `tid` in column `col` (from 1) of row `row` (from 0), copied out:
    /// `None` when NULL, out of range or of another type.
    pub fn tid(&self, row: usize, col: usize) -> Option<pg_sys::ItemPointerData> {
        // SAFETY: a non-null tid datum points at an ItemPointerData in the
        // tuple, alive while `self` is; read unaligned, as it is packed.
        self.value(row, col, pg_sys::TIDOID).map(|d| unsafe {
            std::ptr::read_unaligned(d.cast_mut_ptr::<pg_sys::ItemPointerData>())
        })
    }

    /// The datum in column `col` (from 1) of row `row` (from 0) as it lies in
    /// SPI's memory, when the column has type `oid` and the value is not NULL.
    fn value(&self, row: usize, col: usize, oid: pg_sys::Oid) -> Option<pg_sys::Datum> {
        if row >= self.len || self.table.is_null() {
            return None;
        }
        // SAFETY: as in `get`.
        unsafe {
            let tuple = *(*self.table).vals.add(row);
            let desc = (*self.table).tupdesc;
            if col < 1
                || col > (*desc).natts as usize
                || pg_sys::SPI_gettypeid(desc, col as i32) != oid
            {
                return None;
            }
            let mut isnull = false;
            let datum = pg_sys::SPI_getbinval(tuple, desc, col as i32, &mut isnull);
            (!isnull).then_some(datum)
        }
    }

    /// The bytes of the `text` in column `col` (from 1) of row `row` (from
    /// 0), read in place in SPI's memory (no copy: they are good while these
    /// rows are), `None` when NULL (or out of range).
    pub fn text_bytes(&self, row: usize, col: usize) -> Option<&[u8]> {
        // SAFETY: a text value in a result tuple is detoasted (1- or 4-byte
        // header, which `varlena_to_byte_slice` reads alike) and lives as
        // long as `self`'s connection.
        self.value(row, col, pg_sys::TEXTOID)
            .map(|d| unsafe { pgrx::varlena::varlena_to_byte_slice(d.cast_mut_ptr()) })
    }

    /// Column `col` (from 1) of row `row` (from 0), `None` when NULL (or out
    /// of range). Values that point into the row (`text`, `jsonb`, rows) are
    /// copied out of SPI's memory, as pgrx's own reader copies them, so they
    /// outlive the connection.
    pub fn get<T: FromDatum>(&self, row: usize, col: usize) -> Option<T> {
        if row >= self.len || self.table.is_null() {
            return None;
        }
        // SAFETY: `table` is the SPI_tuptable of the statement just run in the
        // connection still open around the `read` closure that holds `self`;
        // `row` is in range; SPI_getbinval checks `col` and reports NULL for
        // an invalid one (SPI_result is then set, and we answer None).
        unsafe {
            let tuple = *(*self.table).vals.add(row);
            let desc = (*self.table).tupdesc;
            if col < 1 || col > (*desc).natts as usize {
                return None;
            }
            let mut isnull = false;
            let datum = pg_sys::SPI_getbinval(tuple, desc, col as i32, &mut isnull);
            let parent = pgrx::PgMemoryContexts::CurrentMemoryContext.parent()?;
            T::from_datum_in_memory_context(
                parent,
                datum,
                isnull,
                pg_sys::SPI_gettypeid(desc, col as i32),
            )
        }
    }
}

/// The rows of the statement just run in the open SPI connection (for
/// statements run by other means than [`Statement`], such as
/// `fragment::Inferred`).
pub fn last_rows() -> Rows {
    // SAFETY: set by the last statement run in the caller's connection.
    let (table, len) = unsafe { (pg_sys::SPI_tuptable, pg_sys::SPI_processed as usize) };
    Rows { table, len }
}

/// Run `stmt` (declared `generic: true`) through its kept generic plan and
/// read its rows: for a statement whose custom plans cost a re-plan on every
/// call and never beat the generic one (see [`Statement::generic`]).
pub fn run_generic<R>(
    stmt: &'static Statement,
    args: &[DatumWithOid<'_>],
    read: impl FnOnce(Rows) -> Result<R>,
) -> Result<R> {
    Spi::connect(|_| {
        execute_generic(stmt, args)?;
        read(last_rows())
    })
}

/// Run `stmt` (through its kept generic plan where it is declared
/// `generic`) and read its rows.
pub fn run_rows<R>(
    stmt: &'static Statement,
    args: &[DatumWithOid<'_>],
    read: impl FnOnce(Rows) -> Result<R>,
) -> Result<R> {
    if stmt.generic {
        return run_generic(stmt, args, read);
    }
    run_one(stmt, args, |_| read(last_rows()))
}

/// Copy the rows of the statement just run (SPI_tuptable) into the result of
/// the set-returning function `call` (after the rows already there, when
/// called twice). The statement's leading columns are the declared result's;
/// columns after them are the caller's to read, not returned.
fn fill_result(call: &Args, skip_null_first: bool) -> Result<usize> {
    let fcinfo = call.fcinfo();
    // SAFETY: `fcinfo` is the live call (`Args` exists only inside one) of a
    // set-returning function (InitMaterializedSRF, run once per call, checks
    // that the caller accepts a tuplestore and raises if not). SPI_tuptable
    // is the result of the statement just run in the SPI connection still
    // open around us; each of its SPI_processed tuples is deformed with its
    // own descriptor and its leading values copied into the tuplestore, which
    // lives in the caller's per-query memory.
    unsafe {
        let rsinfo = (*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo;
        if rsinfo.is_null() || (*rsinfo).setResult.is_null() {
            pg_sys::InitMaterializedSRF(fcinfo, pg_sys::MAT_SRF_USE_EXPECTED_DESC);
        }
        let (store, desc) = ((*rsinfo).setResult, (*rsinfo).setDesc);
        let table = pg_sys::SPI_tuptable;
        if table.is_null() {
            return Err(Error::Internal {
                context: "set-returning function",
                cause: "the statement returned no rows".into(),
            });
        }
        let rows = pg_sys::SPI_processed as usize;
        let from = (*table).tupdesc;
        let natts = (*desc).natts;
        let same_shape = (*from).natts >= natts
            && (1..=natts)
                .all(|i| pg_sys::SPI_gettypeid(from, i) == pg_sys::SPI_gettypeid(desc, i));
        if !same_shape {
            return Err(Error::Internal {
                context: "set-returning function",
                cause: "the statement's columns do not match the declared result".into(),
            });
        }
        // deformed whole, stored by its leading `natts` values
        let mut values = vec![pg_sys::Datum::from(0); (*from).natts as usize];
        let mut nulls = vec![false; (*from).natts as usize];
        let mut stored = 0;
        for i in 0..rows {
            let tuple = *(*table).vals.add(i);
            pg_sys::heap_deform_tuple(tuple, from, values.as_mut_ptr(), nulls.as_mut_ptr());
            if skip_null_first && nulls.first() == Some(&true) {
                continue;
            }
            pg_sys::tuplestore_putvalues(store, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
            stored += 1;
        }
        Ok(stored)
    }
}

/// Make the set-returning function `call` return a (so far empty) result in
/// materialize mode, as [`run_as_set`] does before it appends a statement's
/// rows: a call that appends its rows itself ([`append_row`]) must, even when
/// it appends none, or the executor reads its NULL result as a row.
pub fn begin_result(call: &Args) {
    let fcinfo = call.fcinfo();
    // SAFETY: as in `fill_result`: the live call of a set-returning function;
    // InitMaterializedSRF checks that the caller accepts a tuplestore.
    unsafe {
        let rsinfo = (*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo;
        if rsinfo.is_null() || (*rsinfo).setResult.is_null() {
            pg_sys::InitMaterializedSRF(fcinfo, pg_sys::MAT_SRF_USE_EXPECTED_DESC);
        }
    }
}

/// Append one row of values read here (a row `access` leased) to the result
/// of the set-returning function `call`, as [`run_as_set`] appends a
/// statement's: the values of the declared result columns, in order and of
/// their types; `None` is NULL. Values past the declared columns are left
/// out, as [`run_as_set`] leaves out a statement's: a released version's
/// schema declares fewer (`take` before its `attempt`). The tuplestore
/// copies them.
pub fn append_row(call: &Args, values: &[Option<pg_sys::Datum>]) -> Result<()> {
    begin_result(call);
    let fcinfo = call.fcinfo();
    // SAFETY: as in `fill_result`, the result begun just above; one datum of
    // each declared column's type (checked in count here, in type by the
    // caller, next to its `#[sql_function]`).
    unsafe {
        let rsinfo = (*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo;
        let (store, desc) = ((*rsinfo).setResult, (*rsinfo).setDesc);
        let values = &values[..values.len().min((*desc).natts as usize)];
        if (*desc).natts as usize != values.len() {
            return Err(Error::Internal {
                context: "set-returning function",
                cause: "a row of another width than the declared result".into(),
            });
        }
        let mut datums: Vec<pg_sys::Datum> = values
            .iter()
            .map(|v| v.unwrap_or(pg_sys::Datum::from(0)))
            .collect();
        let mut nulls: Vec<bool> = values.iter().map(Option::is_none).collect();
        pg_sys::tuplestore_putvalues(store, desc, datums.as_mut_ptr(), nulls.as_mut_ptr());
    }
    Ok(())
}

/// Make rows of values computed here the result of the set-returning
/// function `call` (a summary such as `pump`'s counts). Each row has the
/// values of the declared result columns, in order and of their types;
/// `None` is NULL.
pub fn return_rows(call: &Args, rows: &[&[Option<pg_sys::Datum>]]) -> Result<()> {
    begin_result(call);
    rows.iter().try_for_each(|values| append_row(call, values))
}

/// One row of values computed here as the result (see [`return_rows`]).
pub fn return_row(call: &Args, values: &[Option<pg_sys::Datum>]) -> Result<()> {
    return_rows(call, &[values])
}

/// The first column of the first row, or `None` when there is no row (or it
/// is NULL). pgrx treats reading an empty result as an error; for us "no row"
/// is an answer (a held claim, a fenced write).
pub fn first_value<T: FromDatum + IntoDatum>(t: SpiTupleTable<'_>) -> Result<Option<T>> {
    if t.is_empty() {
        Ok(None)
    } else {
        Ok(t.first().get_one::<T>()?)
    }
}

/// A typed SQL NULL argument.
pub fn null<T: IntoDatum>() -> DatumWithOid<'static> {
    DatumWithOid::null::<T>()
}

/// Words that may stand before `(` without naming a function.
const KEYWORDS_BEFORE_PAREN: &[&str] = &[
    "ALL",
    "AND",
    "ANY",
    "ARRAY",
    "AS",
    "BY",
    "COALESCE",
    "CONFLICT",
    "EXISTS",
    "FROM",
    "GREATEST",
    "IN",
    "JOIN",
    "LATERAL",
    "LEAST",
    "MATERIALIZED",
    "NOT",
    "NULLIF",
    "ON",
    "OR",
    "SELECT",
    "SET",
    "USING",
    "VALUES",
    "WHERE",
    "WITH",
    "FILTER",
    "OVER",
    "RETURNING",
    "THEN",
    "ELSE",
    "WHEN",
    "CASE",
    "INTO",
];
/// Type names that are SQL keywords, so no `search_path` can shadow them.
const KEYWORD_TYPES: &[&str] = &[
    "bigint", "integer", "int", "boolean", "interval", "smallint",
];

/// Words that may follow `FROM`, `JOIN`, `INTO`, `UPDATE` or `USING` without
/// being a relation's name (`ROWS FROM (`, `FOR UPDATE SKIP LOCKED`, `DO
/// UPDATE SET`, `FROM LATERAL (`).
const NOT_RELATIONS: &[&str] = &[
    "ROWS", "LATERAL", "SET", "SKIP", "OF", "NOWAIT", "ONLY", "SELECT",
];

/// The names of the common table expressions `sql` defines (`name AS (`,
/// `name AS MATERIALIZED (`, `name (cols) AS (`): a statement's own, which
/// PostgreSQL looks up before any relation.
fn cte_names(plain: &str) -> Vec<&str> {
    let upper = plain.to_uppercase();
    let mut names = Vec::new();
    let mut from = 0;
    while let Some(at) = upper[from..].find(" AS ").map(|n| n + from) {
        from = at + 4;
        let rest = upper[from..].trim_start();
        let rest = rest.strip_prefix("NOT ").map_or(rest, str::trim_start);
        let rest = rest
            .strip_prefix("MATERIALIZED")
            .map_or(rest, str::trim_start);
        if !rest.starts_with('(') {
            continue;
        }
        let mut before = plain[..at].trim_end();
        if before.ends_with(')')
            && let Some(open) = before.rfind('(')
        {
            before = before[..open].trim_end();
        }
        let start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |n| n + 1);
        names.push(&before[start..]);
    }
    names
}

/// Why `sql` could resolve something through the caller's `search_path`, if it
/// could: an operator not written `OPERATOR(pg_catalog.x)`, a function not
/// written `schema.f(`, a cast to a type not written `schema.t` (SQL keywords
/// such as `bigint` excepted; `CAST(` is refused: its type is not told from
/// an alias here), a relation right after `FROM`, `JOIN`, `INTO`, `UPDATE`
/// or `USING` not written `schema.r` (a common table expression of the
/// statement's own excepted; PostgreSQL looks in the session's `pg_temp`
/// first for relations and types; a relation after a comma in a `FROM` list
/// is not seen: write `JOIN`). String literals are skipped.
pub fn lint(sql: &str) -> std::result::Result<(), String> {
    let mut plain = String::with_capacity(sql.len());
    let mut quoted = false;
    for ch in sql.chars() {
        if ch == '\'' {
            quoted = !quoted;
            plain.push(' ');
        } else {
            plain.push(if quoted { ' ' } else { ch });
        }
    }
    let plain = plain.replace("(*)", "( )");
    let bytes = plain.as_bytes();
    let word_at = |start: usize| -> &str {
        let end = plain[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .map_or(plain.len(), |n| start + n);
        &plain[start..end]
    };
    let ctes = cte_names(&plain);
    let mut in_set = false;
    // parentheses open, and how many were when the SET list began: a
    // subquery inside an assignment (its FROM, its WHERE) does not end it
    let mut depth = 0usize;
    let mut set_depth = 0usize;
    // the word before the one being read, upper-cased
    let mut previous = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i] as char;
        if plain[i..].starts_with("OPERATOR(") {
            let close = plain[i..].find(')').ok_or("an unclosed OPERATOR(")? + i;
            if !plain[i + 9..close].starts_with("pg_catalog.") {
                return Err(format!(
                    "an operator outside pg_catalog: {}",
                    &plain[i..=close]
                ));
            }
            i = close + 1;
        } else if plain[i..].starts_with("::") {
            let ty = word_at(i + 2);
            if !(ty.contains('.') || KEYWORD_TYPES.contains(&ty)) {
                return Err(format!("a cast to an unqualified type: ::{ty}"));
            }
            i += 2 + ty.len();
        } else if c == '$' || (c == '=' && in_set && is_assignment(&plain[..i])) {
            // a parameter, or `=` assigning a column in a SET list
            i += 1;
        } else if "=<>+-*/%^|&!~@#?".contains(c) {
            return Err(format!(
                "an unqualified operator `{c}` near: {}",
                &plain[i.saturating_sub(30)..(i + 10).min(plain.len())]
            ));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let w = word_at(i);
            let upper = w.to_uppercase();
            match upper.as_str() {
                "SET" => {
                    in_set = true;
                    set_depth = depth;
                }
                "WHERE" | "RETURNING" | "FROM" if depth <= set_depth => in_set = false,
                _ => {}
            }
            // the relation after FROM, JOIN, INTO, UPDATE (not `FOR UPDATE`,
            // `FOR NO KEY UPDATE`) or USING
            let introduces = (matches!(upper.as_str(), "FROM" | "JOIN" | "INTO" | "USING")
                && previous != "DISTINCT")
                || (upper == "UPDATE" && previous != "FOR" && previous != "KEY");
            let after = plain[i + w.len()..].trim_start();
            if introduces && after.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                let start = plain.len() - after.len();
                let relation = word_at(start);
                if !relation.contains('.')
                    && !ctes.contains(&relation)
                    && !NOT_RELATIONS.contains(&relation.to_uppercase().as_str())
                {
                    return Err(format!("an unqualified relation: {w} {relation}"));
                }
            }
            if upper == "CAST" && after.starts_with('(') {
                // its type after `AS` reads like an alias: `::schema.type`
                // says the schema where the lint can see it
                return Err("a CAST( (write ::schema.type)".into());
            }
            if after.starts_with('(')
                && !w.contains('.')
                && !KEYWORDS_BEFORE_PAREN.contains(&upper.as_str())
            {
                // `AS alias (cols)`: a name followed by its column list
                let before = plain[..i].trim_end();
                if !before.to_uppercase().ends_with(" AS") {
                    return Err(format!("an unqualified function: {w}("));
                }
            }
            previous = upper;
            i += w.len();
        } else {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                _ => {}
            }
            i += c.len_utf8();
        }
    }
    Ok(())
}

/// Whether the `=` after `before` assigns a column in a `SET` list: it
/// follows a bare column name that follows `SET` or a comma.
fn is_assignment(before: &str) -> bool {
    let before = before.trim_end();
    let column_start = before
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |n| n + 1);
    let rest = before[..column_start].trim_end();
    column_start < before.len() && (rest.ends_with(',') || rest.to_uppercase().ends_with("SET"))
}

#[cfg(test)]
mod tests {
    use super::lint;

    #[test]
    fn lint_accepts_qualified_statements() {
        lint(
            "INSERT INTO sturdy.claims AS held (workflow, token) VALUES ($1, 1)
             ON CONFLICT (workflow) DO UPDATE SET token = held.token OPERATOR(pg_catalog.+) 1
              WHERE held.held_until OPERATOR(pg_catalog.<=) pg_catalog.now() RETURNING NULL::bigint, 'a = b'",
        )
        .unwrap();
        lint("WITH x AS MATERIALIZED (SELECT pg_catalog.count(*) FROM sturdy.queue) SELECT $1::pg_catalog.text").unwrap();
        lint(
            "WITH due AS (SELECT workflow AS w FROM sturdy.queue FOR UPDATE SKIP LOCKED),
                  taken AS NOT MATERIALIZED (SELECT w FROM due FOR NO KEY UPDATE)
             DELETE FROM sturdy.queue q USING ROWS FROM (pg_catalog.unnest($1)) AS d(w), taken
              WHERE q.workflow OPERATOR(pg_catalog.=) d.w",
        )
        .unwrap();
        // a subquery inside an assignment does not end the SET list
        lint(
            "UPDATE sturdy.queue q SET a = COALESCE((SELECT r.x FROM sturdy.queue_retry r
                                                     WHERE r.queue OPERATOR(pg_catalog.=) $1), 1),
                                       b = 2
              WHERE q.queue OPERATOR(pg_catalog.=) $1",
        )
        .unwrap();
    }

    #[test]
    fn lint_refuses_what_a_search_path_could_shadow() {
        for sql in [
            "SELECT 1 FROM sturdy.claims WHERE workflow = $1",
            "SELECT now()",
            "SELECT count(*) FROM sturdy.queue",
            "SELECT $1::text",
            "SELECT a OPERATOR(evil.=) b",
            "SELECT a + 1",
            "UPDATE sturdy.queue SET a = 1, b = 2 WHERE c = 3",
            "UPDATE sturdy.queue SET a = (b = c)",
            "UPDATE sturdy.queue SET a = (SELECT 1 FROM sturdy.claims WHERE x = 1)",
            "UPDATE sturdy.queue SET a = (SELECT 1 FROM sturdy.claims), b = 1 WHERE c = 1",
            "SELECT 1 FROM queue",
            "DELETE FROM claims",
            "UPDATE queue SET a = 1",
            "INSERT INTO checkpoints VALUES (1)",
            "SELECT 1 FROM sturdy.queue JOIN claims USING (workflow)",
            "SELECT CAST($1 AS timestamptz)",
        ] {
            assert!(lint(sql).is_err(), "{sql}");
        }
    }
}
