//! `watch`: waiting for an instance's end without polling.
//!
//! A waiter `LISTEN`s on `sturdy_instance`, then calls `watch(id)`: it locks
//! the instance's row, marks it watched where it is still pending or
//! running, and answers with its status. Every statement that moves an
//! instance to a terminal status returns [`notify_watchers`]'s expression,
//! which notifies only for a watched row. The two meet on the row lock, so
//! no end goes unannounced:
//!
//! - an end that locked the row first makes `watch` wait for its commit,
//!   and `watch` then reads the terminal status (nothing marked, nothing to
//!   wait for);
//! - a `watch` that locked it first commits its mark before the end's
//!   update can lock the row, and that update (in read committed, through
//!   the version it waited for) reads `watched` from the row it replaces, so
//!   its `RETURNING` sends the notification.
//!
//! Under repeatable read or serializable, the end's update of a row changed
//! since its snapshot fails with `40001` (retried by its caller), so it never
//! ends a row without reading its mark either. The mark stays on the row
//! (an instance ends once); a waiter that gives up leaves it, and the end
//! then sends one notification nobody hears.
//!
//! [`notify_watchers`]: super::notify_watchers

use pg_sturdy_macros::sql_function;
use pgrx::pg_sys;

use crate::args;
use crate::error::Result;
use crate::fmgr::Args;
use crate::plan::{self, Statement, first_value, run_one};

static LOCK: Statement = Statement {
    sql: "SELECT finished_at IS NULL AND NOT watched FROM sturdy.instances
           WHERE id OPERATOR(pg_catalog.=) $1 FOR NO KEY UPDATE",
    args: &[pg_sys::INT8OID],
    writes: true,
    generic: false,
};

static MARK: Statement = Statement {
    sql: "UPDATE sturdy.instances SET watched = true WHERE id OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::INT8OID],
    writes: true,
    generic: false,
};

static READ: Statement = Statement {
    sql: "SELECT status, revision, last_error FROM sturdy.instances WHERE id OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::INT8OID],
    writes: false,
    generic: false,
};

/// Returns its row through the call.
#[sql_function(
    "sturdy.watch(id bigint) RETURNS TABLE (status text, revision bigint, last_error text)
     VOLATILE PARALLEL UNSAFE ROWS 1",
    comment = "Ask to be told when instance id ends: marks it (if pending or running) so that its move to succeeded, failed or cancelled sends NOTIFY sturdy_instance with its id at commit; LISTEN sturdy_instance first. Returns its status, revision and last error now (no row when there is no such instance); a terminal status means there is nothing to wait for."
)]
fn watch(call: &Args, id: Option<i64>) -> Result<()> {
    let id = args::required("id", id)?;
    let unmarked = run_one(&LOCK, &[id.into()], first_value::<bool>)?.unwrap_or(false);
    if unmarked {
        run_one(&MARK, &[id.into()], |_| Ok(()))?;
    }
    plan::run_as_set(call, &READ, &[id.into()])?;
    Ok(())
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::testing::sqlstate_of;
    use pgrx::prelude::*;

    fn one<T: FromDatum + IntoDatum>(sql: &str) -> Option<T> {
        Spi::get_one::<T>(sql).expect(sql)
    }

    #[pg_test]
    fn watch_marks_a_live_instance_and_answers_its_status() {
        let id = one::<i64>("SELECT sturdy.start('w', 'bk-watch', '{}')").unwrap();
        let row = format!(
            "SELECT format('%s %s %s', status, revision, last_error) FROM sturdy.watch({id})"
        );
        assert_eq!(one::<String>(&row).as_deref(), Some("pending 1 "));
        assert_eq!(
            one::<bool>(&format!(
                "SELECT watched FROM sturdy.instances WHERE id = {id}"
            )),
            Some(true)
        );
        // the end reads the mark: its RETURNING notifies (delivered at
        // commit; pg_test/test_watch.py listens for it)
        assert_eq!(
            one::<bool>(&format!(
                "SELECT sturdy.transition({id}, 'pending', 'failed', error => 'no')"
            )),
            Some(true)
        );
        assert_eq!(one::<String>(&row).as_deref(), Some("failed 2 no"));
        assert_eq!(
            one::<i64>("SELECT count(*) FROM sturdy.watch(-1)"),
            Some(0),
            "no such instance: no row"
        );
    }

    #[pg_test]
    fn watch_leaves_an_ended_instance_unmarked() {
        let id = one::<i64>("SELECT sturdy.start('w', 'bk-ended', '{}')").unwrap();
        one::<bool>(&format!(
            "SELECT sturdy.transition({id}, 'pending', 'cancelled')"
        ));
        assert_eq!(
            one::<String>(&format!("SELECT status FROM sturdy.watch({id})")).as_deref(),
            Some("cancelled")
        );
        assert_eq!(
            one::<bool>(&format!(
                "SELECT watched FROM sturdy.instances WHERE id = {id}"
            )),
            Some(false)
        );
    }

    #[pg_test]
    fn watch_refuses_a_null_id() {
        assert_eq!(sqlstate_of("SELECT * FROM sturdy.watch(NULL)"), "22004");
    }
}
