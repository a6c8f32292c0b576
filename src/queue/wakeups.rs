//! Wakeups: the mark an empty take leaves, the idle epoch, and the NOTIFY a
//! schedule sends only where a worker may wait (see the module comment).

use super::*;

/// The waiters' marks, for an empty take's mark without a statement.
static WAITERS: access::Table =
    access::Table::new(c"sturdy", c"queue_waiters", &[c"queue", c"since"]);
const W_QUEUE: access::Col = access::Col(0);
const W_SINCE: access::Col = access::Col(1);

/// A take that found nothing marks its queue as waited on, as
/// [`MARK_IDLE`]'s `INSERT ... ON CONFLICT DO NOTHING` does, without the
/// statement where `access` can: under Citus on the queue's node, where the
/// statement went through Citus's local execution, an idle worker's every
/// poll paid a statement planned on the node and parsed again for the
/// shard, and Citus then committed the take by two-phase commit.
pub(super) fn mark_idle(queue: Name) -> Result<()> {
    if let Some(q) = queue.into_datum() {
        let now = pg_sys::TimestampTz::from(pgrx::datum::now());
        let mark = access::Upsert {
            key: &[(W_QUEUE, q)],
            set: &[(
                W_SINCE,
                pg_sys::TIMESTAMPTZOID,
                Some(pg_sys::Datum::from(now)),
            )],
            fill: &[],
            insert_only: &[],
            only_if: None,
            increment: None,
            skip_locked: false,
        };
        let done = WAITERS.with(&[pg_sys::ACL_INSERT], queue.bytes(), |table| {
            table.insert_unless_there(&mark)
        })?;
        if done.is_some() {
            return Ok(());
        }
    }
    run_one(&MARK_IDLE, &[queue.into()], |_| Ok(()))
}

/// Where this backend last found a queue unmarked, by the idle epoch.
///
/// Every mark is made with a bump of `sturdy.queue_idle`, so while the epoch
/// stands where it stood when a probe found the queue unmarked, no worker can
/// have marked it since, and a schedule need not look. The bump comes before
/// the mark's commit, though: a probe that ran in between saw no mark and
/// proves nothing. So after this backend first sees an epoch, it keeps
/// probing on every ready schedule until one whose transaction started
/// [`SETTLE`] later finds the queue unmarked; only that one is trusted. A
/// mark committed more than `SETTLE` after its bump (a take inside a long
/// transaction) may be missed, and the worker's poll interval bounds the
/// delay, as for a schedule that ran concurrently with the empty take.
pub(super) struct Unmarked {
    /// The epoch the entry is about.
    pub(super) epoch: i64,
    /// When this backend first read that epoch (clock time).
    pub(super) seen: pg_sys::TimestampTz,
    /// A probe trusted for this epoch found the queue unmarked.
    pub(super) settled: bool,
}

/// How long a mark may take to commit after its bump and still be found.
pub(super) const SETTLE: pg_sys::TimestampTz = 1_000_000; // µs

thread_local! {
    pub(super) static UNMARKED: RefCell<HashMap<Vec<u8>, Unmarked>> = RefCell::new(HashMap::new());
}

/// A row of `queue` is ready now: wake its waiting workers, if any may wait.
pub(super) fn wake_if_waited(queue: Name) -> Result<()> {
    // a schema of a released version has no epoch: always look
    let Some(epoch) = idle::read() else {
        return wake(queue);
    };
    // Under Citus a take may run on any node and bump that node's epoch,
    // not this one's: look every time
    if crate::scaleout::distributed() {
        if run_one(&MARKED, &[queue.into()], first_value::<bool>)? == Some(true) {
            return wake(queue);
        }
        return Ok(());
    }
    let settled = UNMARKED.with(|u| {
        u.borrow()
            .get(queue.bytes())
            .is_some_and(|m| m.epoch == epoch && m.settled)
    });
    if settled {
        return Ok(());
    }
    if run_one(&MARKED, &[queue.into()], first_value::<bool>)? == Some(true) {
        return wake(queue);
    }
    let started = pg_sys::TimestampTz::from(pgrx::datum::now());
    let clock = pg_sys::TimestampTz::from(pgrx::datum::clock_timestamp());
    UNMARKED.with(|u| {
        let mut unmarked = u.borrow_mut();
        if unmarked.len() >= FLOORS_KEPT && !unmarked.contains_key(queue.bytes()) {
            unmarked.clear();
        }
        let m = unmarked.entry(queue.bytes().to_vec()).or_insert(Unmarked {
            epoch,
            seen: clock,
            settled: false,
        });
        if m.epoch != epoch {
            *m = Unmarked {
                epoch,
                seen: clock,
                settled: false,
            };
        }
        m.settled = started >= m.seen.saturating_add(SETTLE);
    });
    Ok(())
}

/// Clear the queue's waiter mark and notify (see [`WAKE`]).
pub(super) fn wake(queue: Name) -> Result<()> {
    if !crate::scaleout::distributed() {
        let payload = crate::datum::notify_payload(queue.bytes());
        return run_one(&WAKE, &[queue.into(), payload.into()], |_| Ok(()));
    }
    let cleared = run_one(&WAKE_ROUTED, &[queue.into()], |_| {
        Ok(!crate::plan::last_rows().is_empty())
    })?;
    if cleared {
        let payload = crate::datum::notify_payload(queue.bytes());
        run_one(&NOTIFY, &[payload.into()], |_| Ok(()))?;
    }
    Ok(())
}

/// The idle epoch (see [`Unmarked`]); `None` in a schema of a released
/// version, where every ready schedule looks for the mark.
///
/// A read serves this backend's schedules for [`FRESH`] of transaction
/// starts (reading the sequence cost a schedule 3.4k instructions a call,
/// docs/internals.md), which keeps the promise: a schedule whose transaction
/// starts a second after an empty take committed uses a read made at most
/// `FRESH` before that start, so after the take's bump, and looks for the
/// mark it made.
pub(super) mod idle {
    use std::cell::Cell;

    use pgrx::pg_sys;

    use crate::sequence::Sequence;

    static SEQUENCE: Sequence = Sequence::new(c"sturdy", c"queue_idle");

    /// How long a read serves, by transaction start: well under the second
    /// the promise allows.
    const FRESH: pg_sys::TimestampTz = 250_000; // µs

    thread_local! {
        /// The last read, and the start of the transaction that made it.
        pub(super) static LAST: Cell<Option<(Option<i64>, pg_sys::TimestampTz)>> = const { Cell::new(None) };
    }

    pub fn read() -> Option<i64> {
        let started = pg_sys::TimestampTz::from(pgrx::datum::now());
        if let Some((epoch, at)) = LAST.with(Cell::get)
            && at <= started
            && started < at.saturating_add(FRESH)
        {
            return epoch;
        }
        let epoch = SEQUENCE.last_value();
        LAST.with(|l| l.set(Some((epoch, started))));
        epoch
    }

    pub fn bump() {
        SEQUENCE.advance();
        // our own mark: the next schedule here reads the epoch it made
        LAST.with(|l| l.set(None));
    }
}
