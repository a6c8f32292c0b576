//! Flow control: a queue paused, its running limit and its rate limit, all
//! enforced by `take` for workers in any language.
//!
//! A queue's limits are its row in `sturdy.queue_limits`. A backend keeps
//! the whole table (a handful of rows) until the table's next relcache
//! invalidation, which `limit_queue`, `pause` and `resume` send with their
//! transaction: so a queue without limits costs its takes one lookup in an
//! empty map, and a change is seen by every take that starts after it
//! commits (and by this backend's next statement). What a backend keeps is
//! read on a snapshot taken after it took in the invalidation, never on the
//! caller's, which may be older than the change (see [`of`]).
//!
//! - Paused: a take hands out nothing (and leaves no idle mark: the queue is
//!   not empty). `resume` sends `NOTIFY sturdy, '<queue>'` at commit.
//! - Running: the queue's places (`sturdy.queue_places`, one row per place).
//!   A take locks up to `max` free places (no receipt, or a receipt passed)
//!   `FOR UPDATE SKIP LOCKED`, leases at most that many rows, and writes each
//!   row's workflow and receipt into a place it locked. Two takers never lock
//!   one place, so no interleaving hands out more passes than places. A
//!   pass's `done`, `finish` or `wake_at` frees its place (by workflow and
//!   receipt); a pass that dies frees it when its receipt passes.
//! - Per key: the places of each key (`keyed.rs`); a take of such a queue
//!   is one statement of its own, and a pass's end frees its key's place as
//!   it frees a running place.
//! - Rate: a token bucket in the limits row, refilled by `now()` at
//!   `per_second` up to `burst`. A take locks the row (`FOR UPDATE`: takers of
//!   one rate-limited queue go one at a time until each commits), refills it,
//!   hands out at most the whole tokens in it, and takes out one per row.
//!
//! - Settling: after a change that left more passes running than a limit
//!   allows (`setting.rs`), a take waits its turn on the limits row and
//!   counts the places held ([`settle`]) until the queue has settled.
//!
//! A take over a limit hands out fewer rows, or none; never an error.
//!
//! The places of a one-row take, the common one, are locked and written
//! without a statement where `access` can (`access::place`): a free place
//! locked as `FOR UPDATE SKIP LOCKED` locks it, the pass written into the
//! version locked; and the pass's `done` from the same backend rewrites the
//! very version its take wrote ([`PLACED`]), as the take's `done` deletes
//! the row it leased. Anything else goes by the statements below, which
//! decide alike.

use std::rc::Rc;

use super::*;

/// The limits table, kept under its relcache invalidations (see the module
/// comment).
static LIMITS: access::Table = access::Table::new(
    c"sturdy",
    c"queue_limits",
    &[
        c"queue",
        c"paused",
        c"running",
        c"per_key",
        c"per_second",
        c"burst",
    ],
);

/// The places' tables as `access` serves them: the running limit's, and
/// the per-key limit's (with its key).
pub(super) static RUNNING_PLACES: access::Table = access::Table::new(
    c"sturdy",
    c"queue_places",
    &[c"queue", c"workflow", c"receipt", c"place"],
);
pub(super) static KEY_PLACES: access::Table = access::Table::new(
    c"sturdy",
    c"queue_key_places",
    &[c"queue", c"workflow", c"receipt", c"place", c"key"],
);
pub(super) const P_QUEUE: access::Col = access::Col(0);
pub(super) const P_WORKFLOW: access::Col = access::Col(1);
pub(super) const P_RECEIPT: access::Col = access::Col(2);
const P_PLACE: access::Col = access::Col(3);
const P_KEY: access::Col = access::Col(4);

/// What a pass writes into a place, and its end clears: both NULL-able.
const HOLDING: [(access::Col, pg_sys::Oid, bool); 2] = [
    (P_WORKFLOW, pg_sys::TEXTOID, true),
    (P_RECEIPT, pg_sys::TIMESTAMPTZOID, true),
];

/// A free place locked without a statement, with its table opened.
pub(super) struct Held {
    table: access::Opened,
    row: access::Locked,
}

/// What [`lock_place`] found.
pub(super) enum Place {
    Held(Held),
    /// Places, none free (or the free ones held by other takers).
    NoneFree,
    /// No place at all: a key met for the first time.
    NoRows,
}

