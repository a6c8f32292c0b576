//! pg_sturdy: durable-execution primitives inside PostgreSQL.
//!
//! This file is the table of contents. The base rooms, which the capabilities
//! depend on and never the other way round:
//! - `error`: the one error enum (SQLSTATE, message, hint);
//! - `datum`: `text` and `jsonb` values passed through as Postgres holds them;
//! - `args`: argument checks, into validated values;
//! - `fmgr`: how Postgres calls us and how errors leave with their SQLSTATE;
//! - `plan`: statements prepared once per backend, set-returning results;
//! - `fragment`: caller-written SQL fragments checked and prepared;
//! - `access`: hot rows read and written through the access methods, without a statement;
//! - `grants`: whether the role holds a privilege on a relation of ours, kept per backend;
//! - `activity`: how early a transaction running now can have begun, from the server's activity table;
//! - `scaleout`: whether Citus distributes this database's tables of ours;
//! - `sequence`: reading a sequence of ours without a statement;
//! - `rescan`: when a scan from a remembered floor goes back to the start;
//! - `heads`: the furthest floor each queue's takes reached, shared by all backends;
//! - `subxact`: subtransactions and calling a caller's function.
//!
//! Each capability (`claim`, `checkpoint`, `queue`, `outbox`, `workflow`,
//! `batch`) is one module with the same shape (protocol comment, statements,
//! `#[sql_function]`s, tests) and names no other room's tables or columns;
//! its tables are in `sql/<capability>.sql`. The calls that span several
//! are in `compose`, built from the capabilities' operations. `make lint` checks these rules (`scripts/rooms.py`).
//! `unsafe` is allowed only in the base rooms that talk to the server's C
//! API.

#![deny(unsafe_code)]

::pgrx::pg_module_magic!();

#[allow(unsafe_code)]
pub mod access;
#[allow(unsafe_code)]
pub mod activity;
pub mod args;
#[allow(unsafe_code)]
pub mod datum;
pub mod error;
#[allow(unsafe_code)]
pub mod fmgr;
#[allow(unsafe_code)]
pub mod fragment;
#[allow(unsafe_code)]
pub mod grants;
#[allow(unsafe_code)]
pub mod heads;
pub mod placement;
#[allow(unsafe_code)]
pub mod plan;
#[allow(unsafe_code)]
pub mod planner;
#[allow(unsafe_code)]
pub mod scaleout;
#[allow(unsafe_code)]
pub mod sequence;
#[allow(unsafe_code)]
pub mod shard;
#[allow(unsafe_code)]
pub mod subxact;

mod batch;
mod checkpoint;
mod claim;
mod compose;
mod outbox;
mod queue;
mod rescan;
mod workflow;

#[cfg(any(test, feature = "pg_test"))]
mod testing;

// The tables, in dependency order; the functions' CREATE FUNCTIONs come from
// their `#[sql_function]`s, and the grants last.
pgrx::extension_sql_file!("../sql/claims.sql", name = "claims");
pgrx::extension_sql_file!(
    "../sql/checkpoints.sql",
    name = "checkpoints",
    requires = ["claims"]
);
pgrx::extension_sql_file!(
    "../sql/queue.sql",
    name = "queue",
    requires = ["checkpoints"]
);
pgrx::extension_sql_file!("../sql/outbox.sql", name = "outbox", requires = ["queue"]);
pgrx::extension_sql_file!(
    "../sql/workflow.sql",
    name = "workflow",
    requires = ["outbox"]
);
pgrx::extension_sql_file!("../sql/batch.sql", name = "batch", requires = ["workflow"]);
// (the health view counts what sturdy.stuck lists)
pgrx::extension_sql_file!(
    "../sql/health.sql",
    name = "health",
    requires = ["batch", "sturdy_stuck"]
);
pgrx::extension_sql_file!(
    "../sql/scaleout.sql",
    name = "scaleout",
    requires = ["health"]
);
pgrx::extension_sql_file!("../sql/finalize.sql", name = "finalize", finalize);

/// Run once per backend, when the library is loaded: our settings.
#[allow(unsafe_code)]
#[pgrx::pg_guard]
pub extern "C-unwind" fn _PG_init() {
    workflow::define_settings();
    heads::preload();
    planner::install();
}

/// Hooks for `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    /// Preloaded, as docs/operations.md advises on 15 (where the takes'
    /// shared floors need it; 17 and later share them without), so that
    /// the tests of the shared floors run on 15 too.
    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'pg_sturdy'"]
    }
}
