//! The hottest row operations done through the table and index access
//! methods, without a statement: `done`'s delete by primary key
//! ([`Opened::delete_if`]), a one-row `take`'s lease ([`Opened::lease_first`]),
//! the upserts of `schedule` and `claim` ([`Opened::upsert`], `INSERT ... ON
//! CONFLICT DO UPDATE` by the executor's protocol), and the parts of a
//! `finish` without a status: the claim row locked as `FOR UPDATE` locks it
//! ([`Opened::lock`], [`Opened::update`]), the step inserted as `ON CONFLICT
//! DO NOTHING` inserts it ([`Opened::insert_unless_there`]).
//!
//! A statement run through SPI pays, on every call, for the plan cache's
//! checks, an executor started and shut down around its plan and SPI's own
//! bookkeeping. For `done`, which deletes one row by key, that was most of its
//! cost over the plain `DELETE` a client sends (starting the `ModifyTable`
//! alone: ~14k instructions); for a one-row take, starting the plan of its
//! CTEs (lock, limit, index scan, update, TID scan, the join of the two) was
//! ~70k of 281k (docs/internals.md, take). Here the same work is what
//! the plan's nodes would do at run time: index descents, tuple locks,
//! `table_tuple_delete` and `table_tuple_update`.
//!
//! Only where nothing a statement would also do is skipped: a plain table,
//! not a partition, with no table inheriting from it, no triggers (foreign
//! keys that reference it are triggers), no rules, no row-level security and
//! no stored generated column; its indexes plain btrees on columns (no
//! expressions, no predicates, no deferred uniqueness), every key ascending
//! with NULLs last by its type's default operator class, `text` keys under a
//! deterministic collation; for an update or an insert, no `CHECK`
//! constraint; for an insert, no unique index but the primary key, and every
//! column the row does not name NULL-able with no default (its own, its
//! type's or a domain's), or with the very default the caller gives; no
//! module checking a statement's permissions itself (`ExecutorCheckPerms_hook`);
//! the
//! caller must hold, at the table level, the privileges the statement needs
//! (`DELETE`, `UPDATE` or both `INSERT` and `UPDATE`, and `SELECT`; what
//! `pg_class_aclcheck` answered is kept per role until an invalidation that
//! could change it); the transaction must be read-write. The whole list,
//! and how it is tested against the statements, is `docs/fastpath.md`.
//! Where any of that does not hold, the call answers `None` and the caller
//! runs its statement, which does what the executor does and raises what it
//! raises. What the executor does when a row changes under it is done here
//! too: a row locked or deleted by another transaction is waited for (the
//! delete) or skipped (the lease, as `SKIP LOCKED`); one updated and
//! committed since the snapshot is followed to its newest version and
//! rechecked, read committed, as EvalPlanQual would, and under repeatable read
//! or serializable fails with `40001`; an insert waits for a transaction
//! inserting the same key and then updates (or keeps) the row it committed. Predicate locks, WAL, statistics and a
//! publication's replica identity are the access methods' own work, or checked
//! as the executor checks them.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::rc::Rc;

use pgrx::pg_sys;

use crate::error::{Error, Result};
use crate::sequence::Sequence;

/// A table of ours by schema and name, with the columns its calls use.
pub struct Table {
    schema: &'static CStr,
    name: &'static CStr,
    /// Column names, referred to by position in the calls (see [`Col`]).
    columns: &'static [&'static CStr],
}

/// A column of a [`Table`], by its position in the table's `columns`.
#[derive(Clone, Copy)]
pub struct Col(pub usize);

/// What was found out about a table, until its next relcache invalidation.
#[derive(Clone)]
struct Known {
    relid: pg_sys::Oid,
    /// `None`: the table cannot be served here (see the module comment); the
    /// caller runs its statement. Shared: every call takes a copy of what is
    /// known, twice.
    shape: Option<Rc<Shape>>,
}

#[derive(Clone)]
struct Shape {
    /// The attribute number of each of the table's `columns`, and its type.
    attnums: Vec<pg_sys::AttrNumber>,
    types: Vec<pg_sys::Oid>,
    /// Every index.
    indexes: Vec<Index>,
    /// The primary key.
    pkey: pg_sys::Oid,
    /// Every attribute, by attribute number less one, as an insert sees it.
    attrs: Vec<Attr>,
    /// Whether the table has `CHECK` constraints.
    checks: bool,
    /// Whether it has a stored generated column, which every insert and
    /// update computes.
    generated: bool,
    /// This backend's last 32 upserts into the table, a bit each (the
    /// latest lowest): 1 where a row with the key was there. Where few were
    /// ([`FOUND_AT_MOST`]), the next upsert inserts before it looks (see
    /// [`Opened::insert`]).
    found: Cell<u32>,
}

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
const FOUND_AT_MOST: u32 = 4;

