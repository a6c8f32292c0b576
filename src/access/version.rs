//! Row versions written, locked and deleted through the table access method,
//! with the index entries an update that is not HOT needs.

use super::*;

/// Write the lease on the row version in `locked` (at `tid`, locked by us),
/// or with `unless_held` on the version in it that our snapshot found, where
/// no one holds it ([`rewrite_unless_held`]: `Ok(None)` otherwise, nothing
/// written). Returns a slot holding the new version (the caller drops it).
///
/// # Safety
/// As [`rewrite`], or with `unless_held` as [`rewrite_unless_held`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn lease(
    rel: pg_sys::Relation,
    shape: &Shape,
    locked: *mut pg_sys::TupleTableSlot,
    tid: pg_sys::ItemPointerData,
    cid: pg_sys::CommandId,
    snapshot: pg_sys::Snapshot,
    [leased_until, taken_at, takes]: [pg_sys::AttrNumber; 3],
    until: pg_sys::TimestampTz,
    now: pg_sys::TimestampTz,
    unless_held: bool,
) -> Result<Option<*mut pg_sys::TupleTableSlot>> {
    // SAFETY: within the contract above: As [`rewrite`], or with `unless_held` as
    // [`rewrite_unless_held`].
    unsafe {
        let changed = [leased_until, taken_at, takes];
        let edit = |values: &mut [pg_sys::Datum], nulls: &mut [bool]| {
            let at = |attnum: pg_sys::AttrNumber| attnum as usize - 1;
            let Some(more) = (!nulls[at(takes)])
                .then(|| values[at(takes)].value() as i32)
                .and_then(|n| n.checked_add(1))
            else {
                return Err(out_of_range("integer"));
            };
            values[at(leased_until)] = pg_sys::Datum::from(until);
            nulls[at(leased_until)] = false;
            values[at(taken_at)] = pg_sys::Datum::from(now);
            nulls[at(taken_at)] = false;
            values[at(takes)] = pg_sys::Datum::from(more);
            Ok(())
        };
        if unless_held {
            rewrite_unless_held(rel, shape, locked, tid, cid, snapshot, &changed, edit)
        } else {
            rewrite(rel, shape, locked, tid, cid, snapshot, &changed, edit).map(Some)
        }
    }
}

/// Write a new version of the row in `locked` (at `tid`, locked by us), its
/// values (by attribute number less one) changed by `edit`, in the
/// attributes `changed`: with its index entries where the update was not HOT. Returns a slot holding the new
/// version (the caller drops it); nothing is written when `edit` fails.
///
/// # Safety
/// `rel` is open for writing, `locked` holds its row at `tid`, locked by this
/// transaction, `snapshot` is registered.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rewrite(
    rel: pg_sys::Relation,
    shape: &Shape,
    locked: *mut pg_sys::TupleTableSlot,
    tid: pg_sys::ItemPointerData,
    cid: pg_sys::CommandId,
    snapshot: pg_sys::Snapshot,
    changed: &[pg_sys::AttrNumber],
    edit: impl FnOnce(&mut [pg_sys::Datum], &mut [bool]) -> Result<()>,
) -> Result<*mut pg_sys::TupleTableSlot> {
    // SAFETY: within the contract above: `rel` is open for writing, `locked` holds its row
    // at `tid`, locked by this transaction, `snapshot` is registered.
    unsafe {
        match write_version(rel, shape, locked, tid, cid, snapshot, changed, edit, true)? {
            Ok(version) => Ok(version),
            Err(result) => Err(unexpected("table_tuple_update", result)),
        }
    }
}

