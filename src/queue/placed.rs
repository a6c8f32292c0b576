//! Under Citus, where a take may keep what it read of a queue's settings
//! (its limits, whether it has prioritized rows) between calls: on the
//! coordinator, where the calls that change them run and tell every
//! session, and on the worker node that holds the queue's shard, which they
//! tell through `sturdy.queue_changed` (delegated there by `distribute()`).
//! And where its takes keep floors: on the node that holds the shard, which
//! the calls that make a row ready before now tell through
//! `sturdy.queue_backdated`. On one server, everywhere.

use std::cell::Cell;

use super::*;

use crate::scaleout::{distributed, on_coordinator};

thread_local! {
    /// On a worker node, per queue whether its shard is on this node, kept
    /// under `sturdy.queue`'s mark: Citus invalidates the table with every
    /// change of a shard's placement.
    static HELD: RefCell<HashMap<Vec<u8>, bool>> = RefCell::new(HashMap::new());
    static HELD_UNDER: Cell<Option<access::Mark>> = const { Cell::new(None) };
    /// How many marks of `sturdy.queue` this backend has seen: what is kept
    /// of a queue's settings here is kept under it too ([`settings_mark`]),
    /// so a shard moved away and back finds nothing kept from before.
    static PLACED: Cell<u64> = const { Cell::new(0) };
    /// Whether `sturdy.queue_changed` and `sturdy.queue_backdated` are
    /// delegated to the queue's node, under the same mark.
    static DELEGATED: Cell<Option<bool>> = const { Cell::new(None) };
}

/// What is kept here, as of `sturdy.queue`'s mark of now: dropped where it
/// moved (or cannot be kept). A mark this backend has not seen moves take's
/// generation too: a shard that comes back to this node carries the rows
/// made ready before now while it was away, whose `queue_backdated` went to
/// the node that held it then, below the floors this node's takes kept
/// (theirs and those they share in `heads`).
fn placements() {
    let mark = QUEUE.mark().filter(|m| m.keepable());
    let moved = HELD_UNDER.with(Cell::get) != mark;
    if mark.is_none() || moved {
        HELD_UNDER.with(|h| h.set(mark));
        HELD.with(|h| h.borrow_mut().clear());
        PLACED.with(|p| p.set(p.get() + 1));
        DELEGATED.with(|d| d.set(None));
    }
    if moved {
        generation::bump_here();
    }
}

/// Whether `queue`'s shard is on this node (a worker's).
fn holds(queue: &[u8]) -> Result<bool> {
    if let Some(known) = HELD.with(|h| h.borrow().get(queue).copied()) {
        return Ok(known);
    }
    let placed = PLACED.with(Cell::get);
    let held = run_one(
        &HOLDS,
        &[Text::from_bytes(queue).into()],
        first_value::<bool>,
    )?;
    let held = held.unwrap_or(false);
    // found across a change of placements: used once, not kept
    placements();
    if PLACED.with(Cell::get) == placed {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if h.len() >= 4096 {
                h.clear();
            }
            h.insert(queue.to_vec(), held);
        });
    }
    Ok(held)
}

