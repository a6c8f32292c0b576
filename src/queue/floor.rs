//! take's floors: where this backend's takes scan a queue from, when they
//! scan from the start instead, and take's generation.

use super::*;

/// Where this backend's takes scan a queue from.
///
/// `take` scans `queue_visible` in `visible_at` order. Rows taken and done
/// leave index entries behind at the front of that order, and while any
/// snapshot older than their deletion lives (a forgotten `BEGIN`, a long
/// report: a pinned xmin) vacuum cannot remove them, nor can index scans mark
/// them dead, so a scan from the start walks all of them, heap visits and
/// all, on every take: measured, a 16-client churn fell to a fifth of its rate
/// within minutes (docs/benchmarks.md, the churn soak).
///
/// So each backend keeps, per queue, a floor: the place in (`visible_at`,
/// `seq`) order of the oldest row its last take found (every entry before it
/// is of a row taken, or held by another take), or where that is lower the
/// later of [`SLACK`](crate::rescan::SLACK) before that take's transaction
/// began and the oldest running transaction's start ([`floor_after`]); its
/// next take scans from there. Since `seq` makes
/// every place in the index distinct, a take never walks the entries of a
/// drained batch scheduled with one `visible_at`, however long it was. A row
/// can be ready below the floor only by being written there: a past-dated
/// schedule or `wake_at` (they bump `sturdy.queue_generation`, and a take
/// that sees it changed scans from the start), a write committed more than
/// `SLACK` after its `visible_at` while the queue moved on, or a take of it
/// rolled back; or by its lease running out with no `done` (a lease keeps
/// the row in its place). For those, a take scans from the start when it
/// comes up short, on a generation change, and on the schedule of
/// [`Rescans`] (at least every second; rate-limited once such scans get
/// costly), a schedule the backends of a server share per queue where they
/// share floors ([`heads::claim_scan`]: one of them runs the scan due, not
/// each). With a healthy vacuum every short take and every generation
/// change scans from the start, and FIFO order is exact but for a row whose
/// write committed more than `SLACK` after its `visible_at` behind a busy
/// queue (or whose take rolled back, or whose lease ran out), which waits at
/// most a second.
pub(super) struct Floor {
    /// Scan from this place.
    pub(super) at: Position,
    /// The generation the floor holds for (`None`: unknown, it holds for none).
    pub(super) generation: Option<i64>,
    pub(super) rescans: Rescans,
    /// The last scan from the start found rows below where the takes stood
    /// (left behind: see [`take`]): the next scans from the start too.
    pub(super) drain: bool,
}

/// A take that comes up short more than this long (µs) after its
/// transaction began, or after its last scan by the clock began, scans
/// again by the clock before it says empty (see [`take`]): long enough
/// that others may have taken every row due by the time it judged by. A
/// take of an empty queue takes a few dozen microseconds.
pub(super) const RECHECK_AFTER: pg_sys::TimestampTz = 1_000;

/// The most scans by the clock a take that came up short runs (see [`take`]).
pub(super) const CLOCK_SCANS: usize = 4;

/// Queues a backend keeps floors for; past this many it forgets them all.
pub(super) const FLOORS_KEPT: usize = 1024;

thread_local! {
    pub(super) static FLOORS: RefCell<HashMap<Vec<u8>, Floor>> = RefCell::new(HashMap::new());
}

/// `clock_timestamp()` in µs, as [`heads::claim_scan`] reads the time.
pub(super) fn clock() -> pg_sys::TimestampTz {
    pg_sys::TimestampTz::from(pgrx::datum::clock_timestamp())
}

/// A schedule's interval in µs, as [`heads::claim_scan`] reads it.
pub(super) fn every(due: Duration) -> i64 {
    due.as_micros().try_into().unwrap_or(i64::MAX)
}

/// Keep the queue's floor after a take: the oldest row it took, or lower
/// where a transaction still to commit may write below it ([`floor_after`]; after
/// a scan from the start, which holds for `generation`; never lower than the
/// floor after one from the floor). `full`: what a scan from the start in
/// it cost, and whether it found rows left below the floor (`drain`);
/// `from`, where it started by a floor, which for a backend's first take
/// here is another backend's. `citus`: the tables are distributed.
pub(super) fn remember(
    queue: Name,
    taken: &Taken,
    full: Option<(Duration, bool)>,
    from: Option<Position>,
    generation: Option<i64>,
    citus: bool,
) {
    FLOORS.with(|f| {
        let mut floors = f.borrow_mut();
        let now = pg_sys::TimestampTz::from(pgrx::datum::now());
        // (the activity sample only where a floor is kept; not under
        // Citus, where a row's time is its transaction's start on the node
        // that began it, and the transaction that writes it here began
        // later, on this node)
        let found = || {
            let since = if citus {
                None
            } else {
                crate::activity::running_since()
            };
            floor_after(taken.oldest, now, since)
        };
        match (floors.get_mut(queue.bytes()), full) {
            (Some(fl), None) => {
                if taken.oldest.is_some() {
                    fl.at = fl.at.max(found());
                }
            }
            (Some(fl), Some((cost, drain))) => {
                fl.at = found();
                fl.generation = generation;
                fl.rescans.again(cost);
                fl.drain = drain;
            }
            (None, Some((cost, drain))) => {
                if floors.len() >= FLOORS_KEPT {
                    floors.clear();
                }
                floors.insert(
                    queue.bytes().to_vec(),
                    Floor {
                        at: found(),
                        generation,
                        rescans: Rescans::first(cost),
                        drain,
                    },
                );
            }
            (None, None) => {
                // by the floor another backend reached: kept as this one's,
                // its first scan from the start due a second from now
                // (costing nothing, until one is measured)
                let Some(from) = from else {
                    return;
                };
                if floors.len() >= FLOORS_KEPT {
                    floors.clear();
                }
                floors.insert(
                    queue.bytes().to_vec(),
                    Floor {
                        at: if taken.oldest.is_some() {
                            from.max(found())
                        } else {
                            from
                        },
                        generation,
                        rescans: Rescans::first(Duration::ZERO),
                        drain: false,
                    },
                );
            }
        }
    });
}

/// take's generation, read directly (as an SQL expression in every take
/// statement it cost take 14% in instructions; docs/internals.md). `None` in a
/// schema of a released version, which has no such sequence: there every
/// take scans from the start, as those versions did.
pub(super) mod generation {
    use crate::sequence::Sequence;

    static SEQUENCE: Sequence = Sequence::new(c"sturdy", c"queue_generation");

    /// The generation, and the sequence's OID where it exists (which names
    /// this installation's queues in `heads`).
    pub fn read() -> (Option<pgrx::pg_sys::Oid>, Option<i64>) {
        match SEQUENCE.last_value_of() {
            Some((oid, value)) => (Some(oid), value),
            None => (None, None),
        }
    }

    /// A row was made ready before now: this node's takes look from the
    /// start (see [`super::placed::backdated`], which also tells the node
    /// that holds the queue under Citus).
    pub fn bump_here() {
        SEQUENCE.advance();
    }
}
