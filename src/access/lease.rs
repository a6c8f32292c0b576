//! A one-row take's lease: the first due row of a queue, in index order from
//! a floor, leased as `FOR UPDATE SKIP LOCKED` and an `UPDATE` would.

use super::*;

/// A row `lease_first` leased: the call reads it before its buffer goes.
pub struct Leased {
    /// The row's `text` key column, pointing into the new row version.
    pub key: pg_sys::Datum,
    /// Its place in the scan's order, before the lease.
    pub place: (pg_sys::TimestampTz, i64),
    /// Where the new row version lives (see [`Opened::delete_at_if`]).
    pub tid: pg_sys::ItemPointerData,
}

/// The columns [`Opened::lease_first`] works on.
pub struct LeaseColumns {
    /// The index it scans: (queue, visible_at, seq).
    pub queue: Col,
    pub visible_at: Col,
    pub seq: Col,
    /// Due when NULL or at or before `due`; set to the lease's end.
    pub leased_until: Col,
    /// Set to `now`.
    pub taken_at: Col,
    /// One more.
    pub takes: Col,
    /// Returned.
    pub key: Col,
}

/// How many entries of its queue a take's scan reads before it stops and is
/// begun again after them (see `Opened::lease_first`): a take at the head
/// of a queue that 16 workers take from passes over about 8 rows others hold.
pub(super) const FIRST_WINDOW: u32 = 16;

/// The end of a take's scan: the second key's one member, which holds for
/// the next `left` entries of `queue` the btree checks (a page's high key
/// among them: it checks that at the end of each page it reads) and for none
/// after them or of another queue (bytes compared, as the column's "C"
/// collation orders them). Lives on the stack of the scan it ends, which
/// reads it through the key's argument.
pub(super) struct Window {
    queue: pg_sys::Datum,
    left: std::cell::Cell<u32>,
    closed: std::cell::Cell<bool>,
}

impl Window {
    pub(super) fn new(queue: pg_sys::Datum, entries: u32) -> Self {
        Window {
            queue,
            left: std::cell::Cell::new(entries),
            closed: std::cell::Cell::new(false),
        }
    }

    /// Whether the window (not the queue's end) ended the scan; if so, it
    /// holds from now on for every entry of the queue.
    pub(super) fn reopen(&self) -> bool {
        let closed = self.closed.replace(false);
        if closed {
            self.left.set(u32::MAX);
        }
        closed
    }

    /// The member's comparison, called by the btree code for each entry the
    /// scan checks (after the first key held) with the entry's `queue` and
    /// the key's argument, our `Window`: 0 (the entry is within) or 1 (it
    /// is past the end). It calls nothing in the server and cannot fail.
    unsafe extern "C-unwind" fn compare(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
        // SAFETY: the btree code calls a scan key's function with two
        // non-NULL arguments (the function is strict): an index entry's
        // `text` and this key's argument, a `Window` that outlives the scan.
        unsafe {
            let args = (*fcinfo).args.as_slice(2);
            let window = &*(args[1].value.cast_mut_ptr::<Window>());
            let ours = match inline_bytes(args[0].value) {
                Some(stored) => inline_bytes(window.queue).is_some_and(|q| q == stored),
                // compressed: `within` decides on it
                None => true,
            };
            let left = window.left.get();
            if !ours {
                return pg_sys::Datum::from(1i32);
            }
            if left == 0 {
                window.closed.set(true);
                return pg_sys::Datum::from(1i32);
            }
            window.left.set(left - 1);
            pg_sys::Datum::from(0i32)
        }
    }
}

