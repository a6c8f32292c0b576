//! Index scans by key and the reading of a row version's columns.

use super::*;

/// `key` set to "index column `i` = `value`" for a `text` column of `index`.
///
/// # Safety
/// `index` is open; its column `i` is `text`.
pub(super) unsafe fn equal_key(
    key: &mut pg_sys::ScanKeyData,
    index: pg_sys::Relation,
    i: usize,
    value: pg_sys::Datum,
) {
    // SAFETY: within the contract above: `index` is open; its column `i` is `text`.
    unsafe {
        pg_sys::ScanKeyEntryInitialize(
            key,
            0,
            (i + 1) as pg_sys::AttrNumber,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::InvalidOid,
            *(*index).rd_indcollation.add(i),
            pg_sys::Oid::from(pg_sys::F_TEXTEQ),
            value,
        );
    }
}

/// The most columns a key of [`Opened::delete_if`], [`Opened::lock`] or
/// [`Opened::upsert`] has.
pub(super) const MAX_KEYS: usize = 3;

/// The columns of `key`, without an allocation: `None` past [`MAX_KEYS`].
pub(super) fn cols_of(key: &[(Col, pg_sys::Datum)]) -> Option<([Col; MAX_KEYS], usize)> {
    if key.len() > MAX_KEYS {
        return None;
    }
    let mut cols = [Col(0); MAX_KEYS];
    for (c, &(col, _)) in cols.iter_mut().zip(key) {
        *c = col;
    }
    Some((cols, key.len()))
}

/// Scan keys "index column i = `key[i]`", for a key of `text` columns in
/// `index`'s order (at most [`MAX_KEYS`]; the rest of the array unused).
///
/// # Safety
/// `index` is open; its first `key.len()` columns are `text`.
pub(super) unsafe fn key_scan(
    index: pg_sys::Relation,
    key: &[(Col, pg_sys::Datum)],
) -> [pg_sys::ScanKeyData; MAX_KEYS] {
    // SAFETY: within the contract above: `index` is open; its first `key.len()` columns are
    // `text`.
    unsafe {
        let mut keys: [pg_sys::ScanKeyData; MAX_KEYS] = std::mem::zeroed();
        for (i, (k, &(_, v))) in keys.iter_mut().zip(key).enumerate() {
            equal_key(k, index, i, v);
        }
        keys
    }
}

/// The bytes of the `text` datum `value` when it is held in line and
/// uncompressed (a short or a plain header); `None` otherwise.
///
/// # Safety
/// `value` is a valid `text` datum, not read after what it points to goes.
pub(super) unsafe fn inline_bytes<'a>(value: pg_sys::Datum) -> Option<&'a [u8]> {
    // SAFETY: within the contract above: `value` is a valid `text` datum, not read after
    // what it points to goes.
    unsafe {
        let p = value.cast_mut_ptr::<pg_sys::varlena>();
        if pgrx::varlena::varatt_is_1b_e(p) || pgrx::varlena::varatt_is_4b_c(p) {
            return None;
        }
        Some(std::slice::from_raw_parts(
            pgrx::varlena::vardata_any(p).cast::<u8>(),
            pgrx::varlena::varsize_any_exhdr(p),
        ))
    }
}

pub(super) fn same_tid(a: &pg_sys::ItemPointerData, b: &pg_sys::ItemPointerData) -> bool {
    a.ip_blkid.bi_hi == b.ip_blkid.bi_hi
        && a.ip_blkid.bi_lo == b.ip_blkid.bi_lo
        && a.ip_posid == b.ip_posid
}

/// An index scan of `index` under `snapshot` with `keys`, positioned; with
/// `copying`, one that hands back a copy of each index entry it returns
/// (`xs_itup`), as an index-only scan's does.
///
/// # Safety
/// `rel` and `index` are open, `snapshot` is registered (or a dirty
/// snapshot of the caller's), `keys` are valid for `index` and outlive the
/// scan.
pub(super) unsafe fn begin_scan(
    rel: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    keys: &mut [pg_sys::ScanKeyData],
    copying: bool,
) -> pg_sys::IndexScanDesc {
    // SAFETY: within the contract above: `rel` and `index` are open, `snapshot` is
    // registered (or a dirty snapshot of the caller's), `keys` are valid for `index` and
    // outlive the scan.
    unsafe {
        let n = keys.len() as i32;
        #[cfg(feature = "pg18")]
        let scan = pg_sys::index_beginscan(rel, index, snapshot, std::ptr::null_mut(), n, 0);
        #[cfg(not(feature = "pg18"))]
        let scan = pg_sys::index_beginscan(rel, index, snapshot, n, 0);
        // before the rescan, which makes room for the copies
        (*scan).xs_want_itup = copying;
        pg_sys::index_rescan(scan, keys.as_mut_ptr(), n, std::ptr::null_mut(), 0);
        scan
    }
}

/// The `timestamptz` in attribute `attnum` of `slot`, `None` when NULL.
///
/// # Safety
/// `slot` holds a row of a table whose attribute `attnum` is `timestamptz`.
pub(super) unsafe fn timestamptz(
    slot: *mut pg_sys::TupleTableSlot,
    attnum: pg_sys::AttrNumber,
) -> Option<i64> {
    // SAFETY: within the contract above; a `timestamptz` is passed by value.
    unsafe { slot_value(slot, attnum).map(|v| v.value() as i64) }
}