/// Where a place this backend's take wrote lives, for the pass's end.
pub(super) struct Placed {
    /// [`RUNNING`] or [`KEYED`].
    pub(super) held: usize,
    pub(super) queue: Vec<u8>,
    pub(super) workflow: Vec<u8>,
    pub(super) receipt: pg_sys::TimestampTz,
    pub(super) tid: pg_sys::ItemPointerData,
    pub(super) seen: access::Invalidations,
}

thread_local! {
    /// The places this backend's last takes of limited queues wrote without
    /// a statement: a pass's `done` (`ended`) rewrites the version there
    /// instead of looking the place up. Only ever a shortcut: the version is
    /// checked for the queue, workflow and receipt as it is rewritten, and
    /// anything else goes by the statement.
    pub(super) static PLACED: RefCell<Vec<Placed>> = const { RefCell::new(Vec::new()) };
    /// Per queue, the running place this backend's last take locked: its
    /// next take looks from there first, where no other taker is (each
    /// goes back to its own), instead of every taker from the first place.
    static LAST_PLACE: RefCell<HashMap<Vec<u8>, i32>> = RefCell::new(HashMap::new());
}

/// The most [`PLACED`] keeps; past it, the oldest go; and the most queues
/// `LAST_PLACE` keeps, past which it forgets them all.
const PLACED_KEPT: usize = 16;
const LAST_KEPT: usize = 1024;

/// The first free place of `group` (the queue, and for a key's places the
/// key), locked without a statement; `None` where a statement must.
fn lock_place(
    table: &'static access::Table,
    queue: Name,
    group: &[(access::Col, pg_sys::Datum)],
    due: pg_sys::TimestampTz,
    start: Option<i32>,
) -> Result<Option<Place>> {
    let Some(opened) = table.opened(&[pg_sys::ACL_UPDATE], queue.bytes()) else {
        return Ok(None);
    };
    if !opened.can_update(&HOLDING) {
        return Ok(None);
    }
    Ok(opened
        .lock_free(group, P_PLACE, P_RECEIPT, due, start)?
        .map(|free| match free {
            access::Free::Locked(row) => Place::Held(Held { table: opened, row }),
            access::Free::NoneFree => Place::NoneFree,
            access::Free::NoRows => Place::NoRows,
        }))
}

/// A free place of `key` in `queue`'s per-key places, locked without a
/// statement; `None` where a statement must.
pub(super) fn lock_key_place(
    name: Name,
    queue: pg_sys::Datum,
    key: pg_sys::Datum,
    due: pg_sys::TimestampTz,
) -> Result<Option<Place>> {
    lock_place(
        &KEY_PLACES,
        name,
        &[(P_QUEUE, queue), (P_KEY, key)],
        due,
        None,
    )
}

impl Held {
    /// Write the pass of `workflow` with `receipt` into the place (of the
    /// running limit, `RUNNING`, or a key's, `KEYED`), and keep where it
    /// lives for the pass's end.
    pub(super) fn hold(
        &self,
        held: usize,
        queue: Name,
        workflow: &[u8],
        receipt: pg_sys::TimestampTz,
    ) -> Result<()> {
        let tid = self
            .table
            .update(
                &self.row,
                &[
                    (
                        P_WORKFLOW,
                        pg_sys::TEXTOID,
                        Text::from_bytes(workflow).into_datum(),
                    ),
                    (
                        P_RECEIPT,
                        pg_sys::TIMESTAMPTZOID,
                        Some(pg_sys::Datum::from(receipt)),
                    ),
                ],
            )?
            .ok_or_else(|| Error::Internal {
                context: "limits",
                cause: "a place locked to be written could not be".into(),
            })?;
        PLACED.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() >= PLACED_KEPT {
                p.remove(0);
            }
            p.push(Placed {
                held,
                queue: queue.bytes().to_vec(),
                workflow: workflow.to_vec(),
                receipt,
                tid,
                seen: access::Invalidations::now(),
            });
        });
        Ok(())
    }
}

/// One queue's limits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Limits {
    pub(super) paused: bool,
    pub(super) running: Option<i32>,
    pub(super) per_key: Option<i32>,
    pub(super) rate: Option<(f64, i32)>,
    /// Passes that started under an earlier, higher limit may still hold
    /// places past `running` or `per_key` (see [`limit_queue`]): takes count
    /// the places held, one at a time, until none does.
    pub(super) settling: bool,
}

type Known = (access::Mark, Rc<HashMap<Vec<u8>, Limits>>);

/// Under Citus: each queue's limits as read (`None`: it has none), under the
/// mark they were read under.
type KnownOneByOne = (access::Mark, HashMap<Vec<u8>, Option<Limits>>);

