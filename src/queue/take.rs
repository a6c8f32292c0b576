//! `take`: leasing the oldest due rows, one without a statement or a batch
//! through one, and what a take leaves for the `done`s that follow.

use super::*;

/// What one take statement handed out.
pub(super) struct Taken {
    pub(super) rows: usize,
    /// The oldest place, before the take, of the rows it locked (taken, or
    /// missed: locked but not leased, and so still ready there).
    pub(super) oldest: Option<Position>,
}

/// The earlier of two places where either is known.
pub(super) fn earlier(a: Option<Position>, b: Option<Position>) -> Option<Position> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// How many times [`take_from`] runs its statement while rows come back
/// locked but not leased (see the take statements). A rerun leases every
/// row the one before missed, as it holds their locks; it can miss only rows
/// others rewrote during its own few microseconds.
pub(super) const TAKE_ATTEMPTS: usize = 3;

/// The runs of a take statement: at most [`TAKE_ATTEMPTS`] for rows missed,
/// and as many more as the runs count leases that ran out. A lease met run
/// out is counted once (`count_lapsed` clears it), and its row is then
/// either leased by the next run or out of the way, so however many lapsed
/// rows lie ahead of a ready one, the take reaches it; a take that gave up
/// after a few of them came back empty beside a ready row, and marked the
/// queue idle.
#[derive(Default)]
pub(super) struct Runs(usize);

impl Runs {
    /// After a run that counted `lapsed` leases: whether another may run.
    pub(super) fn again(&mut self, lapsed: usize) -> bool {
        self.0 += 1;
        lapsed > 0 || self.0 < TAKE_ATTEMPTS
    }
}

/// The rows this backend's last batch take leased, by workflow: where each
/// one's leased version lives (its tuple id), and the receipt they share (one
/// `now()` and one lease for the whole take). An array `done` of them, the
/// batch worker's next call, goes straight to those versions
/// ([`DONE_LEASED`]) instead of descending the primary key once per row
/// (random workflow names: about three cold pages a row, docs/internals.md). A one-row take keeps its row in [`Taken1`], for the
/// single `done`, which goes to it without a statement.
///
/// Only ever a shortcut: each version is checked for its workflow, queue and
/// receipt as it is deleted, and whatever it did not remove (a row
/// rescheduled meanwhile, a table rewritten by `VACUUM FULL`, a take rolled
/// back) goes through the receipt rule by key, as any other `done` does.
pub(super) struct Leased {
    pub(super) queue: Vec<u8>,
    pub(super) receipt: Option<pg_sys::TimestampTz>,
    pub(super) rows: HashMap<Vec<u8>, pg_sys::ItemPointerData>,
}

/// The row this backend's last one-row take leased, and where its leased
/// version lives: the worker's `done` of it, its next call, deletes that
/// version straight away (`access::Opened::delete_at_if`), without the
/// primary key's pages, which for random workflow names are cold ones (a
/// done descended three pages of it, a tenth of a take and done's time at
/// one client on a core). Only ever a shortcut, as [`Leased`].
pub(super) struct Taken1 {
    pub(super) queue: Vec<u8>,
    pub(super) workflow: Vec<u8>,
    pub(super) receipt: pg_sys::TimestampTz,
    pub(super) tid: pg_sys::ItemPointerData,
    /// The invalidations this backend had taken in when it leased it.
    pub(super) seen: access::Invalidations,
    /// Whether it is still to be used (a `done` of it clears this, keeping
    /// the buffers).
    pub(super) live: bool,
}

