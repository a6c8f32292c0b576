//! Whether this database runs pg_sturdy distributed by Citus
//! (`sturdy.distribute()`, docs/scale-out.md), kept per backend.
//!
//! What changes when it does:
//! - every statement runs a custom plan: Citus routes a statement by the
//!   value of the distribution column, and cannot plan one whose value is a
//!   parameter of a generic plan;
//! - no row work is done without a statement (`access`) but on the node
//!   that holds the row's shard (`shard`): on the coordinator a distributed
//!   table is an empty shell, its rows on the workers;
//! - a take reads its own queue's limits, not every queue's (which would ask
//!   every shard), and keeps them as on one server on the coordinator and on
//!   the node that holds the queue, which the calls that change them tell;
//!   elsewhere it keeps nothing (`queue::placed`);
//! - on a worker node, a statement about a table kept on the coordinator
//!   raises `0A000` (`plan`): the node's own copy is empty;
//! - the takes keep no floor and share none: a floor is a position in this
//!   node's heap;
//! - `sweep` finds its instances and removes what belongs to them in steps,
//!   and statements that read both kinds of table read each in a step of its
//!   own: Citus refuses a join of a distributed table with a local one.
//!
//! - with queues (`distribute()`'s default), claims and checkpoints are
//!   placed by [`place_of`] their workflow, beside the queue the name starts
//!   with: every statement about one workflow's rows names its place too,
//!   which Citus routes by (`claim`'s and `checkpoint`'s `Placed`
//!   statements), and `access` keys those rows by (place, workflow).
//!
//! The answer is found once and kept until a relcache invalidation reaches
//! the backend: distributing a table sends one for it, so a session that
//! was open during `distribute()` learns of it at its next command.

use std::cell::Cell;

use pgrx::pg_sys;
use pgrx::prelude::*;

use pg_sturdy_macros::sql_function;

use crate::args;
use crate::datum::Text;
use crate::error::{Error, Result};

/// How this database's claims are placed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Placement {
    /// Not distributed: one server (or a Citus node before `distribute()`).
    OneServer,
    /// Distributed by the whole workflow name.
    ByWorkflow,
    /// Distributed by [`place_of`] the workflow, colocated with the queues.
    WithQueues,
}

thread_local! {
    static KNOWN: Cell<Option<Placement>> = const { Cell::new(None) };
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    /// Whether this node is the coordinator (Citus's local group 0).
    static COORDINATOR: Cell<Option<bool>> = const { Cell::new(None) };
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    KNOWN.with(|k| k.set(None));
    crate::shard::invalidated(relid);
}

/// Whether `sturdy.claims` is a Citus table in this database.
pub fn distributed() -> bool {
    placement() != Placement::OneServer
}

/// Whether claims and checkpoints are distributed with the queues: by
/// [`place_of`] their workflow, so every statement about one workflow's
/// rows must name its place, and `access` keys them by (place, workflow).
pub fn with_queues() -> bool {
    placement() == Placement::WithQueues
}

/// The value a workflow's claim and checkpoints are placed by when
/// distributed with the queues: its name up to the first `/` (`orders` for
/// `orders/77`, a `start`ed instance's process, which is its queue unless
/// given another), or the whole name where it has no `/` or starts with
/// one. Byte-wise: `/` is one byte in every server encoding.
pub fn place_of(workflow: &[u8]) -> &[u8] {
    match workflow.iter().position(|&b| b == b'/') {
        Some(at) if at > 0 => &workflow[..at],
        _ => workflow,
    }
}

#[sql_function(
    "sturdy.workflow_place(workflow text) RETURNS text IMMUTABLE PARALLEL SAFE",
    comment = "The value the workflow's claim and checkpoints are placed by under Citus, distributed with queues (sturdy.distribute()): its name up to the first /, or the whole name where it has none or starts with one. orders/77 is kept on the node of queue orders. The same on every server."
)]
fn workflow_place(workflow: Option<Text>) -> Result<Text> {
    let workflow = args::name("workflow", workflow)?;
    Ok(Text::from_bytes(place_of(workflow.bytes())))
}

fn placement() -> Placement {
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
    let known = if citus_catalog() {
        match claims_distributed_by().as_deref() {
            None => Placement::OneServer,
            Some("place") => Placement::WithQueues,
            Some(_) => Placement::ByWorkflow,
        }
    } else {
        Placement::OneServer
    };
    KNOWN.with(|k| k.set(Some(known)));
    known
}

/// Under Citus, whether this node is the coordinator (`queue::placed`
/// says what that changes for a take).
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

