//! How early a transaction running now can have begun: read off the server's
//! activity table (what `pg_stat_activity.xact_start` shows), a sample per
//! backend at most every [`SAMPLE_EVERY`].
//!
//! A floor (`rescan`) must stay below every row a transaction still to
//! commit may write into its index's order. A row scheduled for `now()`
//! lies at its transaction's start, so no transaction running now can write
//! one below the earliest of their starts. Each backend reports its
//! transaction's start in its activity entry as the transaction begins
//! (`track_activities`, on by default); a sample is the least of those,
//! taken [`MARGIN`] lower for the instant between a transaction's start and
//! its report. A sample stays a true bound after it is taken: a transaction
//! that begins later begins after it.
//!
//! Not seen: sessions where a superuser turned `track_activities` off, and
//! prepared transactions (they have no session). Their late rows are left to
//! what covered every late row before: the `SLACK` the floors keep anyway,
//! and the scans from the start.

use std::cell::Cell;

use pgrx::pg_sys;

/// How long a sample is used before the next one is taken.
pub const SAMPLE_EVERY: pg_sys::TimestampTz = 20_000; // µs
/// Below the sample's own time: a transaction that began just before the
/// sample may not have reported its start yet.
pub const MARGIN: pg_sys::TimestampTz = 10_000; // µs

thread_local! {
    /// The last sample: when it was taken (clock) and its bound.
    static SAMPLE: Cell<Option<(pg_sys::TimestampTz, pg_sys::TimestampTz)>> = const { Cell::new(None) };
}

/// No transaction running now began before this (see the module comment),
/// or `None` where this server does not report transaction starts.
pub fn running_since() -> Option<pg_sys::TimestampTz> {
    // SAFETY: reads the server's activity table through its own functions;
    // the copy they make lives in a context of the activity module's, which
    // `pgstat_clear_backend_activity_snapshot` frees; nothing of it is kept.
    unsafe {
        if !pg_sys::pgstat_track_activities {
            return None;
        }
        let clock = pg_sys::GetCurrentTimestamp();
        if let Some((at, bound)) = SAMPLE.with(Cell::get)
            && clock.saturating_sub(at) < SAMPLE_EVERY
            && at <= clock
        {
            return Some(bound);
        }
        // A copy of this transaction's, if it made one (`pg_stat_activity`),
        // could be of any age: a fresh one, freed after. (A caller that reads
        // `pg_stat_activity` again in this transaction gets a new copy.)
        pg_sys::pgstat_clear_backend_activity_snapshot();
        let mut bound = clock.saturating_sub(MARGIN);
        for i in 1..=pg_sys::pgstat_fetch_stat_numbackends() {
            #[cfg(feature = "pg15")]
            let entry = pg_sys::pgstat_fetch_stat_local_beentry(i);
            #[cfg(not(feature = "pg15"))]
            let entry = pg_sys::pgstat_get_local_beentry_by_index(i);
            if let Some(entry) = entry.as_ref() {
                let began = entry.backendStatus.st_xact_start_timestamp;
                if began != 0 {
                    bound = bound.min(began);
                }
            }
        }
        pg_sys::pgstat_clear_backend_activity_snapshot();
        SAMPLE.with(|s| s.set(Some((clock, bound))));
        Some(bound)
    }
}