thread_local! {
    static KNOWN: RefCell<Option<Known>> = const { RefCell::new(None) };
    static ONE_BY_ONE: RefCell<Option<KnownOneByOne>> = const { RefCell::new(None) };
}

static LOAD: Statement = Statement {
    sql: "SELECT queue, paused, running, per_key, per_second, burst, settling FROM sturdy.queue_limits",
    args: &[],
    writes: false,
    generic: false,
};

/// Under Citus: the one queue's limits, from its shard ([`LOAD`] would ask
/// every shard), kept per queue under the same mark.
static LOAD_ONE: Statement = Statement {
    sql: "SELECT queue, paused, running, per_key, per_second, burst, settling FROM sturdy.queue_limits
           WHERE queue OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

/// The limits of `queue`, `None` for a queue without any.
///
/// What is kept under a mark was read on a snapshot taken after the mark:
/// the caller's may be older than a change whose invalidation the mark took
/// in (a repeatable-read transaction begun before it, or a statement begun
/// before it committed), and what that snapshot saw would be kept under the
/// new mark until the table's next change.
pub(super) fn of(queue: Name) -> Result<Option<Limits>> {
    let Some(mark) = LIMITS.mark() else {
        return Ok(None); // an older schema: no flow control
    };
    if crate::scaleout::distributed() {
        let mark = placed::settings_mark(queue.bytes(), mark)?;
        return one_by_one(queue, mark);
    }
    let known = KNOWN.with(|k| {
        k.borrow()
            .as_ref()
            .filter(|(m, _)| *m == mark && mark.keepable())
            .map(|(_, all)| all.clone())
    });
    let all = match known {
        Some(all) => all,
        None => {
            // the places a backend looked from first are of the limits
            // before the change (`limit_queue` makes them anew)
            LAST_PLACE.with(|l| l.borrow_mut().clear());
            let all = Rc::new(plan::run_at_latest(&LOAD, &[], |r| {
                Ok((0..r.len())
                    .filter_map(|i| Some((r.text_bytes(i, 1)?.to_vec(), read_limits(&r, i)?)))
                    .collect::<HashMap<_, _>>())
            })?);
            KNOWN.with(|k| *k.borrow_mut() = Some((mark, all.clone())));
            all
        }
    };
    Ok(all.get(queue.bytes()).copied())
}

/// [`of`] under Citus: from what this backend read of the queue under
/// `mark`, else with [`LOAD_ONE`].
fn one_by_one(queue: Name, mark: access::Mark) -> Result<Option<Limits>> {
    let kept = ONE_BY_ONE.with(|k| {
        k.borrow()
            .as_ref()
            .filter(|(m, _)| *m == mark && mark.keepable())
            .and_then(|(_, all)| all.get(queue.bytes()).copied())
    });
    if let Some(limits) = kept {
        return Ok(limits);
    }
    let limits = plan::run_rows(&LOAD_ONE, &[queue.into()], |r| Ok(read_limits(&r, 0)))?;
    // Citus runs the read on the shard's node, in this transaction's
    // snapshot there: kept only where that snapshot is the statement's own
    // (read committed), taken after the mark
    if plan::on_transaction_snapshot() {
        return Ok(limits);
    }
    ONE_BY_ONE.with(|k| {
        let mut k = k.borrow_mut();
        match k.as_mut() {
            Some((m, all)) if *m == mark && all.len() < 1024 => {
                all.insert(queue.bytes().to_vec(), limits);
            }
            _ => *k = Some((mark, HashMap::from([(queue.bytes().to_vec(), limits)]))),
        }
    });
    Ok(limits)
}

/// Row `i` of [`LOAD`]'s columns as limits; `None` past the last row.
fn read_limits(r: &plan::Rows, i: usize) -> Option<Limits> {
    r.text_bytes(i, 1)?;
    Some(Limits {
        paused: r.get::<bool>(i, 2).unwrap_or(false),
        running: r.get::<i32>(i, 3),
        per_key: r.get::<i32>(i, 4),
        rate: r.get::<f64>(i, 5).zip(r.get::<i32>(i, 6)),
        settling: r.get::<bool>(i, 7).unwrap_or(false),
    })
}

/// What a take of a limited queue may hand out, and what it holds for it.
pub(super) struct Gate {
    /// At most this many rows.
    pub(super) allowed: usize,
    /// The free places it locked (running limit), one for each row: by
    /// their numbers through the statements, or without one (`held`).
    places: Vec<i32>,
    held: Option<Held>,
    limits: Limits,
    /// Nothing was ready: the take may mark the queue idle.
    pub(super) nothing_ready: bool,
    /// No place was free (running): the take may mark the queue waited on,
    /// for the pass's end that frees one to wake it.
    pub(super) no_place: bool,
}

impl Gate {
    /// Whether the queue has a per-key limit (its takes go by `keyed`).
    pub(super) fn keyed(&self) -> bool {
        self.limits.per_key.is_some()
    }

    /// A per-key take's limit, and whether it counts the places each key
    /// holds (the queue is settling).
    pub(super) fn per_key(&self) -> (i32, bool) {
        (self.limits.per_key.unwrap_or(0), self.limits.settling)
    }
}

/// Refill the bucket and read what is in it; the row stays locked. (Every
/// `OPERATOR()` binds alike, left to right: the parentheses make the refill
/// `tokens + elapsed * per_second`.) A take that waited for another's lock
/// may have a `now()` before the refill it finds: it adds nothing and
/// leaves the refill's time where it is, so no second is counted twice.
/// A `now()` more than a minute before it is a clock that stepped
/// back (a failover to a standby whose clock is behind): the refill's time
/// moves back to it, so the bucket refills from then on instead of waiting
/// for the clock to pass the old time; at most that minute's tokens (never
/// above `burst`) come twice.
static REFILL: Statement = Statement {
    sql: "UPDATE sturdy.queue_limits
             SET tokens = LEAST(burst::pg_catalog.float8,
                                COALESCE(tokens, burst::pg_catalog.float8)
                                OPERATOR(pg_catalog.+) (GREATEST(0::pg_catalog.float8,
                                    pg_catalog.date_part('epoch', pg_catalog.now()
                                        OPERATOR(pg_catalog.-) COALESCE(refilled_at, pg_catalog.now())))
                                OPERATOR(pg_catalog.*) per_second)),
                 refilled_at = CASE WHEN pg_catalog.now() OPERATOR(pg_catalog.<)
                                         (refilled_at OPERATOR(pg_catalog.-) '1 minute'::pg_catalog.interval)
                                    THEN pg_catalog.now()
                                    ELSE GREATEST(refilled_at, pg_catalog.now()) END
           WHERE queue OPERATOR(pg_catalog.=) $1 AND per_second IS NOT NULL
          RETURNING pg_catalog.floor(tokens)::pg_catalog.int8",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

static SPEND: Statement = Statement {
    sql: "UPDATE sturdy.queue_limits SET tokens = tokens OPERATOR(pg_catalog.-) $2
           WHERE queue OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::TEXTOID, pg_sys::INT8OID],
    writes: true,
    generic: false,
};

/// Up to `$2` free places up to the limit `$3`, locked (others' locked ones
/// skipped). (Places past the limit exist only while the queue settles.)
static FREE_PLACES: Statement = Statement {
    sql: "SELECT place FROM sturdy.queue_places
           WHERE queue OPERATOR(pg_catalog.=) $1 AND place OPERATOR(pg_catalog.<=) $3
             AND (receipt IS NULL OR receipt OPERATOR(pg_catalog.<=) pg_catalog.now())
           ORDER BY place
           LIMIT $2
             FOR UPDATE SKIP LOCKED",
    args: &[pg_sys::TEXTOID, pg_sys::INT8OID, pg_sys::INT4OID],
    writes: true,
    generic: false,
};

static HOLD_PLACES: Statement = Statement {
    sql: "UPDATE sturdy.queue_places p SET workflow = h.workflow, receipt = h.receipt
            FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.int4[]), pg_catalog.unnest($3::pg_catalog.text[]),
                            pg_catalog.unnest($4::pg_catalog.timestamptz[])) AS h(place, workflow, receipt)
           WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.place OPERATOR(pg_catalog.=) h.place",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::INT4ARRAYOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::TIMESTAMPTZARRAYOID,
    ],
    writes: true,
    generic: false,
};

