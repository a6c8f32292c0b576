//! Batch chunks: a backlog worked through one committed chunk per call.
//!
//! A chunk is one statement, built from the caller's fragments:
//!
//! ```sql
//! WITH picked AS MATERIALIZED (
//!     SELECT key FROM target WHERE (pending) AND key > $cursor ORDER BY key LIMIT $chunk),
//!   updated AS (
//!     UPDATE target AS sturdy_batch_row SET set_clause
//!      WHERE (pending) AND sturdy_batch_row.key = ANY (ARRAY(SELECT key FROM picked))
//!     RETURNING 1)
//! SELECT rows updated, rows picked, the last key picked
//! ```
//!
//! The pending predicate is in both places, as the seed learned in
//! production: under `READ COMMITTED` an `UPDATE` that meets a row another
//! transaction changed since the selection re-reads the row's latest version
//! and re-checks its own `WHERE` on it; without the predicate there, a row
//! cancelled mid-chunk would be updated anyway. With it, it is skipped.
//!
//! Linear cost: each chunk starts after the last key of the one before
//! (keyset on `key`), so it reads about `chunk` rows however far the backlog
//! has drained, where selecting "the first `chunk` pending rows" rescans
//! every row already done when nothing indexes the predicate (O(N^2/chunk)).
//! A pass ends when a chunk picks fewer than `chunk` rows. Rows can become
//! pending behind the cursor while a pass runs, so the end of a pass counts
//! the pending rows exactly: none, and the batch is complete; some, and
//! another pass starts from the first key. `remaining` is exact at the start
//! and the end of each pass and carried forward (minus each chunk's rows) in
//! between, so the count is two scans a pass, not one per chunk; `complete`
//! is reported only on an exact count of zero.
//!
//! With an `order_by` other than the key there is no keyset: every chunk
//! selects the first `chunk` pending rows in that order (the seed's shape),
//! which stays cheap only where an index serves the predicate.
//!
//! Progress lives in `sturdy.batches`. A plain `batch` call keeps its row
//! under a name derived from its arguments (so the caller's loop needs no
//! handle), deleted when the batch completes. Named jobs (`batch_start`) are
//! ticked by `batch_tick`, which sizes each chunk from the measured rate of
//! the last one to take `target_seconds`. Calls on one batch take its row's
//! lock: a second `batch` call waits for the first to commit; a second tick
//! returns at once, doing nothing, while another holds the job.
//!
//! The fragments are the caller's SQL: they run with the caller's rights and
//! `search_path`, the statement prepared once per backend and kept (the plan
//! cache re-plans it when the table changes). Values in `args` are bound as
//! `$1..$n`, typed from context, never written into the SQL.

use pg_sturdy_macros::sql_function;
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::{IntoDatum, pg_sys};

use crate::args;
use crate::datum::{SqlName, Text, TextArray};
use crate::error::{Error, Result};
use crate::fmgr::Args;
use crate::fragment::{self, Kind, Target};
use crate::plan::{self, Rows, Statement, first_value, run_one};

/// The alias the chunk's `UPDATE` gives the target; `pending` must not name
/// it (it is placed where the alias is not in scope too).
const ALIAS: &str = "sturdy_batch_row";
/// The largest chunk: the most a tick sizes one to, and the most a caller
/// may ask for (a chunk is one `UPDATE` in the caller's transaction).
const MAX_CHUNK: i64 = 1_000_000;

/// `chunk` checked: positive, and at most [`MAX_CHUNK`].
fn chunk_size(chunk: Option<i32>) -> Result<i32> {
    args::at_most(
        "chunk",
        args::positive("chunk", chunk)?,
        MAX_CHUNK as i32,
        "Pass a chunk of at most 1000000 rows (1000 is a good start); batch_tick sizes later ones itself.",
    )
}

/// One batch's definition, checked.
struct Spec {
    target: pg_sys::Oid,
    set_clause: String,
    pending: String,
    args: Vec<Option<String>>,
    key: String,
    order_by: Option<String>,
    resolved: Target,
}

fn fragment(arg: &'static str, v: Option<Text>) -> Result<String> {
    let v = args::required(arg, v)?;
    let s = String::from_utf8(v.bytes().to_vec()).map_err(|_| Error::Invalid {
        arg,
        why: "is not valid UTF-8".into(),
        hint: "Write fragments in the database's encoding as UTF-8 text.",
    })?;
    if s.trim().is_empty() {
        return Err(Error::Empty { arg });
    }
    Ok(s)
}

