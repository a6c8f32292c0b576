//! The bridge to the server, and the only home of `unsafe`.
//!
//! - [`Statement`]: a static SQL statement prepared once per backend and kept
//!   (`SPI_keepplan`), so a hot call never parses or plans.
//! - [`Jsonb`]: a `jsonb` datum passed through untouched. pgrx's own `JsonB`
//!   goes through text and `serde_json` in both directions; checkpoint values
//!   are the caller's and we never need to look inside them.
//! - [`subtransaction`]: an internal subtransaction, as a PL/pgSQL `EXCEPTION`
//!   block makes one, for the work that must be undone on its own.
//! - [`call_jsonb_function`]: call a `jsonb -> jsonb` function by OID.
//! - [`run_as_set`]: a statement's rows as a set-returning function's result.
//! - [`pinned`]: run with a search path of `pg_catalog` alone.
//! - [`raise`]: raise an [`Error`] with its own SQLSTATE, outside pgrx's frames.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int};
use std::panic::AssertUnwindSafe;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::pg_sys::{self, AsPgCStr, PgTryBuilder};
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiTupleTable};
use pgrx::{FromDatum, IntoDatum, PgMemoryContexts};

use crate::error::Error;

// ---------------------------------------------------------------------------
// Statements

/// One static SQL statement with its argument types. Declared as a `static`
/// next to the function that runs it; its plan is made on first use in each
/// backend and kept for the backend's life. Every name in `sql` is
/// schema-qualified: a kept plan is re-analysed under whatever `search_path`
/// is current when it is invalidated.
pub struct Statement {
    pub sql: &'static str,
    pub args: &'static [pg_sys::Oid],
    /// Writes (or locks) rows: run read-write. Read-only statements run on the
    /// caller's snapshot, as a `STABLE` function's queries should.
    pub writes: bool,
}

thread_local! {
    // Leaked on purpose: a kept plan lives as long as the backend, and handing
    // out `&'static` lets a statement run without holding this borrow, so a
    // caller's effect may call back into pg_sturdy.
    static PLANS: RefCell<HashMap<usize, &'static OwnedPreparedStatement>> = RefCell::new(HashMap::new());
}

impl Statement {
    fn plan(
        &'static self,
        client: &SpiClient<'_>,
    ) -> Result<&'static OwnedPreparedStatement, Error> {
        let key = self as *const Statement as usize;
        if let Some(plan) = PLANS.with(|p| p.borrow().get(&key).copied()) {
            return Ok(plan);
        }
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

    /// Run the statement on an open SPI connection.
    pub fn run<'c>(
        &'static self,
        client: &SpiClient<'c>,
        args: &[DatumWithOid<'_>],
    ) -> Result<SpiTupleTable<'c>, Error> {
        let plan = self.plan(client)?;
        Ok(client.select(plan, None, args)?)
    }
}