pub(super) const RUNNING: usize = 0;
pub(super) const KEYED: usize = 1;

impl Limits {
    /// Which of [`FREE_PLACE`]'s (and [`FREE_PLACES_OF`]'s) tables hold a
    /// pass's places.
    pub(super) fn held(&self) -> impl Iterator<Item = usize> {
        [
            self.running.is_some().then_some(RUNNING),
            self.per_key.is_some().then_some(KEYED),
        ]
        .into_iter()
        .flatten()
    }
}

/// A settling queue's takes go one at a time: each locks the limits row,
/// and what it counts next includes every pass the one before it took.
static LOCK_LIMITS: Statement = Statement {
    sql: "SELECT settling FROM sturdy.queue_limits WHERE queue OPERATOR(pg_catalog.=) $1 FOR UPDATE",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// The running limit's places held now, and whether any past the limit
/// `$2` is.
static HELD_PLACES: Statement = Statement {
    sql: "SELECT pg_catalog.count(*) FILTER (WHERE receipt OPERATOR(pg_catalog.>) pg_catalog.now()),
                 COALESCE(pg_catalog.bool_or(place OPERATOR(pg_catalog.>) $2
                                             AND receipt OPERATOR(pg_catalog.>) pg_catalog.now()), false)
            FROM sturdy.queue_places WHERE queue OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::TEXTOID, pg_sys::INT4OID],
    writes: false,
    generic: false,
};

