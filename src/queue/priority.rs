//! Priorities: among a queue's ready rows, `take` hands out a higher
//! `priority` first, then the oldest `visible_at`, then arrival (`seq`).
//!
//! Rows above the default priority (0) are the only ones in the partial
//! index `queue_prioritized` (queue, priority, visible_at, seq). A take of a
//! queue that has any first descends that index's levels from the highest
//! (one probe each: the next lower priority that exists) and leases each
//! level's ready rows in take's order ([`TAKE_PRIORITIZED`]); what it still
//! wants then comes from the default level by the usual machinery (floors,
//! the path without a statement). Negative priorities are refused by
//! `schedule`: rows below the default would make every take look past the
//! whole default level to reach them, or order the default level's index
//! by priority, which every take of every queue would pay for.
//!
//! A queue without prioritized rows pays nothing for this but a check of a
//! relcache-invalidation mark: each backend remembers, per queue, that it
//! found none there ([`NONE_FOUND`]), under the mark of
//! `sturdy.queue_priorities` ([`SIGNAL`]) it read before looking. A
//! transaction that schedules a row with a priority sends a relcache
//! invalidation of that sequence, which PostgreSQL delivers to every
//! backend after the commit is visible; a take that starts after it has
//! taken it in (every statement start does) and looks again. A take in a
//! repeatable-read transaction that began before the commit, whose
//! snapshot cannot see the row, remembers "none" under the new mark: every
//! backend looks again at least every [`LOOK_AGAIN`] whatever the mark
//! says.

use super::*;

/// The relation whose relcache invalidation says "a row with a priority
/// was scheduled": a sequence nothing else reads or writes, so the
/// invalidation costs the backends nothing but their marks.
static SIGNAL: access::Table = access::Table::new(c"sturdy", c"queue_priorities", &[]);

/// How long a backend goes by having found a queue without prioritized
/// rows, the mark unchanged, before it looks again.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// Queues a backend remembers; past this many it forgets them all.
const KEPT: usize = 1024;

thread_local! {
    /// Per queue: the mark under which this backend found no prioritized
    /// row there, and when.
    static NONE_FOUND: RefCell<HashMap<Vec<u8>, (access::Mark, Instant)>> = RefCell::new(HashMap::new());
}

/// A row of `queue` was scheduled with a priority: every backend looks
/// again once this transaction commits, and this one at once.
pub(super) fn scheduled(queue: Name) -> Result<()> {
    placed::settings_changed(queue.bytes())?;
    signalled(queue);
    Ok(())
}

/// What [`scheduled`] does on this node (`sturdy.queue_changed` does it on
/// the queue's node under Citus).
pub(super) fn signalled(queue: Name) {
    SIGNAL.invalidate();
    NONE_FOUND.with(|n| n.borrow_mut().remove(queue.bytes()));
}

/// Whether a take of `queue` is to look for prioritized rows; with the mark
/// to remember a look that finds none by. `None` where the schema has no
/// priorities (0.1.0's).
pub(super) fn to_look(queue: Name) -> Result<Option<access::Mark>> {
    let Some(mark) = SIGNAL.mark() else {
        return Ok(None);
    };
    let mark = placed::settings_mark(queue.bytes(), mark)?;
    let known = NONE_FOUND.with(|n| {
        n.borrow()
            .get(queue.bytes())
            .is_some_and(|&(m, at)| m == mark && at.elapsed() < LOOK_AGAIN)
    });
    Ok((!known).then_some(mark))
}

static ANY: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM sturdy.queue
                          WHERE queue OPERATOR(pg_catalog.=) $1 AND priority OPERATOR(pg_catalog.>) 0)",
    args: &[pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

/// Whether `queue` may have prioritized rows: without a look where this
/// backend found none under the mark of now (see [`to_look`]), else by one
/// probe of the partial index ([`probed`], or a statement), remembered.
pub(super) fn any(queue: Name) -> Result<bool> {
    let Some(mark) = to_look(queue)? else {
        return Ok(false);
    };
    let any = match probed(queue)? {
        Some(any) => any,
        None => run_one(&ANY, &[queue.into()], first_value::<bool>)?.unwrap_or(true),
    };
    found(queue, mark, any);
    Ok(any)
}

/// Whether `queue` has prioritized rows, found without a statement (one
/// probe of `queue_prioritized`, `access`), where the call may do its row
/// work here; `None` where a statement must say. A take's look, every
/// second per queue and backend, costs a probe, not [`TAKE_PRIORITIZED`]:
/// under Citus that statement is planned for the shard and run through
/// Citus's local execution, which parses it again, and it opens a
/// distributed transaction that the take's own write then commits by
/// two-phase commit (`shard`).
fn probed(queue: Name) -> Result<Option<bool>> {
    let Some(q) = queue.into_datum() else {
        return Ok(None);
    };
    QUEUE.with(&[], queue.bytes(), |table| {
        Ok(table.any_positive(Q_QUEUE, Q_PRIORITY, q))
    })
}

/// Remember that `queue` had no prioritized row under `mark`, or forget
/// that it had none.
pub(super) fn found(queue: Name, mark: access::Mark, any: bool) {
    NONE_FOUND.with(|n| {
        let mut n = n.borrow_mut();
        if any || !mark.keepable() {
            n.remove(queue.bytes());
        } else {
            if n.len() >= KEPT {
                n.clear();
            }
            n.insert(queue.bytes().to_vec(), (mark, Instant::now()));
        }
    });
}

/// The levels above the default, highest first (each one probe of
/// `queue_prioritized`, backwards), as a take statement's first CTE.
macro_rules! levels {
    () => {
        "WITH RECURSIVE levels AS (
              SELECT (SELECT priority FROM sturdy.queue
                       WHERE queue OPERATOR(pg_catalog.=) $1 AND priority OPERATOR(pg_catalog.>) 0
                       ORDER BY priority DESC LIMIT 1) AS p
            UNION ALL
              SELECT (SELECT priority FROM sturdy.queue
                       WHERE queue OPERATOR(pg_catalog.=) $1 AND priority OPERATOR(pg_catalog.>) 0
                         AND priority OPERATOR(pg_catalog.<) l.p
                       ORDER BY priority DESC LIMIT 1)
                FROM levels l WHERE l.p IS NOT NULL)"
    };
}
pub(super) use levels;

