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
//! These takes do not go by the floors (`floor.rs`): each reads the queue
//! from its oldest ready row, and under a pinned xmin walks the dead
//! entries there.

use super::*;

/// The filter of a keyed take's scan: a row without a key, or one whose
/// key has a free place (no receipt, or a passed one), or has no places
/// yet (the take makes them). Each probe runs per row, an index lookup of
/// the key's places (`OFFSET 0` keeps the planner from hashing the places
/// of the whole queue instead).
macro_rules! key_free {
    () => {
        "AND (q.key IS NULL
              OR EXISTS (SELECT FROM sturdy.queue_key_places p
                          WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) q.key
                            AND (p.receipt IS NULL OR p.receipt OPERATOR(pg_catalog.<=) $4)
                         OFFSET 0)
              OR NOT EXISTS (SELECT FROM sturdy.queue_key_places p
                              WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) q.key
                             OFFSET 0))"
    };
}

/// See the module comment. `$1` queue, `$2` lease, `$3` max, `$4` due by.
/// Returns each row leased (workflow, receipt); a row with a key and
/// nothing else for each key met without places; a row with `true` in the
/// fifth column for each row locked with a place but not leased (see the
/// take statements in `sql.rs`: run again).
static TAKE_KEYED: Statement = Statement {
    sql: concat!(
        super::priority::levels!(),
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
                      AND (q.visible_at, q.seq) OPERATOR(pg_catalog.>=) ('-infinity'::pg_catalog.timestamptz, 0)
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
                                     ELSE pg_catalog.count(*) FILTER (WHERE p.receipt IS NULL
                                                 OR p.receipt OPERATOR(pg_catalog.<=) $4) END
                           FROM sturdy.queue_key_places p
                          WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) c.key)
               ORDER BY c.ord
               LIMIT $3),
          locked AS MATERIALIZED (
              SELECT q.ctid, q.workflow, q.key FROM sturdy.queue q
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
                 SET leased_until = pg_catalog.now() OPERATOR(pg_catalog.+) $2, taken_at = pg_catalog.now(),
                     takes = q.takes OPERATOR(pg_catalog.+) 1
               WHERE q.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM go))
              RETURNING q.workflow, q.leased_until AS receipt),
          held AS (
              UPDATE sturdy.queue_key_places p SET workflow = t.workflow, receipt = t.receipt
                FROM taken t JOIN go g ON g.workflow OPERATOR(pg_catalog.=) t.workflow
               WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) g.key
                 AND p.place OPERATOR(pg_catalog.=) g.place)
          SELECT t.workflow, t.receipt, NULL::pg_catalog.int8, NULL::pg_catalog.text, false FROM taken t
          UNION ALL
          SELECT NULL, NULL, NULL, k.key, false
            FROM (SELECT DISTINCT key FROM locked WHERE key IS NOT NULL) k
           WHERE NOT EXISTS (SELECT FROM sturdy.queue_key_places p
                              WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) k.key)
          UNION ALL
          SELECT NULL, NULL, NULL, NULL, true FROM go g
           WHERE NOT EXISTS (SELECT FROM taken t WHERE t.workflow OPERATOR(pg_catalog.=) g.workflow)"
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

