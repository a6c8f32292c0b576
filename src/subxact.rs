//! Running caller code: internal subtransactions, and calling a caller's
//! function by OID.
//!
//! - [`subtransaction`]: work that must be undone on its own, as a PL/pgSQL
//!   `EXCEPTION` block undoes it. Whatever the work raises comes back as an
//!   [`Error`] with its real SQLSTATE (`SD001`, `P0001`, a user's own code),
//!   message, detail and hint, after the subtransaction is rolled back: the
//!   caller decides whether to raise it (`transact`) or record it (a pump).
//! - [`callable`]: what we need to know about a caller's function before
//!   calling it, the `EXECUTE` privilege included: a function the caller may
//!   not call directly is not called for it either.
//! - [`Callable::call`]: call it, with the caller's rights and `search_path`
//!   (a `SECURITY DEFINER` function runs as its owner, exactly as when called
//!   directly). `transact`'s effects and the outbox's subscribers are called
//!   this way.

use pgrx::pg_sys;

use crate::error::Result;
use crate::fmgr::catching;

/// Run `body` in an internal subtransaction. `Ok(Some(v))` keeps its work
/// (released into the caller's transaction); `Ok(None)` rolls it back and
/// answers `None`; an error — returned by `body` or raised inside it — rolls
/// it back and is returned. `body` must open and close its own SPI connection,
/// and nothing read inside it may be used after a rollback unless copied out.
pub fn subtransaction<T>(body: impl FnOnce() -> Result<Option<T>>) -> Result<Option<T>> {
    // SAFETY: the sequence PL/pgSQL's exec_stmt_block uses: begin, keep running
    // in the caller's memory context, and on the way out release or roll back
    // exactly the subtransaction begun here and restore the resource owner.
    // `catching` has returned before either, so no guarded frame is live, and
    // a caught error has already been copied and flushed by pgrx.
    unsafe {
        let (context, owner) = (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner);
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
        let outcome = catching(body);
        match outcome {
            Ok(Some(v)) => {
                pg_sys::ReleaseCurrentSubTransaction();
                pg_sys::MemoryContextSwitchTo(context);
                pg_sys::CurrentResourceOwner = owner;
                Ok(Some(v))
            }
            other => {
                pg_sys::RollbackAndReleaseCurrentSubTransaction();
                pg_sys::MemoryContextSwitchTo(context);
                pg_sys::CurrentResourceOwner = owner;
                other
            }
        }
    }
}

/// A caller's function, checked for a call, with its call info set up once
/// (a PL/pgSQL function keeps its compiled form there between calls).
pub struct Callable {
    pub oid: pg_sys::Oid,
    /// Its qualified name and argument types, for messages and for storing.
    pub name: String,
    flinfo: Box<pg_sys::FmgrInfo>,
}

/// Why a function cannot be called as asked.
#[derive(Debug)]
pub enum Unfit {
    /// No function has that OID (dropped since it was named).
    Missing,
    /// It exists but has another shape; its qualified name.
    Shape(String),
    /// The current user lacks `EXECUTE` on it; its qualified name.
    NotPermitted(String),
}

/// The qualified name and argument types of function `oid`, e.g.
/// `app.on_order(sturdy.outbox, integer)`, whatever the `search_path`.
pub fn qualified_name(oid: pg_sys::Oid) -> Option<String> {
    pgrx::pg_catalog::pg_proc::PgProc::new(oid)?;
    Some(format_qualified(oid))
}

/// The qualified name of function `oid`, which must exist.
fn format_qualified(oid: pg_sys::Oid) -> String {
    // SAFETY: the caller found `oid` in pg_proc; the result is a palloc'd C
    // string.
    unsafe {
        std::ffi::CStr::from_ptr(pg_sys::format_procedure_qualified(oid))
            .to_string_lossy()
            .into_owned()
    }
}

/// Look up function `oid` for a call by the current user as a plain function
/// (not a procedure, aggregate or set-returning function) of exactly the
/// argument types `args`, all `IN`, returning `returns` (or anything when
/// `None`), which the current user may `EXECUTE` (checked as the executor
/// checks a direct call).
pub fn callable(
    oid: pg_sys::Oid,
    args: &[pg_sys::Oid],
    returns: Option<pg_sys::Oid>,
) -> std::result::Result<Callable, Unfit> {
    use pgrx::pg_catalog::pg_proc::{PgProc, ProArgMode, ProKind};
    let Some(proc) = PgProc::new(oid) else {
        return Err(Unfit::Missing);
    };
    let name = format_qualified(oid);
    let fits = matches!(proc.prokind(), ProKind::Function)
        && proc.proargtypes() == args
        && proc.proargmodes().iter().all(|m| *m == ProArgMode::In)
        && returns.is_none_or(|r| proc.prorettype() == r)
        && !proc.proretset();
    if !fits {
        return Err(Unfit::Shape(name));
    }
    if !may_execute(oid) {
        return Err(Unfit::NotPermitted(name));
    }
    let mut flinfo = Box::new(pg_sys::FmgrInfo::default());
    // SAFETY: `oid` is an existing function; the info (and whatever the
    // function's handler caches in it) lives in the current memory context,
    // the calling function's, for as long as this `Callable` is used.
    unsafe { pg_sys::fmgr_info(oid, &mut *flinfo) };
    Ok(Callable { oid, name, flinfo })
}

