//! A pass's end, the limits' part: the places a pass held freed when its
//! `done`, `done_many`, `finish`, `wake_at` or `fail` ends it, all of a
//! workflow's when `cancel` removes its row, and the takes a full limit held
//! back woken. Every call on a pass locks its claim, then its row, then its
//! places (docs/internals.md, "Lock order"), so where the row goes before
//! its places are freed ([`Ending`]) what finds them is read first.

use super::limits::*;
use super::*;

/// Free the place a pass's take wrote without a statement, where this
/// backend knows where it lives: `true` when it was rewritten.
fn free_placed(
    held: usize,
    queue: Name,
    workflow: Name,
    receipt: pg_sys::TimestampTz,
) -> Result<bool> {
    let Some(placed) = PLACED.with(|p| {
        let mut p = p.borrow_mut();
        let i = p.iter().position(|x| {
            x.held == held
                && x.receipt == receipt
                && x.workflow == workflow.bytes()
                && x.queue == queue.bytes()
        })?;
        Some(p.remove(i))
    }) else {
        return Ok(false);
    };
    let (Some(q), Some(w)) = (queue.into_datum(), workflow.into_datum()) else {
        return Ok(false);
    };
    let table = [&RUNNING_PLACES, &KEY_PLACES][held];
    let freed = table.with(&[pg_sys::ACL_UPDATE], queue.bytes(), |t| {
        t.update_at_if(
            placed.tid,
            placed.seen,
            &[(P_QUEUE, q), (P_WORKFLOW, w)],
            (P_RECEIPT, receipt),
            &[
                (P_WORKFLOW, pg_sys::TEXTOID, None),
                (P_RECEIPT, pg_sys::TIMESTAMPTZOID, None),
            ],
        )
    })?;
    Ok(freed == Some(true))
}

/// A pass ended: free the place its take gave it, of the running limit
/// (`RUNNING`) or of its key (`KEYED`).
static FREE_PLACE: [Statement; 2] = [
    Statement {
        sql: "UPDATE sturdy.queue_places SET workflow = NULL, receipt = NULL
               WHERE queue OPERATOR(pg_catalog.=) $1 AND workflow OPERATOR(pg_catalog.=) $2
                 AND receipt OPERATOR(pg_catalog.=) $3",
        args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID],
        writes: true,
        generic: false,
    },
    // (by the key of the pass's row, which is still there: see `ended`)
    Statement {
        sql: "UPDATE sturdy.queue_key_places SET workflow = NULL, receipt = NULL
               WHERE queue OPERATOR(pg_catalog.=) $1
                 AND key OPERATOR(pg_catalog.=) (SELECT q.key FROM sturdy.queue q
                                                  WHERE q.queue OPERATOR(pg_catalog.=) $1
                                                    AND q.workflow OPERATOR(pg_catalog.=) $2)
                 AND workflow OPERATOR(pg_catalog.=) $2 AND receipt OPERATOR(pg_catalog.=) $3",
        args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID],
        writes: true,
        generic: false,
    },
];

/// [`FREE_PLACE`] for the passes of `done_many`; a key's place by the key
/// each pass's row had (`$4`, at the workflow's position), read before the
/// rows went (see [`ending_many`]).
static FREE_PLACES_OF: [Statement; 2] = [
    Statement {
        sql: "UPDATE sturdy.queue_places p SET workflow = NULL, receipt = NULL
                FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS d(workflow, receipt)
               WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.workflow OPERATOR(pg_catalog.=) d.workflow
                 AND p.receipt OPERATOR(pg_catalog.=) d.receipt",
        args: &[
            pg_sys::TEXTOID,
            pg_sys::TEXTARRAYOID,
            pg_sys::TIMESTAMPTZARRAYOID,
            pg_sys::TEXTARRAYOID,
        ],
        writes: true,
        generic: false,
    },
    Statement {
        sql: "UPDATE sturdy.queue_key_places p SET workflow = NULL, receipt = NULL
                FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4))
                     AS d(workflow, receipt, key)
               WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) d.key
                 AND p.workflow OPERATOR(pg_catalog.=) d.workflow
                 AND p.receipt OPERATOR(pg_catalog.=) d.receipt",
        args: &[
            pg_sys::TEXTOID,
            pg_sys::TEXTARRAYOID,
            pg_sys::TIMESTAMPTZARRAYOID,
            pg_sys::TEXTARRAYOID,
        ],
        writes: true,
        generic: false,
    },
];

/// The keys of the rows of workflows `$2` in queue `$1` (those with one),
/// read without a lock: a pass's key place is found by its row's key.
static KEYS_OF: Statement = Statement {
    sql: "SELECT q.workflow, q.key FROM sturdy.queue q
           WHERE q.queue OPERATOR(pg_catalog.=) $1 AND q.workflow OPERATOR(pg_catalog.=) ANY ($2)
             AND q.key IS NOT NULL",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTARRAYOID],
    writes: false,
    generic: false,
};

