//! pg_sturdy: durable-execution primitives inside PostgreSQL.
//!
//! This file is the table of contents. Each capability is one module with the
//! same shape (protocol comment, statements, SQL functions, tests); its tables
//! and `CREATE FUNCTION`s are in `sql/<capability>.sql`, which point at the
//! entry points the module declares. Contract: DESIGN.md; user docs: README.md.

::pgrx::pg_module_magic!();

pub mod error;
pub mod spi;

mod checkpoint;
mod claim;
mod queue;

#[cfg(any(test, feature = "pg_test"))]
mod testing;

// The install script, in dependency order.
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
pgrx::extension_sql_file!("../sql/finalize.sql", name = "finalize", finalize);

/// Hooks for `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