/// `EXECUTE` on function `oid` for the current user. The one place where the
/// server's API differs between the versions we build for.
fn may_execute(oid: pg_sys::Oid) -> bool {
    // SAFETY: plain catalog lookups for an existing function and the current user.
    unsafe {
        #[cfg(feature = "pg15")]
        let result = pg_sys::pg_proc_aclcheck(
            oid,
            pg_sys::GetUserId(),
            pg_sys::ACL_EXECUTE as pg_sys::AclMode,
        );
        #[cfg(not(feature = "pg15"))]
        let result = pg_sys::object_aclcheck(
            pg_sys::ProcedureRelationId,
            oid,
            pg_sys::GetUserId(),
            pg_sys::ACL_EXECUTE as pg_sys::AclMode,
        );
        result == pg_sys::AclResult::ACLCHECK_OK
    }
}

impl Callable {
    /// Call the function on `args` (of the types it was checked for; `None`
    /// is SQL NULL), honouring `STRICT`, with the caller's rights and
    /// `search_path` (a `SECURITY DEFINER` function or one with `SET` clauses
    /// runs as when called directly). Errors it raises propagate as Postgres
    /// errors: run it inside [`subtransaction`] to get them back as values.
    pub fn call(&mut self, args: &[Option<pg_sys::Datum>]) -> Option<pg_sys::Datum> {
        if self.flinfo.fn_strict && args.iter().any(Option::is_none) {
            return None;
        }
        // SAFETY: a FunctionCallInfo for `args.len()` arguments set up as
        // LOCAL_FCINFO/InitFunctionCallInfoData do, for the function whose
        // FmgrInfo was filled by fmgr_info and which takes exactly that many
        // arguments (checked by `callable`); the call goes through pgrx's FFI
        // guard so an ERROR in the callee unwinds as a Rust panic.
        unsafe {
            let fcinfo = pg_sys::palloc0(
                std::mem::size_of::<pg_sys::FunctionCallInfoBaseData>()
                    + args.len() * std::mem::size_of::<pg_sys::NullableDatum>(),
            ) as *mut pg_sys::FunctionCallInfoBaseData;
            let call = &mut *fcinfo;
            call.flinfo = &mut *self.flinfo;
            call.fncollation = pg_sys::InvalidOid;
            call.nargs = args.len() as i16;
            for (slot, arg) in call.args.as_mut_slice(args.len()).iter_mut().zip(args) {
                (slot.value, slot.isnull) = match arg {
                    Some(d) => (*d, false),
                    None => (pg_sys::Datum::from(0), true),
                };
            }
            let func = self.flinfo.fn_addr.expect("fmgr_info sets fn_addr");
            let result = pg_sys::ffi::pg_guard_ffi_boundary(|| func(fcinfo));
            let out = (!call.isnull).then_some(result);
            pg_sys::pfree(fcinfo.cast());
            out
        }
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::error::Error;
    use crate::testing::count;
    use pgrx::prelude::*;

    /// The form the outbox's pump needs: the caught error comes back as a
    /// value with its real SQLSTATE (pgrx alone would say XX000 for the custom
    /// codes), the subtransaction's work is gone, and the caller goes on.
    #[pg_test]
    fn subtransaction_hands_back_what_was_raised_and_undoes_the_work() {
        Spi::run("CREATE TABLE pg_temp.work (n int); SELECT sturdy.claim('w')").unwrap();
        let raised = |sql: &'static str| {
            super::subtransaction(|| {
                Spi::run("INSERT INTO pg_temp.work VALUES (1)")?;
                Spi::run(sql)?;
                Ok(Some(()))
            })
        };
        let custom = raised(
            "DO $$BEGIN RAISE EXCEPTION 'custom' USING ERRCODE = 'AB123', DETAIL = 'd', HINT = 'h'; END$$",
        );
        assert_eq!(
            custom,
            Err(Error::Raised {
                code: *b"AB123",
                message: "custom".into(),
                detail: Some("d".into()),
                hint: Some("h".into())
            })
        );
        let fenced = raised("SELECT sturdy.fence('w', 5)").unwrap_err();
        assert_eq!(&fenced.sqlstate(), b"SD001");
        assert!(
            fenced.to_string().contains("token 5 was never issued"),
            "{fenced}"
        );
        assert_eq!(
            &raised("DO $$BEGIN RAISE 'plain'; END$$")
                .unwrap_err()
                .sqlstate(),
            b"P0001"
        );
        assert_eq!(&raised("SELECT 1/0").unwrap_err().sqlstate(), b"22012");
        assert_eq!(count("pg_temp.work"), 0);
        // and the transaction goes on: kept work stays
        assert_eq!(raised("SELECT 1"), Ok(Some(())));
        assert_eq!(count("pg_temp.work"), 1);
    }
}
