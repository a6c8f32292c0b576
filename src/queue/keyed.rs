//! The per-key limit: at most `per_key` passes of one key (`sturdy.queue.key`)
//! leased at once, all takers together; rows without a key are not limited
//! by it.
//!
//! Each key of a limited queue has `per_key` places in
//! `sturdy.queue_key_places`, made on demand: by `limit_queue` for the keys
//! the queue holds, and by a take for a key it meets without any. A take of
//! such a queue runs one statement ([`TAKE_KEYED`]) that
//!
//! 1. reads the ready rows in take's order (the levels above the default
//!    priority first, see `priority.rs`), passing over rows whose key has
//!    no free place (no place with no receipt or a passed one), up to a
//!    window a few times what the take wants;
//! 2. keeps, of each key, as many rows as the key has free places, and of
//!    those the first `max` in take's order;
//! 3. locks those rows `FOR UPDATE SKIP LOCKED`, and for each key as many
//!    of its free places as it locked rows of it, `FOR UPDATE SKIP
//!    LOCKED` too;
//! 4. leases each locked row that got a place, and writes its workflow and
//!    receipt into that place.
//!
//! Two takers never lock one place, and a row is leased only with a place
//! its taker locked, so no interleaving of takers leases more than
//! `per_key` rows of a key. A pass's `done`, `finish` or `wake_at` frees
//! its place (by workflow and receipt, as the running limit's); a pass
//! that dies frees it when its receipt passes. A row locked without a place
//! (another taker locked the place in between) stays ready, held by this
//! take's lock until it commits, and the take hands out fewer rows.
//!
//! These takes go by the floors (`floor.rs`) as the others do, but a
//! keyed take's floor stops at the first ready row it met, whatever its key
//! ([`head`]): a row passed over because its key had no free place is
//! still to be taken, and a later take must meet it again.

use super::*;

/// The filter of a keyed take's scan: a row without a key, or one whose
/// key has a free place up to the limit `$7` (no receipt, or a passed
/// one), or has no places yet (the take makes them); while the queue
/// settles (`$8`), also fewer places held than the limit. Each probe runs
/// per row, an index lookup of the key's places (`OFFSET 0` keeps the
/// planner from hashing the places of the whole queue instead).
macro_rules! key_free {
    () => {
        "AND (q.key IS NULL
              OR (EXISTS (SELECT FROM sturdy.queue_key_places p
                           WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) q.key
                             AND p.place OPERATOR(pg_catalog.<=) $7
                             AND (p.receipt IS NULL OR p.receipt OPERATOR(pg_catalog.<=) $4)
                          OFFSET 0)
                  AND ($8 IS NOT TRUE
                       OR (SELECT pg_catalog.count(*) FROM sturdy.queue_key_places h
                            WHERE h.queue OPERATOR(pg_catalog.=) $1 AND h.key OPERATOR(pg_catalog.=) q.key
                              AND h.receipt OPERATOR(pg_catalog.>) $4) OPERATOR(pg_catalog.<) $7))
              OR NOT EXISTS (SELECT FROM sturdy.queue_key_places p
                              WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) q.key
                             OFFSET 0))"
    };
}

/// The first ready row of the default level from the floor (`$5`, `$6`),
/// whatever its key: a keyed take's floor goes no further than it, for a row
/// passed over because its key had no free place is still to be taken.
macro_rules! head {
    () => {
        ",
          head AS MATERIALIZED (
              SELECT q.visible_at, q.seq FROM sturdy.queue q
               WHERE q.queue OPERATOR(pg_catalog.=) $1 AND q.priority OPERATOR(pg_catalog.=) 0
                 AND q.visible_at OPERATOR(pg_catalog.<=) $4
                 AND (q.visible_at, q.seq) OPERATOR(pg_catalog.>=) ($5, $6)
                 AND (q.leased_until IS NULL OR q.leased_until OPERATOR(pg_catalog.<=) $4)
               ORDER BY q.visible_at, q.seq
               LIMIT 1)"
    };
}