/// Whether a key's place past the limit `$2` is held now.
static HELD_KEY_PLACES: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM sturdy.queue_key_places
                          WHERE queue OPERATOR(pg_catalog.=) $1 AND place OPERATOR(pg_catalog.>) $2
                            AND receipt OPERATOR(pg_catalog.>) pg_catalog.now())",
    args: &[pg_sys::TEXTOID, pg_sys::INT4OID],
    writes: false,
    generic: false,
};

/// The queue has settled: the places past its limits (`$2`, `$3`) go.
static SETTLED: Statement = Statement {
    sql: "WITH running AS (
              DELETE FROM sturdy.queue_places
               WHERE queue OPERATOR(pg_catalog.=) $1 AND place OPERATOR(pg_catalog.>) COALESCE($2, 0)),
          keyed AS (
              DELETE FROM sturdy.queue_key_places
               WHERE queue OPERATOR(pg_catalog.=) $1 AND place OPERATOR(pg_catalog.>) COALESCE($3, 0))
          UPDATE sturdy.queue_limits SET settling = false WHERE queue OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::TEXTOID, pg_sys::INT4OID, pg_sys::INT4OID],
    writes: true,
    generic: false,
};

/// Ready rows of `queue`, up to `$2`: a batch take of a limited queue locks
/// no more places than there are rows to hold them (the locks of the
/// others would hold every other taker back until this one commits). The
/// scan passes over the leased rows, no more than the running limit.
static READY_UP_TO: Statement = Statement {
    sql: "SELECT pg_catalog.count(*) FROM (
              SELECT FROM sturdy.queue q
               WHERE q.queue OPERATOR(pg_catalog.=) $1 AND q.visible_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                 AND (q.leased_until IS NULL OR q.leased_until OPERATOR(pg_catalog.<=) pg_catalog.now())
               LIMIT $2) r",
    args: &[pg_sys::TEXTOID, pg_sys::INT8OID],
    writes: false,
    generic: false,
};

/// A settling queue (see [`limit_queue`]): the take waits its turn (the
/// limits row's lock), then counts the places held. Where none past a
/// limit is held any more, the queue has settled: the places past the
/// limits go, and this and every later take go by the places alone.
/// Otherwise this take may hand out only what the running limit leaves
/// over the places held, and a per-key take counts each key's (`keyed`).
fn settle(queue: Name, gate: &mut Gate) -> Result<()> {
    let limits = gate.limits;
    if !run_one(&LOCK_LIMITS, &[queue.into()], first_value::<bool>)?.unwrap_or(false) {
        // settled by the take before this one
        gate.limits.settling = false;
        return Ok(());
    }
    let opt_i32 = |v: Option<i32>| v.map_or_else(plan::null::<i32>, Into::into);
    let (held, running_over) = match limits.running {
        Some(running) => plan::run_at_latest(&HELD_PLACES, &[queue.into(), running.into()], |r| {
            Ok((
                r.get::<i64>(0, 1).unwrap_or(0),
                r.get::<bool>(0, 2).unwrap_or(true),
            ))
        })?,
        None => (0, false),
    };
    let key_over = match limits.per_key {
        Some(per_key) => {
            plan::run_at_latest(&HELD_KEY_PLACES, &[queue.into(), per_key.into()], |r| {
                Ok(r.get::<bool>(0, 1).unwrap_or(true))
            })?
        }
        None => false,
    };
    if !running_over && !key_over {
        run_one(
            &SETTLED,
            &[
                queue.into(),
                opt_i32(limits.running),
                opt_i32(limits.per_key),
            ],
            |_| Ok(()),
        )?;
        changed();
        gate.limits.settling = false;
        return Ok(());
    }
    if let Some(running) = limits.running {
        let left = usize::try_from(i64::from(running) - held).unwrap_or(0);
        gate.allowed = gate.allowed.min(left);
    }
    Ok(())
}

