//! Deleting one row of ours by its primary key without a statement: what
//! `DELETE FROM t WHERE k1 = $1 AND k2 = $2 AND c = $3` does, done through
//! the table and index access methods directly.
//!
//! A statement run through SPI pays, on every call, for the plan cache's
//! checks, an executor started and shut down around a one-row plan (a
//! `ModifyTable` over an index scan: measured, ~14k instructions to start the
//! `ModifyTable` alone) and SPI's own bookkeeping; for `done`, which deletes
//! one row by key, that was most of its cost over the plain `DELETE` a client
//! sends (bench/README.md, ninth session). Here the same work is a descent of
//! the primary key, the check, and `table_tuple_delete`.
//!
//! Only where nothing a statement would also do is skipped: the table must be
//! a plain table with no triggers (foreign keys that reference it are
//! triggers), no rules and no row-level security, the caller must hold
//! `DELETE` and `SELECT` on it at the table level, the transaction must be
//! read-write, and the key must be the whole primary key (a btree). Where any
//! of that does not hold, [`Table::delete_if`] answers `None` and the caller
//! runs its statement, which does what the executor does (and raises what it
//! raises). What the executor does for a `DELETE` that finds a row updated
//! under it is done here too: wait for the updater (the access method does),
//! then, read committed, look again under a new snapshot and recheck, as its
//! EvalPlanQual would; repeatable read or serializable, fail with `40001`.
//! Predicate locks, WAL, statistics and a publication's replica identity are
//! the access methods' own work, or checked as the executor checks them.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;

use pgrx::pg_sys;

use crate::error::{Error, Result};

/// A table of ours by schema and name, whose rows can be deleted by key.
pub struct Table {
    schema: &'static CStr,
    name: &'static CStr,
}

/// What was found out about a table, until its next relcache invalidation.
#[derive(Clone, Copy)]
struct Known {
    relid: pg_sys::Oid,
    /// `None`: the table cannot be served here (see the module comment); the
    /// caller runs its statement.
    shape: Option<Shape>,
}

#[derive(Clone, Copy)]
struct Shape {
    pkey: pg_sys::Oid,
    /// The primary key's columns are the call's key columns in the other
    /// order.
    swapped: bool,
    /// The checked column's attribute number.
    check: pg_sys::AttrNumber,
}

thread_local! {
    static KNOWN: RefCell<Vec<(*const Table, Known)>> = const { RefCell::new(Vec::new()) };
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    /// Calls served here, for the tests to see which way a call went.
    #[cfg(any(test, feature = "pg_test"))]
    static SERVED: Cell<u64> = const { Cell::new(0) };
}

/// How many calls this backend served here (tests only).
#[cfg(any(test, feature = "pg_test"))]
pub fn served() -> u64 {
    SERVED.with(Cell::get)
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    KNOWN.with(|k| {
        k.borrow_mut()
            .retain(|(_, known)| relid != pg_sys::InvalidOid && known.relid != relid)
    });
}

/// The result of one lookup through the primary key.
enum Found {
    Not,
    At(pg_sys::ItemPointerData),
}

impl Table {
    pub const fn new(schema: &'static CStr, name: &'static CStr) -> Self {
        Table { schema, name }
    }

    /// What this backend knows of the table, `None` when it does not exist.
    /// `key` and `check` name the columns a call uses.
    fn known(&'static self, key: [&CStr; 2], check: &CStr) -> Option<Known> {
        // SAFETY: catalog lookups inside a transaction (we are called from a
        // statement); the callback is registered once per backend and only
        // clears our cache.
        unsafe {
            if !WATCHING.with(Cell::get) {
                pg_sys::CacheRegisterRelcacheCallback(Some(forget), pg_sys::Datum::from(0));
                WATCHING.with(|w| w.set(true));
            }
            // a cached OID may be of a table dropped since
            pg_sys::AcceptInvalidationMessages();
        }
        let me: *const Table = self;
        if let Some(known) =
            KNOWN.with(|k| k.borrow().iter().find(|(t, _)| *t == me).map(|&(_, k)| k))
        {
            return Some(known);
        }
        // SAFETY: as above; the names are NUL-terminated.
        let known = unsafe {
            let namespace = pg_sys::get_namespace_oid(self.schema.as_ptr(), true);
            if namespace == pg_sys::InvalidOid {
                return None;
            }
            let relid = pg_sys::get_relname_relid(self.name.as_ptr(), namespace);
            if relid == pg_sys::InvalidOid {
                return None;
            }
            Known {
                relid,
                shape: shape(relid, key, check),
            }
        };
        KNOWN.with(|k| k.borrow_mut().push((me, known)));
        Some(known)
    }