/// [`rewrite`] of a version no one holds: where another transaction holds
/// it (a lock or a write not yet committed), or it was changed by a commit
/// since `snapshot` or by this transaction, nothing is written and the
/// answer is `Ok(None)`, at once, without waiting. This is `heap_update`
/// told not to wait, which `tableam.h` documents (a holder answers
/// `TM_BeingModified`) and which its code, written for callers that wait,
/// asserts no one asks for: so a server built with assertions is never
/// asked (`Ok(None)`, for the caller to lock first as ever).
///
/// # Safety
/// As [`rewrite`], but for the lock: `found` holds a version of `rel`'s row
/// at `tid` that `snapshot` sees.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rewrite_unless_held(
    rel: pg_sys::Relation,
    shape: &Shape,
    found: *mut pg_sys::TupleTableSlot,
    tid: pg_sys::ItemPointerData,
    cid: pg_sys::CommandId,
    snapshot: pg_sys::Snapshot,
    changed: &[pg_sys::AttrNumber],
    edit: impl FnOnce(&mut [pg_sys::Datum], &mut [bool]) -> Result<()>,
) -> Result<Option<*mut pg_sys::TupleTableSlot>> {
    if server_asserts() {
        return Ok(None);
    }
    // SAFETY: within the contract above: `found` holds a version of `rel`'s row
    // at `tid` that `snapshot` sees, as `write_version` needs.
    unsafe {
        match write_version(rel, shape, found, tid, cid, snapshot, changed, edit, false)? {
            Ok(version) => Ok(Some(version)),
            Err(
                pg_sys::TM_Result::TM_BeingModified
                | pg_sys::TM_Result::TM_Updated
                | pg_sys::TM_Result::TM_Deleted
                | pg_sys::TM_Result::TM_SelfModified,
            ) => Ok(None),
            Err(other) => Err(unexpected("table_tuple_update", other)),
        }
    }
}

/// Whether the heap version in `slot` shows no one in its `xmax` (never
/// locked, updated or deleted, or only by a transaction that aborted): read
/// without the page's lock, so only a hint of whether
/// [`rewrite_unless_held`] would find it free (which it decides under the
/// lock). A version others hold, or changed since the snapshot, goes to the
/// lock at once instead of to both. `false` for a slot of another kind.
///
/// # Safety
/// `slot` holds a version of a heap table, its buffer pinned.
pub(super) unsafe fn looks_free(slot: *mut pg_sys::TupleTableSlot) -> bool {
    // SAFETY: within the contract above: `slot` holds a version of a heap table, its buffer
    // pinned.
    unsafe {
        let Some(header) = heap_header(slot) else {
            return false;
        };
        // (others may change both meanwhile, under the page's lock)
        let infomask = std::ptr::read_volatile(&raw const (*header).t_infomask);
        let xmax = std::ptr::read_volatile(&raw const (*header).t_choice.t_heap.t_xmax);
        infomask & pg_sys::HEAP_XMAX_INVALID as u16 != 0 || xmax == pg_sys::InvalidTransactionId
    }
}

/// The header of the heap version in `slot`, for a look without the page's
/// lock; `None` for a slot of another kind, or one holding nothing.
///
/// # Safety
/// As [`looks_free`].
pub(super) unsafe fn heap_header(
    slot: *mut pg_sys::TupleTableSlot,
) -> Option<pg_sys::HeapTupleHeader> {
    // SAFETY: within the contract above: As [`looks_free`].
    unsafe {
        if !std::ptr::eq((*slot).tts_ops, &raw const pg_sys::TTSOpsBufferHeapTuple) {
            return None;
        }
        let tuple = (*slot.cast::<pg_sys::BufferHeapTupleTableSlot>())
            .base
            .tuple;
        (!tuple.is_null() && !(*tuple).t_data.is_null()).then(|| (*tuple).t_data)
    }
}

/// Whether the heap version in `slot` shows itself the newest of its row:
/// no one updated it (its `xmax` empty, aborted, only a lock's, or a
/// delete's, which leaves its place pointing at itself). Read without the
/// page's lock, so a hint: a version taken for older than it is only sends
/// the caller to lock the newest and recheck it, as the statement does.
///
/// # Safety
/// As [`looks_free`].
pub(super) unsafe fn looks_newest(slot: *mut pg_sys::TupleTableSlot) -> bool {
    // SAFETY: within the contract above: As [`looks_free`].
    unsafe {
        let Some(header) = heap_header(slot) else {
            return false;
        };
        let infomask = u32::from(std::ptr::read_volatile(&raw const (*header).t_infomask));
        let locked_only = infomask & pg_sys::HEAP_XMAX_LOCK_ONLY != 0
            || infomask & (pg_sys::HEAP_XMAX_IS_MULTI | pg_sys::HEAP_LOCK_MASK)
                == pg_sys::HEAP_XMAX_EXCL_LOCK;
        let next = std::ptr::read_volatile(&raw const (*header).t_ctid);
        infomask & pg_sys::HEAP_XMAX_INVALID != 0
            || locked_only
            || same_tid(&next, &(*slot).tts_tid)
    }
}