#[cfg(any(test, feature = "pg_test"))]
thread_local! {
    /// Upserts that inserted before looking, and how many of those met a
    /// row there: for the tests to see which way a call went.
    pub static INSERTED_FIRST: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

#[derive(Clone)]
struct Index {
    oid: pg_sys::Oid,
    /// Its key columns' attribute numbers, in order.
    keys: Vec<pg_sys::AttrNumber>,
    unique: bool,
}

/// An attribute of the table, for an insert.
#[derive(Clone, Copy)]
struct Attr {
    dropped: bool,
    not_null: bool,
    generated: bool,
    default: Stored,
}

/// A column's default, as far as an insert here can give it.
#[derive(Clone, Copy, PartialEq)]
enum Stored {
    None,
    /// An `integer` constant.
    Int4(i32),
    /// `nextval` of the sequence with this OID.
    Next(pg_sys::Oid),
    /// Anything else: only a statement can give it.
    Other,
}

impl Shape {
    /// Whether an update of a row can be written here: no `CHECK` to test,
    /// no generated column to compute (a statement's update does both).
    fn rewritable(&self) -> bool {
        !self.checks && !self.generated
    }

    /// The index whose key columns are exactly `cols`, in that order.
    fn index_on(&self, cols: &[Col]) -> Option<pg_sys::Oid> {
        self.indexes
            .iter()
            .find(|index| {
                index.keys.len() == cols.len()
                    && index
                        .keys
                        .iter()
                        .zip(cols)
                        .all(|(k, c)| *k == self.attnums[c.0])
            })
            .map(|index| index.oid)
    }
}

thread_local! {
    static KNOWN: RefCell<Vec<(*const Table, Known)>> = const { RefCell::new(Vec::new()) };
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    /// The table whose shape is being read, and whether an invalidation of
    /// it (or of everything) arrived meanwhile: a shape read across one may
    /// be older than it (a `CREATE INDEX`, which our `AccessShareLock` does
    /// not hold off, committed meanwhile), so it is used for that call only,
    /// never kept.
    static READING: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    static DISTURBED: Cell<bool> = const { Cell::new(false) };
    /// Whether a role holds a privilege on a table, as `pg_class_aclcheck`
    /// answered, by (role, table, privilege): kept until an invalidation
    /// that could change the answer (of the table: a `GRANT` or `REVOKE`;
    /// of any role or membership, or of a database, whose owner
    /// `pg_database_owner` stands for). `GRANTS_SEEN` counts those
    /// invalidations: an answer read across one is not kept.
    static GRANTS: RefCell<Vec<(pg_sys::Oid, pg_sys::Oid, u32, bool)>> =
        const { RefCell::new(Vec::new()) };
    static GRANTS_SEEN: Cell<u64> = const { Cell::new(0) };
    /// Calls served here, for the tests to see which way a call went.
    #[cfg(any(test, feature = "pg_test"))]
    static SERVED: Cell<u64> = const { Cell::new(0) };
    /// Leases written without a lock first (see [`Opened::lease_first`]).
    #[cfg(any(test, feature = "pg_test"))]
    static UNLOCKED: Cell<u64> = const { Cell::new(0) };
    /// Run by [`Opened::lease_first`] once its snapshot is taken, for a test
    /// to commit changes the lease must then find (another connection's).
    #[cfg(any(test, feature = "pg_test"))]
    static AFTER_SNAPSHOT: Cell<Option<fn()>> = const { Cell::new(None) };
}

/// How many shared invalidation messages this backend has taken in: one that
/// has taken in none since an earlier reading has seen no table truncated,
/// rewritten or dropped meanwhile (each sends one, and a backend takes them
/// in as it locks a table, before it uses it).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Invalidations(u64);

impl Invalidations {
    pub fn now() -> Self {
        // SAFETY: a counter of this backend's, only ever changed by itself.
        Invalidations(unsafe { pg_sys::SharedInvalidMessageCounter })
    }
}

/// How many leases this backend wrote without a lock first (tests only).
#[cfg(any(test, feature = "pg_test"))]
pub fn leased_unlocked() -> u64 {
    UNLOCKED.with(Cell::get)
}

/// How many calls this backend served here (tests only).
#[cfg(any(test, feature = "pg_test"))]
pub fn served() -> u64 {
    SERVED.with(Cell::get)
}

fn count_served() {
    #[cfg(any(test, feature = "pg_test"))]
    SERVED.with(|n| n.set(n.get() + 1));
}

/// Answers kept in `GRANTS`, at most.
const GRANTS_KEPT: usize = 64;

fn forget_grants() {
    GRANTS.with(|g| g.borrow_mut().clear());
    GRANTS_SEEN.with(|n| n.set(n.get() + 1));
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget_roles(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    forget_grants();
}

/// Register, once per backend, the callbacks that clear what this module
/// keeps (shapes and OIDs, privileges): before anything is kept, so no
/// invalidation can come between a kept answer and its callback.
fn watch() {
    if WATCHING.with(Cell::get) {
        return;
    }
    // SAFETY: registering callbacks that only clear our caches.
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(Some(forget), pg_sys::Datum::from(0));
        for cache in [
            pg_sys::SysCacheIdentifier::AUTHOID,
            pg_sys::SysCacheIdentifier::AUTHMEMMEMROLE,
            pg_sys::SysCacheIdentifier::AUTHMEMROLEMEM,
            pg_sys::SysCacheIdentifier::DATABASEOID,
        ] {
            pg_sys::CacheRegisterSyscacheCallback(
                cache as _,
                Some(forget_roles),
                pg_sys::Datum::from(0),
            );
        }
    }
    WATCHING.with(|w| w.set(true));
}

/// Whether the current role holds `privilege` on the relation `relid` (a
/// table, or one of our sequences).
pub(crate) fn holds(relid: pg_sys::Oid, privilege: u32) -> bool {
    watch();
    // SAFETY: a backend-local lookup and the ACL check of a relation that
    // exists (we hold no lock yet, as ExecCheckPermissions holds none).
    unsafe {
        let user = pg_sys::GetUserId();
        let kept = GRANTS.with(|g| {
            g.borrow()
                .iter()
                .find(|&&(u, r, p, _)| u == user && r == relid && p == privilege)
                .map(|&(.., held)| held)
        });
        if let Some(held) = kept {
            return held;
        }
        let seen = GRANTS_SEEN.with(Cell::get);
        let held = pg_sys::pg_class_aclcheck(relid, user, privilege as pg_sys::AclMode)
            == pg_sys::AclResult::ACLCHECK_OK;
        if GRANTS_SEEN.with(Cell::get) == seen {
            GRANTS.with(|g| {
                let mut grants = g.borrow_mut();
                if grants.len() >= GRANTS_KEPT {
                    grants.clear();
                }
                grants.push((user, relid, privilege, held));
            });
        }
        held
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    if relid == pg_sys::InvalidOid || relid == READING.with(Cell::get) {
        DISTURBED.with(|d| d.set(true));
    }
    forget_grants();
    // a table's own invalidation also comes when an index is created or
    // dropped on it, or its columns change; an index's, when it is rebuilt
    KNOWN.with(|k| {
        k.borrow_mut().retain(|(_, known)| {
            relid != pg_sys::InvalidOid
                && known.relid != relid
                && !known
                    .shape
                    .as_ref()
                    .is_some_and(|s| s.indexes.iter().any(|index| index.oid == relid))
        })
    });
}

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

/// A value an insert gives a column the call leaves out: what the column's
/// default must be for the insert to be done here.
pub enum Fill {
    /// An `integer` constant.
    Int4(i32),
    /// The sequence's next value (`nextval`), taken only when a row is
    /// inserted.
    Next(&'static Sequence),
}

/// What [`Opened::upsert`] writes: the row an `INSERT ... ON CONFLICT (key)
/// DO UPDATE` of these columns would.
pub struct Upsert<'a> {
    /// The primary key's `text` columns, in its order, and their values.
    pub key: &'a [(Col, pg_sys::Datum)],
    /// Columns the insert writes and the update writes over a row already
    /// there, with their types and values (`None`: NULL).
    pub set: &'a [(Col, pg_sys::Oid, Option<pg_sys::Datum>)],
    /// Columns the insert writes and the update leaves as they are.
    pub insert_only: &'a [(Col, pg_sys::Oid, Option<pg_sys::Datum>)],
    /// Columns the insert leaves to their defaults, which must be these.
    pub fill: &'a [(Col, Fill)],
    /// The update's condition (`DO UPDATE ... WHERE`): this `timestamptz`
    /// column of the row there at or before the value; unmet, the row is
    /// kept as it is (locked). `None`: always.
    pub only_if: Option<(Col, pg_sys::TimestampTz)>,
    /// A `bigint` column the update sets to the row's own plus one (`col =
    /// col + 1`), not to its value in `set` (which the insert gives it).
    pub increment: Option<Col>,
}

/// What [`Opened::upsert`] did.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Upserted {
    /// No row had the key: the new one went in.
    Inserted,
    /// The row there was updated; `increment`'s column now holds this.
    Updated(Option<i64>),
    /// The row there was kept as it was, locked (`only_if` unmet, or
    /// nothing to update); or, by [`Opened::insert_unless_there`], unlocked.
    Kept,
}

/// A row [`Opened::lock`] locked, as it stands.
pub struct Locked {
    slot: *mut pg_sys::TupleTableSlot,
    snapshot: pg_sys::Snapshot,
    shape: Rc<Shape>,
    cid: pg_sys::CommandId,
}

impl Drop for Locked {
    fn drop(&mut self) {
        if unwinding() {
            return;
        }
        // SAFETY: made by `Opened::lock` in this transaction, released once;
        // the row lock stays until the transaction ends.
        unsafe {
            pg_sys::ExecDropSingleTupleTableSlot(self.slot);
            pg_sys::UnregisterSnapshot(self.snapshot);
        }
    }
}

/// A relation opened for writing, closed (its lock kept) when dropped.
struct Open(pg_sys::Relation);

impl Drop for Open {
    fn drop(&mut self) {
        if unwinding() {
            return;
        }
        // SAFETY: opened by us in this transaction; the lock stays until its
        // end, as a statement's does.
        unsafe { pg_sys::relation_close(self.0, pg_sys::NoLock as _) }
    }
}

/// Whether an error (raised beneath us, and turned into a panic by pgrx) or
/// a panic of ours is unwinding through the caller: then a destructor here
/// must not call into Postgres. The server may be in any state an error
/// leaves it in: `nextval`'s lock wait, for one, runs under the
/// transaction's resource owner and raises a timeout from there, so closing
/// a relation would look for it in the wrong owner and raise again, inside
/// a destructor, while unwinding, which aborts the process and with it every
/// session of the server. Nothing needs doing, either: the error ends in
/// the abort of the transaction or of the subtransaction the call runs in
/// (`fmgr::call` raises it again; `subxact` rolls back), whose resource
/// owner releases what was held here (relation references, snapshots, the
/// buffer pins of slots), as it does for a statement that fails.
fn unwinding() -> bool {
    std::thread::panicking()
}

impl Table {
    pub const fn new(
        schema: &'static CStr,
        name: &'static CStr,
        columns: &'static [&'static CStr],
    ) -> Self {
        Table {
            schema,
            name,
            columns,
        }
    }

    /// What this backend knows of the table, `None` when it does not exist.
    fn known(&'static self) -> Option<Known> {
        watch();
        // SAFETY: applying pending invalidations inside a transaction (we
        // are called from a statement).
        unsafe {
            // a cached OID may be of a table dropped since
            pg_sys::AcceptInvalidationMessages();
        }
        let me: *const Table = self;
        if let Some(known) = KNOWN.with(|k| {
            k.borrow()
                .iter()
                .find(|(t, _)| *t == me)
                .map(|(_, k)| k.clone())
        }) {
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
            READING.with(|r| r.set(relid));
            DISTURBED.with(|d| d.set(false));
            let shape = shape(relid, self.columns).map(Rc::new);
            READING.with(|r| r.set(pg_sys::InvalidOid));
            Known { relid, shape }
        };
        if !DISTURBED.with(Cell::get) {
            KNOWN.with(|k| k.borrow_mut().push((me, known.clone())));
            Some(known)
        } else {
            // read across an invalidation: this call goes the statement's way
            Some(Known {
                relid: known.relid,
                shape: None,
            })
        }
    }

    /// The table opened for writes that need `privileges` (besides
    /// `SELECT`, which every one needs), with its shape; `None` where a
    /// statement must do them (see the module comment).
    pub fn opened(&'static self, privileges: &[u32]) -> Option<Opened> {
        let relid = self.known()?.relid;
        // SAFETY: inside a transaction (we are called from a statement); the
        // table is opened and locked as a statement writing it would.
        unsafe {
            // one privilege at a time: given several, pg_class_aclcheck
            // answers whether the role holds any of them
            // a loaded module that checks a statement's permissions itself
            // (sepgsql, pgaudit's object audit) must see every write
            if pg_sys::XactReadOnly
                || std::ptr::read(&raw const pg_sys::ExecutorCheckPerms_hook).is_some()
                || !privileges.iter().all(|&p| holds(relid, p))
                || !holds(relid, pg_sys::ACL_SELECT)
            {
                return None;
            }
            let rel = Open(pg_sys::table_open(relid, pg_sys::RowExclusiveLock as _));
            // the shape as of now that we hold the lock: taking it applied
            // any invalidation a change to the table sent (an ALTER TABLE
            // that committed while we waited), which cleared what we knew
            let Known {
                relid: again,
                shape: Some(shape),
            } = self.known()?
            else {
                return None;
            };
            if again != relid {
                return None;
            }
            let class = &*(*rel.0).rd_rel;
            // (a table inheriting from it: the statement reaches its rows
            // too; attached as a partition: its bounds are a constraint)
            if class.relkind as u8 != pg_sys::RELKIND_RELATION
                || class.relhassubclass
                || class.relispartition
                || !(*rel.0).trigdesc.is_null()
                || !(*rel.0).rd_rules.is_null()
                || class.relrowsecurity
            {
                return None;
            }
            Some(Opened {
                rel,
                shape,
                privileges: privileges.iter().fold(0, |all, p| all | p),
            })
        }
    }

    /// `write` done on the table opened for writes that need `privileges`
    /// (see [`Table::opened`]); `None` where it cannot be opened for them.
    pub fn with<T>(
        &'static self,
        privileges: &[u32],
        write: impl FnOnce(&Opened) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        match self.opened(privileges) {
            Some(table) => write(&table),
            None => Ok(None),
        }
    }
}

