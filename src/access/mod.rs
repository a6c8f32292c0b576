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
use crate::grants;
use crate::sequence::Sequence;

mod delete;
mod insert;
mod lease;
mod lock;
mod place;
mod scan;
mod shape;
// The tests, in a file of their own: `pg_schema` takes only an inline module.
#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    include!("tests.rs");
}
mod version;

#[cfg(any(test, feature = "pg_test"))]
pub use insert::INSERTED_FIRST;
pub use lease::{Admit, Admitting, LeaseColumns, Leased};
pub use place::Free;
use scan::*;
use shape::*;
use version::*;

/// A table of ours by schema and name, with the columns its calls use.
pub struct Table {
    schema: &'static CStr,
    name: &'static CStr,
    /// Column names, referred to by position in the calls (see [`Col`]).
    columns: &'static [&'static CStr],
}

/// What [`Table::mark`] answers; `Mark(0)` is never equal to a kept one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Mark(u64);

impl Mark {
    /// Whether a cache kept under this mark may be used again.
    pub fn keepable(self) -> bool {
        self.0 != 0
    }

    /// A mark that also moves with `epoch`, and is never kept where this
    /// one is not or `keep` is false.
    pub fn with(self, epoch: u64, keep: bool) -> Mark {
        if !keep || self.0 == 0 {
            return Mark(0);
        }
        Mark(self.0 ^ (epoch << 40))
    }
}

/// A column of a [`Table`], by its position in the table's `columns`.
#[derive(Clone, Copy)]
pub struct Col(pub usize);

/// What was found out about a table, until its next relcache invalidation.
#[derive(Clone)]
struct Known {
    relid: pg_sys::Oid,
    /// Which finding this is: a new one is made after each invalidation.
    found: u64,
    /// `None`: the table cannot be served here (see the module comment); the
    /// caller runs its statement. Shared: every call takes a copy of what is
    /// known, twice.
    shape: Option<Rc<Shape>>,
}

/// A table, and a shard of it (under Citus) or the table itself.
type KnownOf = (*const Table, Option<pg_sys::Oid>);