thread_local! {
    pub(super) static LEASED: RefCell<Option<Leased>> = const { RefCell::new(None) };
    pub(super) static TAKEN: RefCell<Option<Taken1>> = const { RefCell::new(None) };
    /// Array `done`s that went by tuple id, for the tests to see which way
    /// a call went (the two ways remove the same rows by design).
    #[cfg(any(test, feature = "pg_test"))]
    pub(super) static BY_TID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// One-row `done`s that went to the version of the last take.
    #[cfg(any(test, feature = "pg_test"))]
    pub(super) static ONE_BY_TID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Remember the rows a batch take statement leased (columns 1, 2 and 7).
pub(super) fn lease_rows(queue: Name, r: &plan::Rows) {
    LEASED.with(|l| {
        let mut leased = l.borrow_mut();
        let leased = leased.get_or_insert_with(|| Leased {
            queue: queue.bytes().to_vec(),
            receipt: None,
            rows: HashMap::new(),
        });
        for i in 0..r.len() {
            let (Some(workflow), Some(receipt), Some(tid)) =
                (r.text_bytes(i, 1), r.timestamptz(i, 2), r.tid(i, 8))
            else {
                continue;
            };
            if *leased.receipt.get_or_insert(receipt) != receipt {
                continue;
            }
            leased.rows.insert(workflow.to_vec(), tid);
        }
    });
}

/// The claim a take with `claim` makes of each workflow it leased, for the
/// lease (`claim`'s own operation, handed in by `compose`'s `take`): the
/// new token, `None` where someone still holds the claim.
pub(crate) type Claim = fn(Name, Interval) -> Result<Option<i64>>;

/// The rows a take handed out: each workflow, its receipt and the
/// `attempts` of its row (the passes that failed; `None`: none).
pub(super) type Handed = Vec<(Vec<u8>, pg_sys::TimestampTz, Option<i32>, Option<Jsonb>)>;

/// The rows a take leased that a limit counts: each workflow and its
/// receipt.
pub(super) type Kept = Vec<(Vec<u8>, pg_sys::TimestampTz)>;

/// The rows a take statement leased: its rows with a workflow and a
/// receipt (columns 1 and 2; a row it locked but missed has neither), and
/// which attempt each is (column 4).
pub(super) fn leased(r: &plan::Rows) -> Handed {
    (0..r.len())
        .filter_map(|i| {
            let attempts = r.get::<i32>(i, 4).map(|a| a - 1).filter(|&a| a > 0);
            // (the input copied out of SPI's memory, as `get` copies)
            Some((
                r.text_bytes(i, 1)?.to_vec(),
                r.timestamptz(i, 2)?,
                attempts,
                r.get::<Jsonb>(i, 5),
            ))
        })
        .collect()
}

/// take's `attempt` column for a row with `attempts` failed passes: this
/// pass is the next.
pub(super) fn attempt(attempts: Option<i32>) -> Option<pg_sys::Datum> {
    Some(pg_sys::Datum::from(attempts.unwrap_or(0).saturating_add(1)))
}

/// What a take does with each row it leases, besides returning it.
#[derive(Clone, Copy)]
pub(super) struct Hand<'a> {
    /// Claim its workflow for the lease (`take(claim => true)`).
    pub(super) claim: Option<Claim>,
    /// Keep its workflow and receipt (a limited queue's places and bucket,
    /// `limits::close`).
    pub(super) kept: Option<&'a RefCell<Kept>>,
}

impl Hand<'_> {
    /// Hand out the rows a statement leased (workflow, receipt): each as
    /// the hand asks, appended to the result of `call`.
    pub(super) fn out(&self, call: &Args, leased: &Handed, lease: Interval) -> Result<()> {
        for (workflow, receipt, attempts, input) in leased {
            let workflow = args::name("workflow", Some(Text::from_bytes(workflow)))?;
            let token = self.each(workflow, *receipt, lease)?;
            plan::append_row(
                call,
                &[
                    workflow.into_datum(),
                    Some(pg_sys::Datum::from(*receipt)),
                    token.map(pg_sys::Datum::from),
                    attempt(*attempts),
                    input.map(|j| j.0),
                ],
            )?;
        }
        Ok(())
    }

    /// The token for `workflow`'s row, after doing what the hand asks.
    fn each(
        &self,
        workflow: Name,
        receipt: pg_sys::TimestampTz,
        lease: Interval,
    ) -> Result<Option<i64>> {
        if let Some(kept) = self.kept {
            kept.borrow_mut().push((workflow.bytes().to_vec(), receipt));
        }
        match self.claim {
            Some(claim) => claim(workflow, lease),
            None => Ok(None),
        }
    }
}

