//! The places of a limit (`sturdy.queue_places`, `sturdy.queue_key_places`):
//! the first free row of a group locked as `SELECT ... ORDER BY <primary
//! key> LIMIT 1 FOR UPDATE SKIP LOCKED` locks it, and a row this backend
//! wrote rewritten where it lives, as an `UPDATE ... WHERE <its columns>`
//! would.

use super::*;

/// What [`Opened::lock_free`] found of a group.
pub enum Free {
    /// Its first free row, locked.
    Locked(Locked),
    /// Rows, none free or all free ones held by other transactions.
    NoneFree,
    /// No row at all.
    NoRows,
}

impl Opened {
    /// Whether [`Opened::lock_free`] can be done here: the primary key is
    /// `group` (`text` columns) and then `place`, an `integer`, and `free`
    /// is a `timestamptz`.
    pub fn can_lock_free(&self, group: &[Col], place: Col, free: Col) -> bool {
        let shape = &self.shape;
        self.may(pg_sys::ACL_UPDATE)
            && group.len() <= MAX_KEYS
            && shape.types[free.0] == pg_sys::TIMESTAMPTZOID
            && shape.types[place.0] == pg_sys::INT4OID
            && group.iter().all(|c| shape.types[c.0] == pg_sys::TEXTOID)
            && shape.indexes.iter().any(|index| {
                index.oid == shape.pkey
                    && index.keys.len() == group.len() + 1
                    && index
                        .keys
                        .iter()
                        .zip(group.iter().chain([&place]))
                        .all(|(k, c)| *k == shape.attnums[c.0])
            })
    }

    /// Lock the first row of the group `group` (the leading columns of the
    /// primary key, `text`), in the primary key's order, whose `free`
    /// column is NULL or at or before `due`, as `SELECT ... WHERE <group>
    /// AND (free IS NULL OR free <= due) ORDER BY <primary key> LIMIT 1 FOR
    /// UPDATE SKIP LOCKED` locks it: one another transaction holds is
    /// passed over; read committed, one changed and committed since our
    /// snapshot is followed to its newest version and rechecked (its group
    /// and `free`; that version is read before it is locked, and one not
    /// free is passed over unlocked), under repeatable read or serializable
    /// it fails with `40001`. The lock stays to the end of the transaction.
    /// With `start`, the places from `start` on are looked at first (a
    /// backend that goes back to the place it held last meets no other
    /// taker there). `None` when it cannot be done here.
    pub fn lock_free(
        &self,
        group: &[(Col, pg_sys::Datum)],
        place: Col,
        free: Col,
        due: pg_sys::TimestampTz,
        start: Option<i32>,
    ) -> Result<Option<Free>> {
        let Some((cols, n)) = cols_of(group) else {
            return Ok(None);
        };
        if !self.can_lock_free(&cols[..n], place, free) {
            return Ok(None);
        }
        // from `start` on first; where nothing there is free, the whole
        // group (the places before `start` are the ones not yet looked at)
        if let Some(start) = start {
            match self.lock_free_from(group, free, due, Some(start))? {
                Free::NoRows | Free::NoneFree => {}
                locked => return Ok(Some(locked)),
            }
        }
        self.lock_free_from(group, free, due, None).map(Some)
    }

