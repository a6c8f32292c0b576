//! Under Citus, the shard on this node that holds a row, for `access` to do
//! the row work on it itself: a call made on the node that holds its queue
//! (or its workflow) then costs what it costs on one server, where through
//! Citus each of its statements would be planned twice and deparsed once.
//!
//! What Citus's local execution of a statement on a shard does around it,
//! done here too:
//! - the shard's metadata lock, `ShareLock`, taken before the placement is
//!   trusted: a shard move or split takes it `ExclusiveLock` while it blocks
//!   writes and changes the placement, so none runs until this transaction
//!   ends, and one that ran before has sent the invalidation that makes us
//!   look again ([`local`]). The lock is Citus's own: an advisory lock on
//!   (database, the shard's index among its table's shards, the colocation
//!   group, 8), as `SetLocktagForShardDistributionMetadata` makes it for a
//!   hash-distributed table;
//! - atomicity with writes on other nodes: a transaction that wrote a shard
//!   here and in which Citus began a distributed transaction commits by
//!   two-phase commit, as Citus would commit it had it made the write: at
//!   pre-commit a write through Citus to the same shard that changes no row
//!   marks it so ([`tell_citus`]). The shard is served only outside a
//!   transaction block (one statement, whose calls are ours) and in a
//!   session of the application's own (not a connection of Citus's from
//!   another node, whose transaction another node commits);
//! - read-your-writes: a later statement of the transaction on the same
//!   shard runs through Citus's local execution (one task on a local shard,
//!   outside a transaction block), in this backend, and sees what was
//!   written here.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::prelude::*;

/// A shard of one of our distributed tables, on this node.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Shard {
    pub relid: pg_sys::Oid,
    /// Its index among its table's shards, by hash range.
    index: u32,
    colocation: u32,
}

/// A distributed table and a distribution value.
type ShardOf = (pg_sys::Oid, Vec<u8>);

thread_local! {
    /// Where this node holds it, the shard of each (table, value) asked for;
    /// `None` where another node does. Kept until an invalidation of the
    /// table, which Citus sends with every change of a shard's placement.
    static SHARDS: RefCell<HashMap<ShardOf, Option<Shard>>> = RefCell::new(HashMap::new());
    /// How many invalidations reached [`invalidated`]: a shard found across one
    /// may have been read before the change it announced, and is not kept.
    static EPOCH: Cell<u64> = const { Cell::new(0) };
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    /// A shard this transaction may have written here itself: its table and
    /// the distribution value.
    static WROTE: RefCell<Option<ShardOf>> = const { RefCell::new(None) };
    /// `get_current_transaction_id()`, Citus's.
    static TRANSACTION_ID: Cell<pg_sys::Oid> = const { Cell::new(pg_sys::InvalidOid) };
}

/// Advisory locks of this class are Citus's colocated shards' metadata
/// locks (`ADV_LOCKTAG_CLASS_CITUS_COLOCATED_SHARDS_METADATA`).
const COLOCATED_SHARDS_METADATA: u16 = 8;

/// A relcache invalidation of `relid` (every table's where invalid) reached
/// this backend (`scaleout` passes on its callback's: a backend has few).
pub fn invalidated(relid: pg_sys::Oid) {
    EPOCH.with(|e| e.set(e.get() + 1));
    SHARDS.with(|s| {
        let mut s = s.borrow_mut();
        if relid == pg_sys::InvalidOid {
            s.clear();
        } else {
            s.retain(|(table, _), _| *table != relid);
        }
    });
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_COMMIT | XACT_EVENT_PRE_PREPARE => {
            if let Some((table, key)) = WROTE.with(|w| w.borrow_mut().take())
                && distributed_transaction()
            {
                tell_citus(table, &key);
            }
        }
        XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE => {
            WROTE.with(|w| *w.borrow_mut() = None)
        }
        _ => {}
    }
}