/// Whether the server was built with assertions (`debug_assertions`), read
/// once a backend.
pub(super) fn server_asserts() -> bool {
    thread_local! {
        static ASSERTS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    }
    ASSERTS.with(|a| {
        *a.get().get_or_insert_with(|| {
            // SAFETY: a built-in read-only setting, read by name; the
            // answer is a static string of the GUC machinery, read at once.
            unsafe {
                let value = pg_sys::GetConfigOption(c"debug_assertions".as_ptr(), true, false);
                !value.is_null() && CStr::from_ptr(value).to_bytes() == b"on"
            }
        })
    })
}

/// The new version's write for [`rewrite`] and [`rewrite_unless_held`]:
/// `Err` the update's result where it was not `TM_Ok` (nothing written).
///
/// # Safety
/// As [`rewrite`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn write_version(
    rel: pg_sys::Relation,
    shape: &Shape,
    locked: *mut pg_sys::TupleTableSlot,
    mut tid: pg_sys::ItemPointerData,
    cid: pg_sys::CommandId,
    snapshot: pg_sys::Snapshot,
    changed: &[pg_sys::AttrNumber],
    edit: impl FnOnce(&mut [pg_sys::Datum], &mut [bool]) -> Result<()>,
    wait: bool,
) -> Result<std::result::Result<*mut pg_sys::TupleTableSlot, pg_sys::TM_Result::Type>> {
    // SAFETY: within the contract above: As [`rewrite`].
    unsafe {
        let desc = (*rel).rd_att;
        let natts = (*desc).natts as usize;
        pg_sys::slot_getallattrs(locked);
        let mut values = std::slice::from_raw_parts((*locked).tts_values, natts).to_vec();
        let mut nulls = std::slice::from_raw_parts((*locked).tts_isnull, natts).to_vec();
        edit(&mut values, &mut nulls)?;
        let tuple = pg_sys::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        let version = pg_sys::MakeSingleTupleTableSlot(desc, &pg_sys::TTSOpsHeapTuple);
        pg_sys::ExecStoreHeapTuple(tuple, version, true);
        let mut failure: pg_sys::TM_FailureData = std::mem::zeroed();
        let mut mode = pg_sys::LockTupleMode::LockTupleExclusive;
        #[cfg(feature = "pg15")]
        let mut reindex = false;
        #[cfg(not(feature = "pg15"))]
        let mut reindex = pg_sys::TU_UpdateIndexes::TU_None;
        let result = pg_sys::table_tuple_update(
            rel,
            &mut tid,
            version,
            cid,
            snapshot,
            std::ptr::null_mut(),
            wait,
            &mut failure,
            &mut mode,
            &mut reindex,
        );
        if result != pg_sys::TM_Result::TM_Ok {
            pg_sys::ExecDropSingleTupleTableSlot(version);
            return Ok(Err(result));
        }
        #[cfg(feature = "pg15")]
        let reindex = reindex;
        #[cfg(not(feature = "pg15"))]
        let reindex = reindex != pg_sys::TU_UpdateIndexes::TU_None;
        if reindex {
            // not HOT: every index gets an entry for the new version, as
            // ExecInsertIndexTuples would make it (the key is unchanged, so
            // the unique check finds only our own old version)
            index_entries(rel, shape, version, Some(changed), std::ptr::null_mut());
        }
        Ok(Ok(version))
    }
}

