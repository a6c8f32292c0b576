//! The planner settings a statement of ours runs under, set around its
//! execution only (the plan cache reads them when it makes or chooses a
//! plan) and put back when the execution ends or raises; and the planner
//! hooks that read what is set ([`install`]).

use std::cell::Cell;

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

/// Our statements' planner settings while it lives: sequential scans off,
/// and the extension's tables estimated as [`install`] says.
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
pub struct Ours {
    seqscan: bool,
    ours: bool,
}

thread_local! {
    /// Whether the statement being planned is one of ours ([`Ours`]).
    static OURS: Cell<bool> = const { Cell::new(false) };
}

impl Ours {
    pub fn set() -> Ours {
        // SAFETY: a backend-local setting the planner reads; restored on drop.
        let seqscan = unsafe {
            let was = pg_sys::enable_seqscan;
            pg_sys::enable_seqscan = false;
            was
        };
        Ours {
            seqscan,
            ours: OURS.with(|o| o.replace(true)),
        }
    }
}

impl Drop for Ours {
    fn drop(&mut self) {
        // SAFETY: as in `set`.
        unsafe { pg_sys::enable_seqscan = self.seqscan }
        OURS.with(|o| o.set(self.ours));
    }
}

static mut PREVIOUS: pg_sys::get_relation_info_hook_type = None;
static mut PREVIOUS_STATS: pg_sys::get_relation_stats_hook_type = None;

/// From `_PG_init`: while one of our statements is planned, size the
/// extension's tables by their pages and plan every queue at the default
/// share of them ([`relation_stats`]).
///
/// The planner counts a table's rows as `ANALYZE` or `VACUUM` last found
/// them live, and a queue's share of them by the same sample. Neither says
/// anything of the dead entries an index scan walks as it walks live ones:
/// a queue is often found empty (drained, or full of versions an old
/// snapshot keeps: the public harness's idle-in-transaction phase) or a
/// sliver of its table, and where the planner believes a queue holds one
/// row, a walk of it costs what a lookup by key does. Then `done` read
/// `queue_visible` by queue name instead of the primary key, and
/// `done_many` the whole queue once instead of a key per pair: every entry
/// of the queue, dead ones included, each call, until the next `ANALYZE`
/// (a minute-long stall under the harness; `pg_test/test_plans.py`). So
/// for our statements each table of the extension's schema counts as many
/// rows as its pages hold at its rows' width (the planner's own guess for
/// a table never analyzed) where that is more, its full indexes as many
/// entries, and a queue's share is the default one. A lookup by key is
/// then always the cheaper; the statements that take pairs also look each
/// one up apart (`LATERAL ... OFFSET 0`), which no estimate can merge into
/// a walk of the queue. Other statements, the callers' own included, are
/// planned as the server plans them.
pub fn install() {
    // SAFETY: runs in `_PG_init`, once per process that loads us (a
    // backend inherits the postmaster's when preloaded), and chains the
    // hook as every extension does.
    unsafe {
        PREVIOUS = pg_sys::get_relation_info_hook;
        pg_sys::get_relation_info_hook = Some(relation_info);
        PREVIOUS_STATS = pg_sys::get_relation_stats_hook;
        pg_sys::get_relation_stats_hook = Some(relation_stats);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn relation_info(
    root: *mut pg_sys::PlannerInfo,
    relation: pg_sys::Oid,
    inherited: bool,
    rel: *mut pg_sys::RelOptInfo,
) {
    // SAFETY: the planner's call, with its own `rel` for `relation` (locked
    // by the planner), which the hook may adjust; the lookups are the
    // catalog caches'.
    unsafe {
        if let Some(previous) = PREVIOUS {
            previous(root, relation, inherited, rel);
        }
        if !OURS.with(Cell::get) || inherited || !extensions(relation) {
            return;
        }
        let rel = &mut *rel;
        if rel.pages > 0 {
            // a row's width with its header (24, aligned) and line pointer
            // (4) over a page less its header (24), as estimate_rel_size
            let width = pg_sys::get_relation_data_width(relation, std::ptr::null_mut()).max(1) + 28;
            let per_page = (f64::from(pg_sys::BLCKSZ - 24) / f64::from(width)).floor();
            let full = f64::from(rel.pages) * per_page.max(1.0);
            if rel.tuples < full {
                rel.tuples = full;
                for index in pgrx::PgList::<pg_sys::IndexOptInfo>::from_pg(rel.indexlist).iter_ptr()
                {
                    if (*index).indpred.is_null() && (*index).tuples < full {
                        (*index).tuples = full;
                    }
                }
            }
        }
    }
}

/// Whether `relation` is one of the extension's tables.
///
/// # Safety
/// In a transaction (catalog lookups).
unsafe fn extensions(relation: pg_sys::Oid) -> bool {
    // SAFETY: the catalog caches', in the planner's transaction.
    unsafe {
        pg_sys::get_rel_namespace(relation) == pg_sys::get_namespace_oid(c"sturdy".as_ptr(), true)
    }
}

/// No statistics for the `queue` column of the extension's tables while
/// one of our statements is planned: each queue is planned as the
/// planner's default share of its table's rows (one in 200, or one row of
/// a table of fewer), whatever share of the live rows `ANALYZE` found in
/// it, so that a lookup by key never ties with a walk of its queue.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn relation_stats(
    root: *mut pg_sys::PlannerInfo,
    rte: *mut pg_sys::RangeTblEntry,
    attribute: pg_sys::AttrNumber,
    vardata: *mut pg_sys::VariableStatData,
) -> bool {
    // SAFETY: the planner's call for a column of `rte`'s relation; a hook
    // that returns true with no tuple leaves the column without statistics.
    unsafe {
        if OURS.with(Cell::get)
            && (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION
            && !(*rte).inh
            && extensions((*rte).relid)
            && pg_sys::get_attnum((*rte).relid, c"queue".as_ptr()) == attribute
        {
            (*vardata).statsTuple = std::ptr::null_mut();
            (*vardata).freefunc = None;
            return true;
        }
        match PREVIOUS_STATS {
            Some(previous) => previous(root, rte, attribute, vardata),
            None => false,
        }
    }
}