/// The column `sturdy.claims` is distributed by; `None` where it is not a
/// Citus table.
fn claims_distributed_by() -> Option<String> {
    // its own SPI level: we may be inside a statement's connection
    Spi::get_one::<String>(
        "SELECT COALESCE(pg_catalog.column_to_column_name(logicalrelid, partkey), '')
           FROM pg_catalog.pg_dist_partition
          WHERE logicalrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('sturdy.claims')",
    )
    .ok()
    .flatten()
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

    #[pg_test]
    fn workflow_place_is_the_name_up_to_its_first_slash_and_refuses_a_null_or_empty_one() {
        for (workflow, place) in [
            ("orders/77", "orders"),
            ("fulfil/order-77/retry", "fulfil"),
            ("plain", "plain"),
            ("/leading", "/leading"),
            ("trailing/", "trailing"),
            ("ünï/1", "ünï"),
            (
                "x'); DROP TABLE sturdy.claims; --/1",
                "x'); DROP TABLE sturdy.claims; --",
            ),
        ] {
            assert_eq!(
                Spi::get_one_with_args::<String>(
                    "SELECT sturdy.workflow_place($1)",
                    &[workflow.into()]
                )
                .unwrap()
                .as_deref(),
                Some(place),
                "{workflow}"
            );
        }
        assert_eq!(sqlstate_of("SELECT sturdy.workflow_place(NULL)"), "22004");
        assert_eq!(sqlstate_of("SELECT sturdy.workflow_place('')"), "22023");
        assert_eq!(
            sqlstate_of(&format!(
                "SELECT sturdy.workflow_place('{}')",
                "w".repeat(1025)
            )),
            "22023"
        );
        // on one server nothing is placed: the column stays NULL
        Spi::run("SELECT sturdy.claim('wp/1')").unwrap();
        Spi::run("SELECT sturdy.supply('wp/1', 's', '1')").unwrap();
        assert_eq!(
            Spi::get_one::<i64>(
                "SELECT (SELECT count(*) FROM sturdy.claims WHERE place IS NOT NULL)
                      + (SELECT count(*) FROM sturdy.checkpoints WHERE place IS NOT NULL)"
            )
            .unwrap(),
            Some(0)
        );
    }

    #[pg_test]
    fn queue_node_queue_changed_and_queue_backdated_refuse_a_null_or_empty_queue_and_write_nothing()
    {
        let rows = "SELECT (SELECT count(*) FROM sturdy.queue) + (SELECT count(*) FROM sturdy.queue_limits)";
        Spi::run("SELECT sturdy.limit_queue('qn', running => 2)").unwrap();
        let before = Spi::get_one::<i64>(rows).unwrap();
        for (call, state) in [
            ("SELECT * FROM sturdy.queue_node(NULL)", "22004"),
            ("SELECT * FROM sturdy.queue_node('')", "22023"),
            ("SELECT sturdy.queue_changed(NULL)", "22004"),
            ("SELECT sturdy.queue_changed('')", "22023"),
            ("SELECT sturdy.queue_backdated(NULL)", "22004"),
            ("SELECT sturdy.queue_backdated('')", "22023"),
        ] {
            assert_eq!(sqlstate_of(call), state, "{call}");
        }
        // a hostile name is a name: no node on one server, and a change
        // told to this node's sessions writes nothing
        let hostile = "'q''; DROP TABLE sturdy.queue; --'";
        assert_eq!(
            Spi::get_one::<i64>(&format!(
                "SELECT count(*) FROM sturdy.queue_node({hostile})"
            ))
            .unwrap(),
            Some(0)
        );
        Spi::run(&format!("SELECT sturdy.queue_changed({hostile})")).unwrap();
        Spi::run("SELECT sturdy.queue_changed('qn')").unwrap();
        Spi::run(&format!("SELECT sturdy.queue_backdated({hostile})")).unwrap();
        assert_eq!(Spi::get_one::<i64>(rows).unwrap(), before);
    }

    #[pg_test]
    fn queue_backdated_sends_this_nodes_takes_back_to_the_start() {
        // what a take compares its floor's generation with
        let generation = || {
            Spi::get_one::<i64>("SELECT last_value FROM sturdy.queue_generation")
                .unwrap()
                .unwrap()
        };
        let before = generation();
        Spi::run("SELECT sturdy.queue_backdated('qb')").unwrap();
        assert!(generation() > before);
        // and so does a past-dated schedule, through the same call
        let before = generation();
        Spi::run("SELECT sturdy.schedule('qb-1', now() - interval '1 minute', 'qb')").unwrap();
        assert!(generation() > before);
        let before = generation();
        Spi::run("SELECT sturdy.schedule('qb-2', now(), 'qb')").unwrap();
        assert_eq!(generation(), before);
    }
}
