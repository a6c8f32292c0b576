//! When a scan that starts at a remembered floor goes back to the start.
//!
//! `take` and `pump` read an index in time order (`visible_at`,
//! `next_attempt_at`) whose front fills with the entries of rows already
//! handed out: deleted or updated versions that vacuum has not removed yet,
//! or cannot while a snapshot older than them lives. A scan from the start
//! walks all of them, every call. So each backend keeps a floor, the oldest
//! row its last scan found or, where that is lower, the later of [`SLACK`]
//! before that scan's transaction began and the start of the oldest
//! transaction running ([`floor_after`]), and scans from there; rows that
//! are due below the floor (a write committed late, a lock released by a
//! rollback) are found by a scan from the start, which each caller runs when
//! it comes up short and at least every `max(1 s, 100 × c)`, where `c` is
//! the lesser cost of the last two scans from the start. Once `c` passes
//! [`CHEAP_SCAN`], scans from the start are limited to one per `100 × c`, so
//! they never take more than about 1% of the backend's time however many
//! dead entries there are. This module is that schedule; what a floor is
//! and when else it is void is the caller's, and so is skipping a scan due
//! where another backend ran one of the same queue within the interval
//! (`heads::claim_scan`).

use std::time::{Duration, Instant};

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;

/// How far below the oldest row it found a floor sits: room for writes that
/// commit a little after their timestamp, in a different order than their
/// timestamps.
pub const SLACK: pg_sys::TimestampTz = 100_000; // µs

/// A scan from the start that costs less than this is not rate-limited:
/// whenever a scan from the floor comes up short, one from the start follows.
pub const CHEAP_SCAN: Duration = Duration::from_millis(10);

/// Scans from the start come at least this often (and at most ten minutes
/// apart): [`Rescans::due`].
pub const LEAST_DUE: Duration = Duration::from_secs(1);

/// A place in a scan's order: a time and a tiebreaker that makes it exact
/// (`sturdy.queue.seq`, `sturdy.deliveries.id`).
pub type Position = (pg_sys::TimestampTz, i64);

/// Before every row.
pub const START: Position = (pg_sys::TimestampTz::MIN, i64::MIN);

/// A place's time as a statement parameter: the microseconds `Position`
/// holds, or an infinity for the bounds past any date (`START`, and the
/// pump's end).
pub fn time_param(t: pg_sys::TimestampTz) -> TimestampWithTimeZone {
    TimestampWithTimeZone::try_from(t).unwrap_or(if t < 0 {
        TimestampWithTimeZone::negative_infinity()
    } else {
        TimestampWithTimeZone::positive_infinity()
    })
}

/// The floor after a scan whose oldest row was at `oldest` (or that found
/// nothing, `None`), in a transaction that began at `now`, when no
/// transaction running began before `since` ([`crate::activity`]): that row,
/// or, where that is lower, the later of `since` and [`SLACK`] before `now`.
/// A row the scan could not see is written by a transaction that had not
/// committed when the scan began, so after `now`: one whose write commits
/// within `SLACK` of its time (what the floors promise to keep in order) has
/// a time after `now - SLACK`, and one no earlier than its transaction's
/// start (an earlier one is past-dated, which sends scans back to the
/// start) lies at or after `since`. Everything below the floor was seen,
/// and handed out or held by another scan.
///
/// (`SLACK` below the row found, as the floor was, kept the same promise
/// from further down: in a queue taken within `SLACK` of its writes each
/// take walked the index entries of a whole `SLACK` of rows already done,
/// which without the flush cannot be marked dead before the WAL writer has
/// flushed their commits.)
pub fn floor_after(
    oldest: Option<Position>,
    now: pg_sys::TimestampTz,
    since: Option<pg_sys::TimestampTz>,
) -> Position {
    let late = now.saturating_sub(SLACK).max(since.unwrap_or(i64::MIN));
    let recent = (late.min(now), i64::MIN);
    match oldest {
        Some(found) => found.min(recent),
        None => recent,
    }
}

/// The last scans from the start: when, and what they cost.
#[derive(Clone, Copy, Debug)]
pub struct Rescans {
    /// When the last scan from the start ended.
    at: Instant,
    /// What the last one took, and the lesser of that and the one before
    /// (`c`): a single slow one (a statement's first run prepares it; a lock
    /// wait, a stall) does not count.
    last_cost: Duration,
    full_cost: Duration,
}