/// See the module comment. `$1` queue, `$2` lease, `$3` max, `$4` due by,
/// the default level read from the place (`$5`, `$6`) on, `$7` the
/// per-key limit, `$8` whether the queue settles (`limits::settle`). Returns each row
/// leased (workflow, receipt); a row with a key and nothing else for each
/// key met without places; a row with `true` in the sixth column for each
/// row locked with a place but not leased (see the take statements in
/// `sql.rs`: run again); and a row with the place of [`head`] in the seventh
/// and eighth, where there is one. The fourth is take's `attempt`.
static TAKE_KEYED: Statement = Statement {
    sql: concat!(
        super::priority::levels!(),
        head!(),
        ",
          seen AS MATERIALIZED (
              SELECT s.ctid, s.key, pg_catalog.row_number() OVER () AS ord FROM (
                  (SELECT r.ctid, r.key FROM levels l CROSS JOIN LATERAL (
                       SELECT ctid, key FROM sturdy.queue q
                        WHERE q.queue OPERATOR(pg_catalog.=) $1 AND q.priority OPERATOR(pg_catalog.=) l.p
                          AND q.priority OPERATOR(pg_catalog.>) 0
                          AND q.visible_at OPERATOR(pg_catalog.<=) $4
                          AND (q.leased_until IS NULL OR q.leased_until OPERATOR(pg_catalog.<=) $4)
                          ", key_free!(), "
                        ORDER BY q.visible_at, q.seq
                        LIMIT $3 OPERATOR(pg_catalog.*) 4 OPERATOR(pg_catalog.+) 8) r
                    WHERE l.p IS NOT NULL)
                  UNION ALL
                  (SELECT q.ctid, q.key FROM sturdy.queue q
                    WHERE q.queue OPERATOR(pg_catalog.=) $1 AND q.priority OPERATOR(pg_catalog.=) 0
                      AND q.visible_at OPERATOR(pg_catalog.<=) $4
                      AND (q.visible_at, q.seq) OPERATOR(pg_catalog.>=) ($5, $6)
                      AND (q.leased_until IS NULL OR q.leased_until OPERATOR(pg_catalog.<=) $4)
                      ", key_free!(), "
                    ORDER BY q.visible_at, q.seq
                    LIMIT $3 OPERATOR(pg_catalog.*) 4 OPERATOR(pg_catalog.+) 8)
                  LIMIT $3 OPERATOR(pg_catalog.*) 4 OPERATOR(pg_catalog.+) 8) s),
          chosen AS MATERIALIZED (
              SELECT c.ctid, c.ord FROM (
                  SELECT s.ctid, s.key, s.ord,
                         pg_catalog.row_number() OVER (PARTITION BY s.key ORDER BY s.ord) AS nth
                    FROM seen s) c
               WHERE c.key IS NULL
                  OR c.nth OPERATOR(pg_catalog.<=) (
                         SELECT CASE WHEN pg_catalog.count(*) OPERATOR(pg_catalog.=) 0 THEN 1
                                     ELSE LEAST(pg_catalog.count(*) FILTER (WHERE (p.receipt IS NULL
                                                    OR p.receipt OPERATOR(pg_catalog.<=) $4)
                                                    AND p.place OPERATOR(pg_catalog.<=) $7),
                                                CASE WHEN $8 THEN $7 OPERATOR(pg_catalog.-) pg_catalog.count(*)
                                                                  FILTER (WHERE p.receipt OPERATOR(pg_catalog.>) $4)
                                                     ELSE $7 END) END
                           FROM sturdy.queue_key_places p
                          WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) c.key)
               ORDER BY c.ord
               LIMIT $3),
          locked AS MATERIALIZED (
              SELECT q.ctid, q.workflow, q.key, q.leased_until FROM sturdy.queue q
               WHERE q.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM chosen))
                 AND (q.queue OPERATOR(pg_catalog.=) $1 AND q.visible_at OPERATOR(pg_catalog.<=) $4
                      AND (q.leased_until IS NULL OR q.leased_until OPERATOR(pg_catalog.<=) $4)) IS TRUE
                 FOR UPDATE SKIP LOCKED),
          places AS MATERIALIZED (
              SELECT k.key, pl.places FROM (
                  SELECT key, pg_catalog.count(*) AS n FROM locked WHERE key IS NOT NULL GROUP BY key) k
              CROSS JOIN LATERAL (
                  SELECT pg_catalog.array_agg(x.place ORDER BY x.place) AS places FROM (
                      SELECT p.place FROM sturdy.queue_key_places p
                       WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) k.key
                         AND p.place OPERATOR(pg_catalog.<=) $7
                         AND (p.receipt IS NULL OR p.receipt OPERATOR(pg_catalog.<=) $4)
                       ORDER BY p.place
                       LIMIT k.n
                         FOR UPDATE SKIP LOCKED) x) pl),
          go AS MATERIALIZED (
              SELECT a.ctid, a.workflow, a.key, p.places[a.nth] AS place FROM (
                  SELECT l.ctid, l.workflow, l.key,
                         pg_catalog.row_number() OVER (PARTITION BY l.key ORDER BY c.ord)::integer AS nth
                    FROM locked l JOIN chosen c ON c.ctid OPERATOR(pg_catalog.=) l.ctid) a
              LEFT JOIN places p ON p.key OPERATOR(pg_catalog.=) a.key
               WHERE a.key IS NULL OR p.places[a.nth] IS NOT NULL),
          taken AS (
              UPDATE sturdy.queue AS q
                 ", super::sql::taken_set!(), "
               WHERE q.queue OPERATOR(pg_catalog.=) $1 COLLATE \"default\" AND q.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM go))
                 AND q.leased_until IS NULL
              RETURNING q.workflow, q.leased_until AS receipt, COALESCE(q.attempts, 0) OPERATOR(pg_catalog.+) 1 AS attempt, q.input),
          held AS (
              UPDATE sturdy.queue_key_places p SET workflow = t.workflow, receipt = t.receipt
                FROM taken t JOIN go g ON g.workflow OPERATOR(pg_catalog.=) t.workflow
               WHERE t.receipt IS NOT NULL
                 AND p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) g.key
                 AND p.place OPERATOR(pg_catalog.=) g.place)
          SELECT t.workflow, t.receipt, NULL::pg_catalog.int8, t.attempt, t.input, NULL::pg_catalog.text, false,
                 NULL::pg_catalog.timestamptz, NULL::pg_catalog.int8, NULL::pg_catalog.text, NULL::pg_catalog.timestamptz
            FROM taken t
          UNION ALL
          SELECT NULL, NULL, NULL, NULL, NULL, NULL, false, NULL, NULL, l.workflow, l.leased_until
            FROM locked l WHERE l.leased_until IS NOT NULL
          UNION ALL
          SELECT NULL, NULL, NULL, NULL, NULL, k.key, false, NULL, NULL, NULL, NULL
            FROM (SELECT DISTINCT key FROM locked WHERE key IS NOT NULL) k
           WHERE NOT EXISTS (SELECT FROM sturdy.queue_key_places p
                              WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) k.key)
          UNION ALL
          SELECT NULL, NULL, NULL, NULL, NULL, NULL, true, NULL, NULL, NULL, NULL FROM go g
           WHERE NOT EXISTS (SELECT FROM taken t WHERE t.workflow OPERATOR(pg_catalog.=) g.workflow
                                                   AND t.receipt IS NOT NULL)
          UNION ALL
          SELECT NULL, NULL, NULL, NULL, NULL, NULL, false, h.visible_at, h.seq, NULL, NULL FROM head h"
    ),
    args: &[
        pg_sys::TEXTOID,
        pg_sys::INTERVALOID,
        pg_sys::INT8OID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::INT8OID,
        pg_sys::INT4OID,
        pg_sys::BOOLOID,
    ],
    writes: true,
    generic: true,
};