/// A take statement: up to `max` rows from the place `from` on, due by
/// `due`; run again while it returns rows it locked but could not lease (at
/// most [`Runs`] allows). Each row leased is handed as `hand` asks
/// before it is returned.
#[allow(clippy::too_many_arguments)]
pub(super) fn take_from(
    call: &Args,
    stmt: &'static Statement,
    queue: Name,
    lease: Interval,
    max: i64,
    from: Position,
    due: TimestampWithTimeZone,
    batch: bool,
    hand: Hand<'_>,
) -> Result<Taken> {
    if std::ptr::eq(stmt, &TAKE_ONE)
        && let Some(taken) = lease_one(call, queue, lease, from, due, hand, None)?
    {
        return Ok(taken);
    }
    let at = time_param(from.0);
    let mut taken = Taken {
        rows: 0,
        oldest: None,
    };
    // what a run tells besides its rows: the oldest place it locked, and
    // whether it missed a row (locked but not leased: also a row whose
    // lease ran out, its failure counted after the run, `count_lapsed`)
    let seen = |r: &plan::Rows| {
        if batch {
            lease_rows(queue, r);
        }
        let oldest = (0..r.len())
            .filter_map(|i| Some((r.timestamptz(i, 6)?, r.get::<i64>(i, 7)?)))
            .min();
        let missed = (0..r.len()).any(|i| r.text_bytes(i, 1).is_none());
        note_lapsed(r, if batch { 9 } else { 8 });
        (oldest, missed)
    };
    let mut runs = Runs::default();
    loop {
        let left = max - taken.rows as i64;
        let args = [
            queue.into(),
            lease.into(),
            left.into(),
            at.into(),
            from.1.into(),
            due.into(),
        ];
        let (rows, (oldest, missed)) = match hand {
            Hand {
                claim: None,
                kept: None,
            } => plan::run_as_set_then(call, stmt, &args, |r| seen(&r))?,
            hand => {
                let (leased, seen) = plan::run_rows(stmt, &args, |r| {
                    let leased = leased(&r);
                    Ok((leased, seen(&r)))
                })?;
                plan::begin_result(call);
                hand.out(call, &leased, lease)?;
                (leased.len(), seen)
            }
        };
        let lapsed = count_lapsed(queue)?;
        taken.rows += rows;
        taken.oldest = earlier(taken.oldest, oldest);
        if !missed || taken.rows as i64 >= max || !runs.again(lapsed) {
            break;
        }
    }
    Ok(taken)
}

/// [`TAKE_ONE`]'s work without the statement (see `access`), the row then
/// handed as `hand` asks, where nothing the statement would do is skipped
/// that way; `None` where the statement must run. `admit`: a gate each due
/// row must pass (a per-key limit's, `keyed`).
pub(super) fn lease_one(
    call: &Args,
    queue: Name,
    lease: Interval,
    from: Position,
    due: TimestampWithTimeZone,
    hand: Hand<'_>,
    admit: Option<access::Admitting<'_>>,
) -> Result<Option<Taken>> {
    let Some(q) = queue.into_datum() else {
        return Ok(None);
    };
    plan::begin_result(call);
    // as the statement computes them: `now()` and `now() + lease`
    let now = pgrx::datum::now();
    let until = pg_sys::TimestampTz::from(args::plus(now, lease));
    let mut got = None;
    let Some(leased) = QUEUE.with(&[pg_sys::ACL_UPDATE], queue.bytes(), |table| {
        table.lease_first(
            &LEASE_COLUMNS,
            q,
            from,
            due.into(),
            until,
            now.into(),
            admit,
            |row| {
                got = Some((
                    Text::copied(row.key),
                    row.place,
                    row.tid,
                    row.attempts,
                    row.input.map(Jsonb::copied),
                ))
            },
        )
    })?
    else {
        return Ok(None);
    };
    let Some((workflow, place, tid, attempts, input)) = got.filter(|_| leased) else {
        return Ok(Some(Taken {
            rows: 0,
            oldest: None,
        }));
    };
    let workflow = args::name("workflow", Some(workflow))?;
    // (into the buffers of the last one kept: no allocation a take)
    TAKEN.with(|t| {
        let mut t = t.borrow_mut();
        let kept = t.get_or_insert_with(|| Taken1 {
            queue: Vec::new(),
            workflow: Vec::new(),
            receipt: until,
            tid,
            seen: access::Invalidations::now(),
            live: false,
        });
        kept.queue.clear();
        kept.queue.extend_from_slice(queue.bytes());
        kept.workflow.clear();
        kept.workflow.extend_from_slice(workflow.bytes());
        kept.receipt = until;
        kept.tid = tid;
        kept.seen = access::Invalidations::now();
        kept.live = true;
    });
    let token = hand.each(workflow, until, lease)?;
    plan::append_row(
        call,
        &[
            workflow.into_datum(),
            Some(pg_sys::Datum::from(until)),
            token.map(pg_sys::Datum::from),
            attempt(attempts),
            input.map(|j| j.0),
        ],
    )?;
    Ok(Some(Taken {
        rows: 1,
        oldest: Some(place),
    }))
}