/// Check every argument of a batch before anything runs.
fn spec(
    target: Option<pg_sys::Oid>,
    set_clause: Option<Text>,
    pending: Option<Text>,
    args: Option<TextArray>,
    key: Option<SqlName>,
    order_by: Option<Text>,
) -> Result<Spec> {
    let target = args::required("target", target)?;
    if crate::scaleout::citus_table(target) {
        return Err(Error::Raised {
            code: *b"0A000",
            message: "batch cannot run on a table Citus manages".into(),
            detail: Some(
                "Its chunks go by the key across every shard, which Citus does not keep in one order."
                    .into(),
            ),
            hint: Some(
                "Update a distributed table with a plain UPDATE (Citus runs it on every shard), or batch a table of the coordinator."
                    .into(),
            ),
        });
    }
    let set_clause = fragment("set_clause", set_clause)?;
    let pending = fragment("pending", pending)?;
    let order_by = order_by
        .map(|o| fragment("order_by", Some(o)))
        .transpose()?;
    let SqlName(key) = args::required("key", key)?;
    if key.is_empty() {
        return Err(Error::Empty { arg: "key" });
    }
    let values: Vec<Option<String>> = match args {
        None => return Err(Error::Null { arg: "args" }),
        Some(a) => {
            if a.elements().is_none() {
                return Err(Error::Invalid {
                    arg: "args",
                    why: "has more than one dimension".into(),
                    hint: "Pass a one-dimensional text[] of the values for $1..$n.",
                });
            }
            a.strings()
        }
    };
    if pending.to_lowercase().contains(ALIAS) {
        return Err(Error::Invalid {
            arg: "pending",
            why: format!("must not mention {ALIAS}, the update's alias"),
            hint: "Write pending unqualified (status = $1): it is placed both in the UPDATE and in its sub-select, and the alias exists in only one of them.",
        });
    }
    fragment::check(Kind::SetList, "set_clause", &set_clause)?;
    fragment::check(Kind::Predicate, "pending", &pending)?;
    if let Some(o) = &order_by {
        fragment::check(Kind::OrderBy, "order_by", o)?;
    }
    for (arg, text) in [("set_clause", &set_clause), ("pending", &pending)]
        .into_iter()
        .chain(order_by.iter().map(|o| ("order_by", o)))
    {
        let n = fragment::highest_param(text);
        if n > values.len() {
            return Err(Error::Invalid {
                arg,
                why: format!("refers to ${n}, but args has {} value(s)", values.len()),
                hint: "Pass one args element for each $n the fragments use.",
            });
        }
    }
    let resolved = fragment::target(target, &key)?;
    Ok(Spec {
        target,
        set_clause,
        pending,
        args: values,
        key,
        order_by,
        resolved,
    })
}

impl Spec {
    /// A `sturdy.batches` row's definition, as [`ANON_STATE`] (the first
    /// eight) and [`REGISTER`] (all nine) take it: name, target, fragments,
    /// args, chunk, key, order_by, target_seconds.
    fn columns(
        &self,
        name: DatumWithOid<'static>,
        chunk: i32,
        target_seconds: Option<f64>,
    ) -> [DatumWithOid<'static>; 9] {
        [
            name,
            self.target.into(),
            self.set_clause.clone().into(),
            self.pending.clone().into(),
            self.args.clone().into(),
            chunk.into(),
            self.key.clone().into(),
            self.order_by
                .clone()
                .map_or_else(plan::null::<String>, Into::into),
            target_seconds.map_or_else(plan::null::<f64>, Into::into),
        ]
    }

    /// Keyset mode: the chunks advance on the key.
    fn keyset(&self) -> bool {
        self.order_by.is_none()
    }

    /// The chunk statement. Parameters: the caller's `$1..$n`, then the
    /// cursor (`$n+1`, text, NULL at the start of a pass) and the chunk size.
    fn chunk_sql(&self) -> String {
        let n = self.args.len();
        let (cursor, limit) = (n + 1, n + 2);
        let Target {
            table,
            key,
            key_type,
            gt,
            eq,
        } = &self.resolved;
        let (after, order) = match &self.order_by {
            None => (
                format!(
                    "AND (${cursor}::pg_catalog.text IS NULL OR {key} {gt} ${cursor}::pg_catalog.text::{key_type})"
                ),
                key.clone(),
            ),
            Some(o) => (
                format!("AND ${cursor}::pg_catalog.text IS NULL"),
                format!("\n{o}\n"),
            ),
        };
        format!(
            "WITH picked AS MATERIALIZED (
    SELECT {key} AS k FROM {table}
     WHERE (
{pending}
) {after}
     ORDER BY {order}
     LIMIT ${limit}::pg_catalog.int8),
  updated AS (
    UPDATE {table} AS {ALIAS} SET
{set_clause}
     WHERE (
{pending}
) AND {ALIAS}.{key} {eq} ANY (ARRAY(SELECT k FROM picked))
    RETURNING 1)
SELECT (SELECT pg_catalog.count(*) FROM updated), (SELECT pg_catalog.count(*) FROM picked),
       (SELECT k FROM picked ORDER BY k DESC LIMIT 1)::pg_catalog.text",
            pending = self.pending,
            set_clause = self.set_clause,
        )
    }

    /// The exact count of pending rows.
    fn count_sql(&self) -> String {
        format!(
            "SELECT pg_catalog.count(*) FROM {} WHERE (\n{}\n)",
            self.resolved.table, self.pending
        )
    }

    fn values(&self) -> Vec<Option<&str>> {
        self.args.iter().map(|a| a.as_deref()).collect()
    }

    fn count(&self) -> Result<i64> {
        let sql = self.count_sql();
        Spi::connect(|_| {
            let stmt = fragment::prepare(&sql)?;
            // The count has `pending` alone: the `$n`s only `set_clause` (or
            // `order_by`) uses are not its parameters.
            let values = self.values();
            stmt.execute(&values[..stmt.types.len().min(values.len())])?;
            Ok(plan::last_rows().get::<i64>(0, 1).unwrap_or(0))
        })
    }

    /// One chunk: (rows updated, rows picked, last key picked), and seconds.
    fn chunk(&self, cursor: Option<&str>, chunk: i64) -> Result<(i64, i64, Option<String>, f64)> {
        let sql = self.chunk_sql();
        let mut values = self.values();
        let chunk_text = chunk.to_string();
        values.push(cursor);
        values.push(Some(&chunk_text));
        Spi::connect(|_| {
            let stmt = fragment::prepare(&sql)?;
            let started = std::time::Instant::now();
            stmt.execute(&values)?;
            let seconds = started.elapsed().as_secs_f64();
            let rows: Rows = plan::last_rows();
            Ok((
                rows.get::<i64>(0, 1).unwrap_or(0),
                rows.get::<i64>(0, 2).unwrap_or(0),
                utf8_key(rows.get::<Text>(0, 3))?,
                seconds,
            ))
        })
    }

    /// The name a plain `batch` call keeps its progress under.
    fn anonymous_name(&self) -> String {
        let mut h = Fnv::default();
        h.add(&self.target.to_u32().to_le_bytes());
        for part in [&self.set_clause, &self.pending, &self.key] {
            h.add(part.as_bytes());
            h.add(&[0xff]);
        }
        if let Some(o) = &self.order_by {
            h.add(o.as_bytes());
        }
        h.add(&[0xfe]);
        for a in &self.args {
            match a {
                Some(v) => h.add(v.as_bytes()),
                None => h.add(&[0xfd]),
            }
            h.add(&[0xff]);
        }
        format!("batch:{}:{:016x}", self.resolved.table, h.0)
    }
}

