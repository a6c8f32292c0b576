//! Which schema the queue's statements run against, and the statements for
//! 0.1.0's: a new library serves an old schema until `ALTER EXTENSION
//! pg_sturdy UPDATE`. 0.2.0 added `sturdy.queue.seq` with its sequence and
//! `leased_until` in one update; where the sequence is missing so are both
//! columns, and the queue runs the statements 0.1.0 ran: `visible_at` is the
//! lease and the receipt, a floor is a time (`$5` unused), due means due by
//! `now()` (`$6` unused), and a schedule has no lease to clear.

use pgrx::pg_sys;

use crate::plan::Statement;
use crate::sequence::Sequence;

/// Also the default of `sturdy.queue.seq`.
pub static SEQUENCE: Sequence = Sequence::new(c"sturdy", c"queue_seq");

pub fn current() -> bool {
    SEQUENCE.exists()
}

/// `now` in the current schema, else `released`.
pub fn pick(now: &'static Statement, released: &'static Statement) -> &'static Statement {
    if current() { now } else { released }
}

pub static SCHEDULE_RELEASED: Statement = Statement {
    sql: "INSERT INTO sturdy.queue AS q (queue, workflow, visible_at, taken_at, scheduled_at)
          VALUES ($3, $1, $2, NULL, pg_catalog.now())
          ON CONFLICT (queue, workflow) DO UPDATE
             SET visible_at = EXCLUDED.visible_at, taken_at = NULL, scheduled_at = EXCLUDED.scheduled_at",
    args: &[pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

pub static TAKE_ONE_RELEASED: Statement = Statement {
    sql: "WITH due AS MATERIALIZED (
              SELECT ctid, workflow, visible_at, 0::bigint AS seq FROM sturdy.queue
               WHERE queue OPERATOR(pg_catalog.=) $1
                 AND visible_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                 AND visible_at OPERATOR(pg_catalog.>=) $4
               ORDER BY visible_at
               LIMIT 1
               FOR UPDATE SKIP LOCKED),
          taken AS (
              UPDATE sturdy.queue AS q
                 SET visible_at = pg_catalog.now() OPERATOR(pg_catalog.+) $2, taken_at = pg_catalog.now(),
                     takes = q.takes OPERATOR(pg_catalog.+) 1
               WHERE q.queue OPERATOR(pg_catalog.=) $1 COLLATE \"default\" AND q.ctid OPERATOR(pg_catalog.=) (SELECT ctid FROM due)
              RETURNING q.workflow, q.visible_at AS receipt, q.ctid AS tid)
          SELECT t.workflow, t.receipt, NULL::bigint, 1, NULL::pg_catalog.jsonb, d.visible_at, d.seq
            FROM due d LEFT JOIN taken t ON true",
    args: super::TAKE_ARGS,
    writes: true,
    generic: false,
};

pub static TAKE_MANY_RELEASED: Statement = Statement {
    sql: "WITH due AS MATERIALIZED (
              SELECT ctid, workflow, visible_at, 0::bigint AS seq FROM sturdy.queue
               WHERE queue OPERATOR(pg_catalog.=) $1
                 AND visible_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                 AND visible_at OPERATOR(pg_catalog.>=) $4
               ORDER BY visible_at
               LIMIT $3
               FOR UPDATE SKIP LOCKED),
          taken AS (
              UPDATE sturdy.queue AS q
                 SET visible_at = pg_catalog.now() OPERATOR(pg_catalog.+) $2, taken_at = pg_catalog.now(),
                     takes = q.takes OPERATOR(pg_catalog.+) 1
               WHERE q.queue OPERATOR(pg_catalog.=) $1 COLLATE \"default\" AND q.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM due))
              RETURNING q.workflow, q.visible_at AS receipt, q.ctid AS tid)
          SELECT t.workflow, t.receipt, NULL::bigint, 1, NULL::pg_catalog.jsonb, d.visible_at, d.seq, t.tid
            FROM due d LEFT JOIN taken t ON t.workflow OPERATOR(pg_catalog.=) d.workflow
           ORDER BY d.visible_at, d.seq",
    args: super::TAKE_ARGS,
    writes: true,
    generic: true,
};

pub static DONE_MANY_RELEASED: Statement = Statement {
    sql: concat!(
        "DELETE FROM sturdy.queue q
           USING ",
        super::sql::pairs_by_key!(),
        "
             AND q.visible_at OPERATOR(pg_catalog.=) d.receipt"
    ),
    args: &[
        pg_sys::TEXTARRAYOID,
        pg_sys::TIMESTAMPTZARRAYOID,
        pg_sys::TEXTOID,
    ],
    writes: true,
    generic: false,
};

pub static DONE_LEASED_RELEASED: Statement = Statement {
    sql: "DELETE FROM sturdy.queue q
           USING ROWS FROM (pg_catalog.unnest($4), pg_catalog.unnest($1)) AS d(tid, workflow)
           WHERE q.ctid OPERATOR(pg_catalog.=) d.tid AND (q.workflow OPERATOR(pg_catalog.=) d.workflow) IS TRUE
             AND q.queue OPERATOR(pg_catalog.=) $3 COLLATE \"default\" AND q.visible_at OPERATOR(pg_catalog.=) $2",
    args: &[pg_sys::TEXTARRAYOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID, pg_sys::TIDARRAYOID],
    writes: true,
    generic: true,
};

pub static DONE_RELEASED: Statement = Statement {
    sql: "DELETE FROM sturdy.queue
           WHERE queue OPERATOR(pg_catalog.=) $3 AND workflow OPERATOR(pg_catalog.=) $1
             AND visible_at OPERATOR(pg_catalog.=) $2",
    args: &[pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

pub static WAKE_AT_RELEASED: Statement = Statement {
    sql: "WITH moved AS (
              UPDATE sturdy.queue SET visible_at = $3, taken_at = NULL
               WHERE queue OPERATOR(pg_catalog.=) $4 AND workflow OPERATOR(pg_catalog.=) $1
                 AND visible_at OPERATOR(pg_catalog.=) $2
              RETURNING visible_at OPERATOR(pg_catalog.<=) pg_catalog.now() AS ready)
          SELECT ready AND EXISTS (SELECT FROM sturdy.queue_waiters w WHERE w.queue OPERATOR(pg_catalog.=) $4),
                 CASE WHEN $3 OPERATOR(pg_catalog.<) pg_catalog.now()
                      THEN pg_catalog.nextval(pg_catalog.to_regclass('sturdy.queue_generation')) END
            FROM moved",
    args: &[pg_sys::TEXTOID, pg_sys::TIMESTAMPTZOID, pg_sys::TIMESTAMPTZOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};
