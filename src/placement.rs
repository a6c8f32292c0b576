//! Where a workflow's claim and checkpoints are kept under Citus
//! (`scaleout`): by its whole name, or with the queues by its place
//! (`scaleout::place_of`), and what a statement or a write without one
//! about them needs of that.

use pgrx::{IntoDatum, pg_sys};

use crate::datum::Text;
use crate::plan::Statement;

/// A statement about one workflow's claim or checkpoints, in its two
/// forms: as on one server (and under Citus by workflow), and for claims
/// and checkpoints distributed with the queues (`scaleout::with_queues`),
/// where it names the workflow's place too (`sturdy.workflow_place`, which
/// Citus evaluates and routes by) and an upsert's arbiter by its name (the
/// primary key is (place, workflow) there, where `distribute()` made it,
/// and a worker node plans a statement against its own copy of the table,
/// whose key `CREATE EXTENSION` made).
pub struct Placed {
    pub by_workflow: Statement,
    pub with_queues: Statement,
}

impl Placed {
    /// The form this database runs.
    pub fn get(&'static self) -> &'static Statement {
        if crate::scaleout::with_queues() {
            &self.with_queues
        } else {
            &self.by_workflow
        }
    }
}

/// Where `workflow`'s claim is kept for `access`: the distribution value of
/// its rows under Citus (its place where distributed with the queues, else
/// its name), and its place as a `text` datum where the primary key leads
/// with it.
pub fn kept_at(workflow: &[u8]) -> (&[u8], Option<pg_sys::Datum>) {
    if crate::scaleout::with_queues() {
        let place = crate::scaleout::place_of(workflow);
        (place, Text::from_bytes(place).into_datum())
    } else {
        (workflow, None)
    }
}