/// Insert into every index of `rel` the entries of the row version in
/// `slot`, as `ExecInsertIndexTuples` does: for an update that changed the
/// attributes `changed`, or (`None`) for a speculative insert. A unique index
/// raises on a duplicate key (a statement's immediate check), but for the
/// primary key in a speculative insert: there a duplicate, committed or not,
/// only makes the answer false (an `ON CONFLICT` arbiter's partial check).
/// `pkey`, when not null, is the primary key, open for writing.
///
/// # Safety
/// `rel` is open for writing and `slot` holds a version of its row just
/// written by this transaction; the shape is the table's as of now.
pub(super) unsafe fn index_entries(
    rel: pg_sys::Relation,
    shape: &Shape,
    slot: *mut pg_sys::TupleTableSlot,
    changed: Option<&[pg_sys::AttrNumber]>,
    pkey: pg_sys::Relation,
) -> bool {
    #[cfg(all(feature = "executor_index_entries", feature = "pg15"))]
    if true {
        let _ = pkey;
        // SAFETY: as this function's contract.
        return unsafe { index_entries_by_executor(rel, shape, slot, changed) };
    }
    // SAFETY: within the contract above: `rel` is open for writing and `slot` holds a
    // version of its row just written by this transaction; the shape is the table's as of
    // now.
    unsafe {
        let mut tid = (*slot).tts_tid;
        let mut unique = true;
        for entry in &shape.indexes {
            // a partial index's predicate, decided here
            let mut null = false;
            match entry.only {
                Some(Only::Positive(attnum)) => {
                    let value = pg_sys::slot_getattr(slot, attnum.into(), &mut null);
                    if null || value.value() as i32 <= 0 {
                        continue;
                    }
                }
                Some(Only::NotNull(attnum)) => {
                    pg_sys::slot_getattr(slot, attnum.into(), &mut null);
                    if null {
                        continue;
                    }
                }
                None => {}
            }
            let opened;
            let index = if entry.oid == shape.pkey && !pkey.is_null() {
                pkey
            } else {
                opened = Open(pg_sys::index_open(entry.oid, pg_sys::RowExclusiveLock as _));
                opened.0
            };
            let info = pg_sys::BuildIndexInfo(index);
            let mut ivalues = [pg_sys::Datum::from(0); pg_sys::INDEX_MAX_KEYS as usize];
            let mut inulls = [false; pg_sys::INDEX_MAX_KEYS as usize];
            pg_sys::FormIndexDatum(
                info,
                slot,
                std::ptr::null_mut(),
                ivalues.as_mut_ptr(),
                inulls.as_mut_ptr(),
            );
            let check = if !entry.unique {
                pg_sys::IndexUniqueCheck::UNIQUE_CHECK_NO
            } else if changed.is_none() && entry.oid == shape.pkey {
                pg_sys::IndexUniqueCheck::UNIQUE_CHECK_PARTIAL
            } else {
                pg_sys::IndexUniqueCheck::UNIQUE_CHECK_YES
            };
            let satisfied = pg_sys::index_insert(
                index,
                ivalues.as_mut_ptr(),
                inulls.as_mut_ptr(),
                &mut tid,
                rel,
                check,
                // the hint an update gives an index whose key it left alone
                changed.is_some_and(|c| !entry.keys.iter().any(|k| c.contains(k))),
                info,
            );
            if check == pg_sys::IndexUniqueCheck::UNIQUE_CHECK_PARTIAL && !satisfied {
                unique = false;
            }
        }
        unique
    }
}

/// [`index_entries`] through `ExecInsertIndexTuples`, with the executor
/// state it needs (an `EState`, a `ResultRelInfo` and its opened indexes)
/// made and freed around it: built only for the A/B of the two, on
/// PostgreSQL 15 (`make instructions AB_FEATURES=executor_index_entries`;
/// the figures and the decision are in docs/fastpath.md).
///
/// # Safety
/// As [`index_entries`].
#[cfg(all(feature = "executor_index_entries", feature = "pg15"))]
pub(super) unsafe fn index_entries_by_executor(
    rel: pg_sys::Relation,
    shape: &Shape,
    slot: *mut pg_sys::TupleTableSlot,
    changed: Option<&[pg_sys::AttrNumber]>,
) -> bool {
    // SAFETY: within the contract above; everything made here lives in the
    // executor state's memory, freed with it before this returns.
    unsafe {
        let estate = pg_sys::CreateExecutorState();
        let caller = pg_sys::CurrentMemoryContext;
        pg_sys::CurrentMemoryContext = (*estate).es_query_cxt;
        let info: *mut pg_sys::ResultRelInfo =
            pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>()).cast();
        pg_sys::InitResultRelInfo(info, rel, 0, std::ptr::null_mut(), 0);
        let speculative = changed.is_none();
        pg_sys::ExecOpenIndices(info, speculative);
        let arbiters = if speculative {
            pg_sys::lappend_oid(std::ptr::null_mut(), shape.pkey)
        } else {
            std::ptr::null_mut()
        };
        let mut conflict = false;
        pg_sys::ExecInsertIndexTuples(
            info,
            slot,
            estate,
            !speculative,
            speculative,
            &mut conflict,
            arbiters,
        );
        pg_sys::ExecCloseIndices(info);
        pg_sys::CurrentMemoryContext = caller;
        pg_sys::FreeExecutorState(estate);
        !conflict
    }
}