/// `take`, its arguments checked: leases up to `max` rows of `queue` for
/// `lease` and returns them through `call`, each workflow claimed with
/// `claim` where given (see `compose`'s `take`, the SQL function). Finding
/// nothing, it marks the queue as waited on when `wake` asks for it.
pub(crate) fn take(
    call: &Args,
    queue: Name,
    lease: Interval,
    max: i32,
    claim: Option<Claim>,
    wake: bool,
) -> Result<()> {
    // flow control: what this queue's limits leave (a queue without any
    // pays a lookup in an empty map)
    let gate = match limits::of(queue)? {
        Some(l) => Some(limits::open(queue, l, max as usize)?),
        None => None,
    };
    let max = gate.as_ref().map_or(max, |g| g.allowed as i32);
    if max == 0 {
        // held back. Paused or out of tokens: no idle mark (the queue is
        // not empty, and no event ends either: a pause's resume notifies,
        // a bucket refills by the clock). No free place, or nothing ready:
        // the mark, which a pass's end that frees a place (`ended::ended`)
        // or a schedule answers.
        plan::begin_result(call);
        if wake && gate.as_ref().is_some_and(|g| g.nothing_ready || g.no_place) {
            wakeups::mark_idle(queue)?;
            idle::bump();
        }
        return Ok(());
    }
    let kept = RefCell::new(Vec::new());
    let hand = Hand {
        claim,
        kept: gate.as_ref().map(|_| &kept),
    };
    let close = |rows: usize| -> Result<()> {
        if let Some(gate) = &gate {
            limits::close(queue, gate, &kept.borrow())?;
        }
        if rows == 0 && wake {
            wakeups::mark_idle(queue)?;
            idle::bump();
        }
        Ok(())
    };
    // a per-key limit: a statement of its own for each scan, which reads
    // the levels above the default priority too (`keyed`)
    let keyed = gate.as_ref().is_some_and(|g| g.keyed());
    // the rows above the default priority first, where there are any
    let first = match priority::to_look(queue)?.filter(|_| !keyed) {
        Some(mark) => priority::take(call, queue, lease, max as usize, mark, hand)?,
        None => 0,
    };
    if first >= max as usize {
        return close(first);
    }
    let max = max - first as i32;
    let stmt = statement_for(max);
    let batch = max > 1;
    if batch {
        LEASED.with(|l| *l.borrow_mut() = None);
    }
    let start = Instant::now();
    let now = pgrx::datum::now();
    // Under Citus a take keeps a floor only on the node that holds the
    // queue's shard, where a row made ready before now is signalled
    // (`placed`); elsewhere every take scans the shard from the start.
    // (Asked first: a move of the shard seen now moves the generation.)
    let citus = crate::scaleout::distributed();
    let floors = !citus || placed::takes_keep_floors(queue.bytes())?;
    // Read before any scan: a past-dated write that bumps it after this
    // point is found by the next take.
    let (installation, generation) = generation::read();
    // the floors other backends reached here (`heads`), for this generation
    let shared = installation
        .zip(generation)
        .filter(|_| floors)
        .and_then(|(oid, g)| Some((heads::Queue::new(oid, queue.bytes())?, g)));
    let take = |left: usize, from: Position, due: TimestampWithTimeZone| {
        if keyed {
            let limit = gate.as_ref().map_or((0, false), |g| g.per_key());
            return keyed::take_from(call, queue, lease, left, from, due, hand, limit);
        }
        take_from(
            call,
            stmt,
            queue,
            lease,
            left as i64,
            from,
            due,
            batch,
            hand,
        )
    };
    let (floor, stood) = if floors {
        where_to_start(queue, shared, generation, start)
    } else {
        (None, None)
    };
    let (mut taken, full) = scan(floor, max as usize, now, take)?;
    if !floors {
        return close(first + taken.rows);
    }
    // rows found below where the takes stood: left behind (see `where_to_start`)
    let drain = stood
        .zip(taken.oldest)
        .is_some_and(|(stood, oldest)| oldest < stood);
    remember(
        queue,
        &taken,
        full.map(|cost| (cost, drain)),
        stood,
        generation,
        citus,
    );
    taken.rows += look_again_by_the_clock(
        queue,
        shared,
        generation,
        lease,
        now,
        max as usize - taken.rows.min(max as usize),
        take,
        citus,
    )?;
    publish_floor(queue, shared);
    close(first + taken.rows)
}