/// Where the next scan starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanFrom {
    /// From the start: the last one is too long ago.
    Start,
    /// From the floor; `true` when a scan that comes up short may go on from
    /// the start (not rate-limited now).
    Floor(bool),
}

impl Rescans {
    /// The first scan from the start, just run at a cost of `cost`.
    pub fn first(cost: Duration) -> Self {
        Rescans {
            at: Instant::now(),
            last_cost: cost,
            full_cost: Duration::ZERO,
        }
    }

    /// Another scan from the start, just run at a cost of `cost`.
    pub fn again(&mut self, cost: Duration) {
        self.at = Instant::now();
        self.full_cost = cost.min(self.last_cost);
        self.last_cost = cost;
    }

    /// Where a scan starting at `now` starts.
    pub fn next(&self, now: Instant) -> ScanFrom {
        if now >= self.at + self.due() {
            ScanFrom::Start
        } else {
            ScanFrom::Floor(now >= self.at + self.gap())
        }
    }

    /// Scans from the start are rate-limited to one per this long, once they
    /// cost more than [`CHEAP_SCAN`].
    fn gap(&self) -> Duration {
        if self.full_cost < CHEAP_SCAN {
            Duration::ZERO
        } else {
            self.full_cost.saturating_mul(100)
        }
    }

    /// At the latest this long after the last scan from the start, the next.
    pub fn due(&self) -> Duration {
        self.gap().clamp(LEAST_DUE, Duration::from_secs(600))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_floor_is_exact_under_a_backlog_and_slack_before_the_transaction_above_it() {
        let now = 10_000_000;
        assert_eq!(
            floor_after(Some((now - 200_000, 7)), now, None),
            (now - 200_000, 7)
        );
        // a recent row: SLACK before the transaction, not below the row
        assert_eq!(
            floor_after(Some((now - 50_000, 7)), now, None),
            (now - SLACK, i64::MIN)
        );
        assert_eq!(
            floor_after(Some((now - SLACK, 7)), now, None),
            (now - SLACK, i64::MIN)
        );
        assert_eq!(floor_after(None, now, None), (now - SLACK, i64::MIN));
    }

    #[test]
    fn no_transaction_running_before_since_lifts_the_floor_to_since() {
        let now = 10_000_000;
        // every transaction running began 20 ms ago or later: the row
        // found 50 ms ago is the floor itself
        assert_eq!(
            floor_after(Some((now - 50_000, 7)), now, Some(now - 20_000)),
            (now - 50_000, 7)
        );
        assert_eq!(
            floor_after(Some((now - 5_000, 7)), now, Some(now - 20_000)),
            (now - 20_000, i64::MIN)
        );
        assert_eq!(
            floor_after(None, now, Some(now - 20_000)),
            (now - 20_000, i64::MIN)
        );
        // one began long ago: SLACK, as without `since`
        assert_eq!(
            floor_after(Some((now - 50_000, 7)), now, Some(now - 5_000_000)),
            (now - SLACK, i64::MIN)
        );
        // never above the transaction's own start
        assert_eq!(floor_after(None, now, Some(now + 1_000)), (now, i64::MIN));
    }

    #[test]
    fn cheap_scans_from_the_start_follow_every_short_scan_and_come_every_second() {
        let r = Rescans::first(Duration::from_millis(1));
        assert_eq!(r.next(r.at), ScanFrom::Floor(true));
        assert_eq!(
            r.next(r.at + Duration::from_millis(999)),
            ScanFrom::Floor(true)
        );
        assert_eq!(r.next(r.at + Duration::from_secs(1)), ScanFrom::Start);
    }

    #[test]
    fn costly_scans_from_the_start_are_one_per_hundred_times_their_cost() {
        let mut r = Rescans::first(Duration::from_millis(50));
        // one costly scan alone is not `c`: the lesser of the last two is
        assert_eq!(r.next(r.at), ScanFrom::Floor(true));
        r.again(Duration::from_millis(40));
        assert_eq!(
            r.next(r.at + Duration::from_secs(3)),
            ScanFrom::Floor(false)
        );
        assert_eq!(r.next(r.at + Duration::from_secs(4)), ScanFrom::Start);
    }
}