/// FNV-1a, 64 bits: a stable name for a batch's arguments.
struct Fnv(u64);
impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}
impl Fnv {
    fn add(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// A key value of the batch's table as text (the last one a chunk picked),
/// for the next chunk's statement, whose values are UTF-8: in a database of
/// another encoding, a key whose text is not is refused with `22021`
/// rather than misread.
fn utf8_key(key: Option<Text>) -> Result<Option<String>> {
    key.map(|k| {
        String::from_utf8(k.bytes().to_vec()).map_err(|_| Error::Raised {
            code: *b"22021",
            message: format!(
                "a key of the batch's table is not valid UTF-8: {}",
                k.lossy()
            ),
            detail: None,
            hint: Some(
                "batch walks a text key only where its values are UTF-8: pass key => a column of another type, such as an integer id."
                    .into(),
            ),
        })
    })
    .transpose()
}

/// A batch's progress row, locked.
struct State {
    /// As stored: in a database whose encoding is not UTF-8, any bytes.
    name: Vec<u8>,
    chunk: i64,
    cursor: Option<String>,
    remaining: Option<i64>,
    finished: bool,
    target_seconds: Option<f64>,
}

fn read_state(rows: &Rows) -> Result<Option<State>> {
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(State {
        name: rows
            .get::<Text>(0, 1)
            .map(|t| t.bytes().to_vec())
            .unwrap_or_default(),
        chunk: rows.get::<i64>(0, 2).unwrap_or(1),
        cursor: utf8_key(rows.get::<Text>(0, 3))?,
        remaining: rows.get::<i64>(0, 4),
        finished: rows.get::<bool>(0, 5).unwrap_or(false),
        target_seconds: rows.get::<f64>(0, 6),
    }))
}

static ANON_STATE: Statement = Statement {
    sql: "WITH ins AS (
              INSERT INTO sturdy.batches (name, named, target, set_clause, pending, args, chunk, key, order_by)
              VALUES ($1, false, $2, $3, $4, $5, $6, $7, $8)
              ON CONFLICT (name) DO NOTHING)
          SELECT name, chunk::pg_catalog.int8, cursor, remaining, finished_at IS NOT NULL, target_seconds
            FROM sturdy.batches WHERE name OPERATOR(pg_catalog.=) $1 FOR UPDATE",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::REGCLASSOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::INT4OID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
    ],
    writes: true,
    generic: true,
};

/// The first statement misses the row a concurrent first call is inserting
/// (its `ON CONFLICT DO NOTHING` waited, then did nothing, and the `SELECT`
/// ran on the snapshot from before): read it again.
static ANON_STATE_AGAIN: Statement = Statement {
    sql: "SELECT name, chunk::pg_catalog.int8, cursor, remaining, finished_at IS NOT NULL, target_seconds
            FROM sturdy.batches WHERE name OPERATOR(pg_catalog.=) $1 FOR UPDATE",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: true,
};

static JOB_STATE: Statement = Statement {
    sql: "SELECT name, chunk::pg_catalog.int8, cursor, remaining, finished_at IS NOT NULL, target_seconds,
                 target, set_clause, pending, args, key::pg_catalog.text, order_by
            FROM sturdy.batches WHERE name OPERATOR(pg_catalog.=) $1 AND named
             FOR UPDATE SKIP LOCKED",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: true,
};

