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
    /// Its `attempts` column (failed passes; `None` where NULL, none).
    pub attempts: Option<i32>,
    /// Its `jsonb` input column (`None` where NULL), pointing into the new
    /// row version (possibly a toast pointer: copy it detoasted).
    pub input: Option<pg_sys::Datum>,
}

/// What a take's gate says of a due row (see [`Admitting`]).
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Admit {
    /// Lease it.
    Lease,
    /// Pass over it, as a row another take holds is passed over.
    PassOver,
    /// Lease nothing more: the scan ends here.
    Stop,
}

/// A gate [`Opened::lease_first`] asks of each due row before it leases
/// it, on the very version it would lease (the newest, no one else's): with
/// the row's `group` column (`None` where NULL) and its place.
pub struct Admitting<'a> {
    /// A `text` column of the table.
    pub group: Col,
    pub ask: &'a mut dyn FnMut(Option<pg_sys::Datum>, (pg_sys::TimestampTz, i64)) -> Result<Admit>,
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
    /// Returned (an `integer`: the passes that failed).
    pub attempts: Col,
    /// Returned (a `jsonb`).
    pub input: Col,
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
    /// leased. Where `admit` is given, each due row is leased only where
    /// it says so (see [`Admitting`]).
    #[allow(clippy::too_many_arguments)]
    pub fn lease_first(
        &self,
        c: &LeaseColumns,
        queue: pg_sys::Datum,
        from: (pg_sys::TimestampTz, i64),
        due: pg_sys::TimestampTz,
        until: pg_sys::TimestampTz,
        now: pg_sys::TimestampTz,
        mut admit: Option<Admitting<'_>>,
        leased: impl FnOnce(Leased),
    ) -> Result<Option<bool>> {
        if !self.may(pg_sys::ACL_UPDATE) || !self.shape.rewritable() {
            return Ok(None);
        }
        let Some((scan_index, cols)) = self.lease_columns(c) else {
            return Ok(None);
        };
        let group = match &admit {
            Some(a) if self.shape.types[a.group.0] != pg_sys::TEXTOID => return Ok(None),
            Some(a) => Some(self.shape.attnums[a.group.0]),
            None => None,
        };
        let rel = self.rel.0;
        let lease = Lease {
            rel,
            shape: &self.shape,
            cols,
            queue,
            from,
            due,
            until,
            now,
            group,
            stopped: Cell::new(false),
            lapsed: Cell::new(false),
        };
        // SAFETY: inside a transaction, with the table open for writing (we
        // hold `rel`); everything begun here (the index opened, the
        // snapshot registered, the slots, the scan) is ended before we
        // return, and on an error Postgres raises beneath us its abort
        // releases all of them (see `unwinding`).
        unsafe {
            let index = Open(pg_sys::index_open(scan_index, pg_sys::AccessShareLock as _));
            pg_sys::CheckCmdReplicaIdentity(rel, pg_sys::CmdType::CMD_UPDATE);
            pg_sys::CommandCounterIncrement();
            let cid = pg_sys::GetCurrentCommandId(true);
            let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
            #[cfg(any(test, feature = "pg_test"))]
            if let Some(hook) = AFTER_SNAPSHOT.with(Cell::get) {
                hook();
            }
            let mut scan = QueueScan::begin(rel, index.0, snapshot, queue, from, due);
            let found = pg_sys::table_slot_create(rel, std::ptr::null_mut());
            let locked = pg_sys::table_slot_create(rel, std::ptr::null_mut());
            let outcome = (|| {
                while scan.next(found) {
                    let Some(place) = lease.due_place(found) else {
                        continue;
                    };
                    if lease.lapsed_at(found) {
                        break;
                    }
                    // The lease written at once on the version found, where
                    // no one holds it and no one changed it since our
                    // snapshot (a lock first, the way below, was a record of
                    // its own in the WAL, a fifth of a take's records, and
                    // one more exclusive hold of the page); where someone
                    // does, nothing is written and the way below decides, as
                    // it always did.
                    let written =
                        match lease.write_if_free(found, place, cid, snapshot, &mut admit)? {
                            Tried::Written(version) => {
                                #[cfg(any(test, feature = "pg_test"))]
                                UNLOCKED.with(|n| n.set(n.get() + 1));
                                Some((version, place))
                            }
                            Tried::Passed => None,
                            Tried::Undecided => {
                                lease.lock_and_write(found, locked, cid, snapshot, &mut admit)?
                            }
                        };
                    let Some((version, place)) = written else {
                        if lease.stopped.get() || lease.lapsed.get() {
                            break;
                        }
                        continue;
                    };
                    // (the key is NOT NULL)
                    let key = slot_value(version, cols.key).unwrap_or(pg_sys::Datum::from(0));
                    let attempts = slot_value(version, cols.attempts).map(|d| d.value() as i32);
                    let input = slot_value(version, cols.input);
                    leased(Leased {
                        key,
                        place,
                        tid: (*version).tts_tid,
                        attempts,
                        input,
                    });
                    pg_sys::ExecDropSingleTupleTableSlot(version);
                    return Ok(true);
                }
                Ok(false)
            })();
            scan.end();
            pg_sys::ExecDropSingleTupleTableSlot(found);
            pg_sys::ExecDropSingleTupleTableSlot(locked);
            pg_sys::UnregisterSnapshot(snapshot);
            count_served();
            // a failed pass met: nothing leased, the statement to run
            outcome.map(|leased| (!lease.lapsed.get()).then_some(leased))
        }
    }

    /// The index `lease_first` scans, (queue, visible_at, seq), and the
    /// attribute numbers of `c`'s columns; `None` where the table has no
    /// such index or a column is not of the type the lease reads it as.
    fn lease_columns(&self, c: &LeaseColumns) -> Option<(pg_sys::Oid, Attnums)> {
        let shape = &self.shape;
        let typed =
            |cols: &[Col], oid: pg_sys::Oid| cols.iter().all(|col| shape.types[col.0] == oid);
        if !typed(&[c.queue, c.key], pg_sys::TEXTOID)
            || !typed(
                &[c.visible_at, c.leased_until, c.taken_at],
                pg_sys::TIMESTAMPTZOID,
            )
            || !typed(&[c.seq], pg_sys::INT8OID)
            || !typed(&[c.takes, c.attempts], pg_sys::INT4OID)
            || !typed(&[c.input], pg_sys::JSONBOID)
        {
            return None;
        }
        let index = shape.index_on(&[c.queue, c.visible_at, c.seq])?;
        let at = |col: Col| shape.attnums[col.0];
        Some((
            index,
            Attnums {
                queue: at(c.queue),
                visible_at: at(c.visible_at),
                seq: at(c.seq),
                leased_until: at(c.leased_until),
                taken_at: at(c.taken_at),
                takes: at(c.takes),
                key: at(c.key),
                attempts: at(c.attempts),
                input: at(c.input),
            },
        ))
    }
}