/// `table_tuple_lock` of the row version at `tid` into `slot`: its result and
/// what it says of a version it could not lock (or of the newer one it
/// followed to).
///
/// # Safety
/// `rel` is open, `slot` is one of its slots, `snapshot` is registered.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn lock_version(
    rel: pg_sys::Relation,
    tid: &mut pg_sys::ItemPointerData,
    snapshot: pg_sys::Snapshot,
    slot: *mut pg_sys::TupleTableSlot,
    cid: pg_sys::CommandId,
    mode: pg_sys::LockTupleMode::Type,
    policy: pg_sys::LockWaitPolicy::Type,
    flags: u8,
) -> (pg_sys::TM_Result::Type, pg_sys::TM_FailureData) {
    // SAFETY: within the contract above: `rel` is open, `slot` is one of its slots,
    // `snapshot` is registered.
    unsafe {
        let mut failure: pg_sys::TM_FailureData = std::mem::zeroed();
        let result = pg_sys::table_tuple_lock(
            rel,
            tid,
            snapshot,
            slot,
            cid,
            mode,
            policy,
            flags,
            &mut failure,
        );
        (result, failure)
    }
}

/// Delete the row version at `tid` as a `DELETE` would (waiting for a
/// transaction writing it; no `RETURNING`, no `changingPart`).
///
/// # Safety
/// `rel` is open for writes; `snapshot` is registered; `cid` is this
/// command's.
pub(super) unsafe fn delete_version(
    rel: pg_sys::Relation,
    tid: &mut pg_sys::ItemPointerData,
    cid: pg_sys::CommandId,
    snapshot: pg_sys::Snapshot,
) -> pg_sys::TM_Result::Type {
    // SAFETY: within the contract above: `rel` is open for writes; `snapshot` is
    // registered; `cid` is this command's.
    unsafe {
        let mut failure: pg_sys::TM_FailureData = std::mem::zeroed();
        pg_sys::table_tuple_delete(
            rel,
            tid,
            cid,
            snapshot,
            std::ptr::null_mut(),
            true,
            &mut failure,
            false,
        )
    }
}

/// Whether the row version in `slot` is one `snapshot` sees, or one this
/// transaction wrote (`ExecCheckTupleVisible`'s test, for `ON CONFLICT`
/// under repeatable read or serializable).
///
/// # Safety
/// `slot` holds a row version of `rel`; `snapshot` is registered.
pub(super) unsafe fn visible_to(
    rel: pg_sys::Relation,
    slot: *mut pg_sys::TupleTableSlot,
    snapshot: pg_sys::Snapshot,
) -> bool {
    // SAFETY: within the contract above: `slot` holds a row version of `rel`; `snapshot` is
    // registered.
    unsafe {
        if pg_sys::table_tuple_satisfies_snapshot(rel, slot, snapshot) {
            return true;
        }
        let mut null = false;
        let xmin =
            pg_sys::slot_getsysattr(slot, pg_sys::MinTransactionIdAttributeNumber, &mut null);
        pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from_inner(
            xmin.value() as u32
        ))
    }
}

/// Whether this transaction's snapshot is its first (repeatable read,
/// serializable): a row changed since cannot be written by it.
pub(super) fn repeatable() -> bool {
    // SAFETY: reading a backend-local setting.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// The row version at `tid`, one this backend wrote or leased, read into
/// `slot` where our snapshot still sees it there with `equal` (`text`
/// columns) and `check` equal to `at`: whether it is so. A page past the
/// table's end (truncated by a vacuum, the table rewritten since) cannot be
/// read; none can be cut off while we hold our lock, and none was since
/// `tid` was learnt where this backend has taken in no invalidation since
/// (`seen`: a truncation sends one before it lets go of its lock, which ours
/// waited for) and its own transaction has not given the table a new file
/// (a `TRUNCATE`, `CLUSTER` or `VACUUM FULL` of its own, whose invalidation
/// it takes in only locally, at once): then the table's size is not asked
/// for, a system call a `done`.
///
/// # Safety
/// `rel` is open, `slot` is one of its slots, `snapshot` is registered.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn still_there(
    rel: pg_sys::Relation,
    shape: &Shape,
    tid: pg_sys::ItemPointerData,
    seen: Invalidations,
    snapshot: pg_sys::Snapshot,
    slot: *mut pg_sys::TupleTableSlot,
    equal: &[(Col, pg_sys::Datum)],
    (check, at): (Col, pg_sys::TimestampTz),
) -> bool {
    // SAFETY: within the contract above; the version is read only through
    // the table's access method, which checks the place.
    unsafe {
        let mut place = tid;
        let block = (u32::from(tid.ip_blkid.bi_hi) << 16) | u32::from(tid.ip_blkid.bi_lo);
        #[cfg(feature = "pg15")]
        let renewed = (*rel).rd_firstRelfilenodeSubid;
        #[cfg(not(feature = "pg15"))]
        let renewed = (*rel).rd_firstRelfilelocatorSubid;
        ((Invalidations::now() == seen
            // (InvalidSubTransactionId)
            && renewed == 0)
            || block
                < pg_sys::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM))
            && pg_sys::table_tuple_fetch_row_version(rel, &mut place, snapshot, slot)
            && equal
                .iter()
                .all(|&(col, v)| same_text(slot, shape.attnums[col.0], v))
            && timestamptz(slot, shape.attnums[check.0]) == Some(at)
    }
}