/// [`TAKE_KEYED`] for one row, the common take: the first ready row in
/// take's order whose key looks to have a free place, locked `FOR UPDATE
/// SKIP LOCKED` as it is found, then one free place of its key locked the
/// same way; no window, no ranking. Same arguments and result.
static TAKE_KEYED_ONE: Statement = Statement {
    sql: concat!(
        super::priority::levels!(),
        head!(),
        ",
          cand AS MATERIALIZED (
              SELECT c.ctid, c.workflow, c.key, c.leased_until FROM (
                  SELECT a.ctid, a.workflow, a.key, a.leased_until FROM (
                      SELECT r.ctid, r.workflow, r.key, r.leased_until FROM levels l CROSS JOIN LATERAL (
                          SELECT ctid, workflow, key, leased_until FROM sturdy.queue q
                           WHERE q.queue OPERATOR(pg_catalog.=) $1 AND q.priority OPERATOR(pg_catalog.=) l.p
                             AND q.priority OPERATOR(pg_catalog.>) 0
                             AND q.visible_at OPERATOR(pg_catalog.<=) $4
                             AND (q.leased_until IS NULL OR q.leased_until OPERATOR(pg_catalog.<=) $4)
                             ", key_free!(), "
                           ORDER BY q.visible_at, q.seq
                           LIMIT 1
                             FOR UPDATE SKIP LOCKED) r
                       WHERE l.p IS NOT NULL
                       LIMIT 1) a
                  UNION ALL
                  SELECT b.ctid, b.workflow, b.key, b.leased_until FROM (
                      SELECT q.ctid, q.workflow, q.key, q.leased_until FROM sturdy.queue q
                       WHERE q.queue OPERATOR(pg_catalog.=) $1 AND q.priority OPERATOR(pg_catalog.=) 0
                         AND q.visible_at OPERATOR(pg_catalog.<=) $4
                         AND (q.visible_at, q.seq) OPERATOR(pg_catalog.>=) ($5, $6)
                         AND (q.leased_until IS NULL OR q.leased_until OPERATOR(pg_catalog.<=) $4)
                         ", key_free!(), "
                       ORDER BY q.visible_at, q.seq
                       LIMIT 1
                         FOR UPDATE SKIP LOCKED) b) c
               LIMIT 1),
          place AS MATERIALIZED (
              SELECT p.place FROM sturdy.queue_key_places p, cand c
               WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) c.key
                 AND p.place OPERATOR(pg_catalog.<=) $7
                 AND (p.receipt IS NULL OR p.receipt OPERATOR(pg_catalog.<=) $4)
               ORDER BY p.place
               LIMIT 1
                 FOR UPDATE OF p SKIP LOCKED),
          go AS MATERIALIZED (
              SELECT c.ctid, c.workflow, c.key, (SELECT place FROM place) AS place FROM cand c
               WHERE c.key IS NULL OR EXISTS (SELECT FROM place)),
          taken AS (
              UPDATE sturdy.queue AS q
                 ", super::sql::taken_set!(), "
               WHERE q.queue OPERATOR(pg_catalog.=) $1 COLLATE \"default\" AND q.ctid OPERATOR(pg_catalog.=) (SELECT ctid FROM go)
                 AND q.leased_until IS NULL
              RETURNING q.workflow, q.leased_until AS receipt, COALESCE(q.attempts, 0) OPERATOR(pg_catalog.+) 1 AS attempt, q.input),
          held AS (
              UPDATE sturdy.queue_key_places p SET workflow = t.workflow, receipt = t.receipt
                FROM taken t, go g
               WHERE t.receipt IS NOT NULL
                 AND p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) g.key
                 AND p.place OPERATOR(pg_catalog.=) g.place)
          SELECT t.workflow, t.receipt, NULL::pg_catalog.int8, t.attempt, t.input, NULL::pg_catalog.text, false,
                 NULL::pg_catalog.timestamptz, NULL::pg_catalog.int8, NULL::pg_catalog.text, NULL::pg_catalog.timestamptz
            FROM taken t
          UNION ALL
          SELECT NULL, NULL, NULL, NULL, NULL, NULL, false, NULL, NULL, c.workflow, c.leased_until
            FROM cand c WHERE c.leased_until IS NOT NULL
          UNION ALL
          SELECT NULL, NULL, NULL, NULL, NULL, c.key, false, NULL, NULL, NULL, NULL FROM cand c
           WHERE c.key IS NOT NULL
             AND NOT EXISTS (SELECT FROM sturdy.queue_key_places p
                              WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) c.key)
          UNION ALL
          SELECT NULL, NULL, NULL, NULL, NULL, NULL, true, NULL, NULL, NULL, NULL FROM go g
           WHERE NOT EXISTS (SELECT FROM taken WHERE receipt IS NOT NULL)
          UNION ALL
          SELECT NULL, NULL, NULL, NULL, NULL, NULL, false, h.visible_at, h.seq, NULL, NULL FROM head h"
    ),
    args: &[
        pg_sys::TEXTOID,
        pg_sys::INTERVALOID,
        pg_sys::INT8OID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::INT8OID,
        pg_sys::INT4OID,
        pg_sys::BOOLOID,
    ],
    writes: true,
    generic: true,
};

