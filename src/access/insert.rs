//! Inserts and upserts by the executor's protocol: `INSERT ... ON CONFLICT`
//! with a speculative insertion, without a statement.

use super::*;

/// Where at most this many of a backend's last 32 upserts into a table found
/// a row with their key, the next inserts straight away and looks only if the
/// primary key reports a conflict: one descent of the key instead of two
/// (about 13,000 instructions saved, 12% of a `schedule`), where one that
/// finds a row pays a row inserted and taken back (about 54,000; both counted
/// with `make instructions`). Inserting first pays from about one row found
/// in five upserts down; at one in eight (4 of 32) and fewer it saves at
/// least half of what it could. A table starts as if every upsert had found
/// its row (looking first, as `ON CONFLICT` does) whenever its shape is
/// read again.
pub(super) const FOUND_AT_MOST: u32 = 4;

#[cfg(any(test, feature = "pg_test"))]
thread_local! {
    /// Upserts that inserted before looking, and how many of those met a
    /// row there: for the tests to see which way a call went.
    pub static INSERTED_FIRST: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

impl Opened {
    /// Insert the row `u` describes, or, where one with its key is there
    /// (committed, or once the transaction writing it has ended), update that
    /// one's `set` columns (and `increment`, where `only_if` holds): `INSERT
    /// ... ON CONFLICT (key) DO UPDATE [WHERE]`, by the executor's own
    /// protocol. What it did (see [`Upserted`]); `None` when it cannot be
    /// done here (see the module comment; also any `CHECK` constraint, a
    /// unique index besides the primary key, a default other than `u.fill`
    /// says, or a column it leaves NULL that may not be), with nothing done.
    ///
    /// The key is first looked for under a dirty snapshot, which sees rows
    /// not yet committed: one whose writer is still running is waited for,
    /// and the look made again. A row found is locked (waiting for any
    /// holder) and updated; one changed meanwhile sends us back to the look,
    /// read committed, and fails with `40001` under repeatable read or
    /// serializable, as does a row our snapshot cannot see. None found, the
    /// row is inserted speculatively: the primary key's entry is checked
    /// without raising, and where another transaction's entry for the key
    /// came first, our row is taken back and the look made again. Where
    /// this backend's upserts into the table have seldom found a row, the
    /// insert comes before the look ([`FOUND_AT_MOST`]), and the look only
    /// after the primary key reports an entry for the key.
    pub fn upsert(&self, u: &Upsert) -> Result<Option<Upserted>> {
        Ok(self.insert(u, true, None)?.map(|(done, _)| done))
    }

    /// [`Opened::upsert`], also handing back a copy of the varlena column
    /// `read` of a row there that was kept (`None` otherwise, or NULL).
    pub fn upsert_reading(
        &self,
        u: &Upsert,
        read: Col,
    ) -> Result<Option<(Upserted, Option<pg_sys::Datum>)>> {
        self.insert(u, true, Some(read))
    }

    /// Insert the row `u` describes unless one with its key is there
    /// (committed, or once the transaction writing it has ended): `INSERT
    /// ... ON CONFLICT (key) DO NOTHING`, as [`Opened::upsert`] inserts;
    /// under repeatable read or serializable a row there that the snapshot
    /// cannot see fails with `40001`. Whether a row was inserted; `None`
    /// when it cannot be done here.
    pub fn insert_unless_there(&self, u: &Upsert) -> Result<Option<bool>> {
        Ok(self
            .insert(u, false, None)?
            .map(|(done, _)| done == Upserted::Inserted))
    }

    /// Whether [`Opened::upsert`] (`update`) or
    /// [`Opened::insert_unless_there`] can be done here for `u`.
    pub fn can_insert(&self, u: &Upsert, update: bool) -> bool {
        self.may(pg_sys::ACL_INSERT)
            && (!update || self.may(pg_sys::ACL_UPDATE))
            && Row::insertable(&self.shape, u).is_some()
    }

    /// [`Opened::upsert`] where `update`, else [`Opened::insert_unless_there`].
    pub(super) fn insert(
        &self,
        u: &Upsert,
        update: bool,
        read: Option<Col>,
    ) -> Result<Option<(Upserted, Option<pg_sys::Datum>)>> {
        if !self.may(pg_sys::ACL_INSERT) || (update && !self.may(pg_sys::ACL_UPDATE)) {
            return Ok(None);
        }
        let (rel, shape) = (&self.rel, &self.shape);
        let Some(mut row) = Row::insertable(shape, u) else {
            return Ok(None);
        };
        if read.is_some_and(|col| !matches!(shape.types[col.0], pg_sys::JSONBOID | pg_sys::TEXTOID))
        {
            return Ok(None);
        }
        // a copy of `read` in the row kept, which outlives its buffer
        let keep = |slot: *mut pg_sys::TupleTableSlot| {
            read.and_then(|col| {
                let mut null = false;
                // SAFETY: the slot holds the row locked; the column is a
                // varlena (checked above), copied detoasted.
                unsafe {
                    let v = pg_sys::slot_getattr(slot, shape.attnums[col.0].into(), &mut null);
                    (!null).then(|| {
                        pg_sys::Datum::from(pg_sys::pg_detoast_datum_copy(v.cast_mut_ptr()))
                    })
                }
            })
        };
        // SAFETY: inside a transaction, the table open for writing (we hold
        // `rel`); the index opened here is closed (`Open`), the snapshot
        // registered is unregistered and the slots dropped before we
        // return; on an error Postgres raises beneath us, its abort releases
        // them (see `unwinding`).
        unsafe {
            // an `ON CONFLICT DO UPDATE` is refused as a whole, before it
            // inserts, where its update would be (a publication of updates,
            // no replica identity), as the executor refuses it when it starts
            pg_sys::CheckCmdReplicaIdentity(rel.0, pg_sys::CmdType::CMD_INSERT);
            if update {
                pg_sys::CheckCmdReplicaIdentity(rel.0, pg_sys::CmdType::CMD_UPDATE);
            }
            // (for the look and for the insert's entry)
            let index = Open(pg_sys::index_open(
                shape.pkey,
                pg_sys::RowExclusiveLock as _,
            ));
            pg_sys::CommandCounterIncrement();
            let cid = pg_sys::GetCurrentCommandId(true);
            // what only a row found needs is made when one is
            let mut snapshot: pg_sys::Snapshot = std::ptr::null_mut();
            let existing = pg_sys::table_slot_create(rel.0, std::ptr::null_mut());
            let mut new: *mut pg_sys::TupleTableSlot = std::ptr::null_mut();
            // few rows found lately: insert before looking (the insert's
            // own unique check finds a row there, and then we look)
            let mut look = shape.found.get().count_ones() > FOUND_AT_MOST;
            let outcome = loop {
                pg_sys::check_for_interrupts!();
                let found = if look {
                    conflicting(rel.0, index.0, u.key, existing)
                } else {
                    #[cfg(any(test, feature = "pg_test"))]
                    INSERTED_FIRST.with(|n| n.set((n.get().0 + 1, n.get().1)));
                    None
                };
                // (only the tests' count reads it)
                #[cfg_attr(not(any(test, feature = "pg_test")), allow(unused_variables))]
                let blind = !look;
                look = true;
                let Some(tid) = found else {
                    if let Err(e) = row.fill(shape, u) {
                        break Err(e);
                    }
                    if new.is_null() {
                        new = pg_sys::table_slot_create(rel.0, std::ptr::null_mut());
                    }
                    if insert_speculatively(rel.0, shape, index.0, new, &row, cid) {
                        break Ok((Upserted::Inserted, None));
                    }
                    // a row there (another transaction's came first, or
                    // the insert went in before looking): look
                    #[cfg(any(test, feature = "pg_test"))]
                    if blind {
                        INSERTED_FIRST.with(|n| n.set((n.get().0, n.get().1 + 1)));
                    }
                    continue;
                };
                if snapshot.is_null() {
                    snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
                }
                match on_conflict(rel.0, shape, u, update, tid, existing, snapshot, cid, &keep) {
                    Ok(Some(done)) => break Ok(done),
                    // changed since we found it: the row to update may be
                    // another, or none
                    Ok(None) => continue,
                    Err(e) => break Err(e),
                }
            };
            pg_sys::ExecDropSingleTupleTableSlot(existing);
            if !new.is_null() {
                pg_sys::ExecDropSingleTupleTableSlot(new);
            }
            if !snapshot.is_null() {
                pg_sys::UnregisterSnapshot(snapshot);
            }
            if let Ok((done, _)) = &outcome {
                let found = *done != Upserted::Inserted;
                shape.found.set(shape.found.get() << 1 | u32::from(found));
            }
            count_served();
            outcome.map(Some)
        }
    }
}

/// The row in `row` inserted speculatively through `new` (a slot of `rel`),
/// as `INSERT ... ON CONFLICT` inserts: the primary key's entry checked
/// without raising, and the row taken back where another transaction's
/// entry for the key came first. Whether it went in.
///
/// # Safety
/// `rel` is open for writing and `index` is its primary key, open; `row`
/// is formed with the table's own descriptor, from values of its columns'
/// types; `cid` is this command's.
unsafe fn insert_speculatively(
    rel: pg_sys::Relation,
    shape: &Shape,
    index: pg_sys::Relation,
    new: *mut pg_sys::TupleTableSlot,
    row: &Row,
    cid: pg_sys::CommandId,
) -> bool {
    // SAFETY: within the contract above; the speculative insertion lock is
    // released on every path once taken (an error between would abort the
    // transaction, which releases it).
    unsafe {
        pg_sys::ExecClearTuple(new);
        let natts = row.values.len();
        std::slice::from_raw_parts_mut((*new).tts_values, natts).copy_from_slice(&row.values);
        std::slice::from_raw_parts_mut((*new).tts_isnull, natts).copy_from_slice(&row.nulls);
        pg_sys::ExecStoreVirtualTuple(new);
        let xid = pg_sys::GetCurrentTransactionId();
        let token = pg_sys::SpeculativeInsertionLockAcquire(xid);
        pg_sys::table_tuple_insert_speculative(rel, new, cid, 0, std::ptr::null_mut(), token);
        let first = index_entries(rel, shape, new, None, index);
        pg_sys::table_tuple_complete_speculative(rel, new, token, first);
        pg_sys::SpeculativeInsertionLockRelease(xid);
        first
    }
}

/// `ON CONFLICT` for the row version at `tid` that has `u`'s key: `DO
/// NOTHING` (`!update`) keeps it as it is, unlocked; `DO UPDATE` locks it
/// (waiting for any holder) and writes `u.set` (and `u.increment`) where
/// `u.only_if` holds, else keeps it locked. What was done, with `keep`'s
/// copy of a row kept; `None` where the row changed since it was found (the
/// caller looks again).
///
/// # Safety
/// `rel` is open for writing; `existing` is one of its slots; `snapshot` is
/// registered; `cid` is this command's.
#[allow(clippy::too_many_arguments)]
unsafe fn on_conflict(
    rel: pg_sys::Relation,
    shape: &Shape,
    u: &Upsert,
    update: bool,
    mut tid: pg_sys::ItemPointerData,
    existing: *mut pg_sys::TupleTableSlot,
    snapshot: pg_sys::Snapshot,
    cid: pg_sys::CommandId,
    keep: &dyn Fn(*mut pg_sys::TupleTableSlot) -> Option<pg_sys::Datum>,
) -> Result<Option<(Upserted, Option<pg_sys::Datum>)>> {
    // SAFETY: within the contract above; a new version is formed from the
    // locked one's values with the table's own descriptor (`rewrite`).
    unsafe {
        if !update {
            // DO NOTHING: the row stays as it is, unlocked; but a snapshot
            // of the transaction's start must see it
            if repeatable() {
                if !pg_sys::table_tuple_fetch_row_version(
                    rel,
                    &mut tid,
                    &raw mut pg_sys::SnapshotAnyData,
                    existing,
                ) {
                    return Err(unexpected("table_tuple_fetch_row_version", 0));
                }
                if !visible_to(rel, existing, snapshot) {
                    return Err(serialization("update"));
                }
            }
            return Ok(Some((Upserted::Kept, None)));
        }
        let (result, _) = lock_version(
            rel,
            &mut tid,
            snapshot,
            existing,
            cid,
            pg_sys::LockTupleMode::LockTupleNoKeyExclusive,
            if u.skip_locked {
                pg_sys::LockWaitPolicy::LockWaitSkip
            } else {
                pg_sys::LockWaitPolicy::LockWaitBlock
            },
            0,
        );
        if let Some(e) = changed_since_snapshot(result) {
            return Err(e);
        }
        match result {
            pg_sys::TM_Result::TM_Ok => {}
            pg_sys::TM_Result::TM_WouldBlock => return Ok(Some((Upserted::Kept, None))),
            pg_sys::TM_Result::TM_Updated | pg_sys::TM_Result::TM_Deleted => return Ok(None),
            other => return Err(unexpected("table_tuple_lock", other)),
        }
        // locked; a snapshot of the transaction's start must see it
        if repeatable() && !visible_to(rel, existing, snapshot) {
            return Err(serialization("update"));
        }
        // `WHERE` unmet, or an update that would change nothing (no `set`,
        // no increment: the row kept as it is, locked, rather than
        // rewritten unchanged)
        if u.only_if.is_some_and(|(col, at)| {
            timestamptz(existing, shape.attnums[col.0]).is_none_or(|v| v > at)
        }) || (u.set.is_empty() && u.increment.is_none())
        {
            return Ok(Some((Upserted::Kept, keep(existing))));
        }
        let set: Vec<pg_sys::AttrNumber> =
            u.set.iter().map(|(col, ..)| shape.attnums[col.0]).collect();
        let mut incremented = None;
        let version = rewrite(
            rel,
            shape,
            existing,
            tid,
            cid,
            snapshot,
            &set,
            |values, nulls| {
                // the row's own value, before `set` is written over it
                if let Some(col) = u.increment {
                    let i = shape.attnums[col.0] as usize - 1;
                    let Some(next) = (!nulls[i])
                        .then(|| values[i].value() as i64)
                        .and_then(|n| n.checked_add(1))
                    else {
                        return Err(out_of_range("bigint"));
                    };
                    incremented = Some((i, next));
                }
                for (col, _, value) in u.set {
                    let i = shape.attnums[col.0] as usize - 1;
                    values[i] = value.unwrap_or(pg_sys::Datum::from(0));
                    nulls[i] = value.is_none();
                }
                if let Some((i, next)) = incremented {
                    (values[i], nulls[i]) = (pg_sys::Datum::from(next), false);
                }
                Ok(())
            },
        )?;
        pg_sys::ExecDropSingleTupleTableSlot(version);
        Ok(Some((
            Upserted::Updated(incremented.map(|(_, next)| next)),
            None,
        )))
    }
}

/// The row [`Opened::upsert`] inserts, by attribute number less one.
pub(super) struct Row {
    values: Vec<pg_sys::Datum>,
    nulls: Vec<bool>,
    /// Whether `fill`'s columns hold their values yet.
    filled: bool,
}

impl Row {
    /// The row `u` inserts into a table of `shape`, but for `u.fill`'s
    /// values; `None` where a statement would give the row anything else
    /// (a default `u` does not expect, a generated column), or refuse it (a
    /// `CHECK` constraint, a column it leaves NULL that may not be) or take
    /// another unique index as its arbiter too.
    pub(super) fn insertable(shape: &Shape, u: &Upsert) -> Option<Row> {
        let natts = shape.attrs.len();
        let at = |col: Col| shape.attnums[col.0] as usize - 1;
        let typed = |col: Col, oid: pg_sys::Oid| shape.types[col.0] == oid;
        let (cols, n) = cols_of(u.key)?;
        if shape.index_on(&cols[..n]) != Some(shape.pkey)
            || !u.key.iter().all(|&(col, _)| typed(col, pg_sys::TEXTOID))
            || !u
                .set
                .iter()
                .chain(u.insert_only)
                .all(|&(col, oid, _)| typed(col, oid))
            || !shape.rewritable()
            || shape
                .indexes
                .iter()
                .any(|index| index.unique && index.oid != shape.pkey)
            || u.only_if
                .is_some_and(|(col, _)| !typed(col, pg_sys::TIMESTAMPTZOID))
            || u.increment.is_some_and(|col| {
                !typed(col, pg_sys::INT8OID) || !u.set.iter().any(|&(c, ..)| c.0 == col.0)
            })
        {
            return None;
        }
        let mut values = vec![pg_sys::Datum::from(0); natts];
        let mut nulls = vec![true; natts];
        let mut given = vec![false; natts];
        for &(col, value) in u.key {
            (values[at(col)], nulls[at(col)], given[at(col)]) = (value, false, true);
        }
        for &(col, _, value) in u.set.iter().chain(u.insert_only) {
            let i = at(col);
            values[i] = value.unwrap_or(pg_sys::Datum::from(0));
            (nulls[i], given[i]) = (value.is_none(), true);
        }
        for (col, fill) in u.fill {
            let i = at(*col);
            let expected = match fill {
                Fill::Int4(n) if typed(*col, pg_sys::INT4OID) => Stored::Int4(*n),
                Fill::Next(seq) if typed(*col, pg_sys::INT8OID) => Stored::Next(seq.oid()?),
                _ => return None,
            };
            if shape.attrs[i].default != expected {
                return None;
            }
            (nulls[i], given[i]) = (false, true);
        }
        for (i, a) in shape.attrs.iter().enumerate() {
            if !a.dropped
                && (a.generated
                    || (!given[i] && a.default != Stored::None)
                    || (a.not_null && nulls[i]))
            {
                return None;
            }
        }
        Some(Row {
            values,
            nulls,
            filled: false,
        })
    }

    /// Give `u.fill`'s columns their values, once.
    pub(super) fn fill(&mut self, shape: &Shape, u: &Upsert) -> Result<()> {
        if self.filled {
            return Ok(());
        }
        for (col, fill) in u.fill {
            self.values[shape.attnums[col.0] as usize - 1] = match fill {
                Fill::Int4(n) => pg_sys::Datum::from(*n),
                Fill::Next(seq) => {
                    pg_sys::Datum::from(seq.advance().ok_or_else(|| Error::Internal {
                        context: "access",
                        cause: "the sequence of a column default is gone".into(),
                    })?)
                }
            };
        }
        self.filled = true;
        Ok(())
    }
}

/// The row version whose primary key is `key`, committed or not, as a unique
/// check sees it (a dirty snapshot): where its inserter or deleter is still
/// running, we wait for it to end (or for a speculative insert to be decided)
/// and look again. `None`: no such row.
///
/// # Safety
/// `rel` and its primary key `index` are open; `key` are `text` datums in the
/// index's column order; `slot` is a slot of `rel`.
pub(super) unsafe fn conflicting(
    rel: pg_sys::Relation,
    index: pg_sys::Relation,
    key: &[(Col, pg_sys::Datum)],
    slot: *mut pg_sys::TupleTableSlot,
) -> Option<pg_sys::ItemPointerData> {
    // SAFETY: within the contract above: `rel` and its primary key `index` are open; `key`
    // are `text` datums in the index's column order; `slot` is a slot of `rel`.
    unsafe {
        loop {
            pg_sys::check_for_interrupts!();
            let mut dirty: pg_sys::SnapshotData = std::mem::zeroed();
            dirty.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
            let mut keys = key_scan(index, key);
            let scan = begin_scan(rel, index, &mut dirty, &mut keys[..key.len()], false);
            let found =
                pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot);
            let mut tid = (*slot).tts_tid;
            // set by the visibility check of the version found
            let (xmin, xmax, token) = (dirty.xmin, dirty.xmax, dirty.speculativeToken);
            pg_sys::index_endscan(scan);
            pg_sys::ExecClearTuple(slot);
            if !found {
                return None;
            }
            let running = if xmin != pg_sys::InvalidTransactionId {
                xmin
            } else {
                xmax
            };
            if running == pg_sys::InvalidTransactionId {
                return Some(tid);
            }
            if token != 0 {
                pg_sys::SpeculativeInsertionWait(xmin, token);
            } else {
                pg_sys::XactLockTableWait(
                    running,
                    rel,
                    &mut tid,
                    pg_sys::XLTW_Oper::XLTW_InsertIndex,
                );
            }
        }
    }
}