/// Write `set` (columns, their types and values, `None`: NULL) over the row
/// version in `locked` (at `tid`, locked by us), as an `UPDATE` of those
/// columns would: where the new version lives.
///
/// # Safety
/// As [`rewrite`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rewrite_set(
    rel: pg_sys::Relation,
    shape: &Shape,
    locked: *mut pg_sys::TupleTableSlot,
    tid: pg_sys::ItemPointerData,
    cid: pg_sys::CommandId,
    snapshot: pg_sys::Snapshot,
    set: &[(Col, pg_sys::Oid, Option<pg_sys::Datum>)],
) -> Result<pg_sys::ItemPointerData> {
    let changed: Vec<pg_sys::AttrNumber> =
        set.iter().map(|(col, ..)| shape.attnums[col.0]).collect();
    // SAFETY: within the contract above.
    unsafe {
        let version = rewrite(
            rel,
            shape,
            locked,
            tid,
            cid,
            snapshot,
            &changed,
            |values, nulls| {
                for (&(_, _, value), &attnum) in set.iter().zip(&changed) {
                    let i = attnum as usize - 1;
                    values[i] = value.unwrap_or(pg_sys::Datum::from(0));
                    nulls[i] = value.is_none();
                }
                Ok(())
            },
        )?;
        let at = (*version).tts_tid;
        pg_sys::ExecDropSingleTupleTableSlot(version);
        Ok(at)
    }
}

/// The row version at `tid` (one the scan of `snapshot` found) locked as
/// `FOR UPDATE SKIP LOCKED` locks it, into `locked`: the lock's result, and
/// `TM_WouldBlock` for a version passed over. Read committed, a row changed
/// since the snapshot by a commit (most often another taker's write) is read
/// unlocked first: where that version is the newest and not `wanted`, it is
/// passed over without a lock (one taken only to find it unwanted would stay
/// to our commit and make that row's next writer wait for us); else its
/// newest version is locked, to be rechecked by the caller (a row changed
/// again since, say taken and made free again in place: the statement locks
/// the newest version and rechecks that, and so do we).
///
/// # Safety
/// `rel` is open, `locked` is one of its slots, `snapshot` is registered,
/// `cid` is this command's.
pub(super) unsafe fn lock_skipping(
    rel: pg_sys::Relation,
    tid: pg_sys::ItemPointerData,
    snapshot: pg_sys::Snapshot,
    locked: *mut pg_sys::TupleTableSlot,
    cid: pg_sys::CommandId,
    wanted: impl Fn(*mut pg_sys::TupleTableSlot) -> bool,
) -> pg_sys::TM_Result::Type {
    // SAFETY: within the contract above; the lock stays to the end of the
    // transaction, as `FOR UPDATE`'s does.
    unsafe {
        let mut tid = tid;
        let lock = |tid: &mut pg_sys::ItemPointerData, flags: u32| {
            lock_version(
                rel,
                tid,
                snapshot,
                locked,
                cid,
                pg_sys::LockTupleMode::LockTupleExclusive,
                pg_sys::LockWaitPolicy::LockWaitSkip,
                flags as u8,
            )
        };
        let (result, failure) = lock(&mut tid, 0);
        if result != pg_sys::TM_Result::TM_Updated || repeatable() {
            return result;
        }
        let mut next = failure.ctid;
        if pg_sys::table_tuple_fetch_row_version(
            rel,
            &mut next,
            &raw mut pg_sys::SnapshotAnyData,
            locked,
        ) && !wanted(locked)
            && looks_newest(locked)
        {
            return pg_sys::TM_Result::TM_WouldBlock;
        }
        lock(&mut tid, pg_sys::TUPLE_LOCK_FLAG_FIND_LAST_VERSION).0
    }
}