/// The places of keys met without any: `per_key` of the queue's limits
/// for each of `$2`. The limits row is read `FOR SHARE`: a `limit_queue`
/// under way (which updates it) is waited for and its `per_key` used, and
/// one that starts meanwhile waits for this take, then sees its places and
/// its passes.
static MAKE_PLACES: Statement = Statement {
    sql: "INSERT INTO sturdy.queue_key_places (queue, key, place)
          SELECT $1, k, g
            FROM (SELECT l.per_key FROM sturdy.queue_limits l
                   WHERE l.queue OPERATOR(pg_catalog.=) $1 FOR SHARE) l,
                 pg_catalog.unnest($2::pg_catalog.text[]) k,
                 pg_catalog.generate_series(1, l.per_key) g
          ON CONFLICT (queue, key, place) DO NOTHING",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTARRAYOID],
    writes: true,
    generic: false,
};

/// A take of a queue with a per-key limit: up to `max` rows leased (see the
/// module comment), the default level read from the place `from` on, due by
/// `due`; handed as `hand` asks and appended to the result of `call`. What
/// it took, and as its oldest place the first ready row from `from` on,
/// whatever its key (`take`'s floor stops there: rows passed over for their
/// key are still to be taken).
///
/// `limit`: the per-key limit, and whether the queue settles; settling,
/// each key's places held are counted, by the statements.
#[allow(clippy::too_many_arguments)]
pub(super) fn take_from(
    call: &Args,
    queue: Name,
    lease: Interval,
    max: usize,
    from: Position,
    due: TimestampWithTimeZone,
    hand: Hand<'_>,
    (per_key, settling): (i32, bool),
) -> Result<Taken> {
    let mut taken = Taken {
        rows: 0,
        oldest: None,
    };
    plan::begin_result(call);
    if max == 1
        && !settling
        && let Some(taken) = lease_one(call, queue, lease, from, due, hand)?
    {
        return Ok(taken);
    }
    // a run that made places or missed rows is run again: the places it
    // made are there for the next, the rows it missed are locked by it
    let mut runs = Runs::default();
    loop {
        let stmt = if max - taken.rows == 1 {
            &TAKE_KEYED_ONE
        } else {
            &TAKE_KEYED
        };
        let (leased, placeless, missed, head) = plan::run_rows(
            stmt,
            &[
                queue.into(),
                lease.into(),
                ((max - taken.rows) as i64).into(),
                due.into(),
                time_param(from.0).into(),
                from.1.into(),
                per_key.into(),
                settling.into(),
            ],
            |r| {
                let leased = leased(&r);
                // (copied out as bytes: a text made here would live in SPI's
                // memory, which goes when its connection closes, before
                // MAKE_PLACES reads it; the model checker's keyed takes
                // crashed the backend in that read)
                let placeless: Vec<Vec<u8>> = (0..r.len())
                    .filter_map(|i| r.text_bytes(i, 6).map(<[u8]>::to_vec))
                    .collect();
                let missed = (0..r.len()).any(|i| r.get::<bool>(i, 7) == Some(true));
                let head = (0..r.len())
                    .filter_map(|i| Some((r.timestamptz(i, 8)?, r.get::<i64>(i, 9)?)))
                    .min();
                note_lapsed(&r, 10);
                Ok((leased, placeless, missed, head))
            },
        )?;
        hand.out(call, &leased, lease)?;
        let lapsed = count_lapsed(queue)?;
        taken.rows += leased.len();
        taken.oldest = earlier(taken.oldest, head);
        if !placeless.is_empty() {
            let keys: Vec<Option<Text>> = placeless
                .iter()
                .map(|k| Some(Text::from_bytes(k)))
                .collect();
            run_one(&MAKE_PLACES, &[queue.into(), keys.into()], |_| Ok(()))?;
        } else if !missed {
            break;
        }
        if taken.rows >= max || !runs.again(lapsed) {
            break;
        }
    }
    Ok(taken)
}