static JOB_EXISTS: Statement = Statement {
    sql: "SELECT finished_at IS NOT NULL, remaining FROM sturdy.batches
           WHERE name OPERATOR(pg_catalog.=) $1 AND named",
    args: &[pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

/// After a chunk: progress, and the next cursor and chunk size.
static ADVANCE: Statement = Statement {
    sql: "UPDATE sturdy.batches
             SET cursor = $2, remaining = $3, chunk = $4, pass = pass OPERATOR(pg_catalog.+) $5,
                 done = done OPERATOR(pg_catalog.+) $6, chunks = chunks OPERATOR(pg_catalog.+) 1,
                 seconds = seconds OPERATOR(pg_catalog.+) $7, last_seconds = $7,
                 updated_at = pg_catalog.now(),
                 finished_at = CASE WHEN $8 THEN pg_catalog.now() END
           WHERE name OPERATOR(pg_catalog.=) $1",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::INT8OID,
        pg_sys::INT4OID,
        pg_sys::INT4OID,
        pg_sys::INT8OID,
        pg_sys::FLOAT8OID,
        pg_sys::BOOLOID,
    ],
    writes: true,
    generic: true,
};

static FORGET: Statement = Statement {
    sql: "DELETE FROM sturdy.batches WHERE name OPERATOR(pg_catalog.=) $1 AND NOT named",
    args: &[pg_sys::TEXTOID],
    writes: true,
    generic: true,
};

static REGISTER: Statement = Statement {
    sql: "INSERT INTO sturdy.batches
                 (name, named, target, set_clause, pending, args, chunk, key, order_by, target_seconds)
          VALUES ($1, true, $2, $3, $4, $5, $6, $7, $8, $9)
          ON CONFLICT (name) DO NOTHING
          RETURNING true",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::REGCLASSOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTARRAYOID,
        pg_sys::INT4OID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::FLOAT8OID,
    ],
    writes: true,
    generic: false,
};

static STATEMENT_TIMEOUT: Statement = Statement {
    sql: "SELECT pg_catalog.current_setting('statement_timeout')",
    args: &[],
    writes: false,
    generic: false,
};

/// What one chunk did.
struct Outcome {
    done: i64,
    remaining: i64,
    seconds: f64,
    complete: bool,
}

/// Run one chunk of `spec` on the locked `state`, and record it. `size`
/// gives the next chunk size from this one's measured rate.
fn run_chunk(spec: &Spec, state: &State, size: impl Fn(i64, i64, f64) -> i64) -> Result<Outcome> {
    let keyset = spec.keyset();
    // the start of a pass: count exactly
    let mut remaining = match state.remaining {
        Some(r) => r,
        None => spec.count()?,
    };
    let (done, picked, last, seconds) = spec.chunk(
        if keyset {
            state.cursor.as_deref()
        } else {
            None
        },
        state.chunk,
    )?;
    remaining = (remaining - done).max(0);
    let mut cursor = if keyset {
        last.or(state.cursor.clone())
    } else {
        None
    };
    let (mut complete, mut new_pass) = (false, 0);
    if picked < state.chunk {
        // the end of a pass: count exactly; nothing left is complete, else
        // another pass from the first key
        remaining = spec.count()?;
        if remaining == 0 {
            complete = true;
        } else {
            new_pass = 1;
            cursor = None;
        }
    }
    let next = size(state.chunk, picked, seconds).clamp(1, i64::from(i32::MAX));
    run_one(
        &ADVANCE,
        &[
            Text::from_bytes(&state.name).into(),
            cursor
                .as_deref()
                .map_or_else(plan::null::<String>, Into::into),
            remaining.into(),
            (next as i32).into(),
            new_pass.into(),
            done.into(),
            seconds.into(),
            complete.into(),
        ],
        |_| Ok(()),
    )?;
    Ok(Outcome {
        done,
        remaining,
        seconds,
        complete,
    })
}

fn return_outcome(call: &Args, o: &Outcome) -> Result<()> {
    plan::return_row(
        call,
        &[
            o.done.into_datum(),
            o.remaining.into_datum(),
            o.seconds.into_datum(),
            o.complete.into_datum(),
        ],
    )
}