/// The common shape: open a connection, run one statement, read its result.
pub fn run_one<R>(
    stmt: &'static Statement,
    args: &[DatumWithOid<'_>],
    read: impl FnOnce(SpiTupleTable<'_>) -> Result<R, Error>,
) -> Result<R, Error> {
    Spi::connect(|client| read(stmt.run(client, args)?))
}

/// Run `stmt` and make its rows the result of the set-returning function
/// called through `fcinfo`, in materialize mode: one call fills one
/// tuplestore, each row's values moved over as the statement produced them.
/// pgrx's value-per-call iterator costs a call per row plus one, a tuple
/// descriptor per call, and a trip of every value through Rust and back
/// (measured: `take` spent ~20 µs a call over its own statement that way).
/// The statement's columns must have the types of the function's declared
/// result columns, in order. Returns the number of rows.
pub fn run_as_set(
    fcinfo: pg_sys::FunctionCallInfo,
    stmt: &'static Statement,
    args: &[DatumWithOid<'_>],
) -> Result<usize, Error> {
    run_one(stmt, args, |t| {
        let rows = t.len();
        // SAFETY: `fcinfo` is the live call of a set-returning function
        // (InitMaterializedSRF checks that the caller accepts a tuplestore and
        // raises if not). SPI_tuptable is the result of the statement `t`
        // wraps, valid until the connection closes after this closure; each of
        // its `rows` tuples is deformed with its own descriptor and copied into
        // the tuplestore, which lives in the caller's per-query memory.
        unsafe {
            pg_sys::InitMaterializedSRF(fcinfo, pg_sys::MAT_SRF_USE_EXPECTED_DESC);
            let rsinfo = (*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo;
            let (store, desc) = ((*rsinfo).setResult, (*rsinfo).setDesc);
            let table = pg_sys::SPI_tuptable;
            if table.is_null() {
                return Ok(0);
            }
            let from = (*table).tupdesc;
            let natts = (*desc).natts as usize;
            let same_shape = (*from).natts as usize == natts
                && (*from)
                    .attrs
                    .as_slice(natts)
                    .iter()
                    .zip((*desc).attrs.as_slice(natts))
                    .all(|(a, b)| a.atttypid == b.atttypid);
            if !same_shape {
                return Err(Error::Internal {
                    context: "set-returning function",
                    cause: "the statement's columns do not match the declared result".into(),
                });
            }
            let mut values = vec![pg_sys::Datum::from(0); natts];
            let mut nulls = vec![false; natts];
            for i in 0..rows {
                let tuple = *(*table).vals.add(i);
                pg_sys::heap_deform_tuple(tuple, from, values.as_mut_ptr(), nulls.as_mut_ptr());
                pg_sys::tuplestore_putvalues(store, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
            }
        }
        Ok(rows)
    })
}

/// The first column of the first row, or `None` when there is no row (or it
/// is NULL). pgrx treats reading an empty result as an error; for us "no row"
/// is an answer (a held claim, a fenced write).
pub fn first_value<T: FromDatum + IntoDatum>(t: SpiTupleTable<'_>) -> Result<Option<T>, Error> {
    if t.is_empty() {
        Ok(None)
    } else {
        Ok(t.first().get_one::<T>()?)
    }
}

/// An interval as Postgres prints it (`-00:05:00`, `1 day -24:00:00`).
pub fn interval_text(v: pgrx::datum::Interval) -> String {
    // SAFETY: interval_out takes one interval datum and returns a C string.
    let text: Option<&std::ffi::CStr> =
        unsafe { pgrx::direct_function_call(pg_sys::interval_out, &[v.into_datum()]) };
    text.map_or_else(String::new, |t| t.to_string_lossy().into_owned())
}

/// A typed SQL NULL argument.
pub fn null<T: IntoDatum>() -> DatumWithOid<'static> {
    DatumWithOid::null::<T>()
}

// ---------------------------------------------------------------------------
// Jsonb pass-through

/// A `jsonb` value as Postgres holds it. Read from SPI it is copied (and
/// detoasted) into the caller's memory context, so it outlives the connection.
#[derive(Clone, Copy, Debug)]
pub struct Jsonb(pg_sys::Datum);

impl FromDatum for Jsonb {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        (!is_null).then_some(Jsonb(datum))
    }

    unsafe fn from_datum_in_memory_context(
        mut memory_context: PgMemoryContexts,
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<Self> {
        if is_null {
            return None;
        }
        // SAFETY: a non-null jsonb datum from Postgres points at a varlena.
        unsafe {
            memory_context.switch_to(|_| {
                Some(Jsonb(pg_sys::Datum::from(pg_sys::pg_detoast_datum_copy(
                    datum.cast_mut_ptr(),
                ))))
            })
        }
    }
}

pgrx::impl_sql_translatable!(Jsonb, "jsonb");

// SAFETY (both): a `Jsonb` is exactly one non-null datum, unboxed and boxed as is.
unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for Jsonb {
    unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        unsafe { arg.unbox_arg_using_from_datum() }
            .unwrap_or_else(|| panic!("argument {index} must not be null"))
    }
}

unsafe impl pgrx::callconv::BoxRet for Jsonb {
    unsafe fn box_into<'fcx>(
        self,
        fcinfo: &mut pgrx::callconv::FcInfo<'fcx>,
    ) -> pgrx::datum::Datum<'fcx> {
        unsafe { fcinfo.return_raw_datum(self.0) }
    }
}

impl IntoDatum for Jsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }
    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

// ---------------------------------------------------------------------------
// The pinned search path