    /// [`Opened::lock_free`]'s scan, of the places from `start` on (or
    /// all), its checks done.
    fn lock_free_from(
        &self,
        group: &[(Col, pg_sys::Datum)],
        free: Col,
        due: pg_sys::TimestampTz,
        start: Option<i32>,
    ) -> Result<Free> {
        let n = group.len();
        let (rel, shape) = (self.rel.0, &self.shape);
        let free = shape.attnums[free.0];
        // SAFETY: inside a transaction, with the table open for writing;
        // the scan, the slot it reads into and the index are ended here;
        // the slot locked into and the snapshot go with the `Locked`
        // returned, or here (on an error raised beneath us, the abort
        // releases all of them: see `unwinding`).
        unsafe {
            let index = Open(pg_sys::index_open(shape.pkey, pg_sys::AccessShareLock as _));
            pg_sys::CommandCounterIncrement();
            let cid = pg_sys::GetCurrentCommandId(true);
            let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
            let found = pg_sys::table_slot_create(rel, std::ptr::null_mut());
            let locked = pg_sys::table_slot_create(rel, std::ptr::null_mut());
            let mut keys: [pg_sys::ScanKeyData; MAX_KEYS + 1] = std::mem::zeroed();
            keys[..MAX_KEYS].copy_from_slice(&key_scan(index.0, group));
            let mut k = n;
            if let Some(start) = start {
                pg_sys::ScanKeyEntryInitialize(
                    &mut keys[n],
                    0,
                    (n + 1) as pg_sys::AttrNumber,
                    pg_sys::BTGreaterEqualStrategyNumber as pg_sys::StrategyNumber,
                    pg_sys::InvalidOid,
                    pg_sys::InvalidOid,
                    pg_sys::Oid::from(pg_sys::F_INT4GE),
                    pg_sys::Datum::from(start),
                );
                k += 1;
            }
            let scan = begin_scan(rel, index.0, snapshot, &mut keys[..k], false);
            let is_free = |slot| timestamptz(slot, free).is_none_or(|t| t <= due);
            let mut any = false;
            let outcome = loop {
                if !pg_sys::index_getnext_slot(
                    scan,
                    pg_sys::ScanDirection::ForwardScanDirection,
                    found,
                ) {
                    break Ok(if any { Free::NoneFree } else { Free::NoRows });
                }
                any = true;
                if !is_free(found) {
                    continue;
                }
                let result = lock_skipping(rel, (*found).tts_tid, snapshot, locked, cid, is_free);
                if let Some(e) = changed_since_snapshot(result) {
                    break Err(e);
                }
                match result {
                    pg_sys::TM_Result::TM_Ok => {}
                    // held by another, gone, or written by this command
                    pg_sys::TM_Result::TM_WouldBlock
                    | pg_sys::TM_Result::TM_Deleted
                    | pg_sys::TM_Result::TM_SelfModified => continue,
                    other => break Err(unexpected("table_tuple_lock", other)),
                }
                // the newest version, locked: still free, still of the group?
                if is_free(locked)
                    && group
                        .iter()
                        .all(|&(col, v)| same_text(locked, shape.attnums[col.0], v))
                {
                    break Ok(Free::Locked(Locked {
                        slot: locked,
                        snapshot,
                        shape: Rc::clone(shape),
                        cid,
                    }));
                }
            };
            pg_sys::index_endscan(scan);
            pg_sys::ExecDropSingleTupleTableSlot(found);
            if !matches!(outcome, Ok(Free::Locked(_))) {
                pg_sys::ExecDropSingleTupleTableSlot(locked);
                pg_sys::UnregisterSnapshot(snapshot);
            }
            count_served();
            outcome
        }
    }

    /// Write `set` over the row version at `tid`, one this backend wrote
    /// (the place its last take held), where our snapshot sees it there, it
    /// has `equal` (`text` columns) and `check` equal to `at`, and no
    /// transaction changed it since: as `UPDATE ... SET <set> WHERE
    /// <equal> AND check = at` would, without a look through an index.
    /// `Some(true)` when it was written; `None` in every other case, with
    /// nothing written (a version changed since, moved on or gone, another
    /// row there after a rewrite): then the caller's statement decides.
    /// `seen`: the invalidations this backend had taken in when it learnt
    /// `tid` (see [`Opened::delete_at_if`]).
    pub fn update_at_if(
        &self,
        tid: pg_sys::ItemPointerData,
        seen: Invalidations,
        equal: &[(Col, pg_sys::Datum)],
        (check, at): (Col, pg_sys::TimestampTz),
        set: &[(Col, pg_sys::Oid, Option<pg_sys::Datum>)],
    ) -> Result<Option<bool>> {
        let shape = &self.shape;
        let cols: Vec<(Col, pg_sys::Oid, bool)> = set
            .iter()
            .map(|&(col, oid, value)| (col, oid, value.is_none()))
            .collect();
        if !self.can_update(&cols)
            || shape.types[check.0] != pg_sys::TIMESTAMPTZOID
            || !equal
                .iter()
                .all(|(c, _)| shape.types[c.0] == pg_sys::TEXTOID)
        {
            return Ok(None);
        }
        let rel = self.rel.0;
        // SAFETY: as in `delete_at_if`: the version at `tid` is read only
        // through the table's access method, which checks the place, and
        // only where the page is known to be there; it is locked before it
        // is rewritten, and the slots and the snapshot are released here.
        unsafe {
            pg_sys::CheckCmdReplicaIdentity(rel, pg_sys::CmdType::CMD_UPDATE);
            pg_sys::CommandCounterIncrement();
            let cid = pg_sys::GetCurrentCommandId(true);
            let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
            let slot = pg_sys::table_slot_create(rel, std::ptr::null_mut());
            let mut place = tid;
            let fits = still_there(rel, shape, tid, seen, snapshot, slot, equal, (check, at));
            let outcome = if fits {
                // locked as it stands, waiting for a holder: any change
                // since (by a commit, or by this command) and it is not
                // the version we wrote any more
                let (result, _) = lock_version(
                    rel,
                    &mut place,
                    snapshot,
                    slot,
                    cid,
                    pg_sys::LockTupleMode::LockTupleExclusive,
                    pg_sys::LockWaitPolicy::LockWaitBlock,
                    0,
                );
                match changed_since_snapshot(result) {
                    Some(e) => Err(e),
                    None if result == pg_sys::TM_Result::TM_Ok => {
                        rewrite_set(rel, shape, slot, place, cid, snapshot, set).map(|_| Some(true))
                    }
                    None => Ok(None),
                }
            } else {
                Ok(None)
            };
            pg_sys::ExecDropSingleTupleTableSlot(slot);
            pg_sys::UnregisterSnapshot(snapshot);
            if let Ok(Some(_)) = outcome {
                count_served();
            }
            outcome
        }
    }
}