/// Where Citus began a distributed transaction (it may have written on
/// other nodes), have it commit by two-phase commit as it would had it
/// written the shard itself: a write to the shard through it, which
/// changes no row, run by its local execution, which marks the
/// transaction for two-phase commit. Run before Citus's own pre-commit
/// callback (a backend calls the latest registered first). An error here
/// aborts the transaction, as any at commit does.
fn tell_citus(table: pg_sys::Oid, key: &[u8]) {
    // SAFETY: a catalog lookup by OID, in the transaction.
    let name = unsafe { pg_sys::get_rel_name(table) };
    let by_workflow = !name.is_null()
        // SAFETY: a NUL-terminated name palloc'd by get_rel_name
        && matches!(unsafe { CStr::from_ptr(name) }.to_bytes(), b"claims" | b"checkpoints");
    let sql = if by_workflow {
        // `key` is the distribution value: the workflow, or its place
        // where claims are kept with the queues; naming both columns, the
        // statement is routed by whichever it is (and changes no row: no
        // token is negative)
        "UPDATE sturdy.claims SET token = token
          WHERE place OPERATOR(pg_catalog.=) $1 AND workflow OPERATOR(pg_catalog.=) $1
            AND token OPERATOR(pg_catalog.<) 0"
    } else {
        "UPDATE sturdy.queue SET takes = takes
          WHERE queue OPERATOR(pg_catalog.=) $1 AND workflow OPERATOR(pg_catalog.=) ''"
    };
    let key = String::from_utf8_lossy(key).into_owned();
    // SAFETY: a snapshot for the statement, pushed and popped around it
    // (pre-commit has none active); an error ends the transaction, whose
    // abort pops it.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
    Spi::run_with_args(sql, &[key.into()]).expect("the no-op write Citus's commit needs");
    // SAFETY: the snapshot pushed above
    unsafe { pg_sys::PopActiveSnapshot() };
}

/// Whether Citus began a distributed transaction in this one:
/// `get_current_transaction_id()`'s transaction number is not zero.
fn distributed_transaction() -> bool {
    let function = TRANSACTION_ID.with(Cell::get);
    if function == pg_sys::InvalidOid {
        return true; // never found: assume it did
    }
    // SAFETY: a function of no arguments returning a composite, called in
    // the transaction (pre-commit); its fourth attribute is a bigint.
    unsafe {
        let row = pg_sys::OidFunctionCall0Coll(function, pg_sys::InvalidOid);
        let mut isnull = false;
        let number = pg_sys::GetAttributeByNum(row.cast_mut_ptr(), 4, &mut isnull);
        !isnull && number.value() as i64 != 0
    }
}

fn setting(name: &CStr) -> Option<&'static CStr> {
    // SAFETY: the name is NUL-terminated; the answer is the GUC's own
    // string, valid until it is next set (we read it at once).
    unsafe {
        let v = pg_sys::GetConfigOption(name.as_ptr(), true, false);
        (!v.is_null()).then(|| CStr::from_ptr(v))
    }
}

/// Where `table`'s rows of distribution value `key` are on this node, and a
/// call may write them there itself (see the module comment): the shard,
/// its metadata lock taken. `None`, with nothing taken, where a statement
/// must go through Citus.
pub fn local(table: pg_sys::Oid, key: &[u8]) -> Option<Shard> {
    // SAFETY: backend state read inside a transaction.
    if unsafe { pg_sys::IsTransactionBlock() }
        || setting(c"citus.enable_local_execution").is_none_or(|v| v.to_bytes() != b"on")
        || setting(c"application_name").is_some_and(|v| v.to_bytes().starts_with(b"citus_internal"))
    {
        return None;
    }
    watch();
    let shard = find(table, key)?;
    let tag = pg_sys::LOCKTAG {
        // SAFETY: this backend's database, set at its start
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: shard.index,
        locktag_field3: shard.colocation,
        locktag_field4: COLOCATED_SHARDS_METADATA,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    };
    // SAFETY: a transaction-scoped lock on a tag of our making, as Citus's
    // executor takes it; then the invalidations a change of placement that
    // committed while we waited sent.
    unsafe {
        pg_sys::LockAcquire(&tag, pg_sys::ShareLock as _, false, false);
        pg_sys::AcceptInvalidationMessages();
    }
    if find(table, key) != Some(shard) {
        return None;
    }
    WROTE.with(|w| {
        let mut w = w.borrow_mut();
        if w.is_none() {
            *w = Some((table, key.to_vec()));
        }
    });
    Some(shard)
}