/// Run `body` with a search path of `pg_catalog` alone (no `pg_temp`, nothing
/// of the caller's), so nothing a caller put on its `search_path` can shadow
/// an operator or function in pg_sturdy's statements. This is what `SET
/// search_path` on the function would do, at a fraction of the cost: that
/// clause saves and restores the GUC on every call (measured: 6.0 vs 3.8 µs a
/// call). If `body` raises, the (sub)transaction abort pops the override.
pub fn pinned<T>(body: impl FnOnce() -> T) -> T {
    let mut path = pg_sys::OverrideSearchPath {
        schemas: std::ptr::null_mut(),
        addCatalog: true,
        addTemp: false,
        generation: 0,
    };
    // SAFETY: PushOverrideSearchPath copies `path`; the pop below matches it
    // at the same transaction nesting level.
    unsafe { pg_sys::PushOverrideSearchPath(&mut path) };
    let out = body();
    unsafe { pg_sys::PopOverrideSearchPath() };
    out
}

// ---------------------------------------------------------------------------
// Subtransactions

/// Run `body` in an internal subtransaction. `Ok(Some(v))` keeps its work
/// (released into the caller's transaction); `Ok(None)` and `Err` roll it
/// back. A Postgres error or panic inside rolls it back and is re-raised, so
/// the subtransaction stack is always as the caller left it. `body` must open
/// and close its own SPI connection, and nothing read inside it may be used
/// after a rollback unless it was copied out.
pub fn subtransaction<T>(
    body: impl FnOnce() -> Result<Option<T>, Error>,
) -> Result<Option<T>, Error> {
    struct Saved(pg_sys::MemoryContext, pg_sys::ResourceOwner);
    impl Saved {
        // SAFETY (both): called once, in the subtransaction begun by `subtransaction`.
        unsafe fn release(&self) {
            unsafe {
                pg_sys::ReleaseCurrentSubTransaction();
                self.restore();
            }
        }
        unsafe fn rollback(&self) {
            unsafe {
                pg_sys::RollbackAndReleaseCurrentSubTransaction();
                self.restore();
            }
        }
        unsafe fn restore(&self) {
            unsafe {
                pg_sys::MemoryContextSwitchTo(self.0);
                pg_sys::CurrentResourceOwner = self.1;
            }
        }
    }
    // SAFETY: the standard sequence PL/pgSQL uses for an EXCEPTION block: begin,
    // keep running in the caller's memory context, and on the way out release or
    // roll back exactly the subtransaction begun here, restoring the owner.
    unsafe {
        let saved = Saved(pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner);
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(saved.0);
        let saved = AssertUnwindSafe(saved);
        let outcome = PgTryBuilder::new(AssertUnwindSafe(body))
            .catch_others(|e: CaughtError| {
                saved.rollback();
                e.rethrow()
            })
            .execute();
        match outcome {
            Ok(Some(v)) => {
                saved.release();
                Ok(Some(v))
            }
            other => {
                saved.rollback();
                other
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Calling a caller's function

/// What `transact` needs to know about an effect before calling it.
pub struct ProcInfo {
    pub name: String,
    pub is_jsonb_to_jsonb: bool,
}

/// Look an effect function up; `None` when no function has that OID.
pub fn proc_info(oid: pg_sys::Oid) -> Option<ProcInfo> {
    use pgrx::pg_catalog::pg_proc::{PgProc, ProArgMode, ProKind};
    let proc = PgProc::new(oid)?;
    let args = proc.proargtypes();
    let is_jsonb_to_jsonb = matches!(proc.prokind(), ProKind::Function)
        && args == [pg_sys::JSONBOID]
        && proc.proargmodes().iter().all(|m| *m == ProArgMode::In)
        && proc.prorettype() == pg_sys::JSONBOID
        && !proc.proretset();
    // SAFETY: `oid` names an existing function (PgProc found it); the result
    // is a palloc'd C string.
    let name = unsafe {
        let name = pg_sys::format_procedure_qualified(oid);
        std::ffi::CStr::from_ptr(name)
            .to_string_lossy()
            .into_owned()
    };
    Some(ProcInfo {
        name,
        is_jsonb_to_jsonb,
    })
}

/// Call a `jsonb -> jsonb` function (checked with [`proc_info`]) on `arg`,
/// honouring `STRICT`. Errors it raises propagate as Postgres errors.
pub fn call_jsonb_function(oid: pg_sys::Oid, arg: Option<Jsonb>) -> Option<Jsonb> {
    // SAFETY: FmgrInfo and a one-argument FunctionCallInfo set up as
    // LOCAL_FCINFO/InitFunctionCallInfoData do; the call goes through pgrx's FFI
    // guard so an ERROR in the callee unwinds as a Rust panic.
    unsafe {
        let mut flinfo = pg_sys::FmgrInfo::default();
        pg_sys::fmgr_info(oid, &mut flinfo);
        if flinfo.fn_strict && arg.is_none() {
            return None;
        }
        let fcinfo = pg_sys::palloc0(
            std::mem::size_of::<pg_sys::FunctionCallInfoBaseData>()
                + std::mem::size_of::<pg_sys::NullableDatum>(),
        ) as *mut pg_sys::FunctionCallInfoBaseData;
        let f = &mut *fcinfo;
        f.flinfo = &mut flinfo;
        f.fncollation = pg_sys::InvalidOid;
        f.nargs = 1;
        let slot = &mut f.args.as_mut_slice(1)[0];
        (slot.value, slot.isnull) = match arg {
            Some(Jsonb(d)) => (d, false),
            None => (pg_sys::Datum::from(0), true),
        };
        let func = flinfo.fn_addr.expect("fmgr_info sets fn_addr");
        let result = pg_sys::ffi::pg_guard_ffi_boundary(|| func(fcinfo));
        let out = (!f.isnull).then_some(Jsonb(result));
        pg_sys::pfree(fcinfo.cast());
        out
    }
}

// ---------------------------------------------------------------------------
// Raising with our own SQLSTATE

// Declared here rather than taken from pgrx's bindings (which leave them out on
// purpose): these calls must not be wrapped in pgrx's FFI guard, since the
// whole point is that the ERROR leaves through Postgres's own longjmp.
unsafe extern "C-unwind" {
    fn errstart(elevel: c_int, domain: *const c_char) -> bool;
    fn errcode(sqlerrcode: c_int) -> c_int;
    fn errmsg(fmt: *const c_char, ...) -> c_int;
    fn errhint(fmt: *const c_char, ...) -> c_int;
    fn errfinish(filename: *const c_char, lineno: c_int, funcname: *const c_char);
}

/// Postgres's MAKE_SQLSTATE: five characters packed six bits apiece.
pub const fn sqlstate_code(s: &[u8; 5]) -> c_int {
    let mut v = 0;
    let mut i = 0;
    while i < 5 {
        v += ((s[i] as c_int - b'0' as c_int) & 0x3F) << (6 * i);
        i += 1;
    }
    v
}

/// Raise `e` as an ERROR with its own SQLSTATE. Only for the entry points in
/// [`crate::entry_points!`], after pgrx's guard has returned: nothing owning a
/// destructor may be live in the frames this longjmps over.
pub fn raise(e: Error) -> ! {
    let code = sqlstate_code(e.sqlstate());
    let message = e.to_string().as_pg_cstr();
    let hint = e.hint().as_pg_cstr();
    drop(e);
    // SAFETY: errstart/errcode/errmsg/errhint/errfinish is the ereport()
    // sequence; at ERROR level errfinish does not return.
    unsafe {
        if errstart(pg_sys::PGERROR as c_int, std::ptr::null()) {
            errcode(code);
            errmsg(c"%s".as_ptr(), message);
            errhint(c"%s".as_ptr(), hint);
            errfinish(
                c"pg_sturdy/src/spi.rs".as_ptr(),
                line!() as c_int,
                c"raise".as_ptr(),
            );
        }
    }
    unreachable!("errfinish at ERROR level returned")
}

#[cfg(test)]
mod tests {
    #[test]
    fn sqlstate_packs_like_postgres() {
        use pgrx::PgSqlErrorCode as C;
        assert_eq!(
            super::sqlstate_code(b"23505"),
            C::ERRCODE_UNIQUE_VIOLATION as i32
        );
        assert_eq!(
            super::sqlstate_code(b"22023"),
            C::ERRCODE_INVALID_PARAMETER_VALUE as i32
        );
        assert_eq!(
            super::sqlstate_code(b"XX000"),
            C::ERRCODE_INTERNAL_ERROR as i32
        );
    }
}