    /// Delete the row whose primary key is (`key[0]`, `key[1]`), two `text`
    /// columns, if its `timestamptz` column `check` equals `equals`: whether a
    /// row went. `None` when it cannot be done here (see the module comment):
    /// nothing was done, and the caller runs its statement.
    pub fn delete_if(
        &'static self,
        key: [(&CStr, pg_sys::Datum); 2],
        check: &CStr,
        equals: pg_sys::TimestampTz,
    ) -> Result<Option<bool>> {
        let Some(Known {
            relid,
            shape: Some(shape),
        }) = self.known([key[0].0, key[1].0], check)
        else {
            return Ok(None);
        };
        // the key's values in the index's column order
        let values = if shape.swapped {
            [key[1].1, key[0].1]
        } else {
            [key[0].1, key[1].1]
        };
        // SAFETY: inside a transaction; every relation opened here is closed
        // before we return (the locks stay to the end of the transaction, as
        // a statement's do), the snapshot registered is unregistered, the
        // slot and the scans are released. On an error Postgres raises
        // beneath us, its abort releases all of them.
        unsafe {
            // one privilege at a time: given several, pg_class_aclcheck
            // answers whether the role holds any of them
            let user = pg_sys::GetUserId();
            let holds = |privilege: u32| {
                pg_sys::pg_class_aclcheck(relid, user, privilege as pg_sys::AclMode)
                    == pg_sys::AclResult::ACLCHECK_OK
            };
            if pg_sys::XactReadOnly || !holds(pg_sys::ACL_DELETE) || !holds(pg_sys::ACL_SELECT) {
                return Ok(None);
            }
            let rel = pg_sys::table_open(relid, pg_sys::RowExclusiveLock as _);
            let class = &*(*rel).rd_rel;
            if class.relkind as u8 != pg_sys::RELKIND_RELATION
                || !(*rel).trigdesc.is_null()
                || !(*rel).rd_rules.is_null()
                || class.relrowsecurity
            {
                pg_sys::table_close(rel, pg_sys::NoLock as _);
                return Ok(None);
            }
            let index = pg_sys::index_open(shape.pkey, pg_sys::AccessShareLock as _);
            pg_sys::CheckCmdReplicaIdentity(rel, pg_sys::CmdType::CMD_DELETE);
            // see what the commands before ours in this transaction did, as
            // SPI does before each statement
            pg_sys::CommandCounterIncrement();
            let cid = pg_sys::GetCurrentCommandId(true);
            let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
            let outcome = loop {
                let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
                let found = lookup(rel, index, snapshot, slot, &values, shape.check, equals);
                let Found::At(mut tid) = found else {
                    pg_sys::UnregisterSnapshot(snapshot);
                    break Ok(false);
                };
                let mut failure: pg_sys::TM_FailureData = std::mem::zeroed();
                let result = pg_sys::table_tuple_delete(
                    rel,
                    &mut tid,
                    cid,
                    snapshot,
                    std::ptr::null_mut(),
                    true,
                    &mut failure,
                    false,
                );
                pg_sys::UnregisterSnapshot(snapshot);
                let repeatable = pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32;
                match result {
                    pg_sys::TM_Result::TM_Ok => break Ok(true),
                    // deleted by this very command already
                    pg_sys::TM_Result::TM_SelfModified => break Ok(false),
                    pg_sys::TM_Result::TM_Updated if repeatable => {
                        break Err(serialization(
                            "could not serialize access due to concurrent update",
                        ));
                    }
                    pg_sys::TM_Result::TM_Deleted if repeatable => {
                        break Err(serialization(
                            "could not serialize access due to concurrent delete",
                        ));
                    }
                    // committed under us (the access method waited for it):
                    // look again, as of now
                    pg_sys::TM_Result::TM_Updated => continue,
                    pg_sys::TM_Result::TM_Deleted => break Ok(false),
                    other => {
                        break Err(Error::Internal {
                            context: "keyed delete",
                            cause: format!("unexpected table_tuple_delete result {other}"),
                        });
                    }
                }
            };
            pg_sys::ExecDropSingleTupleTableSlot(slot);
            pg_sys::index_close(index, pg_sys::NoLock as _);
            pg_sys::table_close(rel, pg_sys::NoLock as _);
            #[cfg(any(test, feature = "pg_test"))]
            SERVED.with(|n| n.set(n.get() + 1));
            outcome.map(Some)
        }
    }
}

