//! The queue: which workflows want a pass, and when.
//!
//! One row per (queue, workflow), scored by `visible_at`: in the past means
//! due, in the future sleeping (waiting for a deadline). `take` leases the
//! oldest due rows that no one holds: it sets `leased_until`, which it hands
//! back as a *receipt*, and leaves `visible_at` alone, so the update touches
//! no indexed column and is HOT (no index entry, half the WAL; measured in
//! docs/internals.md). Everything that wants another pass — `schedule`,
//! `arrive` — writes `visible_at` and clears `taken_at`, landing on top of
//! a pass in flight, whose lease it keeps (the row *woken*: no second pass
//! beside the first, and a crash is still a lapse to count); the pass's
//! `done` and `wake_at` then answer false and leave the row ready, so a
//! wakeup that arrived mid-pass is never thrown away by the pass finishing.
//! A dead row (`visible_at` `'infinity'`, `fail.rs`) is left as it is.
//!
//! Takers fan out instead of queueing on the head: `FOR UPDATE SKIP LOCKED`
//! passes over rows another taker is locking. The candidate rows are chosen in
//! a `MATERIALIZED` CTE so `max` bounds what the statement leases, whatever
//! plan is chosen (a `SKIP LOCKED` sub-select rescanned on the inner side of
//! a join would lease different rows on every rescan).
//!
//! Idle workers need not poll, and busy ones pay nothing for that. PostgreSQL
//! commits a transaction that sent `NOTIFY` under one cluster-wide lock held
//! through its WAL flush, so notifying on every schedule would make a busy
//! system commit its schedules one at a time. Instead a worker says it is idle
//! by the `take` that found nothing: that take leaves a mark for its queue
//! (`sturdy.queue_waiters`) and bumps the idle epoch (`sturdy.queue_idle`, a
//! sequence). A schedule (or `arrive`, or a `wake_at` that is already due)
//! that makes a row ready removes the mark and, only if it found one, sends
//! `NOTIFY sturdy, '<queue>'`, delivered at commit (dropped with a rollback).
//! While workers keep finding work there is no mark and no notification.
//!
//! A schedule does not even look for the mark while the epoch stands where it
//! stood when this backend last found the queue unmarked ([`Unmarked`]): a
//! mark is only ever made with a bump, so a busy queue's schedule costs its
//! upsert, not a probe of another table (and the sequence is read at most
//! every quarter second of a backend's transaction starts, see [`idle`]).
//!
//! The guarantee: a schedule that starts at least a second after an empty
//! take committed wakes the workers listening on that queue; one that ran
//! concurrently with the empty take (or whose transaction had started
//! before it) may miss it, and the worker's own poll interval bounds that
//! delay (as it bounds a deadline passing, which wakes nobody).

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use pg_sturdy_macros::sql_function;
use pgrx::IntoDatum;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys;

use crate::access;
use crate::args::{self, Name};
use crate::datum::{Jsonb, JsonbArray, Text, TextArray, TidArray, TimestampArray};
use crate::error::{Error, Result};
use crate::fmgr::Args;
use crate::heads;
use crate::plan::{self, Statement, first_value, run_one};
use crate::rescan::{LEAST_DUE, Position, Rescans, START, ScanFrom, floor_after, time_param};

mod done;
mod ended;
mod extend;
mod fail;
mod floor;
mod keyed;
mod limits;
mod placed;
mod priority;
mod schedule;
mod schema;
mod setting;
mod sql;
mod take;
mod wakeups;

// The tests, in a file of their own: `pg_schema` takes only an inline module.
#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    include!("tests.rs");
    include!("fail_tests.rs");
    include!("input_tests.rs");
}

pub(crate) use done::remove as remove_done;
pub(crate) use ended::{ending, freed};
pub(crate) use fail::{LAPSED, cancel_row, fail_pass, sweep_failing, take_died};
use fail::{count_lapsed, note_lapsed};
use floor::*;
pub(crate) use keyed::sweep_key_places;
pub use schedule::schedule_at;
use sql::*;
use take::*;
pub(crate) use take::{Claim, take};
use wakeups::*;

/// The queue's table, for `done` and a one-row `take` without a statement
/// (see `access`); its columns by position.
static QUEUE: access::Table = access::Table::new(
    c"sturdy",
    c"queue",
    &[
        c"queue",
        c"workflow",
        c"leased_until",
        c"visible_at",
        c"seq",
        c"taken_at",
        c"takes",
        c"scheduled_at",
        c"priority",
        c"key",
        c"attempts",
        c"input",
    ],
);
const Q_QUEUE: access::Col = access::Col(0);
const Q_WORKFLOW: access::Col = access::Col(1);
const Q_LEASED_UNTIL: access::Col = access::Col(2);
const Q_VISIBLE_AT: access::Col = access::Col(3);
const Q_SEQ: access::Col = access::Col(4);
const Q_TAKEN_AT: access::Col = access::Col(5);
const Q_TAKES: access::Col = access::Col(6);
const Q_SCHEDULED_AT: access::Col = access::Col(7);
const Q_PRIORITY: access::Col = access::Col(8);
const Q_KEY: access::Col = access::Col(9);
const Q_ATTEMPTS: access::Col = access::Col(10);
const Q_INPUT: access::Col = access::Col(11);

/// The last finite `timestamptz`: `'infinity'` (a dead row's `visible_at`,
/// `fail.rs`) is past it, and no schedule or `wake_at` may write it.
const LAST_FINITE: pg_sys::TimestampTz = i64::MAX - 1;

static LEASE_COLUMNS: access::LeaseColumns = access::LeaseColumns {
    queue: Q_QUEUE,
    visible_at: Q_VISIBLE_AT,
    seq: Q_SEQ,
    leased_until: Q_LEASED_UNTIL,
    taken_at: Q_TAKEN_AT,
    takes: Q_TAKES,
    key: Q_WORKFLOW,
    attempts: Q_ATTEMPTS,
    input: Q_INPUT,
};
