//! Whether this database runs pg_sturdy distributed by Citus
//! (`sturdy.distribute()`, docs/scale-out.md), kept per backend.
//!
//! What changes when it does:
//! - every statement runs a custom plan: Citus routes a statement by the
//!   value of the distribution column, and cannot plan one whose value is a
//!   parameter of a generic plan;
//! - no row work is done without a statement (`access`): on the coordinator
//!   a distributed table is an empty shell, its rows on the workers;
//! - a take reads its own queue's limits, not every queue's (which would ask
//!   every shard), and keeps them as on one server on the coordinator, where
//!   the calls that change them send their invalidations; on a worker node
//!   (a call made or delegated there) it keeps nothing ([`on_coordinator`]);
//! - on a worker node, a statement about a table kept on the coordinator
//!   raises `0A000` (`plan`): the node's own copy is empty;
//! - the takes keep no floor and share none: a floor is a position in this
//!   node's heap;
//! - `sweep` finds its instances and removes what belongs to them in steps,
//!   and statements that read both kinds of table read each in a step of its
//!   own: Citus refuses a join of a distributed table with a local one.
//!
//! The answer is found once and kept until a relcache invalidation reaches
//! the backend: distributing a table sends one for it, so a session that
//! was open during `distribute()` learns of it at its next command.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::access;
use crate::datum::Text;
use crate::error::{Error, Result};
use crate::plan::{self, Statement};

thread_local! {
    static KNOWN: Cell<Option<bool>> = const { Cell::new(None) };
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    /// Whether this node is the coordinator (Citus's local group 0).
    static COORDINATOR: Cell<Option<bool>> = const { Cell::new(None) };
    /// On a worker node: `sturdy.queue`'s OID, and per queue whether its
    /// shard is on this node, kept until an invalidation of the table (Citus
    /// sends one with every change of a shard's placement).
    static HELD: RefCell<(pg_sys::Oid, HashMap<Vec<u8>, bool>)> =
        RefCell::new((pg_sys::InvalidOid, HashMap::new()));
    /// How many such invalidations arrived: what is kept of a queue's
    /// settings here is kept under it too ([`settings_mark`]), so a shard
    /// moved away and back finds nothing kept from before.
    static PLACED: Cell<u64> = const { Cell::new(0) };
    /// Whether `sturdy.queue_changed` is delegated to the queue's node.
    static DELEGATED: Cell<Option<bool>> = const { Cell::new(None) };
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    KNOWN.with(|k| k.set(None));
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if relid == pg_sys::InvalidOid || relid == h.0 {
            h.1.clear();
            PLACED.with(|p| p.set(p.get() + 1));
            DELEGATED.with(|d| d.set(None));
        }
    });
}

/// Whether `sturdy.claims` is a Citus table in this database.
pub fn distributed() -> bool {
    // SAFETY: registering a callback that only clears our answer, then
    // applying pending invalidations inside a transaction (we are called
    // from a statement).
    unsafe {
        if !WATCHING.with(Cell::get) {
            pg_sys::CacheRegisterRelcacheCallback(Some(forget), pg_sys::Datum::from(0));
            WATCHING.with(|w| w.set(true));
        }
        pg_sys::AcceptInvalidationMessages();
    }
    if let Some(known) = KNOWN.with(Cell::get) {
        return known;
    }
    let known = citus_catalog() && claims_distributed();
    KNOWN.with(|k| k.set(Some(known)));
    known
}

/// Under Citus, whether this node is the coordinator. The calls that change
/// what a take keeps between calls (a queue's limits, the signal of a
/// prioritized row) send their invalidations from where they run, the
/// coordinator, so a backend on another node (a call made there, or
/// delegated there) keeps none of it (`access::Table::mark`).
pub fn on_coordinator() -> bool {
    if let Some(known) = COORDINATOR.with(Cell::get) {
        return known;
    }
    let known = Spi::get_one::<bool>(
        "SELECT groupid OPERATOR(pg_catalog.=) 0 FROM pg_catalog.pg_dist_local_group",
    )
    .ok()
    .flatten()
    .unwrap_or(true);
    COORDINATOR.with(|c| c.set(Some(known)));
    known
}

/// The tables `sturdy.distribute()` leaves on the coordinator: a worker
/// node has copies of its own, empty, which a call made there must not use.
const ON_COORDINATOR: &[&str] = &[
    "instances",
    "idempotency_keys",
    "outbox",
    "deliveries",
    "subscriptions",
    "outbox_waiters",
    "batches",
    "samples",
];

/// The first of [`ON_COORDINATOR`] that `sql` names.
fn coordinator_table(sql: &str) -> Option<&'static str> {
    ON_COORDINATOR.iter().copied().find(|table| {
        let name = format!("sturdy.{table}");
        sql.match_indices(&name).any(|(at, _)| {
            !sql[at + name.len()..].starts_with(|c: char| c == '_' || c.is_ascii_alphanumeric())
        })
    })
}

/// Under Citus on a worker node, the error for a statement about a table
/// kept on the coordinator ([`ON_COORDINATOR`]): the call is made where it
/// cannot run correctly.
pub fn runs_here(sql: &str) -> Result<()> {
    if !crate::scaleout::distributed() || crate::scaleout::on_coordinator() {
        return Ok(());
    }
    match coordinator_table(sql) {
        None => Ok(()),
        Some(table) => Err(Error::Raised {
            code: *b"0A000",
            message: format!(
                "this call needs sturdy.{table}, which pg_sturdy keeps on the Citus coordinator, and this node is a worker"
            ),
            detail: None,
            hint: Some(
                "Make this call on the coordinator. On a worker node only the calls about claims, checkpoints and queues run (docs/scale-out.md).".into(),
            ),
        }),
    }
}