/// The gate of a take of up to `max` rows of `queue`, which has `limits`.
pub(super) fn open(queue: Name, limits: Limits, max: usize) -> Result<Gate> {
    let mut gate = Gate {
        allowed: if limits.paused { 0 } else { max },
        places: Vec::new(),
        held: None,
        limits,
        nothing_ready: false,
        no_place: false,
    };
    if gate.allowed > 0 && limits.settling {
        settle(queue, &mut gate)?;
    }
    if gate.allowed > 0 && limits.rate.is_some() {
        let tokens = run_one(&REFILL, &[queue.into()], first_value::<i64>)?.unwrap_or(0);
        gate.allowed = gate.allowed.min(usize::try_from(tokens).unwrap_or(0));
    }
    if gate.allowed > 1 && limits.running.is_some() {
        let ready = run_one(
            &READY_UP_TO,
            &[queue.into(), (gate.allowed as i64).into()],
            first_value::<i64>,
        )?
        .unwrap_or(0);
        gate.allowed = gate.allowed.min(usize::try_from(ready).unwrap_or(0));
        gate.nothing_ready = ready == 0;
    }
    if gate.allowed == 1
        && !gate.limits.settling
        && limits.running.is_some()
        && let Some(q) = queue.into_datum()
        && let Some(place) = lock_place(
            &RUNNING_PLACES,
            queue,
            &[(P_QUEUE, q)],
            pgrx::datum::now().into(),
            LAST_PLACE.with(|l| l.borrow().get(queue.bytes()).copied()),
        )?
    {
        match place {
            Place::Held(held) => {
                if let Some(number) = held.table.int4(&held.row, P_PLACE) {
                    LAST_PLACE.with(|l| {
                        let mut l = l.borrow_mut();
                        if l.len() >= LAST_KEPT {
                            l.clear();
                        }
                        l.insert(queue.bytes().to_vec(), number);
                    });
                }
                gate.held = Some(held);
            }
            Place::NoneFree | Place::NoRows => {
                gate.allowed = 0;
                gate.no_place = true;
            }
        }
    } else if gate.allowed > 0
        && let Some(running) = limits.running
    {
        gate.places = plan::run_rows(
            &FREE_PLACES,
            &[queue.into(), (gate.allowed as i64).into(), running.into()],
            |r| Ok((0..r.len()).filter_map(|i| r.get::<i32>(i, 1)).collect()),
        )?;
        gate.allowed = gate.allowed.min(gate.places.len());
        gate.no_place = gate.places.is_empty();
    }
    if gate.limits.settling && limits.running.is_some() && gate.allowed == 0 && !limits.paused {
        // held back by the passes still running from before the change
        gate.no_place = true;
    }
    Ok(gate)
}

/// After the take: each row it handed out holds a place it locked, and the
/// bucket gives up a token for it.
pub(super) fn close(
    queue: Name,
    gate: &Gate,
    taken: &[(Vec<u8>, pg_sys::TimestampTz)],
) -> Result<()> {
    if taken.is_empty() {
        return Ok(());
    }
    if let Some(held) = &gate.held
        && let [(workflow, receipt)] = taken
    {
        held.hold(RUNNING, queue, workflow, *receipt)?;
    } else if gate.limits.running.is_some() {
        let places: Vec<i32> = gate.places.iter().copied().take(taken.len()).collect();
        let workflows: Vec<Option<Text>> = taken
            .iter()
            .map(|(w, _)| Some(Text::from_bytes(w)))
            .collect();
        let receipts: Vec<Option<TimestampWithTimeZone>> = taken
            .iter()
            .map(|(_, r)| TimestampWithTimeZone::try_from(*r).ok())
            .collect();
        run_one(
            &HOLD_PLACES,
            &[
                queue.into(),
                places.into(),
                workflows.into(),
                receipts.into(),
            ],
            |_| Ok(()),
        )?;
    }
    if gate.limits.rate.is_some() {
        run_one(&SPEND, &[queue.into(), (taken.len() as i64).into()], |_| {
            Ok(())
        })?;
    }
    Ok(())
}

/// What this backend keeps goes with the change (the other backends drop
/// theirs when it commits).
pub(super) fn changed() {
    LIMITS.invalidate();
    KNOWN.with(|k| *k.borrow_mut() = None);
}
