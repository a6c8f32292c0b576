//! A row locked by its key as `SELECT ... FOR UPDATE` locks it, read, and
//! updated as an `UPDATE` of it would.

use super::*;

impl Opened {
    /// Whether [`Opened::lock`] can be done here, by a key of `cols`.
    pub fn can_lock(&self, cols: &[Col]) -> bool {
        self.may(pg_sys::ACL_UPDATE) && self.keyed_by(cols)
    }

    /// Lock the row whose primary key is `key` (`text` columns, in the
    /// primary key's order) as `SELECT ... FOR UPDATE` does: waiting for a
    /// transaction that holds it; read committed, a row updated and
    /// committed meanwhile is followed to its newest version, which must
    /// still have the key; under repeatable read or serializable one changed
    /// since the snapshot fails with `40001`. `Some(None)`: no such row;
    /// `None` when it cannot be done here.
    pub fn lock(&self, key: &[(Col, pg_sys::Datum)]) -> Result<Option<Option<Locked>>> {
        let Some((cols, n)) = cols_of(key) else {
            return Ok(None);
        };
        if !self.can_lock(&cols[..n]) {
            return Ok(None);
        }
        let (rel, shape) = (&self.rel, &self.shape);
        // SAFETY: as in `delete_if`; the slot and the snapshot go with the
        // `Locked` returned, or here.
        unsafe {
            let index = Open(pg_sys::index_open(shape.pkey, pg_sys::AccessShareLock as _));
            pg_sys::CommandCounterIncrement();
            let cid = pg_sys::GetCurrentCommandId(true);
            let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
            let slot = pg_sys::table_slot_create(rel.0, std::ptr::null_mut());
            let mut keys = key_scan(index.0, key);
            let scan = begin_scan(rel.0, index.0, snapshot, &mut keys[..key.len()], false);
            let found =
                pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot);
            let mut tid = (*slot).tts_tid;
            pg_sys::index_endscan(scan);
            let locked = Locked {
                slot,
                snapshot,
                shape: Rc::clone(shape),
                cid,
            };
            if !found {
                return Ok(Some(None));
            }
            let flags = pg_sys::TUPLE_LOCK_FLAG_LOCK_UPDATE_IN_PROGRESS as u8
                | if repeatable() {
                    0
                } else {
                    pg_sys::TUPLE_LOCK_FLAG_FIND_LAST_VERSION as u8
                };
            let (result, failure) = lock_version(
                rel.0,
                &mut tid,
                snapshot,
                slot,
                cid,
                pg_sys::LockTupleMode::LockTupleExclusive,
                pg_sys::LockWaitPolicy::LockWaitBlock,
                flags,
            );
            count_served();
            if let Some(e) = changed_since_snapshot(result) {
                return Err(e);
            }
            match result {
                pg_sys::TM_Result::TM_Ok => {}
                // gone, or updated by this very command: as invisible
                pg_sys::TM_Result::TM_Deleted | pg_sys::TM_Result::TM_SelfModified => {
                    return Ok(Some(None));
                }
                other => return Err(unexpected("table_tuple_lock", other)),
            }
            // a newer version than the snapshot's: the key rechecked on it,
            // as EvalPlanQual would
            if failure.traversed
                && !key
                    .iter()
                    .all(|&(col, v)| same_text(slot, shape.attnums[col.0], v))
            {
                return Ok(Some(None));
            }
            Ok(Some(Some(locked)))
        }
    }

    /// The `bigint` column `col` of a row [`Opened::lock`] locked.
    pub fn int8(&self, row: &Locked, col: Col) -> Option<i64> {
        (self.shape.types[col.0] == pg_sys::INT8OID)
            // SAFETY: the slot holds the locked row, the column is `bigint`.
            .then(|| unsafe { int8(row.slot, self.shape.attnums[col.0]) })
            .flatten()
    }

    /// The `integer` column `col` of a row [`Opened::lock`] (or
    /// [`Opened::lock_free`]) locked.
    pub fn int4(&self, row: &Locked, col: Col) -> Option<i32> {
        (self.shape.types[col.0] == pg_sys::INT4OID)
            // SAFETY: as in `int8`, for an `integer`, passed by value too.
            .then(|| unsafe { slot_value(row.slot, self.shape.attnums[col.0]) })
            .flatten()
            .map(|v| v.value() as i32)
    }

    /// The `timestamptz` column `col` of a row [`Opened::lock`] locked.
    pub fn timestamptz(&self, row: &Locked, col: Col) -> Option<pg_sys::TimestampTz> {
        (self.shape.types[col.0] == pg_sys::TIMESTAMPTZOID)
            // SAFETY: as in `int8`, for a `timestamptz`.
            .then(|| unsafe { timestamptz(row.slot, self.shape.attnums[col.0]) })
            .flatten()
    }

    /// Whether [`Opened::update`] can write `cols` (with these types, `NULL`
    /// only where `nullable`) over a locked row here.
    pub fn can_update(&self, cols: &[(Col, pg_sys::Oid, bool)]) -> bool {
        let shape = &self.shape;
        self.may(pg_sys::ACL_UPDATE)
            && shape.rewritable()
            && cols.iter().all(|&(col, oid, null)| {
                shape.types[col.0] == oid
                    && (!null || !shape.attrs[shape.attnums[col.0] as usize - 1].not_null)
            })
    }

    /// Write `set` (columns, their types and values, `None`: NULL) over the
    /// row [`Opened::lock`] locked, as an `UPDATE` of it would: the new
    /// version with its index entries where the update is not HOT. `None`
    /// when it cannot be done here (a `CHECK` constraint to test, a column
    /// of another type, a NULL where none may be), with nothing written;
    /// else where the new version lives.
    pub fn update(
        &self,
        row: &Locked,
        set: &[(Col, pg_sys::Oid, Option<pg_sys::Datum>)],
    ) -> Result<Option<pg_sys::ItemPointerData>> {
        let shape = &self.shape;
        let cols: Vec<(Col, pg_sys::Oid, bool)> = set
            .iter()
            .map(|&(col, oid, value)| (col, oid, value.is_none()))
            .collect();
        if !Rc::ptr_eq(shape, &row.shape) || !self.can_update(&cols) {
            return Ok(None);
        }
        // SAFETY: the row is locked by us in `row.slot`, its snapshot
        // registered; the table is open for writing.
        unsafe {
            pg_sys::CheckCmdReplicaIdentity(self.rel.0, pg_sys::CmdType::CMD_UPDATE);
            let tid = rewrite_set(
                self.rel.0,
                shape,
                row.slot,
                (*row.slot).tts_tid,
                row.cid,
                row.snapshot,
                set,
            )?;
            count_served();
            Ok(Some(tid))
        }
    }
}
