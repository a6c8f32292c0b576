//! The planner settings a statement of ours runs under, set around its
//! execution only (the plan cache reads them when it makes or chooses a
//! plan) and put back when the execution ends or raises.

use pgrx::pg_sys;

use crate::error::Result;

/// Runs a kept plan custom (its parameters' values planned in) while it
/// lives: what a statement of ours needs under Citus, which plans a
/// statement by the distribution column's value. The plan cache reads the
/// setting when it chooses a plan, so it is set around our execution only,
/// and put back when the execution ends or raises.
pub struct Custom(Option<i32>);

impl Custom {
    pub fn around(sql: &str) -> Result<Custom> {
        if !crate::scaleout::distributed() {
            return Ok(Custom(None));
        }
        crate::scaleout::runs_here(sql)?; // (where it cannot run: an error)
        // SAFETY: a backend-local setting the plan cache reads; restored on drop.
        unsafe {
            let was = pg_sys::plan_cache_mode;
            pg_sys::plan_cache_mode = pg_sys::PlanCacheMode::PLAN_CACHE_MODE_FORCE_CUSTOM_PLAN as _;
            Ok(Custom(Some(was)))
        }
    }
}

impl Drop for Custom {
    fn drop(&mut self) {
        if let Some(was) = self.0 {
            // SAFETY: as in `around`.
            unsafe { pg_sys::plan_cache_mode = was }
        }
    }
}

/// Sequential scans off for the planner while it lives.
///
/// The plan cache makes a kept plan on its first run, and again after an
/// invalidation or when it turns a custom plan generic, for the tables as
/// they are then: on a queue still small a sequential scan is the cheaper
/// way to the rows a batch take leases by tuple id, and that plan stayed
/// while the queue grew (measured: a take of 16 reading 20,006 rows; under
/// the public harness's 16-worker backlog the takes' scans were most of the
/// server's time). Every statement of ours reaches its rows by key or tuple
/// id, or reads a table that stays small, and runs no caller code, so none
/// is planned with them. The setting's variable is set and put back as
/// [`Custom`] does `plan_cache_mode`'s, without a GUC nest level (a save and
/// restore on every call, docs/security.md); `SHOW` never runs in between.
pub struct NoSeqScans(bool);

impl NoSeqScans {
    pub fn set() -> NoSeqScans {
        // SAFETY: a backend-local setting the planner reads; restored on drop.
        unsafe {
            let was = pg_sys::enable_seqscan;
            pg_sys::enable_seqscan = false;
            NoSeqScans(was)
        }
    }
}

impl Drop for NoSeqScans {
    fn drop(&mut self) {
        // SAFETY: as in `set`.
        unsafe { pg_sys::enable_seqscan = self.0 }
    }
}
