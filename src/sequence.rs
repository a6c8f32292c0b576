//! Reading one of our sequences without a statement: `last_value` as
//! `pg_sequence_last_value` gives it, for a per-call cost of a function call.
//!
//! A sequence is found by schema and name once per backend; the OID is
//! forgotten on any change to `pg_class` (a syscache callback), so a dropped
//! and re-created extension, or a schema of a released version that gains the
//! sequence with `ALTER EXTENSION ... UPDATE`, is found again. Pending
//! invalidations are applied before the OID is used.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::mem::size_of;

use pgrx::pg_sys;

/// A sequence of the extension's schema, by name.
pub struct Sequence {
    schema: &'static CStr,
    name: &'static CStr,
}

#[derive(Clone, Copy)]
enum Known {
    /// Not there (a schema of an older version): read as `None`.
    Missing,
    Oid(pg_sys::Oid),
}

thread_local! {
    /// What each sequence was found to be since the last change to `pg_class`.
    static KNOWN: RefCell<Vec<(*const Sequence, Known)>> = const { RefCell::new(Vec::new()) };
    static WATCHING: Cell<bool> = const { Cell::new(false) };
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    KNOWN.with(|k| k.borrow_mut().clear());
}

impl Sequence {
    pub const fn new(schema: &'static CStr, name: &'static CStr) -> Self {
        Sequence { schema, name }
    }

    pub fn oid(&'static self) -> Option<pg_sys::Oid> {
        // SAFETY: catalog lookups inside a transaction (we are called from a
        // statement); the callback is registered once per backend, and it
        // only clears our cache.
        unsafe {
            if !WATCHING.with(Cell::get) {
                pg_sys::CacheRegisterSyscacheCallback(
                    pg_sys::SysCacheIdentifier::RELOID as _,
                    Some(forget),
                    pg_sys::Datum::from(0),
                );
                WATCHING.with(|w| w.set(true));
            }
            // a cached OID may be of a relation dropped since
            pg_sys::AcceptInvalidationMessages();
        }
        let me: *const Sequence = self;
        let known = KNOWN.with(|k| k.borrow().iter().find(|(s, _)| *s == me).map(|&(_, k)| k));
        let known = known.unwrap_or_else(|| {
            // SAFETY: as above; both names are NUL-terminated statics.
            let relid = unsafe {
                let namespace = pg_sys::get_namespace_oid(self.schema.as_ptr(), true);
                if namespace == pg_sys::InvalidOid {
                    pg_sys::InvalidOid
                } else {
                    pg_sys::get_relname_relid(self.name.as_ptr(), namespace)
                }
            };
            let known = if relid == pg_sys::InvalidOid {
                Known::Missing
            } else {
                Known::Oid(relid)
            };
            KNOWN.with(|k| k.borrow_mut().push((me, known)));
            known
        });
        match known {
            Known::Oid(oid) => Some(oid),
            Known::Missing => None,
        }
    }

    /// Whether the sequence exists (it does not in the schema of an older
    /// version, before `ALTER EXTENSION pg_sturdy UPDATE`).
    pub fn exists(&'static self) -> bool {
        self.oid().is_some()
    }

    /// The sequence's last value; `None` where it does not exist or was
    /// never advanced. Raises as `pg_sequence_last_value` does (no SELECT or
    /// USAGE on it).
    pub fn last_value(&'static self) -> Option<i64> {
        call(pg_sys::pg_sequence_last_value, self.oid()?)
    }

    /// Advance the sequence, as `nextval` does; `None` where it does not
    /// exist. Raises as `nextval` does (no USAGE or UPDATE on it).
    pub fn advance(&'static self) -> Option<i64> {
        call(pg_sys::nextval_oid, self.oid()?)
    }
}

/// Call a built-in V1 function of one `oid` argument returning `int8`.
fn call(
    function: unsafe fn(pg_sys::FunctionCallInfo) -> pg_sys::Datum,
    oid: pg_sys::Oid,
) -> Option<i64> {
    // SAFETY: a zeroed call frame with room for the one argument the
    // function reads; an error it raises unwinds through pgrx's guard like
    // any SQL error.
    unsafe {
        let fcinfo = pg_sys::palloc0(
            size_of::<pg_sys::FunctionCallInfoBaseData>() + size_of::<pg_sys::NullableDatum>(),
        )
        .cast::<pg_sys::FunctionCallInfoBaseData>();
        (*fcinfo).nargs = 1;
        (*fcinfo).args.as_mut_slice(1)[0] = pg_sys::NullableDatum {
            value: pg_sys::Datum::from(oid),
            isnull: false,
        };
        let value = function(fcinfo);
        let null = (*fcinfo).isnull;
        pg_sys::pfree(fcinfo.cast());
        (!null).then(|| value.value() as i64)
    }
}