/// The statement a take of `max` rows runs in this schema.
fn statement_for(max: i32) -> &'static Statement {
    match (max, schema::current()) {
        (1, true) => &TAKE_ONE,
        (_, true) => &TAKE_MANY,
        (1, false) => &schema::TAKE_ONE_RELEASED,
        (_, false) => &schema::TAKE_MANY_RELEASED,
    }
}

/// Where a take of `queue` starts: from the floor, or from the start; and
/// whether a short take may go back to the start. Rate-limited, the floor
/// holds whatever the generation; otherwise only for the generation it was
/// found under. A floor goes on to the furthest another backend reached
/// under this generation (`shared`), which holds as one's own would.
///
/// A scan from the start due by the backend's own schedule is skipped
/// where another backend of the server ran one of this queue within that
/// schedule's interval (`heads::claim_scan`): one a second for the
/// server, not one a second for each of its backends. One that found a
/// row below where the takes stood leaves `drain` set: this backend's
/// next takes scan from the start too (as often as the rate limit lets
/// them), until one finds nothing left there.
///
/// Returns (where to start, whether a short take may go back to the
/// start), `None` for the start; and where a take by the floor would have
/// started (`None`: the floor holds for no generation of now).
fn where_to_start(
    queue: Name,
    shared: Option<(heads::Queue, i64)>,
    generation: Option<i64>,
    start: Instant,
) -> (Option<(Position, bool)>, Option<Position>) {
    FLOORS.with(|f| {
        let floors = f.borrow();
        let Some(fl) = floors.get(queue.bytes()) else {
            // This backend's first take here: from the floor another one
            // reached under this generation, where one did (it holds as
            // this backend's own would) and some backend scanned from the
            // start less than a second ago, not through the whole dead
            // front; rows left below it are the periodic scans'. Where none
            // did, this take is the periodic scan: a server whose every
            // connection takes once (a `pg_cron` job's) still scans from the
            // start once a second.
            let reached = shared.and_then(|(q, g)| Some((q, heads::read(&q, g)?)));
            let adopted = reached.filter(|(q, _)| !heads::claim_scan(q, clock(), every(LEAST_DUE)));
            return (adopted.map(|(_, at)| (at, true)), reached.map(|(_, at)| at));
        };
        let further = shared.and_then(|(q, g)| heads::read(&q, g));
        let at = further.map_or(fl.at, |f| f.max(fl.at));
        let holds = fl.generation.is_some() && fl.generation == generation;
        let floor = match fl.rescans.next(start) {
            ScanFrom::Start if holds && !fl.drain => match shared {
                Some((q, _)) if !heads::claim_scan(&q, clock(), every(fl.rescans.due())) => {
                    Some((at, true))
                }
                _ => None,
            },
            ScanFrom::Start => None,
            ScanFrom::Floor(false) => Some((at, false)),
            ScanFrom::Floor(true) if holds && !fl.drain => Some((at, true)),
            ScanFrom::Floor(true) => None,
        };
        (floor, holds.then_some(at))
    })
}