/// [`TAKE_KEYED`] for one row, the common take: the first ready row in
/// take's order whose key looks to have a free place, locked `FOR UPDATE
/// SKIP LOCKED` as it is found, then one free place of its key locked the
/// same way; no window, no ranking. Same arguments and result.
static TAKE_KEYED_ONE: Statement = Statement {
    sql: concat!(
        super::priority::levels!(),
        ",
          cand AS MATERIALIZED (
              SELECT c.ctid, c.workflow, c.key FROM (
                  SELECT a.ctid, a.workflow, a.key FROM (
                      SELECT r.ctid, r.workflow, r.key FROM levels l CROSS JOIN LATERAL (
                          SELECT ctid, workflow, key FROM sturdy.queue q
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
                  SELECT b.ctid, b.workflow, b.key FROM (
                      SELECT q.ctid, q.workflow, q.key FROM sturdy.queue q
                       WHERE q.queue OPERATOR(pg_catalog.=) $1 AND q.priority OPERATOR(pg_catalog.=) 0
                         AND q.visible_at OPERATOR(pg_catalog.<=) $4
                         AND (q.visible_at, q.seq) OPERATOR(pg_catalog.>=) ('-infinity'::pg_catalog.timestamptz, 0)
                         AND (q.leased_until IS NULL OR q.leased_until OPERATOR(pg_catalog.<=) $4)
                         ", key_free!(), "
                       ORDER BY q.visible_at, q.seq
                       LIMIT 1
                         FOR UPDATE SKIP LOCKED) b) c
               LIMIT 1),
          place AS MATERIALIZED (
              SELECT p.place FROM sturdy.queue_key_places p, cand c
               WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) c.key
                 AND (p.receipt IS NULL OR p.receipt OPERATOR(pg_catalog.<=) $4)
               ORDER BY p.place
               LIMIT 1
                 FOR UPDATE OF p SKIP LOCKED),
          go AS MATERIALIZED (
              SELECT c.ctid, c.workflow, c.key, (SELECT place FROM place) AS place FROM cand c
               WHERE c.key IS NULL OR EXISTS (SELECT FROM place)),
          taken AS (
              UPDATE sturdy.queue AS q
                 SET leased_until = pg_catalog.now() OPERATOR(pg_catalog.+) $2, taken_at = pg_catalog.now(),
                     takes = q.takes OPERATOR(pg_catalog.+) 1
               WHERE q.ctid OPERATOR(pg_catalog.=) (SELECT ctid FROM go)
              RETURNING q.workflow, q.leased_until AS receipt),
          held AS (
              UPDATE sturdy.queue_key_places p SET workflow = t.workflow, receipt = t.receipt
                FROM taken t, go g
               WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) g.key
                 AND p.place OPERATOR(pg_catalog.=) g.place)
          SELECT t.workflow, t.receipt, NULL::pg_catalog.int8, NULL::pg_catalog.text, false FROM taken t
          UNION ALL
          SELECT NULL, NULL, NULL, c.key, false FROM cand c
           WHERE c.key IS NOT NULL
             AND NOT EXISTS (SELECT FROM sturdy.queue_key_places p
                              WHERE p.queue OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) c.key)
          UNION ALL
          SELECT NULL, NULL, NULL, NULL, true FROM go g WHERE NOT EXISTS (SELECT FROM taken)"
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

/// The places of keys met without any: `per_key` of the queue's limits
/// for each of `$2`.
static MAKE_PLACES: Statement = Statement {
    sql: "INSERT INTO sturdy.queue_key_places (queue, key, place)
          SELECT $1, k, g
            FROM pg_catalog.unnest($2::pg_catalog.text[]) k,
                 pg_catalog.generate_series(1, (SELECT l.per_key FROM sturdy.queue_limits l
                                                 WHERE l.queue OPERATOR(pg_catalog.=) $1)) g
          ON CONFLICT (queue, key, place) DO NOTHING",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTARRAYOID],
    writes: true,
    generic: false,
};

/// A take of a queue with a per-key limit: up to `max` rows leased (see the
/// module comment), handed as `hand` asks and appended to the result of
/// `call`; how many.
pub(super) fn take(
    call: &Args,
    queue: Name,
    lease: Interval,
    max: usize,
    hand: Hand<'_>,
) -> Result<usize> {
    let due = pgrx::datum::now();
    let mut handed = 0;
    plan::begin_result(call);
    // a run that made places or missed rows is run again: the places it
    // made are there for the next, the rows it missed are locked by it
    for _ in 0..TAKE_ATTEMPTS {
        let stmt = if max - handed == 1 {
            &TAKE_KEYED_ONE
        } else {
            &TAKE_KEYED
        };
        let (leased, placeless, missed) = plan::run_rows(
            stmt,
            &[
                queue.into(),
                lease.into(),
                ((max - handed) as i64).into(),
                due.into(),
            ],
            |r| {
                let leased = leased(&r);
                let placeless: Vec<Option<Text>> = (0..r.len())
                    .filter_map(|i| r.text_bytes(i, 4).map(|k| Some(Text::from_bytes(k))))
                    .collect();
                let missed = (0..r.len()).any(|i| r.get::<bool>(i, 5) == Some(true));
                Ok((leased, placeless, missed))
            },
        )?;
        hand.out(call, &leased, lease)?;
        handed += leased.len();
        if !placeless.is_empty() {
            run_one(&MAKE_PLACES, &[queue.into(), placeless.into()], |_| Ok(()))?;
        } else if !missed {
            break;
        }
        if handed >= max {
            break;
        }
    }
    Ok(handed)
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