/// Whether `queue`'s shard is on this node (a worker's).
fn holds(queue: &[u8]) -> Result<bool> {
    if let Some(known) = HELD.with(|h| h.borrow().1.get(queue).copied()) {
        return Ok(known);
    }
    let placed = PLACED.with(Cell::get);
    let (relid, held) = plan::run_one(&HOLDS, &[Text::from_bytes(queue).into()], |t| {
        Ok(t.first().get_two::<pg_sys::Oid, bool>()?)
    })?;
    let held = held.unwrap_or(false);
    // found across a change of placements: used once, not kept
    if PLACED.with(Cell::get) == placed {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            h.0 = relid.unwrap_or(pg_sys::InvalidOid);
            if h.1.len() >= 4096 {
                h.1.clear();
            }
            h.1.insert(queue.to_vec(), held);
        });
    }
    Ok(held)
}

static HOLDS: Statement = Statement {
    sql: "SELECT 'sturdy.queue'::pg_catalog.regclass::pg_catalog.oid,
                 EXISTS (SELECT FROM pg_catalog.pg_dist_placement p
                          WHERE p.shardid OPERATOR(pg_catalog.=)
                                pg_catalog.get_shard_id_for_distribution_column('sturdy.queue'::pg_catalog.regclass, $1)
                            AND p.groupid OPERATOR(pg_catalog.=) (SELECT groupid FROM pg_catalog.pg_dist_local_group))",
    args: &[pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

static DELEGATION: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_object o
                          WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                            AND o.objid OPERATOR(pg_catalog.=) 'sturdy.queue_changed(text)'::pg_catalog.regprocedure
                            AND o.force_delegation)",
    args: &[],
    writes: false,
    generic: false,
};

/// The mark under which a take keeps what it read of `queue`'s settings
/// (its limits, whether it has prioritized rows), from `mark`, the mark of
/// the table they come from. As it is on one server and on the coordinator,
/// where the calls that change them run. On a worker node, kept only where
/// the node holds the queue's shard (those calls send their invalidation
/// there too, through `sturdy.queue_changed`), and then moved by every
/// change of a shard's placement; elsewhere `Mark(0)`: nothing is kept.
pub fn settings_mark(queue: &[u8], mark: access::Mark) -> Result<access::Mark> {
    if !distributed() || on_coordinator() {
        return Ok(mark);
    }
    let delegated = match DELEGATED.with(Cell::get) {
        Some(known) => known,
        None => {
            let known =
                plan::run_one(&DELEGATION, &[], plan::first_value::<bool>)?.unwrap_or(false);
            DELEGATED.with(|d| d.set(Some(known)));
            known
        }
    };
    let keep = delegated && holds(queue)?;
    Ok(mark.with(PLACED.with(Cell::get), keep))
}

/// A queue's settings change (`limit_queue`, `pause`, `resume`, a
/// prioritized `schedule`): under Citus only on the coordinator, which
/// also tells the node holding the queue (`sturdy.queue_changed`, delegated
/// there by `distribute()`, runs there in this transaction and sends its
/// invalidation with its commit). On a worker node, `0A000`: the
/// coordinator's sessions would keep what they read before.
pub fn settings_changed(queue: &[u8]) -> Result<()> {
    if !distributed() {
        return Ok(());
    }
    if !on_coordinator() {
        return Err(Error::Raised {
            code: *b"0A000",
            message: "a queue's limits, its pause and its prioritized rows change on the Citus coordinator, and this node is a worker".into(),
            detail: None,
            hint: Some("Make this call on the coordinator: its sessions and the queue's node learn of the change at commit (docs/scale-out.md).".into()),
        });
    }
    plan::run_one(&TELL_QUEUE_NODE, &[Text::from_bytes(queue).into()], |_| {
        Ok(())
    })
}

/// Delegated to the queue's node (a function in `FROM`: Citus delegates a
/// call made inside another only that way, with `force_delegation`).
static TELL_QUEUE_NODE: Statement = Statement {
    sql: "SELECT FROM sturdy.queue_changed($1)",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// Whether Citus's metadata table is in this database (its extension
/// created).
fn citus_catalog() -> bool {
    // SAFETY: a catalog lookup inside a transaction; the name is a
    // NUL-terminated literal.
    unsafe {
        pg_sys::get_relname_relid(
            c"pg_dist_partition".as_ptr(),
            pg_sys::PG_CATALOG_NAMESPACE.into(),
        ) != pg_sys::InvalidOid
    }
}

/// Whether the table is one Citus manages (distributed, reference, or a
/// Citus local table); false where Citus is not installed.
pub fn citus_table(relid: pg_sys::Oid) -> bool {
    citus_catalog()
        && Spi::get_one_with_args::<bool>(
            "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                             WHERE logicalrelid OPERATOR(pg_catalog.=) $1)",
            &[relid.into()],
        )
        .ok()
        .flatten()
        .unwrap_or(false)
}

fn claims_distributed() -> bool {
    // its own SPI level: we may be inside a statement's connection
    Spi::get_one::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
                         WHERE logicalrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('sturdy.claims'))",
    )
    .ok()
    .flatten()
    .unwrap_or(false)
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::testing::sqlstate_of;
    use pgrx::prelude::*;

    #[pg_test]
    fn distribute_without_citus_is_refused_and_changes_nothing() {
        assert_eq!(sqlstate_of("SELECT sturdy.distribute()"), "0A000");
        assert!(!super::distributed());
        // the statements still plan as on one server: a take walks no
        // further than its row
        Spi::run("SELECT sturdy.schedule('d-1')").unwrap();
        assert_eq!(
            Spi::get_one::<String>("SELECT workflow FROM sturdy.take()").unwrap(),
            Some("d-1".into())
        );
    }
}