/// Returns its row through the call.
#[sql_function(
    "sturdy.batch(target regclass, set_clause text, pending text, args text[] DEFAULT '{}',
                  chunk integer DEFAULT 1000, key name DEFAULT 'id', order_by text DEFAULT NULL)
     RETURNS TABLE (done bigint, remaining bigint, seconds float8, complete boolean)
     VOLATILE PARALLEL UNSAFE ROWS 1",
    comment = "One chunk: UPDATE target SET set_clause on up to chunk rows where pending holds, pending re-checked on each row as updated; each call goes on after the last key of the one before. set_clause, pending and order_by are caller-written SQL (never build them from request data), run with your rights and search_path; $1..$n in them are bound from args. remaining is exact at the start and end of a pass, carried forward between; complete only on an exact zero."
)]
#[allow(clippy::too_many_arguments)]
fn batch(
    call: &Args,
    target: Option<pg_sys::Oid>,
    set_clause: Option<Text>,
    pending: Option<Text>,
    args: Option<TextArray>,
    chunk: Option<i32>,
    key: Option<SqlName>,
    order_by: Option<Text>,
) -> Result<()> {
    let spec = spec(target, set_clause, pending, args, key, order_by)?;
    let chunk = chunk_size(chunk)?;
    let name = spec.anonymous_name();
    let state_args = spec.columns(name.clone().into(), chunk, None);
    let state_args = &state_args[..8];
    // The progress row, locked. A call that waited for a concurrent call of
    // the same batch finds the row that call inserted (on a second look, with
    // a fresh snapshot), or none if that call completed the batch and deleted
    // it: then it starts afresh.
    let mut found = None;
    for _ in 0..3 {
        found = plan::run_generic(&ANON_STATE, state_args, |rows| read_state(&rows))?;
        if found.is_none() {
            found = plan::run_generic(&ANON_STATE_AGAIN, &[name.as_str().into()], |rows| {
                read_state(&rows)
            })?;
        }
        if found.is_some() {
            break;
        }
    }
    let state = found.ok_or(Error::Internal {
        context: "batch",
        cause: "its progress row kept vanishing".into(),
    })?;
    // a plain call's chunk size is the one it passes
    let state = State {
        chunk: i64::from(chunk),
        ..state
    };
    let outcome = run_chunk(&spec, &state, |_, _, _| i64::from(chunk))?;
    if outcome.complete {
        plan::run_generic(&FORGET, &[name.as_str().into()], |_| Ok(()))?;
    }
    return_outcome(call, &outcome)
}

#[sql_function(
    "sturdy.batch_start(name text, target regclass, set_clause text, pending text, args text[] DEFAULT '{}',
                        chunk integer DEFAULT 1000, key name DEFAULT 'id', order_by text DEFAULT NULL,
                        target_seconds float8 DEFAULT NULL)
     RETURNS void VOLATILE PARALLEL UNSAFE",
    comment = "Register a named batch job for sturdy.batch_tick (e.g. from pg_cron), checked as batch checks its arguments. chunk is the first chunk's size; each tick then sizes the next from the measured rate to take target_seconds (default: a fifth of statement_timeout, or 1 s without one)."
)]
#[allow(clippy::too_many_arguments)]
fn batch_start(
    name: Option<Text>,
    target: Option<pg_sys::Oid>,
    set_clause: Option<Text>,
    pending: Option<Text>,
    args: Option<TextArray>,
    chunk: Option<i32>,
    key: Option<SqlName>,
    order_by: Option<Text>,
    target_seconds: Option<f64>,
) -> Result<()> {
    let name = args::name("name", name)?;
    let spec = spec(target, set_clause, pending, args, key, order_by)?;
    let chunk = chunk_size(chunk)?;
    if let Some(t) = target_seconds
        && !(t > 0.0 && t.is_finite())
    {
        return Err(Error::NotPositive {
            arg: "target_seconds",
            got: t.to_string(),
            interval: false,
        });
    }
    // the statements must prepare (columns exist, types fit) before the job is kept
    Spi::connect(|_| {
        fragment::prepare(&spec.chunk_sql())?;
        fragment::prepare(&spec.count_sql()).map(|_| ())
    })?;
    let inserted = run_one(
        &REGISTER,
        &spec.columns(name.into(), chunk, target_seconds),
        first_value::<bool>,
    )?;
    if inserted.is_none() {
        return Err(Error::Raised {
            code: *b"42710",
            message: format!("batch job {:?} already exists", name.lossy()),
            detail: None,
            hint: Some("Choose another name, or DELETE it from sturdy.batches first.".into()),
        });
    }
    Ok(())
}

/// The tick's target duration: the job's, or a fifth of statement_timeout,
/// or one second.
fn target_seconds(job: Option<f64>) -> Result<f64> {
    if let Some(t) = job {
        return Ok(t);
    }
    let timeout = run_one(&STATEMENT_TIMEOUT, &[], first_value::<String>)?.unwrap_or_default();
    Ok(parse_ms(&timeout)
        .filter(|ms| *ms > 0.0)
        .map_or(1.0, |ms| ms / 1000.0 / 5.0))
}

/// `statement_timeout` as SHOW prints it (`0`, `500ms`, `3min`, `1h`).
fn parse_ms(s: &str) -> Option<f64> {
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    Some(match unit.trim() {
        "" | "ms" => n,
        "s" => n * 1e3,
        "min" => n * 60e3,
        "h" => n * 3600e3,
        "d" => n * 86400e3,
        "us" => n / 1e3,
        _ => return None,
    })
}

/// The next chunk: this one's rate times the target, at most double this
/// one (a fast empty chunk says little), at least one row.
fn next_chunk(target: f64, chunk: i64, picked: i64, seconds: f64) -> i64 {
    if picked == 0 || seconds <= 0.0 {
        return chunk;
    }
    let rate = picked as f64 / seconds;
    ((rate * target) as i64).clamp(1, (chunk * 2).min(MAX_CHUNK))
}

