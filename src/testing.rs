//! Helpers for `#[pg_test]`s.

use pgrx::prelude::*;

/// Define `pg_temp.error_of(q)` once per session: run `q` inside a PL/pgSQL
/// exception block, so the error is caught by Postgres itself and its fields
/// are read before any pgrx frame could re-code it. Defined only if missing,
/// so a test may call it after `SET ROLE`.
fn define_probe() {
    Spi::run(
        "DO $$BEGIN
           IF pg_catalog.to_regprocedure('pg_temp.error_of(text)') IS NULL THEN
             CREATE FUNCTION pg_temp.error_of(q text) RETURNS text LANGUAGE plpgsql AS $f$
             DECLARE s text; m text; d text; h text;
             BEGIN EXECUTE q; RETURN '00000';
             EXCEPTION WHEN OTHERS THEN
               GET STACKED DIAGNOSTICS s = RETURNED_SQLSTATE, m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL,
                                       h = PG_EXCEPTION_HINT;
               RETURN concat_ws(' | ', s, m, nullif(d, ''), nullif(h, ''));
             END $f$;
           END IF;
         END$$",
    )
    .unwrap();
}

/// `SQLSTATE | message | detail | hint` of the error `sql` fails with (empty
/// parts left out), or `00000` when it succeeds.
pub fn error_of(sql: &str) -> String {
    define_probe();
    Spi::get_one_with_args::<String>("SELECT pg_temp.error_of($1)", &[sql.into()])
        .unwrap()
        .unwrap()
}

/// The SQLSTATE `sql` fails with, or `00000` when it succeeds.
pub fn sqlstate_of(sql: &str) -> String {
    error_of(sql)[..5].to_owned()
}

/// A trigger on `table` that changes nothing (`BEFORE` the `events`, for
/// each row): it sends the calls that could go without a statement (see
/// `access`) to their statements, which fire it.
pub fn trigger_noop(table: &str, events: &str) {
    Spi::run(&format!(
        "CREATE OR REPLACE FUNCTION pg_temp.noop() RETURNS trigger LANGUAGE plpgsql AS
           $f$BEGIN RETURN NEW; END$f$;
         CREATE TRIGGER noop BEFORE {events} ON {table}
           FOR EACH ROW EXECUTE FUNCTION pg_temp.noop();"
    ))
    .unwrap();
}

/// Rows in `table` (a trusted literal from the test itself).
pub fn count(table: &str) -> i64 {
    Spi::get_one::<i64>(&format!("SELECT count(*) FROM {table}"))
        .unwrap()
        .unwrap()
}