/// The attribute number of column `name` of `relid` (cached by the syscache).
fn shape_attnum(relid: pg_sys::Oid, name: &CStr) -> pg_sys::AttrNumber {
    // SAFETY: a syscache lookup inside a transaction.
    unsafe { pg_sys::get_attnum(relid, name.as_ptr()) }
}

/// Whether `relid` can be served here, and how: its primary key is a btree
/// on exactly the two `text` columns `key` (in either order), and `check` is
/// a `timestamptz` column.
///
/// # Safety
/// Inside a transaction.
unsafe fn shape(relid: pg_sys::Oid, key: [&CStr; 2], check: &CStr) -> Option<Shape> {
    unsafe {
        let attnums = key.map(|k| shape_attnum(relid, k));
        let check = shape_attnum(relid, check);
        let missing = pg_sys::InvalidAttrNumber as pg_sys::AttrNumber;
        if attnums.contains(&missing)
            || check == missing
            || attnums
                .iter()
                .any(|&a| pg_sys::get_atttype(relid, a) != pg_sys::TEXTOID)
            || pg_sys::get_atttype(relid, check) != pg_sys::TIMESTAMPTZOID
        {
            return None;
        }
        let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as _);
        #[cfg(feature = "pg18")]
        let pkey = pg_sys::RelationGetPrimaryKeyIndex(rel, false);
        #[cfg(not(feature = "pg18"))]
        let pkey = pg_sys::RelationGetPrimaryKeyIndex(rel);
        pg_sys::table_close(rel, pg_sys::NoLock as _);
        if pkey == pg_sys::InvalidOid {
            return None;
        }
        let index = pg_sys::index_open(pkey, pg_sys::AccessShareLock as _);
        let form = &*(*index).rd_index;
        let columns = form.indkey.values.as_slice(form.indnatts as usize);
        let fits = (*(*index).rd_rel).relam == pg_sys::BTREE_AM_OID
            && form.indnatts == 2
            && form.indnkeyatts == 2
            && (columns == attnums || columns == [attnums[1], attnums[0]]);
        let swapped = columns != attnums;
        pg_sys::index_close(index, pg_sys::NoLock as _);
        fits.then_some(Shape {
            pkey,
            swapped,
            check,
        })
    }
}

/// The row version `snapshot` sees under key `values` (in the index's column
/// order), if its column `check` equals `equals`.
///
/// # Safety
/// `rel` and `index` are open, `index` is `rel`'s btree on two `text`
/// columns, `slot` is `rel`'s, `snapshot` is registered.
unsafe fn lookup(
    rel: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    slot: *mut pg_sys::TupleTableSlot,
    values: &[pg_sys::Datum; 2],
    check: pg_sys::AttrNumber,
    equals: pg_sys::TimestampTz,
) -> Found {
    unsafe {
        let mut keys: [pg_sys::ScanKeyData; 2] = std::mem::zeroed();
        for (i, (k, v)) in keys.iter_mut().zip(values).enumerate() {
            pg_sys::ScanKeyEntryInitialize(
                k,
                0,
                (i + 1) as pg_sys::AttrNumber,
                pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
                pg_sys::InvalidOid,
                *(*index).rd_indcollation.add(i),
                pg_sys::RegProcedure::from(pg_sys::F_TEXTEQ),
                *v,
            );
        }
        #[cfg(feature = "pg18")]
        let scan = pg_sys::index_beginscan(rel, index, snapshot, std::ptr::null_mut(), 2, 0);
        #[cfg(not(feature = "pg18"))]
        let scan = pg_sys::index_beginscan(rel, index, snapshot, 2, 0);
        pg_sys::index_rescan(scan, keys.as_mut_ptr(), 2, std::ptr::null_mut(), 0);
        let mut found = Found::Not;
        if pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {
            let mut null = false;
            let value = pg_sys::slot_getattr(slot, check.into(), &mut null);
            if !null && value.value() as pg_sys::TimestampTz == equals {
                found = Found::At((*slot).tts_tid);
            }
        }
        pg_sys::index_endscan(scan);
        pg_sys::ExecClearTuple(slot);
        found
    }
}

fn serialization(message: &str) -> Error {
    Error::Raised {
        code: *b"40001",
        message: message.into(),
        detail: None,
        hint: Some("The transaction might succeed if retried.".into()),
    }
}