fn watch() {
    if WATCHING.with(Cell::get) {
        return;
    }
    // SAFETY: registering a callback that only checks and clears what
    // this module keeps. (Invalidations come through `scaleout`'s, which
    // is registered before any call here: `access` asks it first.)
    unsafe { pg_sys::RegisterXactCallback(Some(at_end), std::ptr::null_mut()) };
    WATCHING.with(|w| w.set(true));
}

/// The shard (see [`SHARDS`]), found in Citus's metadata on a miss: its
/// relation, its index among the table's shards by hash range (Citus's
/// `shardIndex`), and its colocation group; only for a hash-distributed
/// table in one.
fn find(table: pg_sys::Oid, key: &[u8]) -> Option<Shard> {
    let entry = (table, key.to_vec());
    if let Some(known) = SHARDS.with(|s| s.borrow().get(&entry).copied()) {
        return known;
    }
    let value = std::str::from_utf8(key).ok()?;
    let epoch = EPOCH.with(Cell::get);
    let found = Spi::connect(|client| {
        if TRANSACTION_ID.with(Cell::get) == pg_sys::InvalidOid {
            let oid = client
                .select(
                    "SELECT pg_catalog.to_regprocedure('pg_catalog.get_current_transaction_id()')::pg_catalog.oid",
                    None,
                    &[],
                )?
                .first()
                .get_one::<pg_sys::Oid>()?;
            TRANSACTION_ID.with(|t| t.set(oid.unwrap_or(pg_sys::InvalidOid)));
        }
        let row = client.select(
            "SELECT pg_catalog.to_regclass(pg_catalog.shard_name($1, s.shardid))::pg_catalog.oid,
                    (SELECT pg_catalog.count(*) FROM pg_catalog.pg_dist_shard o
                      WHERE o.logicalrelid OPERATOR(pg_catalog.=) s.logicalrelid
                        AND o.shardminvalue::pg_catalog.int4 OPERATOR(pg_catalog.<) s.shardminvalue::pg_catalog.int4)::pg_catalog.int4,
                    p.colocationid
               FROM pg_catalog.pg_dist_shard s
               JOIN pg_catalog.pg_dist_partition p ON p.logicalrelid OPERATOR(pg_catalog.=) s.logicalrelid
              WHERE s.shardid OPERATOR(pg_catalog.=) pg_catalog.get_shard_id_for_distribution_column($1, $2)
                AND p.partmethod OPERATOR(pg_catalog.=) 'h' AND p.colocationid OPERATOR(pg_catalog.<>) 0
                AND EXISTS (SELECT FROM pg_catalog.pg_dist_placement pl
                             WHERE pl.shardid OPERATOR(pg_catalog.=) s.shardid
                               AND pl.groupid OPERATOR(pg_catalog.=) (SELECT groupid FROM pg_catalog.pg_dist_local_group))",
            None,
            &[
                pgrx::datum::DatumWithOid::from(table),
                value.into(),
            ],
        )?;
        if row.is_empty() {
            return Ok::<_, pgrx::spi::Error>(None);
        }
        let (relid, index, colocation) = row.first().get_three::<pg_sys::Oid, i32, i32>()?;
        Ok(relid.zip(index).zip(colocation).map(|((relid, index), colocation)| Shard {
            relid,
            index: index as u32,
            colocation: colocation as u32,
        }))
    })
    .ok()
    .flatten();
    if EPOCH.with(Cell::get) == epoch {
        SHARDS.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() >= 4096 {
                s.clear();
            }
            s.insert(entry, found);
        });
    }
    found
}