/// The take's scans by `now()`: from `floor` (see [`where_to_start`]) or
/// from the start, and, where one from the floor came up short and may,
/// from the start for the rest. What they took, and how long the scan
/// from the start took where one ran.
fn scan(
    floor: Option<(Position, bool)>,
    max: usize,
    now: TimestampWithTimeZone,
    take: impl Fn(usize, Position, TimestampWithTimeZone) -> Result<Taken>,
) -> Result<(Taken, Option<Duration>)> {
    let began = Instant::now();
    let (taken, full, may_rescan) = match floor {
        Some((at, may)) => (take(max, at, now)?, None, may),
        None => (take(max, START, now)?, Some(began.elapsed()), true),
    };
    if taken.rows >= max || full.is_some() || !may_rescan {
        return Ok((taken, full));
    }
    // Came up short from the floor: the start decides.
    let again = Instant::now();
    let more = take(max - taken.rows, START, now)?;
    let oldest = earlier(taken.oldest, more.oldest);
    Ok((
        Taken {
            rows: taken.rows + more.rows,
            oldest,
        },
        Some(again.elapsed()),
    ))
}

/// Scans by the clock for the `left` rows a take still wants; how many
/// they took.
///
/// Due means due by `now()`, the transaction's start. When the take comes
/// up short with that stale, the scans may have judged by a time gone by:
/// while they walked, the others took every row due by it, and the rows
/// scheduled since are not due by it. A scan from the start that walked
/// millions of dead entries under a pinned xmin, at 16 clients on two
/// cores, took 3.7 s of clock time (docs/internals.md, take); under a dead
/// front of a million entries a first take's scan from the start took a
/// few hundred milliseconds, and the one scan by the clock that followed
/// from its own floor, as far behind, came up empty too, beside a thousand
/// ready rows; or the caller's transaction began long ago. So before the
/// take says empty it scans again by the clock, from the furthest floor
/// (its own, or one another backend reached under this generation since,
/// which holds as its own would: where the others have got to), and again,
/// by a clock read afresh, while a scan came up short but took long enough
/// for the head to move on ([`RECHECK_AFTER`]), up to [`CLOCK_SCANS`] of
/// them. Not when `now()` is stale by the lease or more: the lease counts
/// from `now()`, and would have ended before the row was handed out.
#[allow(clippy::too_many_arguments)]
fn look_again_by_the_clock(
    queue: Name,
    shared: Option<(heads::Queue, i64)>,
    generation: Option<i64>,
    lease: Interval,
    now: TimestampWithTimeZone,
    mut left: usize,
    take: impl Fn(usize, Position, TimestampWithTimeZone) -> Result<Taken>,
    citus: bool,
) -> Result<usize> {
    let mut took = 0;
    let mut stale_since = pg_sys::TimestampTz::from(now);
    for _ in 0..CLOCK_SCANS {
        if left == 0 {
            break;
        }
        let clock = pgrx::datum::clock_timestamp();
        let at_clock = pg_sys::TimestampTz::from(clock);
        if at_clock - stale_since <= RECHECK_AFTER
            || i128::from(at_clock - pg_sys::TimestampTz::from(now)) >= lease.as_micros()
        {
            break;
        }
        let own = FLOORS.with(|f| f.borrow().get(queue.bytes()).map(|fl| fl.at));
        let further = shared.and_then(|(q, g)| heads::read(&q, g));
        let Some(at) = own.max(further) else {
            break;
        };
        let more = take(left, at, clock)?;
        remember(queue, &more, None, None, generation, citus);
        took += more.rows;
        left -= more.rows.min(left);
        stale_since = at_clock;
    }
    Ok(took)
}

/// This backend's floor for `queue`, offered to the others (`heads`) where
/// it holds for the generation they share.
fn publish_floor(queue: Name, shared: Option<(heads::Queue, i64)>) {
    if let Some((q, g)) = shared
        && let Some(at) = FLOORS.with(|f| {
            let floors = f.borrow();
            let fl = floors.get(queue.bytes())?;
            (fl.generation == Some(g)).then_some(fl.at)
        })
    {
        heads::offer(&q, g, at);
    }
}