/// The attribute numbers of [`LeaseColumns`]' columns in the table.
#[derive(Clone, Copy)]
struct Attnums {
    queue: pg_sys::AttrNumber,
    visible_at: pg_sys::AttrNumber,
    seq: pg_sys::AttrNumber,
    leased_until: pg_sys::AttrNumber,
    taken_at: pg_sys::AttrNumber,
    takes: pg_sys::AttrNumber,
    key: pg_sys::AttrNumber,
    attempts: pg_sys::AttrNumber,
    input: pg_sys::AttrNumber,
}

/// One `lease_first`: what it leases and how, for its steps.
struct Lease<'a> {
    rel: pg_sys::Relation,
    shape: &'a Shape,
    cols: Attnums,
    queue: pg_sys::Datum,
    from: (pg_sys::TimestampTz, i64),
    due: pg_sys::TimestampTz,
    until: pg_sys::TimestampTz,
    now: pg_sys::TimestampTz,
    /// The gate's column, where there is a gate.
    group: Option<pg_sys::AttrNumber>,
    /// The gate said [`Admit::Stop`].
    stopped: Cell<bool>,
    /// The scan met a due row whose lease ran out: a failed pass, which the
    /// take's statement counts (its attempt, its backoff), not this.
    lapsed: Cell<bool>,
}

/// What [`Lease::write_if_free`] did.
enum Tried {
    /// Leased: the slot of the new version.
    Written(*mut pg_sys::TupleTableSlot),
    /// The gate passed over the row, with nothing written.
    Passed,
    /// Nothing written: [`Lease::lock_and_write`] decides.
    Undecided,
}

