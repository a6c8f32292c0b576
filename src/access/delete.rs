//! A row deleted by its key, or at the place this backend's take left it,
//! as a `DELETE ... WHERE key = ... AND col = ...` would.

use super::*;

impl Opened {
    /// [`Opened::delete_if`] for a row version this backend knows the place
    /// of, `tid` (the one its last take wrote): where our snapshot sees the
    /// version there and it is the row `key` names, with `check` equal to
    /// `equals` and `present` not NULL, it is deleted without a look through the primary key (whose
    /// pages, for random keys, are the ones a `done` would otherwise touch
    /// cold). `Some(true)` when it went; `None` in every other case, with
    /// nothing done: a version since changed, moved on or gone, another row
    /// at that place after a rewrite. Then the caller goes by the key, which
    /// decides as ever.
    pub fn delete_at_if(
        &self,
        tid: pg_sys::ItemPointerData,
        seen: Invalidations,
        key: &[(Col, pg_sys::Datum)],
        (check, equals): (Col, pg_sys::TimestampTz),
        present: Col,
    ) -> Result<Option<bool>> {
        if !self.may_delete_by(key, check, present) {
            return Ok(None);
        }
        let (rel, shape) = (&self.rel, &self.shape);
        // SAFETY: as in `delete_if`; the version at `tid` is only read
        // through the table's access method, which checks the place.
        unsafe {
            pg_sys::CheckCmdReplicaIdentity(rel.0, pg_sys::CmdType::CMD_DELETE);
            pg_sys::CommandCounterIncrement();
            let cid = pg_sys::GetCurrentCommandId(true);
            let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
            let slot = pg_sys::table_slot_create(rel.0, std::ptr::null_mut());
            let mut at = tid;
            let fits = still_there(
                rel.0,
                shape,
                tid,
                seen,
                snapshot,
                slot,
                key,
                (check, equals),
            ) && timestamptz(slot, shape.attnums[present.0]).is_some();
            let outcome = if fits {
                let result = delete_version(rel.0, &mut at, cid, snapshot);
                match changed_since_snapshot(result) {
                    Some(e) => Err(e),
                    // anything but a delete (changed or gone meanwhile, by
                    // a commit the access method waited for, or by this
                    // command): the key decides
                    None => Ok((result == pg_sys::TM_Result::TM_Ok).then_some(true)),
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

    /// Whether [`Opened::delete_if`] (or [`Opened::delete_at_if`]) can be
    /// done here for `key`.
    pub(super) fn may_delete_by(
        &self,
        key: &[(Col, pg_sys::Datum)],
        check: Col,
        present: Col,
    ) -> bool {
        cols_of(key).is_some_and(|(cols, n)| self.can_delete_if(&cols[..n], check, present))
    }

    /// Whether [`Opened::delete_if`] can be done here, by a key of `cols`.
    pub fn can_delete_if(&self, cols: &[Col], check: Col, present: Col) -> bool {
        self.may(pg_sys::ACL_DELETE)
            && self.keyed_by(cols)
            && self.shape.types[check.0] == pg_sys::TIMESTAMPTZOID
            && self.shape.types[present.0] == pg_sys::TIMESTAMPTZOID
    }

    /// Delete the row whose primary key is `key` (`text` columns, in the
    /// primary key's order) if its `timestamptz` column `check` equals
    /// `equals` and its `timestamptz` column `present` is not NULL: whether
    /// a row went. `None` when it cannot be done here (see
    /// the module comment): nothing was done, and the caller runs its
    /// statement.
    pub fn delete_if(
        &self,
        key: &[(Col, pg_sys::Datum)],
        (check, equals): (Col, pg_sys::TimestampTz),
        present: Col,
    ) -> Result<Option<bool>> {
        if !self.may_delete_by(key, check, present) {
            return Ok(None);
        }
        let (rel, shape) = (&self.rel, &self.shape);
        // SAFETY: inside a transaction; the relations opened here are closed
        // before we return (see `Open`), the snapshot registered is
        // unregistered, the slot and the scans are released. On an error
        // Postgres raises beneath us, its abort releases all of them.
        unsafe {
            let index = Open(pg_sys::index_open(shape.pkey, pg_sys::AccessShareLock as _));
            pg_sys::CheckCmdReplicaIdentity(rel.0, pg_sys::CmdType::CMD_DELETE);
            // see what the commands before ours in this transaction did, as
            // SPI does before each statement
            pg_sys::CommandCounterIncrement();
            let cid = pg_sys::GetCurrentCommandId(true);
            let slot = pg_sys::table_slot_create(rel.0, std::ptr::null_mut());
            let (check, present) = (shape.attnums[check.0], shape.attnums[present.0]);
            let outcome = loop {
                pg_sys::check_for_interrupts!();
                let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
                let mut keys = key_scan(index.0, key);
                let scan = begin_scan(rel.0, index.0, snapshot, &mut keys[..key.len()], false);
                let mut found = None;
                if pg_sys::index_getnext_slot(
                    scan,
                    pg_sys::ScanDirection::ForwardScanDirection,
                    slot,
                ) && timestamptz(slot, check) == Some(equals)
                    && timestamptz(slot, present).is_some()
                {
                    found = Some((*slot).tts_tid);
                }
                pg_sys::index_endscan(scan);
                pg_sys::ExecClearTuple(slot);
                let Some(mut tid) = found else {
                    pg_sys::UnregisterSnapshot(snapshot);
                    break Ok(false);
                };
                let result = delete_version(rel.0, &mut tid, cid, snapshot);
                pg_sys::UnregisterSnapshot(snapshot);
                if let Some(e) = changed_since_snapshot(result) {
                    break Err(e);
                }
                match result {
                    pg_sys::TM_Result::TM_Ok => break Ok(true),
                    // deleted by this very command already
                    pg_sys::TM_Result::TM_SelfModified => break Ok(false),
                    // committed under us (the access method waited for it):
                    // look again, as of now
                    pg_sys::TM_Result::TM_Updated => continue,
                    pg_sys::TM_Result::TM_Deleted => break Ok(false),
                    other => break Err(unexpected("table_tuple_delete", other)),
                }
            };
            pg_sys::ExecDropSingleTupleTableSlot(slot);
            count_served();
            outcome.map(Some)
        }
    }
}