/// A table of ours opened here for writes (its lock kept to the end of the
/// transaction, as a statement's is), with what is known of it. Each write
/// answers `None` where it cannot be done here, with nothing done: one the
/// table was not opened for (`privileges`), or one its shape does not allow.
pub struct Opened {
    rel: Open,
    shape: Rc<Shape>,
    /// The privileges the role was found to hold, one bit each.
    privileges: u32,
}

impl Opened {
    /// Whether the table was opened for writes that need `privilege`.
    fn may(&self, privilege: u32) -> bool {
        self.privileges & privilege == privilege
    }

    /// Whether the primary key is exactly `cols`, all `text`: a key
    /// [`Opened::delete_if`], [`Opened::lock`] and [`Opened::upsert`] take.
    fn keyed_by(&self, cols: &[Col]) -> bool {
        let shape = &self.shape;
        cols.len() <= MAX_KEYS
            && shape.index_on(cols) == Some(shape.pkey)
            && cols.iter().all(|col| shape.types[col.0] == pg_sys::TEXTOID)
    }

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
    /// of another type, a NULL where none may be), with nothing written.
    pub fn update(
        &self,
        row: &Locked,
        set: &[(Col, pg_sys::Oid, Option<pg_sys::Datum>)],
    ) -> Result<Option<()>> {
        let shape = &self.shape;
        let cols: Vec<(Col, pg_sys::Oid, bool)> = set
            .iter()
            .map(|&(col, oid, value)| (col, oid, value.is_none()))
            .collect();
        if !Rc::ptr_eq(shape, &row.shape) || !self.can_update(&cols) {
            return Ok(None);
        }
        let changed: Vec<pg_sys::AttrNumber> =
            set.iter().map(|(col, ..)| shape.attnums[col.0]).collect();
        // SAFETY: the row is locked by us in `row.slot`, its snapshot
        // registered; the table is open for writing.
        unsafe {
            pg_sys::CheckCmdReplicaIdentity(self.rel.0, pg_sys::CmdType::CMD_UPDATE);
            let version = rewrite(
                self.rel.0,
                shape,
                row.slot,
                (*row.slot).tts_tid,
                row.cid,
                row.snapshot,
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
            pg_sys::ExecDropSingleTupleTableSlot(version);
        }
        count_served();
        Ok(Some(()))
    }

    /// [`Opened::delete_if`] for a row version this backend knows the place
    /// of, `tid` (the one its last take wrote): where our snapshot sees the
    /// version there and it is the row `key` names, with `check` equal to
    /// `equals`, it is deleted without a look through the primary key (whose
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
        check: Col,
        equals: pg_sys::TimestampTz,
    ) -> Result<Option<bool>> {
        // SAFETY: as in `delete_if`; the version at `tid` is only read
        // through the table's access method, which checks the place.
        if !self.may_delete_by(key, check) {
            return Ok(None);
        }
        let (rel, shape) = (&self.rel, &self.shape);
        unsafe {
            pg_sys::CheckCmdReplicaIdentity(rel.0, pg_sys::CmdType::CMD_DELETE);
            pg_sys::CommandCounterIncrement();
            let cid = pg_sys::GetCurrentCommandId(true);
            let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot());
            let slot = pg_sys::table_slot_create(rel.0, std::ptr::null_mut());
            let mut at = tid;
            // a page past the table's end (truncated by a vacuum, the table
            // rewritten since) cannot be read; none can be cut off while we
            // hold our lock, and none was since `tid` was learnt where this
            // backend has taken in no invalidation since (a truncation sends
            // one before it lets go of its lock, which ours waited for) and
            // its own transaction has not given the table a new file (a
            // `TRUNCATE`, `CLUSTER` or `VACUUM FULL` of its own, whose
            // invalidation it takes in only locally, at once): then the
            // table's size is not asked for, a system call a `done`
            let block = (u32::from(tid.ip_blkid.bi_hi) << 16) | u32::from(tid.ip_blkid.bi_lo);
            #[cfg(feature = "pg15")]
            let renewed = (*rel.0).rd_firstRelfilenodeSubid;
            #[cfg(not(feature = "pg15"))]
            let renewed = (*rel.0).rd_firstRelfilelocatorSubid;
            let fits = ((Invalidations::now() == seen
                // (InvalidSubTransactionId)
                && renewed == 0)
                || block
                    < pg_sys::RelationGetNumberOfBlocksInFork(
                        rel.0,
                        pg_sys::ForkNumber::MAIN_FORKNUM,
                    ))
                && pg_sys::table_tuple_fetch_row_version(rel.0, &mut at, snapshot, slot)
                && key
                    .iter()
                    .all(|&(col, v)| same_text(slot, shape.attnums[col.0], v))
                && timestamptz(slot, shape.attnums[check.0]) == Some(equals);
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
    fn may_delete_by(&self, key: &[(Col, pg_sys::Datum)], check: Col) -> bool {
        cols_of(key).is_some_and(|(cols, n)| self.can_delete_if(&cols[..n], check))
    }

    /// Whether [`Opened::delete_if`] can be done here, by a key of `cols`.
    pub fn can_delete_if(&self, cols: &[Col], check: Col) -> bool {
        self.may(pg_sys::ACL_DELETE)
            && self.keyed_by(cols)
            && self.shape.types[check.0] == pg_sys::TIMESTAMPTZOID
    }

    /// Delete the row whose primary key is `key` (`text` columns, in the
    /// primary key's order) if its `timestamptz` column `check` equals
    /// `equals`: whether a row went. `None` when it cannot be done here (see
    /// the module comment): nothing was done, and the caller runs its
    /// statement.
    pub fn delete_if(
        &self,
        key: &[(Col, pg_sys::Datum)],
        check: Col,
        equals: pg_sys::TimestampTz,
    ) -> Result<Option<bool>> {
        // SAFETY: inside a transaction; the relations opened here are closed
        // before we return (see `Open`), the snapshot registered is
        // unregistered, the slot and the scans are released. On an error
        // Postgres raises beneath us, its abort releases all of them.
        if !self.may_delete_by(key, check) {
            return Ok(None);
        }
        let (rel, shape) = (&self.rel, &self.shape);
        unsafe {
            let index = Open(pg_sys::index_open(shape.pkey, pg_sys::AccessShareLock as _));
            pg_sys::CheckCmdReplicaIdentity(rel.0, pg_sys::CmdType::CMD_DELETE);
            // see what the commands before ours in this transaction did, as
            // SPI does before each statement
            pg_sys::CommandCounterIncrement();
            let cid = pg_sys::GetCurrentCommandId(true);
            let slot = pg_sys::table_slot_create(rel.0, std::ptr::null_mut());
            let check = shape.attnums[check.0];
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
    fn insert(
        &self,
        u: &Upsert,
        update: bool,
        read: Option<Col>,
    ) -> Result<Option<(Upserted, Option<pg_sys::Datum>)>> {
        // SAFETY: as in `delete_if`; the row is formed with the table's own
        // descriptor, from values of its columns' types; the speculative
        // insertion lock is released on every path once taken (an error
        // between would abort the transaction, which releases it).
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
                let Some(mut tid) = found else {
                    if let Err(e) = row.fill(shape, u) {
                        break Err(e);
                    }
                    if new.is_null() {
                        new = pg_sys::table_slot_create(rel.0, std::ptr::null_mut());
                    }
                    pg_sys::ExecClearTuple(new);
                    let natts = row.values.len();
                    std::slice::from_raw_parts_mut((*new).tts_values, natts)
                        .copy_from_slice(&row.values);
                    std::slice::from_raw_parts_mut((*new).tts_isnull, natts)
                        .copy_from_slice(&row.nulls);
                    pg_sys::ExecStoreVirtualTuple(new);
                    let xid = pg_sys::GetCurrentTransactionId();
                    let token = pg_sys::SpeculativeInsertionLockAcquire(xid);
                    pg_sys::table_tuple_insert_speculative(
                        rel.0,
                        new,
                        cid,
                        0,
                        std::ptr::null_mut(),
                        token,
                    );
                    let first = index_entries(rel.0, shape, new, None, index.0);
                    pg_sys::table_tuple_complete_speculative(rel.0, new, token, first);
                    pg_sys::SpeculativeInsertionLockRelease(xid);
                    if first {
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
                if !update {
                    // DO NOTHING: the row stays as it is, unlocked; but a
                    // snapshot of the transaction's start must see it
                    if repeatable() {
                        if !pg_sys::table_tuple_fetch_row_version(
                            rel.0,
                            &mut tid,
                            &raw mut pg_sys::SnapshotAnyData,
                            existing,
                        ) {
                            break Err(unexpected("table_tuple_fetch_row_version", 0));
                        }
                        if !visible_to(rel.0, existing, snapshot) {
                            break Err(serialization("update"));
                        }
                    }
                    break Ok((Upserted::Kept, None));
                }
                let (result, _) = lock_version(
                    rel.0,
                    &mut tid,
                    snapshot,
                    existing,
                    cid,
                    pg_sys::LockTupleMode::LockTupleNoKeyExclusive,
                    pg_sys::LockWaitPolicy::LockWaitBlock,
                    0,
                );
                if let Some(e) = changed_since_snapshot(result) {
                    break Err(e);
                }
                match result {
                    pg_sys::TM_Result::TM_Ok => {}
                    // changed since we found it: the row to update may be
                    // another, or none
                    pg_sys::TM_Result::TM_Updated | pg_sys::TM_Result::TM_Deleted => continue,
                    other => break Err(unexpected("table_tuple_lock", other)),
                }
                // locked; a snapshot of the transaction's start must see it
                if repeatable() && !visible_to(rel.0, existing, snapshot) {
                    break Err(serialization("update"));
                }
                // `WHERE` unmet, or an update that would change nothing (no
                // `set`, no increment: the row kept as it is, locked, rather
                // than rewritten unchanged)
                if u.only_if.is_some_and(|(col, at)| {
                    timestamptz(existing, shape.attnums[col.0]).is_none_or(|v| v > at)
                }) || (u.set.is_empty() && u.increment.is_none())
                {
                    break Ok((Upserted::Kept, keep(existing)));
                }
                let set: Vec<pg_sys::AttrNumber> =
                    u.set.iter().map(|(col, ..)| shape.attnums[col.0]).collect();
                let mut incremented = None;
                let written = rewrite(
                    rel.0,
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
                );
                break written.map(|version| {
                    pg_sys::ExecDropSingleTupleTableSlot(version);
                    (Upserted::Updated(incremented.map(|(_, next)| next)), None)
                });
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

/// The row [`Opened::upsert`] inserts, by attribute number less one.
struct Row {
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
    fn insertable(shape: &Shape, u: &Upsert) -> Option<Row> {
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
    fn fill(&mut self, shape: &Shape, u: &Upsert) -> Result<()> {
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
unsafe fn conflicting(
    rel: pg_sys::Relation,
    index: pg_sys::Relation,
    key: &[(Col, pg_sys::Datum)],
    slot: *mut pg_sys::TupleTableSlot,
) -> Option<pg_sys::ItemPointerData> {
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

/// Write the lease on the row version in `locked` (at `tid`, locked by us),
/// or with `unless_held` on the version in it that our snapshot found, where
/// no one holds it ([`rewrite_unless_held`]: `Ok(None)` otherwise, nothing
/// written). Returns a slot holding the new version (the caller drops it).
///
/// # Safety
/// As [`rewrite`], or with `unless_held` as [`rewrite_unless_held`].
#[allow(clippy::too_many_arguments)]
unsafe fn lease(
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
unsafe fn rewrite(
    rel: pg_sys::Relation,
    shape: &Shape,
    locked: *mut pg_sys::TupleTableSlot,
    tid: pg_sys::ItemPointerData,
    cid: pg_sys::CommandId,
    snapshot: pg_sys::Snapshot,
    changed: &[pg_sys::AttrNumber],
    edit: impl FnOnce(&mut [pg_sys::Datum], &mut [bool]) -> Result<()>,
) -> Result<*mut pg_sys::TupleTableSlot> {
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
unsafe fn rewrite_unless_held(
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
unsafe fn looks_free(slot: *mut pg_sys::TupleTableSlot) -> bool {
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
unsafe fn heap_header(slot: *mut pg_sys::TupleTableSlot) -> Option<pg_sys::HeapTupleHeader> {
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
unsafe fn looks_newest(slot: *mut pg_sys::TupleTableSlot) -> bool {
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
fn server_asserts() -> bool {
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
unsafe fn write_version(
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
unsafe fn index_entries(
    rel: pg_sys::Relation,
    shape: &Shape,
    slot: *mut pg_sys::TupleTableSlot,
    changed: Option<&[pg_sys::AttrNumber]>,
    pkey: pg_sys::Relation,
) -> bool {
    unsafe {
        let mut tid = (*slot).tts_tid;
        let mut unique = true;
        for entry in &shape.indexes {
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

/// `table_tuple_lock` of the row version at `tid` into `slot`: its result and
/// what it says of a version it could not lock (or of the newer one it
/// followed to).
///
/// # Safety
/// `rel` is open, `slot` is one of its slots, `snapshot` is registered.
#[allow(clippy::too_many_arguments)]
unsafe fn lock_version(
    rel: pg_sys::Relation,
    tid: &mut pg_sys::ItemPointerData,
    snapshot: pg_sys::Snapshot,
    slot: *mut pg_sys::TupleTableSlot,
    cid: pg_sys::CommandId,
    mode: pg_sys::LockTupleMode::Type,
    policy: pg_sys::LockWaitPolicy::Type,
    flags: u8,
) -> (pg_sys::TM_Result::Type, pg_sys::TM_FailureData) {
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
unsafe fn delete_version(
    rel: pg_sys::Relation,
    tid: &mut pg_sys::ItemPointerData,
    cid: pg_sys::CommandId,
    snapshot: pg_sys::Snapshot,
) -> pg_sys::TM_Result::Type {
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
unsafe fn visible_to(
    rel: pg_sys::Relation,
    slot: *mut pg_sys::TupleTableSlot,
    snapshot: pg_sys::Snapshot,
) -> bool {
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
fn repeatable() -> bool {
    // SAFETY: reading a backend-local setting.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// `key` set to "index column `i` = `value`" for a `text` column of `index`.
///
/// # Safety
/// `index` is open; its column `i` is `text`.
unsafe fn equal_key(
    key: &mut pg_sys::ScanKeyData,
    index: pg_sys::Relation,
    i: usize,
    value: pg_sys::Datum,
) {
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
const MAX_KEYS: usize = 2;

/// The columns of `key`, without an allocation: `None` past [`MAX_KEYS`].
fn cols_of(key: &[(Col, pg_sys::Datum)]) -> Option<([Col; MAX_KEYS], usize)> {
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
unsafe fn key_scan(
    index: pg_sys::Relation,
    key: &[(Col, pg_sys::Datum)],
) -> [pg_sys::ScanKeyData; MAX_KEYS] {
    unsafe {
        let mut keys: [pg_sys::ScanKeyData; MAX_KEYS] = std::mem::zeroed();
        for (i, (k, &(_, v))) in keys.iter_mut().zip(key).enumerate() {
            equal_key(k, index, i, v);
        }
        keys
    }
}

/// How many entries of its queue a take's scan reads before it stops and is
/// begun again after them (see `Opened::lease_first`): a take at the head
/// of a queue that 16 workers take from passes over about 8 rows others hold.
const FIRST_WINDOW: u32 = 16;

/// The end of a take's scan: the second key's one member, which holds for
/// the next `left` entries of `queue` the btree checks (a page's high key
/// among them: it checks that at the end of each page it reads) and for none
/// after them or of another queue (bytes compared, as the column's "C"
/// collation orders them). Lives on the stack of the scan it ends, which
/// reads it through the key's argument.
struct Window {
    queue: pg_sys::Datum,
    left: std::cell::Cell<u32>,
    closed: std::cell::Cell<bool>,
}

impl Window {
    fn new(queue: pg_sys::Datum, entries: u32) -> Self {
        Window {
            queue,
            left: std::cell::Cell::new(entries),
            closed: std::cell::Cell::new(false),
        }
    }

    /// Whether the window (not the queue's end) ended the scan; if so, it
    /// holds from now on for every entry of the queue.
    fn reopen(&self) -> bool {
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

/// The bytes of the `text` datum `value` when it is held in line and
/// uncompressed (a short or a plain header); `None` otherwise.
///
/// # Safety
/// `value` is a valid `text` datum, not read after what it points to goes.
unsafe fn inline_bytes<'a>(value: pg_sys::Datum) -> Option<&'a [u8]> {
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

fn same_tid(a: &pg_sys::ItemPointerData, b: &pg_sys::ItemPointerData) -> bool {
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
unsafe fn begin_scan(
    rel: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    keys: &mut [pg_sys::ScanKeyData],
    copying: bool,
) -> pg_sys::IndexScanDesc {
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
unsafe fn timestamptz(
    slot: *mut pg_sys::TupleTableSlot,
    attnum: pg_sys::AttrNumber,
) -> Option<i64> {
    unsafe { slot_value(slot, attnum).map(|v| v.value() as i64) }
}

/// The `bigint` in attribute `attnum` of `slot`, `None` when NULL.
///
/// # Safety
/// As [`timestamptz`], for a `bigint`.
unsafe fn int8(slot: *mut pg_sys::TupleTableSlot, attnum: pg_sys::AttrNumber) -> Option<i64> {
    unsafe { timestamptz(slot, attnum) }
}

/// Whether the `text` attribute `attnum` of `slot` holds the bytes of `value`.
///
/// # Safety
/// `slot` holds a row whose attribute `attnum` is `text`; `value` is a
/// detoasted `text` datum.
unsafe fn same_text(
    slot: *mut pg_sys::TupleTableSlot,
    attnum: pg_sys::AttrNumber,
    value: pg_sys::Datum,
) -> bool {
    unsafe { slot_value(slot, attnum).is_some_and(|v| same_bytes(v, value)) }
}

/// Attribute `attnum` (from 1) of `slot`, `None` when NULL: `slot_getattr`,
/// with the server asked to deform the row only as far as the slot has not
/// yet (one call for the several columns a take reads of a row).
///
/// # Safety
/// `slot` holds a row with at least `attnum` attributes.
unsafe fn slot_value(
    slot: *mut pg_sys::TupleTableSlot,
    attnum: pg_sys::AttrNumber,
) -> Option<pg_sys::Datum> {
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
unsafe fn same_bytes(stored: pg_sys::Datum, value: pg_sys::Datum) -> bool {
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

/// Whether `relid` can be served here, and how: the attribute number and type
/// of each of `columns` (all must exist), every index a btree on plain columns
/// with immediate uniqueness, and a primary key.
///
/// # Safety
/// Inside a transaction.
unsafe fn shape(relid: pg_sys::Oid, columns: &[&CStr]) -> Option<Shape> {
    unsafe {
        // locked first: the catalog as of now, and no ALTER TABLE until the
        // transaction ends
        let rel = Open(pg_sys::table_open(relid, pg_sys::AccessShareLock as _));
        let mut attnums = Vec::with_capacity(columns.len());
        let mut types = Vec::with_capacity(columns.len());
        for name in columns {
            let attnum = pg_sys::get_attnum(relid, name.as_ptr());
            if attnum == pg_sys::InvalidAttrNumber as pg_sys::AttrNumber {
                return None;
            }
            attnums.push(attnum);
            types.push(pg_sys::get_atttype(relid, attnum));
        }
        #[cfg(feature = "pg18")]
        let pkey = pg_sys::RelationGetPrimaryKeyIndex(rel.0, false);
        #[cfg(not(feature = "pg18"))]
        let pkey = pg_sys::RelationGetPrimaryKeyIndex(rel.0);
        if pkey == pg_sys::InvalidOid {
            return None;
        }
        let list = pg_sys::RelationGetIndexList(rel.0);
        let oids: Vec<pg_sys::Oid> = if list.is_null() {
            Vec::new()
        } else {
            (0..(*list).length as usize)
                .map(|i| (*(*list).elements.add(i)).oid_value)
                .collect()
        };
        pg_sys::list_free(list);
        let mut indexes = Vec::with_capacity(oids.len());
        for oid in oids {
            let index = Open(pg_sys::index_open(oid, pg_sys::AccessShareLock as _));
            let form = &*(*index.0).rd_index;
            let plain = (*(*index.0).rd_rel).relam == pg_sys::BTREE_AM_OID
                && form.indimmediate
                && !form.indisexclusion
                && form.indnatts == form.indnkeyatts
                && pg_sys::RelationGetIndexExpressions(index.0).is_null()
                && pg_sys::RelationGetIndexPredicate(index.0).is_null()
                && form.indisvalid
                && form.indisready;
            let keys = form.indkey.values.as_slice(form.indnatts as usize).to_vec();
            if !plain || keys.contains(&0) || !ordered_as_assumed(index.0, relid, &keys) {
                return None;
            }
            indexes.push(Index {
                oid,
                keys,
                unique: form.indisunique,
            });
        }
        let desc = (*rel.0).rd_att;
        let constr = (*desc).constr;
        let defaults: &[pg_sys::AttrDefault] = if constr.is_null() || (*constr).defval.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts((*constr).defval, (*constr).num_defval as usize)
        };
        let attrs = (0..(*desc).natts as usize)
            .map(|i| {
                let a = &*attribute(desc, i);
                let default = match defaults.iter().find(|d| d.adnum as usize == i + 1) {
                    Some(d) => default_of(d.adbin),
                    // without a default of its own, a column takes its
                    // type's (a domain's), and a domain's constraints are
                    // checked on what it is given, NULL included: only a
                    // statement does either
                    None if !a.attisdropped
                        && (pg_sys::get_typtype(a.atttypid) as u8 == pg_sys::TYPTYPE_DOMAIN
                            || !pg_sys::get_typdefault(a.atttypid).is_null()) =>
                    {
                        Stored::Other
                    }
                    None => Stored::None,
                };
                Attr {
                    dropped: a.attisdropped,
                    not_null: a.attnotnull,
                    generated: a.attgenerated != 0,
                    default,
                }
            })
            .collect();
        Some(Shape {
            attnums,
            types,
            indexes,
            pkey,
            attrs,
            checks: !constr.is_null() && (*constr).num_check > 0,
            generated: !constr.is_null() && (*constr).has_generated_stored,
            found: Cell::new(u32::MAX),
        })
    }
}

/// Whether the btree `index` on `relid`'s columns `keys` orders and
/// compares as the calls here assume: every column ascending with NULLs
/// last, by its type's default operator class (the scan keys name those
/// classes' comparison functions), and text under a deterministic collation
/// (equal only where the bytes are, which is how keys and queues are
/// compared here).
///
/// # Safety
/// `index` is open; `keys` are its key columns' attribute numbers.
unsafe fn ordered_as_assumed(
    index: pg_sys::Relation,
    relid: pg_sys::Oid,
    keys: &[pg_sys::AttrNumber],
) -> bool {
    unsafe {
        keys.iter().enumerate().all(|(i, &attnum)| {
            let type_ = pg_sys::get_atttype(relid, attnum);
            let class = pg_sys::GetDefaultOpClass(type_, pg_sys::BTREE_AM_OID);
            let collation = *(*index).rd_indcollation.add(i);
            *(*index).rd_indoption.add(i) == 0
                && class != pg_sys::InvalidOid
                && *(*index).rd_opfamily.add(i) == pg_sys::get_opclass_family(class)
                && *(*index).rd_opcintype.add(i) == pg_sys::get_opclass_input_type(class)
                && (collation == pg_sys::InvalidOid
                    || pg_sys::get_collation_isdeterministic(collation))
        })
    }
}

/// Attribute `i` (from 0) of `desc`.
///
/// # Safety
/// `i` is below `desc`'s `natts`.
unsafe fn attribute(desc: pg_sys::TupleDesc, i: usize) -> *const pg_sys::FormData_pg_attribute {
    unsafe {
        #[cfg(feature = "pg18")]
        let a = pg_sys::TupleDescAttr(desc, i as i32).cast_const();
        #[cfg(not(feature = "pg18"))]
        let a = (*desc).attrs.as_ptr().add(i);
        a
    }
}

/// What the stored default expression `adbin` is, for an insert here.
///
/// # Safety
/// `adbin` is a node tree's string form, from `pg_attrdef`.
unsafe fn default_of(adbin: *const std::ffi::c_char) -> Stored {
    unsafe {
        let node = pg_sys::stringToNode(adbin).cast::<pg_sys::Node>();
        if node.is_null() {
            return Stored::Other;
        }
        let constant = |node: *mut pg_sys::Node, type_: pg_sys::Oid| {
            let c = node.cast::<pg_sys::Const>();
            ((*node).type_ == pg_sys::NodeTag::T_Const
                && (*c).consttype == type_
                && !(*c).constisnull)
                .then(|| (*c).constvalue)
        };
        if let Some(v) = constant(node, pg_sys::INT4OID) {
            return Stored::Int4(v.value() as i32);
        }
        if (*node).type_ == pg_sys::NodeTag::T_FuncExpr {
            let f = node.cast::<pg_sys::FuncExpr>();
            let args = (*f).args;
            if (*f).funcid == pg_sys::Oid::from(pg_sys::F_NEXTVAL)
                && !args.is_null()
                && (*args).length == 1
                && let Some(seq) = constant(
                    (*(*args).elements).ptr_value.cast::<pg_sys::Node>(),
                    pg_sys::REGCLASSOID,
                )
            {
                return Stored::Next(pg_sys::Oid::from(seq.value() as u32));
            }
        }
        Stored::Other
    }
}

/// The error of `+ 1` past the largest value of `type_`, as Postgres says it.
fn out_of_range(type_: &str) -> Error {
    Error::Raised {
        code: *b"22003",
        message: format!("{type_} out of range"),
        detail: None,
        hint: None,
    }
}

fn serialization(what: &str) -> Error {
    Error::Raised {
        code: *b"40001",
        message: format!("could not serialize access due to concurrent {what}"),
        detail: None,
        hint: Some("The transaction might succeed if retried.".into()),
    }
}

/// Under repeatable read or serializable, the error for a row another
/// transaction changed (`TM_Updated`) or removed (`TM_Deleted`) since the
/// snapshot, as the executor raises it; `None` for any other answer, and
/// always read committed, where each caller goes on by its own rule.
fn changed_since_snapshot(result: pg_sys::TM_Result::Type) -> Option<Error> {
    if !repeatable() {
        return None;
    }
    match result {
        pg_sys::TM_Result::TM_Updated => Some(serialization("update")),
        pg_sys::TM_Result::TM_Deleted => Some(serialization("delete")),
        _ => None,
    }
}

fn unexpected(call: &'static str, result: pg_sys::TM_Result::Type) -> Error {
    Error::Internal {
        context: "access",
        cause: format!("unexpected {call} result {result}"),
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use std::cell::Cell;

    use pgrx::pg_sys;
    use pgrx::prelude::*;

    use super::{AFTER_SNAPSHOT, served};

    thread_local! {
        /// Checks the permission hook below saw of `sturdy.queue`.
        static AUDITED: Cell<u64> = const { Cell::new(0) };
        /// Times the hook below changed the row.
        static CHANGES: Cell<u32> = const { Cell::new(0) };
    }

    /// Count the range-table entries (15) or permission entries (16 and
    /// later) naming `sturdy.queue`; allow everything.
    unsafe fn audit_list(
        list: *mut pg_sys::List,
        relid: impl Fn(*mut std::ffi::c_void) -> pg_sys::Oid,
    ) -> bool {
        unsafe {
            let namespace = pg_sys::get_namespace_oid(c"sturdy".as_ptr(), false);
            let queue = pg_sys::get_relname_relid(c"queue".as_ptr(), namespace);
            if !list.is_null() {
                for i in 0..(*list).length as usize {
                    if relid((*(*list).elements.add(i)).ptr_value) == queue {
                        AUDITED.with(|n| n.set(n.get() + 1));
                    }
                }
            }
            true
        }
    }

    #[cfg(feature = "pg15")]
    #[pg_guard]
    unsafe extern "C-unwind" fn audit(range_table: *mut pg_sys::List, _raise: bool) -> bool {
        unsafe { audit_list(range_table, |p| (*p.cast::<pg_sys::RangeTblEntry>()).relid) }
    }

    #[cfg(not(feature = "pg15"))]
    #[pg_guard]
    unsafe extern "C-unwind" fn audit(
        _range_table: *mut pg_sys::List,
        permissions: *mut pg_sys::List,
        _raise: bool,
    ) -> bool {
        unsafe {
            audit_list(permissions, |p| {
                (*p.cast::<pg_sys::RTEPermissionInfo>()).relid
            })
        }
    }

    /// With a module's `ExecutorCheckPerms_hook` set (sepgsql, pgaudit's
    /// object audit), every write goes through its statement, which the
    /// hook sees; without it, the same calls go without one.
    #[pg_test]
    fn a_permission_checking_module_sees_every_write() {
        let calls = [
            "SELECT sturdy.schedule('audited', now() - interval '1 second', 'audit')",
            "CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('audit')",
            "SELECT sturdy.done(workflow, receipt, 'audit') FROM t",
        ];
        for hooked in [false, true] {
            Spi::run("DROP TABLE IF EXISTS t").unwrap();
            // SAFETY: the hook is this backend's, set for these calls only
            // and put back as it was.
            let previous = unsafe { pg_sys::ExecutorCheckPerms_hook };
            if hooked {
                unsafe { pg_sys::ExecutorCheckPerms_hook = Some(audit) };
            }
            for call in calls {
                let (before, audited) = (served(), AUDITED.with(Cell::get));
                Spi::run(call).unwrap();
                let went_without = served() > before;
                let seen = AUDITED.with(Cell::get) > audited;
                assert_eq!(
                    (went_without, seen),
                    (!hooked, hooked),
                    "{call}, hook set: {hooked}: (without a statement, seen by the hook)"
                );
            }
            unsafe { pg_sys::ExecutorCheckPerms_hook = previous };
        }
    }

    /// The other connection's two commits: a lease of the row, then the
    /// lease taken back (each a new version of it, in place).
    fn lease_and_release() {
        if CHANGES.with(Cell::get) >= 8 {
            return;
        }
        CHANGES.with(|n| n.set(n.get() + 1));
        Spi::run(
            "SELECT dblink_exec('chain', 'UPDATE sturdy.queue SET leased_until = now() + interval ''1 hour'' WHERE queue = ''chain''');
             SELECT dblink_exec('chain', 'UPDATE sturdy.queue SET leased_until = NULL WHERE queue = ''chain''')",
        )
        .unwrap();
    }

    /// Read committed, a take that finds its row changed since its snapshot
    /// twice over (leased, then due again) leases the newest version, as
    /// the statement (which locks the newest and rechecks it) would: the
    /// version between, leased, is not the row as it stands.
    #[pg_test]
    fn a_take_leases_a_row_changed_twice_since_its_snapshot_where_its_newest_version_is_due() {
        Spi::run(
            "CREATE EXTENSION IF NOT EXISTS dblink;
             SELECT dblink_connect('chain', pg_catalog.format('dbname=%s port=%s host=%s user=%s',
                 current_database(), current_setting('port'),
                 split_part(current_setting('unix_socket_directories'), ',', 1), current_user));
             SELECT * FROM dblink('chain', 'SELECT sturdy.schedule(''c'', now() - interval ''1 minute'', ''chain'')::text')
               AS t(scheduled text)",
        )
        .unwrap();
        CHANGES.with(|n| n.set(0));
        AFTER_SNAPSHOT.with(|h| h.set(Some(lease_and_release)));
        // in a subtransaction rolled back after it, so that the other
        // connection can delete the row it committed
        let taken = std::cell::RefCell::new(None);
        let _ = crate::subxact::subtransaction(|| {
            *taken.borrow_mut() =
                Spi::get_one::<String>("SELECT workflow FROM sturdy.take('chain', '1 minute')")
                    .unwrap();
            Ok(None::<()>)
        });
        AFTER_SNAPSHOT.with(|h| h.set(None));
        Spi::run(
            "SELECT dblink_exec('chain', 'DELETE FROM sturdy.queue WHERE queue = ''chain''');
             SELECT dblink_disconnect('chain')",
        )
        .unwrap();
        assert!(
            CHANGES.with(Cell::get) >= 1,
            "the row was never changed under the take"
        );
        assert_eq!(taken.into_inner().as_deref(), Some("c"));
    }
}
