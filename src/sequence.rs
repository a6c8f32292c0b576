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
    /// never advanced. Without SELECT or USAGE on it, what
    /// `pg_sequence_last_value` does (PostgreSQL 15 raises, 18 answers NULL).
    pub fn last_value(&'static self) -> Option<i64> {
        self.last_value_of().and_then(|(_, value)| value)
    }

    /// [`Sequence::last_value`], with the sequence's OID (`None` where it
    /// does not exist).
    pub fn last_value_of(&'static self) -> Option<(pg_sys::Oid, Option<i64>)> {
        let oid = self.oid()?;
        let value = match read_shared(oid) {
            Some(value) => value,
            None => call(pg_sys::pg_sequence_last_value, oid),
        };
        Some((oid, value))
    }

    /// Advance the sequence, as `nextval` does; `None` where it does not
    /// exist. Raises as `nextval` does (no USAGE or UPDATE on it).
    pub fn advance(&'static self) -> Option<i64> {
        call(pg_sys::nextval_oid, self.oid()?)
    }
}

/// A sequence's data, as `sequence.h` lays it out after the tuple header.
#[repr(C)]
struct SequenceData {
    last_value: i64,
    log_cnt: i64,
    is_called: bool,
}

/// The magic number in a sequence page's special space (`sequence.c`).
const SEQUENCE_MAGIC: u32 = 0x1717;

/// `pg_sequence_last_value`'s answer read under a share lock on the
/// sequence's page, where that function takes it exclusively (it shares
/// `read_seq_tuple` with `nextval`): every `take` reads the queue's
/// generation, and would hold that one page alone each time, whatever the
/// number of takers. `nextval` changes the page only under its exclusive
/// lock, so a share lock reads a value it wrote whole. `None` where this
/// does not apply (no SELECT or USAGE, not a permanent sequence, a page not
/// laid out as expected): the caller asks the function.
fn read_shared(oid: pg_sys::Oid) -> Option<Option<i64>> {
    if !crate::grants::holds(oid, pg_sys::ACL_SELECT | pg_sys::ACL_USAGE) {
        return None;
    }
    // SAFETY: the relation is opened and locked as the function opens it
    // (AccessShareLock, kept to the transaction's end); its first page is
    // pinned and share-locked while it is read, and only read; every offset
    // is checked against the page before it is followed.
    unsafe {
        let rel = pg_sys::relation_open(oid, pg_sys::AccessShareLock as _);
        let form = &*(*rel).rd_rel;
        if form.relkind as u8 != pg_sys::RELKIND_SEQUENCE
            || form.relpersistence as u8 != pg_sys::RELPERSISTENCE_PERMANENT
        {
            pg_sys::relation_close(rel, pg_sys::NoLock as _);
            return None;
        }
        let buffer = pg_sys::ReadBuffer(rel, 0);
        pg_sys::LockBuffer(buffer, pg_sys::BUFFER_LOCK_SHARE as _);
        let page = pg_sys::BufferGetPage(buffer);
        let magic = pg_sys::PageGetSpecialPointer(page)
            .cast::<u32>()
            .read_unaligned();
        let mut value = None;
        if magic == SEQUENCE_MAGIC && pg_sys::PageGetMaxOffsetNumber(page) >= 1 {
            let item = pg_sys::PageGetItemId(page, pg_sys::FirstOffsetNumber as _);
            let header = size_of::<pg_sys::HeapTupleHeaderData>();
            if (*item).lp_flags() == pg_sys::LP_NORMAL && (*item).lp_len() as usize >= header {
                let tuple = pg_sys::PageGetItem(page, item).cast::<pg_sys::HeapTupleHeaderData>();
                let offset = (*tuple).t_hoff as usize;
                // (the tuple ends at `is_called`: no padding after it)
                let data_len = std::mem::offset_of!(SequenceData, is_called) + size_of::<bool>();
                if (*item).lp_len() as usize >= offset + data_len {
                    let data = tuple
                        .cast::<u8>()
                        .add(offset)
                        .cast::<SequenceData>()
                        .read_unaligned();
                    value = Some(data.is_called.then_some(data.last_value));
                }
            }
        }
        pg_sys::UnlockReleaseBuffer(buffer);
        pg_sys::relation_close(rel, pg_sys::NoLock as _);
        value
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

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use super::{Sequence, read_shared};

    static PLAIN: Sequence = Sequence::new(c"public", c"sturdy_t_plain");
    static CACHED: Sequence = Sequence::new(c"public", c"sturdy_t_cached");

    fn function(name: &str) -> Option<i64> {
        Spi::get_one::<i64>(&format!(
            "SELECT pg_sequence_last_value('{name}'::regclass)"
        ))
        .unwrap()
    }

    /// The page read under a share lock gives what `pg_sequence_last_value`
    /// gives: nothing before the first `nextval` or after `setval(.., false)`,
    /// and the value on the page (with CACHE, the last one cached).
    #[pg_test]
    fn last_value_reads_what_pg_sequence_last_value_reads() {
        assert_eq!(PLAIN.last_value(), None, "not there yet");
        Spi::run(
            "CREATE SEQUENCE public.sturdy_t_plain;
             CREATE SEQUENCE public.sturdy_t_cached CACHE 10",
        )
        .unwrap();
        let oid = PLAIN.oid().unwrap();
        assert_eq!(read_shared(oid), Some(None), "read from the page");
        assert_eq!(PLAIN.last_value(), None);
        assert_eq!(function("sturdy_t_plain"), None);
        Spi::run("SELECT nextval('public.sturdy_t_plain') FROM generate_series(1, 3)").unwrap();
        assert_eq!(read_shared(oid), Some(Some(3)));
        assert_eq!(function("sturdy_t_plain"), Some(3));
        Spi::run("SELECT setval('public.sturdy_t_plain', 42, false)").unwrap();
        assert_eq!(PLAIN.last_value(), None);
        assert_eq!(function("sturdy_t_plain"), None);
        Spi::run("SELECT setval('public.sturdy_t_plain', 42)").unwrap();
        assert_eq!(PLAIN.last_value(), Some(42));
        Spi::run("SELECT nextval('public.sturdy_t_cached')").unwrap();
        assert_eq!(CACHED.last_value(), function("sturdy_t_cached"));
        assert_eq!(CACHED.last_value(), Some(10));
    }

    /// Without SELECT or USAGE on the sequence the page is not read here:
    /// `pg_sequence_last_value` answers (PostgreSQL 15 raises, 18 says NULL).
    #[pg_test]
    fn without_a_grant_the_function_answers() {
        Spi::run(
            "CREATE SEQUENCE public.sturdy_t_plain;
             SELECT nextval('public.sturdy_t_plain');
             CREATE ROLE sturdy_t_stranger NOLOGIN;
             GRANT USAGE ON SCHEMA public TO sturdy_t_stranger",
        )
        .unwrap();
        let oid = PLAIN.oid().unwrap();
        assert_eq!(read_shared(oid), Some(Some(1)));
        Spi::run("SET LOCAL ROLE sturdy_t_stranger").unwrap();
        assert_eq!(read_shared(oid), None, "no grant: not read here");
        Spi::run("RESET ROLE; GRANT SELECT ON SEQUENCE public.sturdy_t_plain TO sturdy_t_stranger")
            .unwrap();
        Spi::run("SET LOCAL ROLE sturdy_t_stranger").unwrap();
        assert_eq!(read_shared(oid), Some(Some(1)), "granted: read here");
        Spi::run("RESET ROLE").unwrap();
    }
}