static HOLDS: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_placement p
                          WHERE p.shardid OPERATOR(pg_catalog.=)
                                pg_catalog.get_shard_id_for_distribution_column('sturdy.queue'::pg_catalog.regclass, $1)
                            AND p.groupid OPERATOR(pg_catalog.=) (SELECT groupid FROM pg_catalog.pg_dist_local_group))",
    args: &[pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

static DELEGATION: Statement = Statement {
    sql: "SELECT pg_catalog.count(*) OPERATOR(pg_catalog.=) 2 FROM pg_catalog.pg_dist_object o
           WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
             AND o.objid OPERATOR(pg_catalog.=) ANY (ARRAY['sturdy.queue_changed(text)'::pg_catalog.regprocedure,
                                                        'sturdy.queue_backdated(text)'::pg_catalog.regprocedure]::pg_catalog.oid[])
             AND o.force_delegation",
    args: &[],
    writes: false,
    generic: false,
};

/// The mark under which a take keeps what it read of `queue`'s settings
/// (its limits, whether it has prioritized rows), from `mark`, the mark of
/// the table they come from. As it is on one server and on the coordinator,
/// where the calls that change them run. On a worker node, kept only where
/// the node holds the queue's shard (those calls send their invalidation
/// there too, through `sturdy.queue_changed`), and then moved by every
/// change of a shard's placement; elsewhere `Mark(0)`: nothing is kept.
pub(super) fn settings_mark(queue: &[u8], mark: access::Mark) -> Result<access::Mark> {
    if !distributed() || on_coordinator() {
        return Ok(mark);
    }
    placements();
    let keep = delegated()? && holds(queue)?;
    Ok(mark.with(PLACED.with(Cell::get), keep))
}

/// Whether the calls that change a queue tell its node (`distribute()`
/// delegated `queue_changed` and `queue_backdated` there), as of the
/// placements' mark [`placements`] last saw.
fn delegated() -> Result<bool> {
    if let Some(known) = DELEGATED.with(Cell::get) {
        return Ok(known);
    }
    let known = run_one(&DELEGATION, &[], first_value::<bool>)?.unwrap_or(false);
    DELEGATED.with(|d| d.set(Some(known)));
    Ok(known)
}

/// Under Citus, whether a take of `queue` keeps a floor (`floor`; on one
/// server it always does): where this node holds the queue's shard, so
/// that a row made ready before now is signalled here (`queue_backdated`,
/// delegated here by `distribute()`), on a worker or on a coordinator that
/// holds shards. Anywhere else a take scans the queue's shard from the
/// start.
pub(super) fn takes_keep_floors(queue: &[u8]) -> Result<bool> {
    placements();
    Ok(delegated()? && holds(queue)?)
}

/// A row of `queue` was made ready before now (`generation`): this node's
/// takes scan from the start at their next take, and under Citus so do the
/// takes on the node that holds the queue: `sturdy.queue_backdated` runs
/// there, in this transaction (delegated by `distribute()`), where that is
/// not this node.
pub(super) fn backdated(queue: &[u8]) -> Result<()> {
    generation::bump_here();
    if !distributed() {
        return Ok(());
    }
    placements();
    if holds(queue)? {
        return Ok(());
    }
    run_one(&TELL_BACKDATED, &[Text::from_bytes(queue).into()], |_| {
        Ok(())
    })
}

/// Delegated to the queue's node, as [`TELL_QUEUE_NODE`].
static TELL_BACKDATED: Statement = Statement {
    sql: "SELECT FROM sturdy.queue_backdated($1)",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// A queue's settings change (`limit_queue`, `pause`, `resume`, a
/// prioritized `schedule`): under Citus only on the coordinator, which
/// also tells the node holding the queue (`sturdy.queue_changed`, delegated
/// there by `distribute()`, runs there in this transaction and sends its
/// invalidation with its commit). On a worker node, `0A000`: the
/// coordinator's sessions would keep what they read before.
pub(super) fn settings_changed(queue: &[u8]) -> Result<()> {
    if !distributed() {
        return Ok(());
    }
    if !on_coordinator() {
        return Err(Error::Raised {
            code: *b"0A000",
            message: "a queue's limits, its pause and its prioritized rows change on the Citus coordinator, and this node is a worker".into(),
            detail: None,
            hint: Some("Make this call on the coordinator: its sessions and the queue's node learn of the change at commit (docs/scale-out.md).".into()),
        });
    }
    run_one(&TELL_QUEUE_NODE, &[Text::from_bytes(queue).into()], |_| {
        Ok(())
    })
}

/// Delegated to the queue's node (a function in `FROM`: Citus delegates a
/// call made inside another only that way, with `force_delegation`).
static TELL_QUEUE_NODE: Statement = Statement {
    sql: "SELECT FROM sturdy.queue_changed($1)",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};
