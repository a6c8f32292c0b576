//! Helpers for `#[pg_test]`s.

use pgrx::prelude::*;

/// The SQLSTATE `sql` fails with, or `00000` when it succeeds. The statement
/// runs inside a PL/pgSQL exception block, so the error is caught by Postgres
/// itself and its code is read before any pgrx frame could re-code it.
pub fn sqlstate_of(sql: &str) -> String {
    Spi::run(
        "CREATE OR REPLACE FUNCTION pg_temp.sqlstate_of(q text) RETURNS text LANGUAGE plpgsql AS $$
         BEGIN EXECUTE q; RETURN '00000'; EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $$",
    )
    .unwrap();
    Spi::get_one_with_args::<String>("SELECT pg_temp.sqlstate_of($1)", &[sql.into()])
        .unwrap()
        .unwrap()
}

/// Rows in `table` (a trusted literal from the test itself).
pub fn count(table: &str) -> i64 {
    Spi::get_one::<i64>(&format!("SELECT count(*) FROM {table}"))
        .unwrap()
        .unwrap()
}