/// The most keys a one-row take remembers as full during its scan (a
/// linear look-up: the keys a scan meets full before it finds a row are
/// few, unless many keys are full at once, where a look-up per row is what
/// it costs past these).
const FULL_KEPT: usize = 64;

/// [`TAKE_KEYED_ONE`]'s work without a statement (see `access`): the first
/// due row from `from` on whose key has a free place (or that has no key),
/// leased as a one-row take of a queue without limits leases it, the place
/// locked first (`FOR UPDATE SKIP LOCKED`, as the statement locks it) and
/// written after. `None` where the statement must run, with nothing leased:
/// the queue has prioritized rows (whose levels the statement reads), a key
/// has no places yet (the statement's caller makes them), or `access`
/// cannot serve a table here.
fn lease_one(
    call: &Args,
    queue: Name,
    lease: Interval,
    from: Position,
    due: TimestampWithTimeZone,
    hand: Hand<'_>,
) -> Result<Option<Taken>> {
    if priority::any(queue)? {
        return Ok(None);
    }
    let Some(q) = queue.into_datum() else {
        return Ok(None);
    };
    let by = pg_sys::TimestampTz::from(due);
    // the place locked for the last key admitted, and that key (`None`: a
    // row without one); the first row passed over for its key; whether a
    // key without places stopped the scan
    let mut held: Option<(Vec<u8>, limits::Held)> = None;
    // keys found full in this scan: their other rows are passed over
    // without looking for a place again (a full key with a long backlog
    // would cost a place lookup per row)
    let mut full: Vec<Vec<u8>> = Vec::new();
    let mut admitted: Option<Option<Vec<u8>>> = None;
    let mut passed: Option<Position> = None;
    let mut placeless = false;
    let mut ask = |key: Option<pg_sys::Datum>, place: Position| -> Result<access::Admit> {
        let Some(key) = key else {
            admitted = Some(None);
            return Ok(access::Admit::Lease);
        };
        // (copied: the row's value may be stored compressed)
        let key = Text::copied(key);
        if held.as_ref().is_some_and(|(k, _)| k == key.bytes()) {
            admitted = Some(Some(key.bytes().to_vec()));
            return Ok(access::Admit::Lease);
        }
        if full.iter().any(|k| k == key.bytes()) {
            passed = Some(passed.map_or(place, |p| p.min(place)));
            return Ok(access::Admit::PassOver);
        }
        let Some(k) = key.into_datum() else {
            placeless = true;
            return Ok(access::Admit::Stop);
        };
        match limits::lock_key_place(queue, q, k, by)? {
            Some(limits::Place::Held(h)) => {
                held = Some((key.bytes().to_vec(), h));
                admitted = Some(Some(key.bytes().to_vec()));
                Ok(access::Admit::Lease)
            }
            Some(limits::Place::NoneFree) => {
                passed = Some(passed.map_or(place, |p| p.min(place)));
                if full.len() < FULL_KEPT {
                    full.push(key.bytes().to_vec());
                }
                Ok(access::Admit::PassOver)
            }
            Some(limits::Place::NoRows) | None => {
                placeless = true;
                Ok(access::Admit::Stop)
            }
        }
    };
    let Some(mut taken) = take::lease_one(
        call,
        queue,
        lease,
        from,
        due,
        hand,
        Some(access::Admitting {
            group: Q_KEY,
            ask: &mut ask,
        }),
    )?
    else {
        return Ok(None);
    };
    if placeless {
        // (nothing was leased: a stop ends the scan before any lease)
        return Ok(None);
    }
    if taken.rows == 1
        && let Some(Some(key)) = &admitted
    {
        let Some((k, place)) = held.as_ref().filter(|(k, _)| k == key) else {
            return Err(Error::Internal {
                context: "keyed",
                cause: "a row was leased without its key's place".into(),
            });
        };
        debug_assert_eq!(k, key);
        let written = TAKEN.with(|t| {
            t.borrow()
                .as_ref()
                .filter(|t| t.live)
                .map(|t| (t.workflow.clone(), t.receipt))
        });
        let Some((workflow, receipt)) = written else {
            return Err(Error::Internal {
                context: "keyed",
                cause: "the row leased was not kept".into(),
            });
        };
        place.hold(limits::KEYED, queue, &workflow, receipt)?;
    }
    // the floor stops at the first row passed over for its key
    taken.oldest = earlier(taken.oldest, passed);
    Ok(Some(taken))
}