impl Opened {
    /// Lease the first row of queue `queue` at or after the place `from` in
    /// (visible_at, seq) order that is due by `due` (`visible_at` and any
    /// lease's end at or before it) and not locked by another transaction
    /// (skipped, as `FOR UPDATE SKIP LOCKED` does; one another take leased
    /// since our snapshot is passed over without being locked, as the
    /// statement would not): its lease ends `until`,
    /// it was taken `now`, taken once more. `leased` reads the row before its
    /// buffer is released. `None` when it cannot be done here (see the
    /// module comment), with nothing done; `Some(false)` when no row was
    /// leased.
    #[allow(clippy::too_many_arguments)]
    pub fn lease_first(
        &self,
        c: &LeaseColumns,
        queue: pg_sys::Datum,
        from: (pg_sys::TimestampTz, i64),
        due: pg_sys::TimestampTz,
        until: pg_sys::TimestampTz,
        now: pg_sys::TimestampTz,
        leased: impl FnOnce(Leased),
    ) -> Result<Option<bool>> {
        // SAFETY: as in `delete_if`; the new row version is formed from the
        // locked one's values with the table's own descriptor.
        if !self.may(pg_sys::ACL_UPDATE) || !self.shape.rewritable() {
            return Ok(None);
        }
        let (rel, shape) = (&self.rel, &self.shape);
        unsafe {
            let Some(scan_index) = shape.index_on(&[c.queue, c.visible_at, c.seq]) else {
                return Ok(None);
            };
            let [
                visible_at,
                seq,
                leased_until,
                taken_at,
                takes,
                key,
                queue_col,
            ] = [
                c.visible_at,
                c.seq,
                c.leased_until,
                c.taken_at,
                c.takes,
                c.key,
                c.queue,
            ]
            .map(|col| shape.attnums[col.0]);
            let typed =
                |cols: &[Col], oid: pg_sys::Oid| cols.iter().all(|col| shape.types[col.0] == oid);
            if !typed(&[c.queue, c.key], pg_sys::TEXTOID)
                || !typed(
                    &[c.visible_at, c.leased_until, c.taken_at],
                    pg_sys::TIMESTAMPTZOID,
                )
                || !typed(&[c.seq], pg_sys::INT8OID)
                || !typed(&[c.takes], pg_sys::INT4OID)
            {
                return Ok(None);
            }
            let index = Open(pg_sys::index_open(scan_index, pg_sys::AccessShareLock as _));
            pg_sys::CheckCmdReplicaIdentity(rel.0, pg_sys::CmdType::CMD_UPDATE);
            pg_sys::CommandCounterIncrement();
            let cid = pg_sys::GetCurrentCommandId(true);
            let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
            #[cfg(any(test, feature = "pg_test"))]
            if let Some(hook) = AFTER_SNAPSHOT.with(Cell::get) {
                hook();
            }
            // (queue, visible_at, seq) >= ($queue, $from): the one key the
            // index checks. A btree scan reads a leaf page at a time and
            // checks its keys against every entry from the start to the
            // page's end, though one row is wanted: with the statement's
            // three (queue =, the row comparison, visible_at <= due) that
            // was a quarter of a take's instructions. The end of the queue
            // and of what is due are checked here instead, on the entries
            // the scan hands back (it copies them out: `xs_want_itup`),
            // where the scan stops at the first past either, as those keys
            // made it stop. (Attribute numbers of the index's columns.)
            let mut row: [pg_sys::ScanKeyData; 3] = std::mem::zeroed();
            for (i, (proc_, collation, value)) in [
                (
                    pg_sys::F_BTTEXTCMP,
                    *(*index.0).rd_indcollation.add(0),
                    queue,
                ),
                (
                    pg_sys::F_TIMESTAMPTZ_CMP,
                    pg_sys::InvalidOid,
                    pg_sys::Datum::from(from.0),
                ),
                (
                    pg_sys::F_BTINT8CMP,
                    pg_sys::InvalidOid,
                    pg_sys::Datum::from(from.1),
                ),
            ]
            .into_iter()
            .enumerate()
            {
                let end = if i == 2 { pg_sys::SK_ROW_END } else { 0 };
                pg_sys::ScanKeyEntryInitialize(
                    &mut row[i],
                    (pg_sys::SK_ROW_MEMBER | end) as i32,
                    (i + 1) as pg_sys::AttrNumber,
                    pg_sys::BTGreaterEqualStrategyNumber as pg_sys::StrategyNumber,
                    pg_sys::InvalidOid,
                    collation,
                    pg_sys::Oid::from(proc_),
                    value,
                );
            }
            // A second key that only ends the scan: ROW(queue) <= the window,
            // a row comparison of one member that `Window::compare` decides.
            // It holds for the first `FIRST_WINDOW` entries of this queue
            // the btree checks and for none after them or of another queue;
            // required in the scan's direction, its first failure stops the
            // read of the page there. The btree reads a leaf page at a time,
            // checking the first key against every entry from the start to
            // the page's end, though a take wants a few: that was a fifth of
            // a take's instructions. Where the window closes before a row is
            // leased, the scan is begun again, with no window.
            let window = Window::new(queue, FIRST_WINDOW);
            let mut compare: pg_sys::FmgrInfo = std::mem::zeroed();
            compare.fn_addr = Some(Window::compare);
            compare.fn_oid = pg_sys::InvalidOid;
            compare.fn_nargs = 2;
            compare.fn_strict = true;
            compare.fn_mcxt = pg_sys::CurrentMemoryContext;
            let mut upper: [pg_sys::ScanKeyData; 1] = std::mem::zeroed();
            pg_sys::ScanKeyEntryInitializeWithInfo(
                &mut upper[0],
                (pg_sys::SK_ROW_MEMBER | pg_sys::SK_ROW_END) as i32,
                1,
                pg_sys::BTLessEqualStrategyNumber as pg_sys::StrategyNumber,
                pg_sys::InvalidOid,
                *(*index.0).rd_indcollation.add(0),
                &mut compare,
                pg_sys::Datum::from(&raw const window),
            );
            let mut keys: [pg_sys::ScanKeyData; 2] = std::mem::zeroed();
            for (k, strategy, members) in [
                (0, pg_sys::BTGreaterEqualStrategyNumber, row.as_mut_ptr()),
                (1, pg_sys::BTLessEqualStrategyNumber, upper.as_mut_ptr()),
            ] {
                keys[k].sk_flags = pg_sys::SK_ROW_HEADER as i32;
                keys[k].sk_attno = 1;
                keys[k].sk_strategy = strategy as pg_sys::StrategyNumber;
                keys[k].sk_argument = pg_sys::Datum::from(members);
            }
            let scan = begin_scan(rel.0, index.0, snapshot, &mut keys[..], true);
            let found = pg_sys::table_slot_create(rel.0, std::ptr::null_mut());
            let locked = pg_sys::table_slot_create(rel.0, std::ptr::null_mut());
            // the entry the scan is on: still of this queue, and due? (and
            // its place, kept for a scan begun again after it)
            let last = std::cell::Cell::new(None);
            let within = || {
                let mut values = [pg_sys::Datum::from(0); 3];
                let mut nulls = [true; 3];
                pg_sys::index_deform_tuple(
                    (*scan).xs_itup,
                    (*scan).xs_itupdesc,
                    values.as_mut_ptr(),
                    nulls.as_mut_ptr(),
                );
                let ok = !nulls[0]
                    && !nulls[1]
                    && !nulls[2]
                    && same_bytes(values[0], queue)
                    && values[1].value() as i64 <= due;
                if ok {
                    last.set(Some((values[1], values[2], (*scan).xs_heaptid)));
                }
                ok
            };
            // the entry a window closed after, met first again by the scan
            // begun after it
            let mut seen: Option<pg_sys::ItemPointerData> = None;
            let is_due = |slot: *mut pg_sys::TupleTableSlot| {
                let place = (timestamptz(slot, visible_at), int8(slot, seq));
                let lease = timestamptz(slot, leased_until);
                match place {
                    (Some(v), Some(s))
                        if v <= due && (v, s) >= from && lease.is_none_or(|l| l <= due) =>
                    {
                        Some((v, s))
                    }
                    _ => None,
                }
            };
            let mut outcome = Ok(false);
            loop {
                pg_sys::check_for_interrupts!();
                // `index_getnext_slot`, with the entry looked at before the
                // heap (a chain that may hold another visible version is
                // followed on, as there)
                if !(*scan).xs_heap_continue {
                    let tid = pg_sys::index_getnext_tid(
                        scan,
                        pg_sys::ScanDirection::ForwardScanDirection,
                    );
                    if tid.is_null() {
                        // The window closed: on from the last entry handed
                        // back, which the new scan meets again (first among
                        // any of the same key: versions of one row), or
                        // from the same place when there was none (the
                        // window also counts the high key of each page read,
                        // and a run of pages whose entries are all marked
                        // dead has nothing else).
                        if window.reopen() {
                            if let Some((at, seq, tid)) = last.get() {
                                row[1].sk_argument = at;
                                row[2].sk_argument = seq;
                                seen = Some(tid);
                            }
                            pg_sys::index_rescan(
                                scan,
                                keys.as_mut_ptr(),
                                keys.len() as i32,
                                std::ptr::null_mut(),
                                0,
                            );
                            continue;
                        }
                        break;
                    }
                    if !within() {
                        break;
                    }
                    if seen.is_some_and(|s| same_tid(&s, &*tid)) {
                        seen = None;
                        continue;
                    }
                }
                if !pg_sys::index_fetch_heap(scan, found) {
                    continue;
                }
                let Some(found_place) = is_due(found) else {
                    continue;
                };
                // The lease written at once on the version found, where no
                // one holds it and no one changed it since our snapshot (a
                // lock first, the way below, was a record of its own in the
                // WAL, a fifth of a take's records, and one more exclusive
                // hold of the page); where someone does, nothing is written
                // and the way below decides, as it always did.
                let written = if looks_free(found) && same_text(found, queue_col, queue) {
                    match lease(
                        rel.0,
                        shape,
                        found,
                        (*found).tts_tid,
                        cid,
                        snapshot,
                        [leased_until, taken_at, takes],
                        until,
                        now,
                        true,
                    ) {
                        Ok(version) => version.map(|v| (v, found_place)),
                        Err(e) => {
                            outcome = Err(e);
                            break;
                        }
                    }
                } else {
                    None
                };
                #[cfg(any(test, feature = "pg_test"))]
                if written.is_some() {
                    UNLOCKED.with(|n| n.set(n.get() + 1));
                }
                let (version, place) = match written {
                    Some(written) => written,
                    None => {
                        let mut tid = (*found).tts_tid;
                        let lock = |tid: &mut pg_sys::ItemPointerData, flags: u32| {
                            lock_version(
                                rel.0,
                                tid,
                                snapshot,
                                locked,
                                cid,
                                pg_sys::LockTupleMode::LockTupleExclusive,
                                pg_sys::LockWaitPolicy::LockWaitSkip,
                                flags as u8,
                            )
                        };
                        let (mut result, failure) = lock(&mut tid, 0);
                        if result == pg_sys::TM_Result::TM_Updated && !repeatable() {
                            // Changed since our snapshot, by a commit: most often
                            // another take's lease. A lock on the newest version,
                            // taken only to find it leased, would stay to our
                            // commit and make that taker's `done` wait for us; so
                            // the version the change made is read unlocked first,
                            // and the newest locked only when that one is due, or
                            // when it is not the newest itself (a row changed
                            // again since, say leased and then made due again in
                            // place: the statement locks the newest version and
                            // rechecks that, and so do we).
                            let mut next = failure.ctid;
                            if pg_sys::table_tuple_fetch_row_version(
                                rel.0,
                                &mut next,
                                &raw mut pg_sys::SnapshotAnyData,
                                locked,
                            ) && is_due(locked).is_none()
                                && looks_newest(locked)
                            {
                                continue;
                            }
                            (result, _) = lock(&mut tid, pg_sys::TUPLE_LOCK_FLAG_FIND_LAST_VERSION);
                        }
                        if let Some(e) = changed_since_snapshot(result) {
                            outcome = Err(e);
                            break;
                        }
                        match result {
                            pg_sys::TM_Result::TM_Ok => {}
                            // another taker holds it; or this command itself
                            pg_sys::TM_Result::TM_WouldBlock
                            | pg_sys::TM_Result::TM_SelfModified => {
                                continue;
                            }
                            pg_sys::TM_Result::TM_Deleted => continue,
                            other => {
                                outcome = Err(unexpected("table_tuple_lock", other));
                                break;
                            }
                        }
                        // the newest version, locked: due as it stands now? (it may
                        // be one committed after our snapshot, which the lock went on
                        // to; the key cannot have changed unnoticed either)
                        let Some(place) = is_due(locked) else {
                            continue;
                        };
                        if !same_text(locked, queue_col, queue) {
                            continue;
                        }
                        let tid = (*locked).tts_tid;
                        match lease(
                            rel.0,
                            shape,
                            locked,
                            tid,
                            cid,
                            snapshot,
                            [leased_until, taken_at, takes],
                            until,
                            now,
                            false,
                        ) {
                            Ok(Some(version)) => (version, place),
                            // (not given without `unless_held`)
                            Ok(None) => continue,
                            Err(e) => {
                                outcome = Err(e);
                                break;
                            }
                        }
                    }
                };
                // (the key is NOT NULL)
                let key = slot_value(version, key).unwrap_or(pg_sys::Datum::from(0));
                leased(Leased {
                    key,
                    place,
                    tid: (*version).tts_tid,
                });
                pg_sys::ExecDropSingleTupleTableSlot(version);
                outcome = Ok(true);
                break;
            }
            pg_sys::index_endscan(scan);
            pg_sys::ExecDropSingleTupleTableSlot(found);
            pg_sys::ExecDropSingleTupleTableSlot(locked);
            pg_sys::UnregisterSnapshot(snapshot);
            count_served();
            outcome.map(Some)
        }
    }
}