impl Lease<'_> {
    /// Whether the gate, where there is one, lets the row version in
    /// `slot`, at `place`, be leased.
    ///
    /// # Safety
    /// `slot` holds a version of the table.
    unsafe fn admits(
        &self,
        slot: *mut pg_sys::TupleTableSlot,
        place: (pg_sys::TimestampTz, i64),
        admit: &mut Option<Admitting<'_>>,
    ) -> Result<bool> {
        let (Some(a), Some(group)) = (admit.as_mut(), self.group) else {
            return Ok(true);
        };
        // SAFETY: the slot holds a row of the table; the gate's column is
        // `text` (checked in `lease_first`).
        let value = unsafe { slot_value(slot, group) };
        match (a.ask)(value, place)? {
            Admit::Lease => Ok(true),
            Admit::PassOver => Ok(false),
            Admit::Stop => {
                self.stopped.set(true);
                Ok(false)
            }
        }
    }

    /// The place of the row version in `slot`, where it is at or after
    /// `from` and due (its `visible_at` and any lease's end at or before
    /// `due`).
    ///
    /// # Safety
    /// `slot` holds a version of the table (the scan's or the lock's).
    /// Whether the due row in `slot` is one whose lease ran out (noted in
    /// `lapsed`): its pass failed, and counting that is the statement's.
    ///
    /// # Safety
    /// As [`Lease::due_place`].
    unsafe fn lapsed_at(&self, slot: *mut pg_sys::TupleTableSlot) -> bool {
        // SAFETY: as in `due_place`
        let lapsed = unsafe { timestamptz(slot, self.cols.leased_until).is_some() };
        if lapsed {
            self.lapsed.set(true);
        }
        lapsed
    }

    unsafe fn due_place(
        &self,
        slot: *mut pg_sys::TupleTableSlot,
    ) -> Option<(pg_sys::TimestampTz, i64)> {
        // SAFETY: the slot holds a row of the table; the columns were found
        // to be `timestamptz` and `bigint` (`lease_columns`).
        unsafe {
            let place = (
                timestamptz(slot, self.cols.visible_at),
                int8(slot, self.cols.seq),
            );
            let lease = timestamptz(slot, self.cols.leased_until);
            match place {
                (Some(v), Some(s))
                    if v <= self.due
                        && (v, s) >= self.from
                        && lease.is_none_or(|l| l <= self.due) =>
                {
                    Some((v, s))
                }
                _ => None,
            }
        }
    }

    /// The lease written on the version the scan found, in `found` (at
    /// `place`), where it looks free (no one holds it, no one changed it
    /// since our snapshot), is of our queue and the gate admits it: the slot
    /// of the new version; or nothing written, the gate having passed over
    /// the row, or for [`Lease::lock_and_write`] to decide.
    ///
    /// # Safety
    /// `found` holds the version the scan fetched, its buffer pinned;
    /// `snapshot` is the scan's, registered; `cid` is this command's.
    unsafe fn write_if_free(
        &self,
        found: *mut pg_sys::TupleTableSlot,
        place: (pg_sys::TimestampTz, i64),
        cid: pg_sys::CommandId,
        snapshot: pg_sys::Snapshot,
        admit: &mut Option<Admitting<'_>>,
    ) -> Result<Tried> {
        // SAFETY: as this function's contract; `lease` with `unless_held`
        // writes nothing where the version turns out held after all.
        unsafe {
            if !looks_free(found) || !same_text(found, self.cols.queue, self.queue) {
                return Ok(Tried::Undecided);
            }
            if !self.admits(found, place, admit)? {
                return Ok(Tried::Passed);
            }
            let written = lease(
                self.rel,
                self.shape,
                found,
                (*found).tts_tid,
                cid,
                snapshot,
                [self.cols.leased_until, self.cols.taken_at, self.cols.takes],
                self.until,
                self.now,
                true,
            )?;
            Ok(written.map_or(Tried::Undecided, Tried::Written))
        }
    }

    /// The row of the version in `found` locked as `FOR UPDATE SKIP LOCKED`
    /// locks it (its newest version, read committed, into `locked`) and
    /// leased where it is still due and of our queue: the slot of the new
    /// version and the row's place; `None` where it was passed over (held by
    /// another transaction, gone, no longer due, or not admitted by the
    /// gate: then it stays locked, as `FOR UPDATE` leaves a row it locked).
    ///
    /// # Safety
    /// As [`Lease::write_if_free`]; `locked` is another slot of the table.
    unsafe fn lock_and_write(
        &self,
        found: *mut pg_sys::TupleTableSlot,
        locked: *mut pg_sys::TupleTableSlot,
        cid: pg_sys::CommandId,
        snapshot: pg_sys::Snapshot,
        admit: &mut Option<Admitting<'_>>,
    ) -> Result<Option<(*mut pg_sys::TupleTableSlot, (pg_sys::TimestampTz, i64))>> {
        // SAFETY: the table is open, its slots and the snapshot live to the
        // end of the scan; the lock is kept to the end of the transaction,
        // as `FOR UPDATE`'s is.
        unsafe {
            // (a version another take leased since is passed over unlocked:
            // `lock_skipping`; one made due again in place is rechecked)
            let result = lock_skipping(self.rel, (*found).tts_tid, snapshot, locked, cid, |v| {
                self.due_place(v).is_some()
            });
            if let Some(e) = changed_since_snapshot(result) {
                return Err(e);
            }
            match result {
                pg_sys::TM_Result::TM_Ok => {}
                // another taker holds it; or this command itself
                pg_sys::TM_Result::TM_WouldBlock | pg_sys::TM_Result::TM_SelfModified => {
                    return Ok(None);
                }
                pg_sys::TM_Result::TM_Deleted => return Ok(None),
                other => return Err(unexpected("table_tuple_lock", other)),
            }
            // the newest version, locked: due as it stands now? (it may be
            // one committed after our snapshot, which the lock went on to;
            // the key cannot have changed unnoticed either)
            let Some(place) = self.due_place(locked) else {
                return Ok(None);
            };
            if self.lapsed_at(locked) {
                return Ok(None);
            }
            if !same_text(locked, self.cols.queue, self.queue)
                || !self.admits(locked, place, admit)?
            {
                return Ok(None);
            }
            let tid = (*locked).tts_tid;
            let version = lease(
                self.rel,
                self.shape,
                locked,
                tid,
                cid,
                snapshot,
                [self.cols.leased_until, self.cols.taken_at, self.cols.takes],
                self.until,
                self.now,
                false,
            )?;
            // (`None` is not given without `unless_held`)
            Ok(version.map(|v| (v, place)))
        }
    }
}