/// Returns its row through the call.
#[sql_function(
    "sturdy.batch_tick(name text)
     RETURNS TABLE (done bigint, remaining bigint, seconds float8, complete boolean)
     VOLATILE PARALLEL UNSAFE ROWS 1",
    comment = "Run one chunk of the named job and size the next from its measured rate. A finished job does nothing (complete); a job another tick is running returns at once with nothing done."
)]
fn batch_tick(call: &Args, name: Option<Text>) -> Result<()> {
    let name = args::name("name", name)?;
    let job = plan::run_generic(&JOB_STATE, &[name.into()], |rows| {
        let Some(state) = read_state(&rows)? else {
            return Ok(None);
        };
        Ok(Some((
            state,
            rows.get::<pg_sys::Oid>(0, 7),
            rows.get::<String>(0, 8),
            rows.get::<String>(0, 9),
            rows.get::<Vec<Option<String>>>(0, 10),
            rows.get::<String>(0, 11),
            rows.get::<String>(0, 12),
        )))
    })?;
    let Some((state, target, set_clause, pending, values, key, order_by)) = job else {
        // unknown, or another tick holds it
        return match run_one(&JOB_EXISTS, &[name.into()], |t| {
            if t.is_empty() {
                return Ok(None);
            }
            Ok(Some(t.first().get_two::<bool, i64>()?))
        })? {
            None => Err(Error::Raised {
                code: *b"42704",
                message: format!("batch job {:?} does not exist", name.lossy()),
                detail: None,
                hint: Some("Register it with sturdy.batch_start.".into()),
            }),
            Some((finished, remaining)) => return_outcome(
                call,
                &Outcome {
                    done: 0,
                    remaining: remaining.unwrap_or(0),
                    seconds: 0.0,
                    complete: finished.unwrap_or(false),
                },
            ),
        };
    };
    if state.finished {
        return return_outcome(
            call,
            &Outcome {
                done: 0,
                remaining: 0,
                seconds: 0.0,
                complete: true,
            },
        );
    }
    let text = |v: Option<String>| v.map(|s| Text::new(&s));
    let array = values.map(|v| TextArray::from_strings(&v));
    let spec = spec(
        target,
        text(set_clause),
        text(pending),
        array,
        key.map(SqlName),
        order_by.map(|s| Text::new(&s)),
    )?;
    let target = target_seconds(state.target_seconds)?;
    let outcome = run_chunk(&spec, &state, |chunk, picked, seconds| {
        next_chunk(target, chunk, picked, seconds)
    })?;
    return_outcome(call, &outcome)
}

#[cfg(test)]
mod unit {
    use super::{next_chunk, parse_ms};

    #[test]
    fn statement_timeout_as_shown_is_read_in_ms() {
        assert_eq!(parse_ms("0"), Some(0.0));
        assert_eq!(parse_ms("500ms"), Some(500.0));
        assert_eq!(parse_ms("3min"), Some(180_000.0));
        assert_eq!(parse_ms("1h"), Some(3_600_000.0));
        assert_eq!(parse_ms("weird"), None);
    }