thread_local! {
    /// By table, and for a shard of it (under Citus) by the shard.
    static KNOWN: RefCell<Vec<(KnownOf, Known)>> = const { RefCell::new(Vec::new()) };
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    /// The table whose shape is being read, and whether an invalidation of
    /// it (or of everything) arrived meanwhile: a shape read across one may
    /// be older than it (a `CREATE INDEX`, which our `AccessShareLock` does
    /// not hold off, committed meanwhile), so it is used for that call only,
    /// never kept.
    static READING: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
    static DISTURBED: Cell<bool> = const { Cell::new(false) };
    /// How many findings this backend made (`Known::found`).
    static FOUND: Cell<u64> = const { Cell::new(0) };
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

/// Register, once per backend, the callback that clears what this module
/// keeps (shapes and OIDs): before anything is kept, so no invalidation can
/// come between a kept answer and its callback.
fn watch() {
    if WATCHING.with(Cell::get) {
        return;
    }
    // SAFETY: registering a callback that only clears our cache.
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(Some(forget), pg_sys::Datum::from(0));
    }
    WATCHING.with(|w| w.set(true));
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    if relid == pg_sys::InvalidOid || relid == READING.with(Cell::get) {
        DISTURBED.with(|d| d.set(true));
    }
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
    /// A row there that another transaction holds locked is kept as it is,
    /// not waited for, as `FOR UPDATE SKIP LOCKED` passes over it
    /// ([`Upserted::Kept`], unlocked).
    pub skip_locked: bool,
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
        self.known_as(None)
    }

    /// What this backend knows of the table, or with `shard` of that shard
    /// of it (`shard::local`), which is a table of the same columns.
    fn known_as(&'static self, shard: Option<pg_sys::Oid>) -> Option<Known> {
        let me = (self as *const Table, shard);
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
            let relid = match shard {
                Some(relid) => relid,
                None => {
                    let namespace = pg_sys::get_namespace_oid(self.schema.as_ptr(), true);
                    if namespace == pg_sys::InvalidOid {
                        return None;
                    }
                    pg_sys::get_relname_relid(self.name.as_ptr(), namespace)
                }
            };
            if relid == pg_sys::InvalidOid {
                return None;
            }
            READING.with(|r| r.set(relid));
            DISTURBED.with(|d| d.set(false));
            let shape = shape(relid, self.columns).map(Rc::new);
            READING.with(|r| r.set(pg_sys::InvalidOid));
            let found = FOUND.with(|f| {
                f.set(f.get() + 1);
                f.get()
            });
            Known {
                relid,
                found,
                shape,
            }
        };
        if !DISTURBED.with(Cell::get) {
            KNOWN.with(|k| k.borrow_mut().push((me, known.clone())));
            Some(known)
        } else {
            // read across an invalidation: this call goes the statement's way
            Some(Known {
                relid: known.relid,
                found: known.found,
                shape: None,
            })
        }
    }

    /// A mark that stays the same while no relcache invalidation of the
    /// table (or of every table) reaches this backend: what a cache of the
    /// table's rows is kept under, where whoever changes them sends one
    /// ([`Table::invalidate`]). `None` when the table does not exist.
    ///
    /// Under Citus the calls that change such rows (`limit_queue`, `pause`,
    /// `resume`, a prioritized `schedule`) run on the coordinator and send
    /// their invalidation there and to the node that holds the queue
    /// (`queue::placed` says where a mark may be kept).
    pub fn mark(&'static self) -> Option<Mark> {
        let known = self.known()?;
        // a finding read across an invalidation is never kept: no mark
        let kept = KNOWN.with(|k| {
            k.borrow()
                .iter()
                .any(|((t, _), kn)| std::ptr::eq(*t, self) && kn.found == known.found)
        });
        Some(Mark(if kept { known.found } else { 0 }))
    }

    /// Send a relcache invalidation of the table with this transaction: at
    /// its commit every backend, and at its next command this one, drops
    /// what it keeps under the table's [`Mark`].
    pub fn invalidate(&'static self) {
        if let Some(known) = self.known() {
            // SAFETY: inside a transaction (we are called from a statement);
            // registers a message sent at commit, nothing more.
            unsafe { pg_sys::CacheInvalidateRelcacheByRelid(known.relid) }
        }
    }

    /// The table opened for writes that need `privileges` (besides
    /// `SELECT`, which every one needs), with its shape, for rows whose
    /// distribution value under Citus is `at` (the queue or the workflow);
    /// `None` where a statement must do them (see the module comment).
    ///
    /// Under Citus, the shard that holds them where it is on this node and
    /// may be written here (`shard::local`, which takes Citus's own lock as
    /// its local execution would), else `None`: on the coordinator a
    /// distributed table is an empty shell, and rows on another node are
    /// reached through Citus.
    pub fn opened(&'static self, privileges: &[u32], at: &[u8]) -> Option<Opened> {
        let table = self.known()?.relid;
        // one privilege at a time: given several, pg_class_aclcheck answers
        // whether the role holds any of them
        let holds = |relid| {
            privileges.iter().all(|&p| grants::holds(relid, p))
                && grants::holds(relid, pg_sys::ACL_SELECT)
        };
        // SAFETY: backend state, read inside a transaction (we are called
        // from a statement).
        unsafe {
            // a loaded module that checks a statement's permissions itself
            // (sepgsql, pgaudit's object audit) must see every write
            if pg_sys::XactReadOnly
                || std::ptr::read(&raw const pg_sys::ExecutorCheckPerms_hook).is_some()
                || !holds(table)
            {
                return None;
            }
        }
        // a shard's privileges are its table's, which Citus passes on to
        // it: both are held
        let shard = if crate::scaleout::distributed() {
            let shard = crate::shard::local(table, at)?.relid;
            if !holds(shard) {
                return None;
            }
            Some(shard)
        } else {
            None
        };
        let relid = shard.unwrap_or(table);
        // SAFETY: inside a transaction; the table is opened and locked as a
        // statement writing it would.
        unsafe {
            // (a shard found in Citus's metadata may have been dropped since:
            // try; our own table was just found by its name)
            let rel = if shard.is_some() {
                pg_sys::try_table_open(relid, pg_sys::RowExclusiveLock as _)
            } else {
                pg_sys::table_open(relid, pg_sys::RowExclusiveLock as _)
            };
            if rel.is_null() {
                return None;
            }
            let rel = Open(rel);
            // the shape as of now that we hold the lock: taking it applied
            // any invalidation a change to the table sent (an ALTER TABLE
            // that committed while we waited), which cleared what we knew
            let Known {
                relid: again,
                shape: Some(shape),
                ..
            } = (if shard.is_some() {
                self.known_as(shard)
            } else {
                self.known()
            })?
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
    /// on rows of distribution value `at` (see [`Table::opened`]); `None`
    /// where it cannot be opened for them.
    pub fn with<T>(
        &'static self,
        privileges: &[u32],
        at: &[u8],
        write: impl FnOnce(&Opened) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        match self.opened(privileges, at) {
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