/// The scan of a take over the queue's index, (queue, visible_at, seq): its
/// keys, the window that ends it, and where it got to. The scan holds
/// pointers into the keys and the keys into the window, so all of it lives
/// in one box that does not move while the scan does.
struct QueueScan {
    /// (queue, visible_at, seq) >= ($queue, $from): the members of the one
    /// key the index checks.
    row: [pg_sys::ScanKeyData; 3],
    /// The one member of the key that ends the scan (see `begin`).
    upper: [pg_sys::ScanKeyData; 1],
    /// The two row comparisons the scan is given.
    keys: [pg_sys::ScanKeyData; 2],
    compare: pg_sys::FmgrInfo,
    window: Window,
    scan: pg_sys::IndexScanDesc,
    queue: pg_sys::Datum,
    due: pg_sys::TimestampTz,
    /// The last entry handed back that was of the queue and due (its
    /// place and heap tid), for a scan begun again after it.
    last: Option<(pg_sys::Datum, pg_sys::Datum, pg_sys::ItemPointerData)>,
    /// The entry a window closed after, met first again by the scan begun
    /// after it.
    seen: Option<pg_sys::ItemPointerData>,
}

impl QueueScan {
    /// The scan begun from `from` in queue `queue`.
    ///
    /// # Safety
    /// `rel` and `index` are open (`index` the table's (queue, visible_at,
    /// seq) btree), `snapshot` is registered; the scan is ended by
    /// [`QueueScan::end`] before any of them goes.
    unsafe fn begin(
        rel: pg_sys::Relation,
        index: pg_sys::Relation,
        snapshot: pg_sys::Snapshot,
        queue: pg_sys::Datum,
        from: (pg_sys::TimestampTz, i64),
        due: pg_sys::TimestampTz,
    ) -> Box<QueueScan> {
        // SAFETY: the keys are plain data, zeroed then filled as
        // `ScanKeyEntryInitialize` fills them; every pointer set between
        // them (the row members, the window, the comparison) points into the
        // box, which is not moved again; the scan is begun last, on keys
        // complete, as the caller's contract allows.
        unsafe {
            let mut s = Box::new(QueueScan {
                row: std::mem::zeroed(),
                upper: std::mem::zeroed(),
                keys: std::mem::zeroed(),
                compare: std::mem::zeroed(),
                window: Window::new(queue, FIRST_WINDOW),
                scan: std::ptr::null_mut(),
                queue,
                due,
                last: None,
                seen: None,
            });
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
            for (i, (proc_, collation, value)) in [
                (pg_sys::F_BTTEXTCMP, *(*index).rd_indcollation.add(0), queue),
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
                    &mut s.row[i],
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
            s.compare.fn_addr = Some(Window::compare);
            s.compare.fn_oid = pg_sys::InvalidOid;
            s.compare.fn_nargs = 2;
            s.compare.fn_strict = true;
            s.compare.fn_mcxt = pg_sys::CurrentMemoryContext;
            let window = pg_sys::Datum::from(&raw const s.window);
            let compare = &raw mut s.compare;
            pg_sys::ScanKeyEntryInitializeWithInfo(
                &mut s.upper[0],
                (pg_sys::SK_ROW_MEMBER | pg_sys::SK_ROW_END) as i32,
                1,
                pg_sys::BTLessEqualStrategyNumber as pg_sys::StrategyNumber,
                pg_sys::InvalidOid,
                *(*index).rd_indcollation.add(0),
                compare,
                window,
            );
            let members = [s.row.as_mut_ptr(), s.upper.as_mut_ptr()];
            for (k, (strategy, members)) in [
                pg_sys::BTGreaterEqualStrategyNumber,
                pg_sys::BTLessEqualStrategyNumber,
            ]
            .into_iter()
            .zip(members)
            .enumerate()
            {
                s.keys[k].sk_flags = pg_sys::SK_ROW_HEADER as i32;
                s.keys[k].sk_attno = 1;
                s.keys[k].sk_strategy = strategy as pg_sys::StrategyNumber;
                s.keys[k].sk_argument = pg_sys::Datum::from(members);
            }
            s.scan = begin_scan(rel, index, snapshot, &mut s.keys[..], true);
            s
        }
    }

    /// The next version of a row of the queue due by `due`, fetched into
    /// `slot`: `index_getnext_slot`, with each entry looked at before the
    /// heap (a chain that may hold another visible version is followed on,
    /// as there). `false` at the queue's end or the first entry not due.
    ///
    /// # Safety
    /// Begun by [`QueueScan::begin`] and not ended; `slot` is one of the
    /// table's.
    unsafe fn next(&mut self, slot: *mut pg_sys::TupleTableSlot) -> bool {
        // SAFETY: the scan is live (this function's contract); the entry it
        // copied out (`xs_itup`) is read only while it is on it.
        unsafe {
            loop {
                pg_sys::check_for_interrupts!();
                if !(*self.scan).xs_heap_continue {
                    let tid = pg_sys::index_getnext_tid(
                        self.scan,
                        pg_sys::ScanDirection::ForwardScanDirection,
                    );
                    if tid.is_null() {
                        if self.reopen() {
                            continue;
                        }
                        return false;
                    }
                    if !self.within() {
                        return false;
                    }
                    if self.seen.is_some_and(|s| same_tid(&s, &*tid)) {
                        self.seen = None;
                        continue;
                    }
                }
                if pg_sys::index_fetch_heap(self.scan, slot) {
                    return true;
                }
            }
        }
    }

    /// The window closed: on from the last entry handed back, which the new
    /// scan meets again (first among any of the same key: versions of one
    /// row), or from the same place when there was none (the window also
    /// counts the high key of each page read, and a run of pages whose
    /// entries are all marked dead has nothing else). `false` where the
    /// queue's end, not the window, ended the scan.
    ///
    /// # Safety
    /// As [`QueueScan::next`].
    unsafe fn reopen(&mut self) -> bool {
        if !self.window.reopen() {
            return false;
        }
        if let Some((at, seq, tid)) = self.last {
            self.row[1].sk_argument = at;
            self.row[2].sk_argument = seq;
            self.seen = Some(tid);
        }
        // SAFETY: the scan is live; its keys are ours, in the box.
        unsafe {
            pg_sys::index_rescan(
                self.scan,
                self.keys.as_mut_ptr(),
                self.keys.len() as i32,
                std::ptr::null_mut(),
                0,
            );
        }
        true
    }

    /// Whether the entry the scan is on is still of the queue and due (and
    /// its place, kept for a scan begun again after it).
    ///
    /// # Safety
    /// As [`QueueScan::next`], the scan on an entry.
    unsafe fn within(&mut self) -> bool {
        // SAFETY: the scan copied the entry out (`xs_want_itup`) with its
        // descriptor; its three columns are the index's.
        unsafe {
            let mut values = [pg_sys::Datum::from(0); 3];
            let mut nulls = [true; 3];
            pg_sys::index_deform_tuple(
                (*self.scan).xs_itup,
                (*self.scan).xs_itupdesc,
                values.as_mut_ptr(),
                nulls.as_mut_ptr(),
            );
            let ok = !nulls[0]
                && !nulls[1]
                && !nulls[2]
                && same_bytes(values[0], self.queue)
                && values[1].value() as i64 <= self.due;
            if ok {
                self.last = Some((values[1], values[2], (*self.scan).xs_heaptid));
            }
            ok
        }
    }

    /// The scan ended.
    ///
    /// # Safety
    /// As [`QueueScan::next`]; not used again.
    unsafe fn end(self: Box<Self>) {
        // SAFETY: begun by `begin`, ended once (the box goes with it).
        unsafe { pg_sys::index_endscan(self.scan) }
    }
}