/// Lease up to `$3` ready rows above the default priority, level by level
/// from the highest, each level in take's order (`$4`: due by; `$2`: the
/// lease). Returns each row leased (workflow, receipt); one row whose
/// workflow is NULL for each row locked but not leased (see the take
/// statements in `sql.rs`: run again); and in every row whether the queue
/// has any prioritized row at all (a row with nothing else where it has
/// none ready).
static TAKE_PRIORITIZED: Statement = Statement {
    sql: concat!(
        levels!(),
        ",
          due AS MATERIALIZED (
              SELECT r.ctid, r.workflow, r.leased_until FROM levels l CROSS JOIN LATERAL (
                  SELECT ctid, workflow, leased_until FROM sturdy.queue
                   WHERE queue OPERATOR(pg_catalog.=) $1 AND priority OPERATOR(pg_catalog.=) l.p
                     AND priority OPERATOR(pg_catalog.>) 0
                     AND visible_at OPERATOR(pg_catalog.<=) $4
                     AND (leased_until IS NULL OR leased_until OPERATOR(pg_catalog.<=) $4)
                   ORDER BY visible_at, seq
                   LIMIT $3
                   FOR UPDATE SKIP LOCKED) r
               WHERE l.p IS NOT NULL
               LIMIT $3),
          taken AS (
              UPDATE sturdy.queue AS q
                 ", super::sql::taken_set!(), "
               WHERE q.queue OPERATOR(pg_catalog.=) $1 COLLATE \"default\" AND q.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM due))
                 AND q.leased_until IS NULL
              RETURNING q.workflow, q.leased_until AS receipt, COALESCE(q.attempts, 0) OPERATOR(pg_catalog.+) 1 AS attempt, q.input)
          SELECT t.workflow, t.receipt, NULL::pg_catalog.int8, t.attempt, t.input,
                 (SELECT p FROM levels LIMIT 1) IS NOT NULL, d.workflow IS NOT NULL,
                 CASE WHEN d.leased_until IS NOT NULL THEN d.workflow END, d.leased_until
            FROM (SELECT) one
            LEFT JOIN (due d LEFT JOIN taken t ON t.workflow OPERATOR(pg_catalog.=) d.workflow) ON true"
    ),
    args: &[
        pg_sys::TEXTOID,
        pg_sys::INTERVALOID,
        pg_sys::INT8OID,
        pg_sys::TIMESTAMPTZOID,
    ],
    writes: true,
    generic: true,
};

/// A take's prioritized rows: up to `max` leased, handed as `hand` asks
/// and appended to the result of `call`; how many. `mark` is what
/// [`to_look`] read.
pub(super) fn take(
    call: &Args,
    queue: Name,
    lease: Interval,
    max: usize,
    mark: access::Mark,
    hand: Hand<'_>,
) -> Result<usize> {
    if probed(queue)? == Some(false) {
        found(queue, mark, false);
        return Ok(0);
    }
    let due = pgrx::datum::now();
    let mut handed = 0;
    let mut runs = Runs::default();
    loop {
        let (leased, missed, any) = plan::run_rows(
            &TAKE_PRIORITIZED,
            &[
                queue.into(),
                lease.into(),
                ((max - handed) as i64).into(),
                due.into(),
            ],
            |r| {
                let leased = leased(&r);
                let any = !r.is_empty() && r.get::<bool>(0, 6).unwrap_or(false);
                // a row of `due` the update did not lease
                let missed = (0..r.len())
                    .any(|i| r.text_bytes(i, 1).is_none() && r.get::<bool>(i, 7) == Some(true));
                note_lapsed(&r, 8);
                Ok((leased, missed, any))
            },
        )?;
        found(queue, mark, any);
        hand.out(call, &leased, lease)?;
        let lapsed = count_lapsed(queue)?;
        handed += leased.len();
        if !missed || handed >= max || !runs.again(lapsed) {
            break;
        }
    }
    Ok(handed)
}