/// The key of `$2`'s row in queue `$1`, read without a lock.
static KEY_OF: Statement = Statement {
    sql: "SELECT q.key FROM sturdy.queue q
           WHERE q.queue OPERATOR(pg_catalog.=) $1 AND q.workflow OPERATOR(pg_catalog.=) $2",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

/// A key's place of a pass ended, by the key its row had (`$4`).
static FREE_KEY_PLACE: Statement = Statement {
    sql: "UPDATE sturdy.queue_key_places SET workflow = NULL, receipt = NULL
           WHERE queue OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $4
             AND workflow OPERATOR(pg_catalog.=) $2 AND receipt OPERATOR(pg_catalog.=) $3",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TEXTOID,
    ],
    writes: true,
    generic: false,
};

/// Every place of a workflow's passes in a queue, whatever their receipts
/// (`cancel`): of the running limit, and of the key its row has.
static ABANDON: [Statement; 2] = [
    Statement {
        sql: "UPDATE sturdy.queue_places SET workflow = NULL, receipt = NULL
               WHERE queue OPERATOR(pg_catalog.=) $1 AND workflow OPERATOR(pg_catalog.=) $2",
        args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
    Statement {
        sql: "UPDATE sturdy.queue_key_places SET workflow = NULL, receipt = NULL
               WHERE queue OPERATOR(pg_catalog.=) $1
                 AND key OPERATOR(pg_catalog.=) (SELECT q.key FROM sturdy.queue q
                                                  WHERE q.queue OPERATOR(pg_catalog.=) $1
                                                    AND q.workflow OPERATOR(pg_catalog.=) $2)
                 AND workflow OPERATOR(pg_catalog.=) $2",
        args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
        writes: true,
        generic: false,
    },
];

/// `cancel`'s end of every pass of `workflow` in `queue`, its row still
/// there and locked: its places freed, whatever their receipts. Whether the
/// queue has a running or per-key limit, for [`freed`].
pub(super) fn abandoned(queue: Name, workflow: Name) -> Result<bool> {
    let limits = of(queue)?;
    for held in limits.iter().flat_map(Limits::held) {
        run_one(&ABANDON[held], &[queue.into(), workflow.into()], |_| Ok(()))?;
    }
    Ok(limits.is_some_and(|l| l.held().next().is_some()))
}

/// [`FREE_KEY_PLACE`] by any key: the queue's key places walked, for a
/// place this backend wrote whose version moved on (see [`Ending::free`]).
static FREE_KEY_PLACE_ANY: Statement = Statement {
    sql: "UPDATE sturdy.queue_key_places SET workflow = NULL, receipt = NULL
           WHERE queue OPERATOR(pg_catalog.=) $1 AND workflow OPERATOR(pg_catalog.=) $2
             AND receipt OPERATOR(pg_catalog.=) $3",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID],
    writes: true,
    generic: false,
};

/// The end of passes whose rows go before their places are freed (`done`,
/// `done_many`, `finish`): every call on a pass locks its row first, then
/// its places, then its claim (docs/internals.md, "Lock order"), so a
/// place is freed after the row went, by what was read of the row before
/// (without a lock): the key a key's place is found by. Made by [`ending`]
/// and [`ending_many`], used by [`Ending::free`].
pub struct Ending {
    /// Which of the queue's limits hold places ([`RUNNING`], [`KEYED`]).
    held: [bool; 2],
    /// For a per-key limit, each pass's key (by workflow), where this
    /// backend does not know where its place lives.
    keys: Option<HashMap<Vec<u8>, Vec<u8>>>,
}

/// Whether this backend's take wrote the place of (`held`, queue,
/// workflow, receipt) without a statement, and still knows where.
fn placed_here(held: usize, queue: Name, workflow: &[u8], receipt: pg_sys::TimestampTz) -> bool {
    PLACED.with(|p| {
        p.borrow().iter().any(|x| {
            x.held == held
                && x.receipt == receipt
                && x.workflow == workflow
                && x.queue == queue.bytes()
        })
    })
}

/// A pass of `workflow` with `receipt` about to end, its row still there:
/// see [`Ending`]. A queue without a running or per-key limit reads
/// nothing.
pub fn ending(queue: Name, workflow: Name, receipt: TimestampWithTimeZone) -> Result<Ending> {
    let limits = of(queue)?;
    let mut held = [false; 2];
    for h in limits.iter().flat_map(Limits::held) {
        held[h] = true;
    }
    let mut keys = None;
    if held[KEYED] && !placed_here(KEYED, queue, workflow.bytes(), receipt.into()) {
        // (copied out as bytes: SPI's memory goes when its connection closes)
        let key = run_one(&KEY_OF, &[queue.into(), workflow.into()], |t| {
            Ok(first_value::<Text>(t)?.map(|k| k.bytes().to_vec()))
        })?;
        keys = Some(
            key.map(|k| (workflow.bytes().to_vec(), k))
                .into_iter()
                .collect(),
        );
    }
    Ok(Ending { held, keys })
}

/// [`ending`] for the passes of `done_many`.
pub(super) fn ending_many(queue: Name, workflows: TextArray) -> Result<Ending> {
    let limits = of(queue)?;
    let mut held = [false; 2];
    for h in limits.iter().flat_map(Limits::held) {
        held[h] = true;
    }
    let mut keys = None;
    if held[KEYED] {
        keys = Some(plan::run_rows(
            &KEYS_OF,
            &[queue.into(), workflows.into()],
            |r| {
                Ok((0..r.len())
                    .filter_map(|i| {
                        Some((r.text_bytes(i, 1)?.to_vec(), r.text_bytes(i, 2)?.to_vec()))
                    })
                    .collect())
            },
        )?);
    }
    Ok(Ending { held, keys })
}

impl Ending {
    /// The places of the pass of `workflow` with `receipt` freed, its row
    /// gone (or left for a wakeup): whether the queue has a running or
    /// per-key limit, for [`freed`], which the caller calls last.
    pub fn free(
        &self,
        queue: Name,
        workflow: Name,
        receipt: TimestampWithTimeZone,
    ) -> Result<bool> {
        for held in [RUNNING, KEYED].into_iter().filter(|&h| self.held[h]) {
            if free_placed(held, queue, workflow, receipt.into())? {
                continue;
            }
            if held == RUNNING {
                run_one(
                    &FREE_PLACE[RUNNING],
                    &[queue.into(), workflow.into(), receipt.into()],
                    |_| Ok(()),
                )?;
                continue;
            }
            match self.keys.as_ref() {
                Some(keys) => {
                    if let Some(key) = keys.get(workflow.bytes()) {
                        run_one(
                            &FREE_KEY_PLACE,
                            &[
                                queue.into(),
                                workflow.into(),
                                receipt.into(),
                                Text::from_bytes(key).into(),
                            ],
                            |_| Ok(()),
                        )?;
                    }
                }
                // (this backend's take wrote it, but the version moved on
                // since, as a `limit_queue` that made the places anew moves
                // it: by any key, the row gone)
                None => run_one(
                    &FREE_KEY_PLACE_ANY,
                    &[queue.into(), workflow.into(), receipt.into()],
                    |_| Ok(()),
                )?,
            }
        }
        Ok(self.held.iter().any(|&h| h))
    }

    /// [`Ending::free`] for the passes of `done_many`.
    pub(super) fn free_many(
        &self,
        queue: Name,
        workflows: TextArray,
        receipts: TimestampArray,
    ) -> Result<bool> {
        for held in [RUNNING, KEYED].into_iter().filter(|&h| self.held[h]) {
            let keys: Vec<Option<Text>> = match (held, self.keys.as_ref()) {
                (KEYED, Some(keys)) => workflows
                    .each_bytes()
                    .iter()
                    .map(|w| w.and_then(|w| keys.get(w)).map(|k| Text::from_bytes(k)))
                    .collect(),
                _ => Vec::new(),
            };
            run_one(
                &FREE_PLACES_OF[held],
                &[queue.into(), workflows.into(), receipts.into(), keys.into()],
                |_| Ok(()),
            )?;
        }
        Ok(self.held.iter().any(|&h| h))
    }
}

/// A pass of `workflow` with `receipt` ends (`done`, `finish`, `wake_at`):
/// where its queue has a running or per-key limit, its places are free
/// again. Called while the pass's row is still there: a key's place is
/// found by the row's key, where this backend does not know where it lives
/// (its take ran elsewhere). A row gone, or given another key since the
/// take, leaves its place to be freed when the receipt passes: the limit
/// holds one place fewer for the key meanwhile, never one more.
///
/// Answers whether the queue has a running or per-key limit, for
/// [`freed`], which the caller calls last.
pub fn ended(queue: Name, workflow: Name, receipt: TimestampWithTimeZone) -> Result<bool> {
    let limits = of(queue)?;
    for held in limits.iter().flat_map(Limits::held) {
        if free_placed(held, queue, workflow, receipt.into())? {
            continue;
        }
        run_one(
            &FREE_PLACE[held],
            &[queue.into(), workflow.into(), receipt.into()],
            |_| Ok(()),
        )?;
    }
    Ok(limits.is_some_and(|l| l.held().next().is_some()))
}

/// After a pass's end has freed its places and removed or moved its row:
/// where the queue has a running or per-key limit, wake the workers a take
/// held back left waiting (its idle mark), as a schedule of a ready row
/// does, so a worker asleep on `LISTEN` takes again when a place frees, not
/// at its poll interval. Last, holding the mark's row to the commit: a take
/// that marks the queue waits for that row, and may hold the lock of the
/// pass's row (a row it locked, found leased since, and kept locked), which
/// the pass's end would otherwise still wait for. `limited`: what
/// [`ended`] (or [`ended_many`]) answered.
pub fn freed(queue: Name, limited: bool) -> Result<()> {
    if limited {
        wake_if_waited(queue)?;
    }
    Ok(())
}
