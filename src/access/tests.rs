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