    #[test]
    fn the_next_chunk_follows_the_rate_but_at_most_doubles() {
        assert_eq!(next_chunk(1.0, 1000, 1000, 0.1), 2000);
        assert_eq!(next_chunk(1.0, 1000, 1000, 4.0), 250);
        assert_eq!(next_chunk(1.0, 1000, 0, 0.0), 1000);
        assert_eq!(next_chunk(0.001, 1000, 1000, 10.0), 1);
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::testing::{count, error_of, sqlstate_of};
    use pgrx::prelude::*;

    fn text(sql: &str) -> Option<String> {
        Spi::get_one::<String>(sql).unwrap()
    }

    fn table(rows: i32) {
        Spi::run(&format!(
            "CREATE TABLE public.receipts (id int PRIMARY KEY, status text NOT NULL, period int NOT NULL);
             INSERT INTO public.receipts SELECT i, 'planned', i % 7 FROM generate_series(1, {rows}) i;"
        ))
        .unwrap();
    }

    fn chunk(sql_args: &str) -> String {
        text(&format!(
            "SELECT format('%s %s %s', done, remaining, complete) FROM sturdy.batch('public.receipts', {sql_args})"
        ))
        .unwrap()
    }

    #[pg_test]
    fn chunks_advance_on_the_key_and_complete_on_an_exact_zero() {
        table(2500);
        let args = "'status = $1', 'status = $2', ARRAY['pending', 'planned'], 1000";
        assert_eq!(chunk(args), "1000 1500 f");
        assert_eq!(
            count("sturdy.batches"),
            1,
            "a plain batch keeps its progress"
        );
        assert_eq!(
            text("SELECT cursor FROM sturdy.batches").as_deref(),
            Some("1000")
        );
        assert_eq!(chunk(args), "1000 500 f");
        assert_eq!(chunk(args), "500 0 t");
        assert_eq!(count("sturdy.batches"), 0, "and forgets it when complete");
        assert_eq!(count("public.receipts WHERE status = 'pending'"), 2500);
        // a batch that finds nothing is complete at once
        assert_eq!(chunk(args), "0 0 t");
    }

    #[pg_test]
    fn args_are_bound_and_typed_from_context() {
        table(100);
        // period is an integer column compared with $3: typed integer, not text
        assert_eq!(
            chunk(
                "'status = $1', 'status = $2 AND period = $3', ARRAY['pending', 'planned', '3'], 1000"
            ),
            "14 0 t"
        );
        assert_eq!(count("public.receipts WHERE status = 'pending'"), 14);
        assert_eq!(
            count("public.receipts WHERE status = 'pending' AND period <> 3"),
            0
        );
        // a value the type refuses raises the type's own error
        assert_eq!(
            sqlstate_of(
                "SELECT * FROM sturdy.batch('public.receipts', 'status = $1', 'period = $2', ARRAY['x', 'nope'])"
            ),
            "22P02"
        );
        // a value is never SQL: this is the literal string, matching nothing
        assert_eq!(
            chunk("'status = $1', 'status = $2', ARRAY['x', 'planned'' OR true --'], 1000"),
            "0 0 t"
        );
        // a $n only the set clause uses: the count of pending rows, which
        // has the predicate alone, is not handed it
        assert_eq!(
            chunk("'period = $1', 'status = ''planned'' AND period = 2', ARRAY['40'], 5"),
            "5 10 f"
        );
        assert_eq!(count("public.receipts WHERE period = 40"), 5);
        // and a value no fragment uses is bound to nothing
        assert_eq!(
            chunk("'status = ''done''', 'status = ''planned'' AND period = 4', ARRAY['x'], 1000"),
            "14 0 t"
        );
        assert_eq!(count("public.receipts WHERE status = 'done'"), 14);
    }

    #[pg_test]
    fn rows_made_pending_behind_the_cursor_are_not_missed() {
        table(3000);
        let args = "'status = $1', 'status = $2', ARRAY['pending', 'planned'], 1000";
        assert_eq!(chunk(args), "1000 2000 f");
        assert_eq!(chunk(args), "1000 1000 f");
        // someone makes row 10 (behind the cursor) pending again
        Spi::run("UPDATE public.receipts SET status = 'planned' WHERE id = 10").unwrap();
        assert_eq!(
            chunk(args),
            "1000 0 f",
            "carried forward: an estimate, not complete"
        );
        assert_eq!(
            chunk(args),
            "0 1 f",
            "the end of the pass counts, and finds it"
        );
        assert_eq!(
            text("SELECT format('%s %s', pass, cursor IS NULL) FROM sturdy.batches").as_deref(),
            Some("2 t")
        );
        assert_eq!(chunk(args), "1 0 t");
        assert_eq!(count("public.receipts WHERE status = 'planned'"), 0);
    }

    #[pg_test]
    fn an_order_other_than_the_key_works_without_a_keyset() {
        table(30);
        let args = "'status = $1', 'status = $2', ARRAY['pending', 'planned'], 10, 'id', 'period DESC, id'";
        assert_eq!(chunk(args), "10 20 f");
        // periods 6 and 5 (4 rows each), then 2 of period 4
        assert_eq!(
            count("public.receipts WHERE status = 'planned' AND period >= 5"),
            0
        );
        assert_eq!(
            count("public.receipts WHERE status = 'pending' AND period = 4"),
            2
        );
        assert_eq!(chunk(args), "10 10 f");
        assert_eq!(chunk(args), "10 0 f");
        assert_eq!(chunk(args), "0 0 t");
    }

    #[pg_test]
    fn named_jobs_tick_to_completion_and_then_do_nothing() {
        table(2000);
        Spi::run(
            "SELECT sturdy.batch_start('move', 'public.receipts', 'status = $1', 'status = $2',
                                       ARRAY['pending', 'planned'], chunk => 500, target_seconds => 60)",
        )
        .unwrap();
        assert_eq!(
            sqlstate_of(
                "SELECT sturdy.batch_start('move', 'public.receipts', 'status = 1', 'true')"
            ),
            "42710"
        );
        let tick = || {
            text("SELECT format('%s %s %s', done, remaining, complete) FROM sturdy.batch_tick('move')")
                .unwrap()
        };
        assert_eq!(tick(), "500 1500 f");
        // the next chunk is sized from the rate, at most double
        assert_eq!(
            text("SELECT chunk::text FROM sturdy.batches WHERE name = 'move'").as_deref(),
            Some("1000")
        );
        assert_eq!(tick(), "1000 500 f");
        assert_eq!(tick(), "500 0 t");
        assert_eq!(tick(), "0 0 t", "a finished job does nothing");
        assert_eq!(
            text("SELECT format('%s %s %s %s', done, remaining, chunks, complete) FROM sturdy.batch_jobs WHERE name = 'move'")
                .as_deref(),
            Some("2000 0 3 t")
        );
        assert_eq!(
            sqlstate_of("SELECT * FROM sturdy.batch_tick('nope')"),
            "42704"
        );
    }