/// The `bigint` in attribute `attnum` of `slot`, `None` when NULL.
///
/// # Safety
/// As [`timestamptz`], for a `bigint`.
pub(super) unsafe fn int8(
    slot: *mut pg_sys::TupleTableSlot,
    attnum: pg_sys::AttrNumber,
) -> Option<i64> {
    // SAFETY: within the contract above; a `bigint` is passed by value, as a
    // `timestamptz` is.
    unsafe { timestamptz(slot, attnum) }
}

/// Whether the `text` attribute `attnum` of `slot` holds the bytes of `value`.
///
/// # Safety
/// `slot` holds a row whose attribute `attnum` is `text`; `value` is a
/// detoasted `text` datum.
pub(super) unsafe fn same_text(
    slot: *mut pg_sys::TupleTableSlot,
    attnum: pg_sys::AttrNumber,
    value: pg_sys::Datum,
) -> bool {
    // SAFETY: within the contract above: the attribute is a `text` datum.
    unsafe { slot_value(slot, attnum).is_some_and(|v| same_bytes(v, value)) }
}

/// Attribute `attnum` (from 1) of `slot`, `None` when NULL: `slot_getattr`,
/// with the server asked to deform the row only as far as the slot has not
/// yet (one call for the several columns a take reads of a row).
///
/// # Safety
/// `slot` holds a row with at least `attnum` attributes.
pub(super) unsafe fn slot_value(
    slot: *mut pg_sys::TupleTableSlot,
    attnum: pg_sys::AttrNumber,
) -> Option<pg_sys::Datum> {
    // SAFETY: within the contract above: `slot` holds a row with at least `attnum`
    // attributes.
    unsafe {
        let n = i32::from(attnum);
        if i32::from((*slot).tts_nvalid) < n {
            pg_sys::slot_getsomeattrs_int(slot, n);
        }
        let i = (n - 1) as usize;
        (!*(*slot).tts_isnull.add(i)).then(|| *(*slot).tts_values.add(i))
    }
}

/// Whether the `text` datum `stored` (from a tuple: maybe short-headed or
/// compressed) holds the same bytes as `value` (a plain in-memory `text`).
///
/// # Safety
/// Both are valid `text` datums.
pub(super) unsafe fn same_bytes(stored: pg_sys::Datum, value: pg_sys::Datum) -> bool {
    // SAFETY: within the contract above: Both are valid `text` datums.
    unsafe {
        if let (Some(a), Some(b)) = (inline_bytes(stored), inline_bytes(value)) {
            return a == b;
        }
        let stored = pg_sys::pg_detoast_datum_packed(stored.cast_mut_ptr());
        let bytes = |p: *mut pg_sys::varlena| {
            std::slice::from_raw_parts(
                pgrx::varlena::vardata_any(p).cast::<u8>(),
                pgrx::varlena::varsize_any_exhdr(p),
            )
        };
        bytes(stored) == bytes(value.cast_mut_ptr())
    }
}

impl Opened {
    /// Whether a row visible now has `key` = `value` and `positive` above
    /// 0: one probe of the table's partial btree on (`key`, `positive`, …)
    /// `WHERE positive > 0` (`queue_prioritized`), which holds only such
    /// rows, as `SELECT EXISTS` over them would answer it in this
    /// transaction (a fresh snapshot where the statement would take one,
    /// and this transaction's own writes). `None` where the table has no
    /// such index or `key` is not `text`: a statement must say.
    pub fn any_positive(&self, key: Col, positive: Col, value: pg_sys::Datum) -> Option<bool> {
        let shape = &self.shape;
        if shape.types[key.0] != pg_sys::TEXTOID {
            return None;
        }
        let (key_at, positive_at) = (shape.attnums[key.0], shape.attnums[positive.0]);
        let index = shape.indexes.iter().find(|index| {
            index.keys.first() == Some(&key_at)
                && index.keys.get(1) == Some(&positive_at)
                && index.only == Some(Only::Positive(positive_at))
        })?;
        // SAFETY: inside a transaction, with the table open (`self.rel`);
        // the index opened, the snapshot registered, the slot and the scan
        // are ended before we return, and on an error raised beneath us the
        // abort releases them (see `unwinding`); the key is the index's
        // first column, `text`.
        unsafe {
            let opened = Open(pg_sys::index_open(index.oid, pg_sys::AccessShareLock as _));
            pg_sys::CommandCounterIncrement();
            let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
            let slot = pg_sys::table_slot_create(self.rel.0, std::ptr::null_mut());
            let mut keys: [pg_sys::ScanKeyData; 1] = std::mem::zeroed();
            equal_key(&mut keys[0], opened.0, 0, value);
            let scan = begin_scan(self.rel.0, opened.0, snapshot, &mut keys, false);
            let found =
                pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot);
            pg_sys::index_endscan(scan);
            pg_sys::ExecDropSingleTupleTableSlot(slot);
            pg_sys::UnregisterSnapshot(snapshot);
            // (a look before a call's row work, not a call served here:
            // not counted in `served`)
            Some(found)
        }
    }
}
