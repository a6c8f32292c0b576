//! Whether the current role holds a privilege on one of our relations, as
//! `pg_class_aclcheck` answers, kept per backend until an invalidation that
//! could change the answer. Asked before every call served without a
//! statement (`access`) and every sequence read directly (`sequence`).

use std::cell::{Cell, RefCell};

use pgrx::pg_sys;

thread_local! {
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    /// Whether a role holds a privilege on a table, as `pg_class_aclcheck`
    /// answered, by (role, table, privilege): kept until an invalidation
    /// that could change the answer (of the table: a `GRANT` or `REVOKE`;
    /// of any role or membership, or of a database, whose owner
    /// `pg_database_owner` stands for). `GRANTS_SEEN` counts those
    /// invalidations: an answer read across one is not kept.
    static GRANTS: RefCell<Vec<(pg_sys::Oid, pg_sys::Oid, u32, bool)>> =
        const { RefCell::new(Vec::new()) };
    static GRANTS_SEEN: Cell<u64> = const { Cell::new(0) };
}

/// Answers kept in `GRANTS`, at most.
const GRANTS_KEPT: usize = 64;

fn forget_grants() {
    GRANTS.with(|g| g.borrow_mut().clear());
    GRANTS_SEEN.with(|n| n.set(n.get() + 1));
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget_roles(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    forget_grants();
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget_relation(_arg: pg_sys::Datum, _relid: pg_sys::Oid) {
    // a GRANT or REVOKE on a table sends its relcache invalidation
    forget_grants();
}

/// Register, once per backend, the callbacks that clear the answers kept:
/// before anything is kept, so no invalidation can come between a kept
/// answer and its callback.
fn watch() {
    if WATCHING.with(Cell::get) {
        return;
    }
    // SAFETY: registering callbacks that only clear our cache.
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(Some(forget_relation), pg_sys::Datum::from(0));
        for cache in [
            pg_sys::SysCacheIdentifier::AUTHOID,
            pg_sys::SysCacheIdentifier::AUTHMEMMEMROLE,
            pg_sys::SysCacheIdentifier::AUTHMEMROLEMEM,
            pg_sys::SysCacheIdentifier::DATABASEOID,
        ] {
            pg_sys::CacheRegisterSyscacheCallback(
                cache as _,
                Some(forget_roles),
                pg_sys::Datum::from(0),
            );
        }
    }
    WATCHING.with(|w| w.set(true));
}

/// Whether the current role holds `privilege` on the relation `relid` (a
/// table, or one of our sequences).
pub fn holds(relid: pg_sys::Oid, privilege: u32) -> bool {
    watch();
    // SAFETY: a backend-local lookup and the ACL check of a relation that
    // exists (we hold no lock yet, as ExecCheckPermissions holds none).
    unsafe {
        let user = pg_sys::GetUserId();
        let kept = GRANTS.with(|g| {
            g.borrow()
                .iter()
                .find(|&&(u, r, p, _)| u == user && r == relid && p == privilege)
                .map(|&(.., held)| held)
        });
        if let Some(held) = kept {
            return held;
        }
        let seen = GRANTS_SEEN.with(Cell::get);
        let held = pg_sys::pg_class_aclcheck(relid, user, privilege as pg_sys::AclMode)
            == pg_sys::AclResult::ACLCHECK_OK;
        if GRANTS_SEEN.with(Cell::get) == seen {
            GRANTS.with(|g| {
                let mut grants = g.borrow_mut();
                if grants.len() >= GRANTS_KEPT {
                    grants.clear();
                }
                grants.push((user, relid, privilege, held));
            });
        }
        held
    }
}