    #[pg_test]
    fn batch_bad_input_gets_a_clear_error_and_writes_nothing() {
        table(10);
        let t = "'public.receipts'";
        for (sql, state) in [
            (
                format!("SELECT * FROM sturdy.batch({t}, 'status = 1', 'true', chunk => 0)"),
                "22023",
            ),
            (
                format!("SELECT * FROM sturdy.batch({t}, 'status = 1', 'true', chunk => NULL)"),
                "22004",
            ),
            (
                "SELECT * FROM sturdy.batch(NULL, 'status = 1', 'true')".into(),
                "22004",
            ),
            (
                "SELECT * FROM sturdy.batch(999999::oid::regclass, 'status = 1', 'true')".into(),
                "42P01",
            ),
            (
                format!("SELECT * FROM sturdy.batch({t}, '', 'true')"),
                "22023",
            ),
            (
                format!("SELECT * FROM sturdy.batch({t}, 'status = 1', '  ')"),
                "22023",
            ),
            (
                format!("SELECT * FROM sturdy.batch({t}, NULL, 'true')"),
                "22004",
            ),
            (
                format!("SELECT * FROM sturdy.batch({t}, 'status = 1', NULL)"),
                "22004",
            ),
            (
                format!("SELECT * FROM sturdy.batch({t}, 'status = 1', 'true', NULL)"),
                "22004",
            ),
            (
                format!("SELECT * FROM sturdy.batch({t}, 'status = 1', 'true', key => 'nope')"),
                "42703",
            ),
            (
                format!("SELECT * FROM sturdy.batch({t}, 'status = 1', 'true', key => '')"),
                "22023",
            ),
            // hostile fragments: a second statement, a clause of their own
            (
                format!(
                    "SELECT * FROM sturdy.batch({t}, 'status = ''x''; DELETE FROM public.receipts', 'true')"
                ),
                "22023",
            ),
            (
                format!(
                    "SELECT * FROM sturdy.batch({t}, 'status = ''x''', 'true', order_by => 'id; DROP TABLE public.receipts')"
                ),
                "22023",
            ),
            (
                format!(
                    "SELECT * FROM sturdy.batch({t}, 'status = ''x''', 'true) UNION SELECT (true')"
                ),
                "22023",
            ),
            (
                format!(
                    "SELECT * FROM sturdy.batch({t}, 'status = ''x''', 'true; DELETE FROM public.receipts')"
                ),
                "22023",
            ),
            // closes our parenthesis: inside it, OR would take the chunk's
            // own conditions out of their AND
            (
                format!(
                    "SELECT * FROM sturdy.batch({t}, 'status = ''x''', 'status = ''planned'') OR (true')"
                ),
                "22023",
            ),
            (
                format!("SELECT * FROM sturdy.batch({t}, 'status = ''x''', 'true /*')"),
                "42601",
            ),
            (
                format!("SELECT * FROM sturdy.batch({t}, 'status = ''x''', 'status = = 1')"),
                "42601",
            ),
            (
                format!("SELECT * FROM sturdy.batch({t}, 'status = ''x'' WHERE false', 'true')"),
                "22023",
            ),
            (
                format!(
                    "SELECT * FROM sturdy.batch({t}, 'status = ''x''', 'true', order_by => 'id LIMIT 1')"
                ),
                "22023",
            ),
            // the update's alias, and a $n args does not have
            (
                format!(
                    "SELECT * FROM sturdy.batch({t}, 'status = ''x''', 'sturdy_batch_row.status = ''planned''')"
                ),
                "22023",
            ),
            (
                format!(
                    "SELECT * FROM sturdy.batch({t}, 'status = $1', 'status = $2', ARRAY['x'])"
                ),
                "22023",
            ),
            // a fragment PostgreSQL itself refuses
            (
                format!("SELECT * FROM sturdy.batch({t}, 'nope = 1', 'true')"),
                "42703",
            ),
            (
                format!("SELECT * FROM sturdy.batch({t}, 'status = 1', 'true', ARRAY[ARRAY['a']])"),
                "22023",
            ),
        ] {
            assert_eq!(sqlstate_of(&sql), state, "{sql}");
        }
        assert!(
            error_of(&format!("SELECT * FROM sturdy.batch({t}, 'status = ''x''; DELETE FROM public.receipts', 'true')"))
                .contains("set_clause must be a list of column assignments")
        );
        assert_eq!(count("public.receipts WHERE status = 'planned'"), 10);
        assert_eq!(count("sturdy.batches"), 0);
        assert_eq!(
            sqlstate_of("SELECT sturdy.batch_start('', 'public.receipts', 'status = 1', 'true')"),
            "22023"
        );
        assert_eq!(sqlstate_of("SELECT * FROM sturdy.batch_tick('')"), "22023");
        assert_eq!(
            sqlstate_of("SELECT * FROM sturdy.batch_tick(NULL)"),
            "22004"
        );
        // batch_all refuses what batch refuses, before its first chunk
        assert_eq!(
            sqlstate_of(
                "CALL sturdy.batch_all('public.receipts', 'status = 1', 'true', chunk => 0)"
            ),
            "22023"
        );
        assert_eq!(
            sqlstate_of(
                "CALL sturdy.batch_all('public.receipts', 'status = 1; DROP TABLE x', 'true')"
            ),
            "22023"
        );
        assert_eq!(count("public.receipts WHERE status = 'planned'"), 10);
        assert_eq!(count("sturdy.batches"), 0);
        assert_eq!(
            sqlstate_of(
                "SELECT sturdy.batch_start('j', 'public.receipts', 'status = 1', 'true', target_seconds => 0)"
            ),
            "22023"
        );
    }
}