/// The places of keys with no row left in their queue, free (no receipt,
/// or a passed one), at most `$1` keys': deleted. A take that meets such a
/// key again makes its places again.
static SWEEP_PLACES: Statement = Statement {
    sql: "WITH gone AS (
              SELECT p.queue, p.key FROM sturdy.queue_key_places p
               WHERE p.place OPERATOR(pg_catalog.=) 1
                 AND NOT EXISTS (SELECT FROM sturdy.queue q
                                  WHERE q.queue OPERATOR(pg_catalog.=) p.queue AND q.key OPERATOR(pg_catalog.=) p.key)
                 AND NOT EXISTS (SELECT FROM sturdy.queue_key_places h
                                  WHERE h.queue OPERATOR(pg_catalog.=) p.queue AND h.key OPERATOR(pg_catalog.=) p.key
                                    AND h.receipt OPERATOR(pg_catalog.>) pg_catalog.now())
               LIMIT $1),
          deleted AS (
              DELETE FROM sturdy.queue_key_places p USING gone g
               WHERE p.queue OPERATOR(pg_catalog.=) g.queue AND p.key OPERATOR(pg_catalog.=) g.key
                 AND (p.receipt IS NULL OR p.receipt OPERATOR(pg_catalog.<=) pg_catalog.now())
              RETURNING p.queue, p.key)
          SELECT pg_catalog.count(*) FROM (SELECT DISTINCT queue, key FROM deleted) d",
    args: &[pg_sys::INT4OID],
    writes: true,
    generic: false,
};

/// `sweep`'s batch of per-key places: how many keys' places went.
pub(crate) fn sweep_key_places(max: i32) -> Result<i64> {
    Ok(run_one(&SWEEP_PLACES, &[max.into()], first_value::<i64>)?.unwrap_or(0))
}
