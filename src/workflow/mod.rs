//! Workflow instances: a process started for a business key, moved through
//! its statuses by compare-and-set, found when it stops moving, and swept
//! away some time after it finished.
//!
//! `start` (composed in `compose`) writes a `pending` instance here and
//! schedules its workflow on the queue in the caller's transaction, so the
//! instance exists exactly when the change that started it does, and a
//! worker will take it. Its workflow name is `process/id`: the name its
//! claims, checkpoints and queue row use.
//!
//! Idempotency: a start with a key first reserves `(process, key)` with an
//! insert on the key's primary key. Two starts racing on one key meet on that
//! index: the second waits for the first to commit, then finds the key taken
//! and returns the first one's instance instead of creating another (no
//! error); if the first rolls back, the second's insert goes through and it
//! creates the instance. A key lives `sturdy.idempotency_ttl` from when it was
//! written (the setting as it was then); after that a start reuses it for a
//! new instance.
//!
//! Statuses: `pending`, `running`, and the terminal `succeeded`, `failed` and
//! `cancelled`, which are never left. Every move is a compare-and-set on the
//! current status (and, when given, the revision, which every move bumps), so
//! of two racing moves one wins and the other is told so. `transition` and
//! `finish` with a token (in `compose`) are fenced exactly like `record`: the
//! claim row is read `FOR UPDATE` and only the current token passes.
//!
//! `sweep` deletes in bounded batches (a `pg_cron` job calls it again and
//! again): finished instances older than the cutoff with their checkpoints,
//! claims and queue rows, outbox messages whose deliveries are all done, and
//! expired idempotency keys. It skips what a live pass may hold: an instance
//! whose claim is held or whose queue row is leased, and rows other
//! transactions have locked.

use pg_sturdy_macros::sql_function;
use pgrx::IntoDatum;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;

use crate::args::{self, Name};
use crate::datum::{Jsonb, Text};
use crate::error::{Error, MAX_NAME_BYTES, Result};
use crate::fmgr::Args;
use crate::placement::Placed;
use crate::plan::{self, Statement, first_value, null, run_one};

mod watch;

/// The `RETURNING` expression of every statement that may move an instance
/// to a terminal status: where someone watches it (`watch`), `NOTIFY
/// sturdy_instance, '<id>'`, delivered at commit. An instance nobody
/// watches pays for one column read, and no commit sends a notification
/// nobody waits for (a notifying commit is serialised with every other).
macro_rules! notify_watchers {
    () => {
        "CASE WHEN watched AND finished_at IS NOT NULL
              THEN pg_catalog.pg_notify('sturdy_instance', id::pg_catalog.text) END"
    };
}
pub(crate) use notify_watchers;

/// How long an idempotency key keeps returning its first instance, in
/// milliseconds (a duration with units when set: `'300ms'`, `'24h'`).
pub static IDEMPOTENCY_TTL: GucSetting<i32> = GucSetting::<i32>::new(24 * 60 * 60 * 1000);

/// Called from `_PG_init`.
pub fn define_settings() {
    GucRegistry::define_int_guc(
        c"sturdy.idempotency_ttl",
        c"How long a start's idempotency key returns the instance it first created.",
        c"A duration (e.g. '24h', '300ms'), fixed on the key when it is written; at most about 24 days.",
        &IDEMPOTENCY_TTL,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
}

const STATUSES: [&str; 5] = ["pending", "running", "succeeded", "failed", "cancelled"];
pub(crate) const TERMINAL: [&str; 3] = ["succeeded", "failed", "cancelled"];

/// A status argument: one of [`STATUSES`].
pub(crate) fn parse_status(arg: &'static str, v: Option<Text>) -> Result<&'static str> {
    let v = args::required(arg, v)?;
    STATUSES
        .iter()
        .find(|s| s.as_bytes() == v.bytes())
        .copied()
        .ok_or_else(|| Error::Invalid {
            arg,
            why: format!(
                "must be one of pending, running, succeeded, failed, cancelled, got {:?}",
                v.lossy()
            ),
            hint: "Pass one of the five statuses, in lower case.",
        })
}

/// An instance's workflow name is `process/id`, and a workflow name is a
/// name: at most MAX_NAME_BYTES. Room for the `/` and any bigint.
const MAX_PROCESS_BYTES: usize = MAX_NAME_BYTES - 21;

static START: Statement = Statement {
    sql: "INSERT INTO sturdy.instances
                 (id, process, business_key, workflow, queue, variables, created_at, updated_at)
          SELECT n.id, $1, $2, $1 OPERATOR(pg_catalog.||) '/' OPERATOR(pg_catalog.||) n.id::pg_catalog.text,
                 COALESCE($4, $1), $3, pg_catalog.now(), pg_catalog.now()
            FROM (SELECT COALESCE($5, pg_catalog.nextval('sturdy.instances_id_seq'::pg_catalog.regclass)) AS id) n
          RETURNING id, workflow, queue",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::JSONBOID,
        pg_sys::TEXTOID,
        pg_sys::INT8OID,
    ],
    writes: true,
    generic: false,
};

/// Reserve `(process, key)` for a new instance id; an expired key is taken
/// over. No row back: the key is live and belongs to another instance (the
/// conflicting row is now locked, and [`KEY_OWNER`] reads it).
static RESERVE_KEY: Statement = Statement {
    sql: "INSERT INTO sturdy.idempotency_keys AS k (process, key, instance, created_at, expires_at)
          SELECT $1, $2, n.id, pg_catalog.now(),
                 pg_catalog.now() OPERATOR(pg_catalog.+) pg_catalog.make_interval(0, 0, 0, 0, 0, 0, $3)
            FROM (SELECT pg_catalog.nextval('sturdy.instances_id_seq'::pg_catalog.regclass) AS id) n
          ON CONFLICT (process, key) DO UPDATE
             SET instance = EXCLUDED.instance, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
           WHERE k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
          RETURNING k.instance",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::FLOAT8OID],
    writes: true,
    generic: false,
};

static KEY_OWNER: Statement = Statement {
    sql: "SELECT instance FROM sturdy.idempotency_keys
           WHERE process OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
    // a fresh snapshot: the key a concurrent start just committed
    writes: true,
    generic: false,
};

/// The newest instance of a business key; its step is its newest checkpoint,
/// and its last progress the later of its last status change and that.
///
/// Each table is read in a step of its own (the checkpoints by the workflow
/// the instance step found): under Citus, where the checkpoints are
/// distributed and the instances are not, no statement may join the two.
static STATUS: Statement = Statement {
    sql: "WITH i AS MATERIALIZED (
              SELECT id, process, workflow, status, revision, last_error, updated_at FROM sturdy.instances
               WHERE business_key OPERATOR(pg_catalog.=) $1
               ORDER BY id DESC LIMIT 1),
          cp AS MATERIALIZED (
              SELECT c.step, c.recorded_at FROM sturdy.checkpoints c
               WHERE c.workflow OPERATOR(pg_catalog.=) (SELECT workflow FROM i)
               ORDER BY c.recorded_at DESC, c.step DESC LIMIT 1)
          SELECT i.id, i.process, i.workflow, i.status, i.revision, cp.step, i.last_error,
                 GREATEST(i.updated_at, cp.recorded_at)
            FROM i LEFT JOIN cp ON true",
    args: &[pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

/// [`STATUS`] under Citus, in two statements: the instance on the
/// coordinator, then its newest checkpoint by its workflow, which Citus
/// routes to the one shard that holds it ([`STATUS`]'s workflow comes from
/// a subquery, so Citus would ask every shard).
static STATUS_INSTANCE: Statement = Statement {
    sql: "SELECT id, process, workflow, status, revision, last_error, updated_at FROM sturdy.instances
           WHERE business_key OPERATOR(pg_catalog.=) $1
           ORDER BY id DESC LIMIT 1",
    args: &[pg_sys::TEXTOID],
    writes: false,
    generic: false,
};

static STATUS_STEP: Placed = Placed {
    by_workflow: Statement {
        sql: "SELECT c.step, c.recorded_at FROM sturdy.checkpoints c
               WHERE c.workflow OPERATOR(pg_catalog.=) $1
               ORDER BY c.recorded_at DESC, c.step DESC LIMIT 1",
        args: &[pg_sys::TEXTOID],
        writes: false,
        generic: false,
    },
    with_queues: Statement {
        sql: "SELECT c.step, c.recorded_at FROM sturdy.checkpoints c
               WHERE c.place OPERATOR(pg_catalog.=) sturdy.workflow_place($1)
                 AND c.workflow OPERATOR(pg_catalog.=) $1
               ORDER BY c.recorded_at DESC, c.step DESC LIMIT 1",
        args: &[pg_sys::TEXTOID],
        writes: false,
        generic: false,
    },
};

fn status_in_steps(call: &Args, business_key: Name) -> Result<()> {
    let found = plan::run_rows(&STATUS_INSTANCE, &[business_key.into()], |r| {
        Ok((|| {
            Some((
                r.get::<i64>(0, 1)?,
                r.get::<String>(0, 2)?,
                r.get::<String>(0, 3)?,
                r.get::<String>(0, 4)?,
                r.get::<i64>(0, 5)?,
                r.get::<String>(0, 6),
                r.get::<TimestampWithTimeZone>(0, 7)?,
            ))
        })())
    })?;
    let Some((id, process, workflow, status, revision, last_error, updated_at)) = found else {
        plan::begin_result(call);
        return Ok(());
    };
    let (step, recorded_at) =
        plan::run_rows(STATUS_STEP.get(), &[workflow.as_str().into()], |r| {
            Ok((r.get::<String>(0, 1), r.get::<TimestampWithTimeZone>(0, 2)))
        })?;
    let progress = recorded_at
        .filter(|&at| at > updated_at)
        .unwrap_or(updated_at);
    plan::return_row(
        call,
        &[
            id.into_datum(),
            process.into_datum(),
            workflow.into_datum(),
            status.into_datum(),
            revision.into_datum(),
            step.into_datum(),
            last_error.into_datum(),
            progress.into_datum(),
        ],
    )
}

/// `stuck`'s walk: up to `$4` live instances whose last status change is
/// older than the cutoff, from just past (`$2`, `$3`) in (updated_at, id)
/// order (`instances_live`), each with its last checkpoint's time. The
/// checkpoints are read for the walked instances by name: under Citus they
/// are distributed and the instances are not, and no statement may join
/// the two.
static STUCK_WALK: Statement = Statement {
    sql: "WITH i AS MATERIALIZED (
              SELECT id, process, business_key, workflow, status, updated_at FROM sturdy.instances
               WHERE status OPERATOR(pg_catalog.=) ANY ('{pending,running}'::pg_catalog.text[])
                 AND updated_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) $1)
                 AND ($2 IS NULL OR (updated_at, id) OPERATOR(pg_catalog.>) ($2, $3))
               ORDER BY updated_at, id
               LIMIT $4),
          p AS MATERIALIZED (
              SELECT c.workflow, pg_catalog.max(c.recorded_at) AS at FROM sturdy.checkpoints c
               WHERE c.workflow OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT workflow FROM i))
               GROUP BY c.workflow)
          SELECT i.id, i.process, i.business_key, i.workflow, i.status,
                 GREATEST(i.updated_at, p.at) AS stalled_since, i.updated_at,
                 p.at IS NULL OR p.at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) $1) AS stalled
            FROM i LEFT JOIN p ON p.workflow OPERATOR(pg_catalog.=) i.workflow
           ORDER BY i.updated_at, i.id",
    args: &[
        pg_sys::INTERVALOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::INT8OID,
        pg_sys::INT4OID,
    ],
    writes: false,
    generic: false,
};

static INSTANCE_WORKFLOW: Statement = Statement {
    sql: "SELECT workflow FROM sturdy.instances WHERE id OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::INT8OID],
    writes: false,
    generic: false,
};

/// The compare-and-set: from `$2`, never from a terminal status, at revision
/// `$4` when given.
static TRANSITION: Statement = Statement {
    sql: concat!("UPDATE sturdy.instances
             SET status = $3, revision = revision OPERATOR(pg_catalog.+) 1, updated_at = pg_catalog.now(),
                 finished_at = CASE WHEN $3 OPERATOR(pg_catalog.=) ANY ('{succeeded,failed,cancelled}'::pg_catalog.text[])
                                    THEN pg_catalog.now() END,
                 last_error = COALESCE($5, last_error)
           WHERE id OPERATOR(pg_catalog.=) $1 AND status OPERATOR(pg_catalog.=) $2
             AND NOT (status OPERATOR(pg_catalog.=) ANY ('{succeeded,failed,cancelled}'::pg_catalog.text[]))
             AND ($4 IS NULL OR revision OPERATOR(pg_catalog.=) $4)
          RETURNING true, ", notify_watchers!()),
    args: &[
        pg_sys::INT8OID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::INT8OID,
        pg_sys::TEXTOID,
    ],
    writes: true,
    generic: false,
};

/// One batch of finished instances and what belongs to them. An instance is
/// left alone while its claim is held or its queue row is leased (a pass may
/// be running), and when another transaction holds its row.
static SWEEP_INSTANCES: Statement = Statement {
    sql: "WITH victims AS MATERIALIZED (
              SELECT i.id, i.workflow, i.queue FROM sturdy.instances i
               WHERE i.finished_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) $1)
                 AND NOT EXISTS (SELECT FROM sturdy.claims c
                                  WHERE c.workflow OPERATOR(pg_catalog.=) i.workflow
                                    AND c.held_until OPERATOR(pg_catalog.>) pg_catalog.now())
                 AND NOT EXISTS (SELECT FROM sturdy.queue q
                                  WHERE q.queue OPERATOR(pg_catalog.=) i.queue
                                    AND q.workflow OPERATOR(pg_catalog.=) i.workflow
                                    AND q.leased_until OPERATOR(pg_catalog.>) pg_catalog.now())
               ORDER BY i.finished_at
               LIMIT $2
                 FOR UPDATE OF i SKIP LOCKED),
          instances AS (
              DELETE FROM sturdy.instances i USING victims v WHERE i.id OPERATOR(pg_catalog.=) v.id RETURNING 1),
          checkpoints AS (
              DELETE FROM sturdy.checkpoints c USING victims v
               WHERE c.workflow OPERATOR(pg_catalog.=) v.workflow RETURNING 1),
          claims AS (
              DELETE FROM sturdy.claims c USING victims v
               WHERE c.workflow OPERATOR(pg_catalog.=) v.workflow
                 AND c.held_until OPERATOR(pg_catalog.<=) pg_catalog.now() RETURNING 1),
          queue AS (
              DELETE FROM sturdy.queue q USING victims v
               WHERE q.queue OPERATOR(pg_catalog.=) v.queue AND q.workflow OPERATOR(pg_catalog.=) v.workflow
              RETURNING 1)
          SELECT (SELECT pg_catalog.count(*) FROM instances), (SELECT pg_catalog.count(*) FROM checkpoints),
                 (SELECT pg_catalog.count(*) FROM claims), (SELECT pg_catalog.count(*) FROM queue)",
    args: &[pg_sys::INTERVALOID, pg_sys::INT4OID],
    writes: true,
    generic: true,
};

/// Under Citus (`scaleout`): the finished instances of [`SWEEP_INSTANCES`],
/// found and locked on the coordinator, where the instances are. Whether a
/// pass may be running is asked of the distributed tables in a step of its
/// own ([`SWEEP_BUSY`]), and what belongs to them removed by one statement
/// per table ([`SWEEP_CHECKPOINTS`], [`SWEEP_CLAIMS`], and [`SWEEP_QUEUE`]
/// once per queue, routed to its shard): no statement joins the two kinds
/// of table, which Citus refuses.
static SWEEP_FIND: Statement = Statement {
    sql: "SELECT i.id, i.workflow, i.queue FROM sturdy.instances i
           WHERE i.finished_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) $1)
           ORDER BY i.finished_at
           LIMIT $2
             FOR UPDATE OF i SKIP LOCKED",
    args: &[pg_sys::INTERVALOID, pg_sys::INT4OID],
    writes: true,
    generic: false,
};

/// Of the workflows `$1` (in queues `$2`, pairwise), those a pass may be
/// running: a live claim, or a leased queue row.
static SWEEP_BUSY: Statement = Statement {
    sql: "SELECT c.workflow FROM sturdy.claims c
           WHERE c.workflow OPERATOR(pg_catalog.=) ANY ($1)
             AND c.held_until OPERATOR(pg_catalog.>) pg_catalog.now()
          UNION
          SELECT q.workflow FROM sturdy.queue q
           WHERE q.queue OPERATOR(pg_catalog.=) ANY ($2) AND q.workflow OPERATOR(pg_catalog.=) ANY ($1)
             AND q.leased_until OPERATOR(pg_catalog.>) pg_catalog.now()",
    args: &[pg_sys::TEXTARRAYOID, pg_sys::TEXTARRAYOID],
    writes: false,
    generic: false,
};

static SWEEP_DELETE: Statement = Statement {
    sql: "WITH gone AS (DELETE FROM sturdy.instances WHERE id OPERATOR(pg_catalog.=) ANY ($1) RETURNING 1)
          SELECT pg_catalog.count(*) FROM gone",
    args: &[pg_sys::INT8ARRAYOID],
    writes: true,
    generic: false,
};

static SWEEP_CHECKPOINTS: Statement = Statement {
    sql: "DELETE FROM sturdy.checkpoints WHERE workflow OPERATOR(pg_catalog.=) ANY ($1)",
    args: &[pg_sys::TEXTARRAYOID],
    writes: true,
    generic: false,
};

static SWEEP_CLAIMS: Statement = Statement {
    sql: "DELETE FROM sturdy.claims WHERE workflow OPERATOR(pg_catalog.=) ANY ($1)
             AND held_until OPERATOR(pg_catalog.<=) pg_catalog.now()",
    args: &[pg_sys::TEXTARRAYOID],
    writes: true,
    generic: false,
};

static SWEEP_QUEUE: Statement = Statement {
    sql: "DELETE FROM sturdy.queue WHERE queue OPERATOR(pg_catalog.=) $1
             AND workflow OPERATOR(pg_catalog.=) ANY ($2)",
    args: &[pg_sys::TEXTOID, pg_sys::TEXTARRAYOID],
    writes: true,
    generic: false,
};

/// Outbox messages older than the cutoff whose deliveries are all done
/// (their deliveries go with them, by the foreign key's cascade). A message
/// with a pending or dead delivery stays.
static SWEEP_OUTBOX: Statement = Statement {
    sql: "WITH victims AS MATERIALIZED (
              SELECT o.id FROM sturdy.outbox o
               WHERE o.created_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) $1)
                 AND NOT EXISTS (SELECT FROM sturdy.deliveries d
                                  WHERE d.outbox_id OPERATOR(pg_catalog.=) o.id
                                    AND d.state OPERATOR(pg_catalog.<>) 'done')
               ORDER BY o.id
               LIMIT $2
                 FOR UPDATE OF o SKIP LOCKED),
          gone AS (
              DELETE FROM sturdy.outbox o USING victims v WHERE o.id OPERATOR(pg_catalog.=) v.id RETURNING 1)
          SELECT pg_catalog.count(*) FROM gone",
    args: &[pg_sys::INTERVALOID, pg_sys::INT4OID],
    writes: true,
    generic: true,
};

static SWEEP_KEYS: Statement = Statement {
    sql: "WITH victims AS MATERIALIZED (
              SELECT ctid FROM sturdy.idempotency_keys
               WHERE expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
               ORDER BY expires_at
               LIMIT $1
                 FOR UPDATE SKIP LOCKED),
          gone AS (
              DELETE FROM sturdy.idempotency_keys
               WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT ctid FROM victims))
              RETURNING 1)
          SELECT pg_catalog.count(*) FROM gone",
    args: &[pg_sys::INT4OID],
    writes: true,
    generic: true,
};

/// A new instance (with id `id` when a key reserved one), to be scheduled.
fn create(
    process: Name,
    business_key: Name,
    variables: Jsonb,
    queue: Option<Name>,
    id: Option<i64>,
) -> Result<Started> {
    let queue_arg = queue.map_or_else(null::<Text>, Into::into);
    let id_arg = id.map_or_else(null::<i64>, Into::into);
    let (id, workflow, queue) = run_one(
        &START,
        &[
            process.into(),
            business_key.into(),
            variables.into(),
            queue_arg,
            id_arg,
        ],
        |t| {
            let row = t.first();
            // as bytes: in a database whose encoding is not UTF-8 the
            // names need not be
            let bytes = |t: Option<Text>| t.map(|t| t.bytes().to_vec());
            Ok((
                row.get::<i64>(1)?,
                bytes(row.get::<Text>(2)?),
                bytes(row.get::<Text>(3)?),
            ))
        },
    )?;
    let missing = || Error::Internal {
        context: "start",
        cause: "the insert returned no row".into(),
    };
    let (id, workflow, queue) = (
        id.ok_or_else(missing)?,
        workflow.ok_or_else(missing)?,
        queue.ok_or_else(missing)?,
    );
    Ok(Started {
        id,
        created: Some((workflow, queue)),
    })
}

/// What a start did: the instance's id, and where it created the instance
/// (not where an idempotency key returned an earlier one) the workflow and
/// queue to schedule it on, as bytes (in a database whose encoding is not
/// UTF-8 the names need not be).
pub(crate) struct Started {
    pub(crate) id: i64,
    pub(crate) created: Option<(Vec<u8>, Vec<u8>)>,
}

/// `start`'s instance, for its arguments as given (checked here): created
/// pending, or the one a live idempotency key points to. The caller
/// schedules a created one (`compose`'s `start`).
pub(crate) fn start_instance(
    process: Option<Text>,
    business_key: Option<Text>,
    variables: Option<Jsonb>,
    idempotency_key: Option<Text>,
    queue: Option<Text>,
) -> Result<Started> {
    let process = args::name("process", process)?;
    if process.lossy().len() > MAX_PROCESS_BYTES {
        return Err(Error::TooLong {
            arg: "process",
            bytes: process.lossy().len(),
        });
    }
    let business_key = args::name("business_key", business_key)?;
    let variables = args::required("variables", variables)?;
    if variables.kind() != "object" {
        return Err(Error::Invalid {
            arg: "variables",
            why: format!("must be a JSON object, got a JSON {}", variables.kind()),
            hint: "Pass an object of the instance's variables, e.g. '{\"order\": 42}' (or '{}').",
        });
    }
    let key = args::optional_name("idempotency_key", idempotency_key)?;
    let queue = args::optional_name("queue", queue)?;
    let Some(key) = key else {
        return create(process, business_key, variables, queue, None);
    };
    let ttl_seconds = f64::from(IDEMPOTENCY_TTL.get()) / 1000.0;
    let reserved = run_one(
        &RESERVE_KEY,
        &[process.into(), key.into(), ttl_seconds.into()],
        first_value::<i64>,
    )?;
    match reserved {
        Some(id) => create(process, business_key, variables, queue, Some(id)),
        None => run_one(
            &KEY_OWNER,
            &[process.into(), key.into()],
            first_value::<i64>,
        )?
        .map(|id| Started { id, created: None })
        .ok_or(Error::Internal {
            context: "start",
            cause: "an idempotency key neither reserved nor found".into(),
        }),
    }
}

/// Returns its row through the call.
#[sql_function(
    "sturdy.status(business_key text)
     RETURNS TABLE (id bigint, process text, workflow text, status text, revision bigint, step text,
                    last_error text, updated_at timestamptz)
     STABLE PARALLEL UNSAFE ROWS 1",
    comment = "The newest instance for business_key: its workflow name, status and revision, its current step (its newest checkpoint), last error, and last progress (status change or checkpoint). No row when there is none."
)]
fn status_of(call: &Args, business_key: Option<Text>) -> Result<()> {
    let business_key = args::name("business_key", business_key)?;
    if crate::scaleout::distributed() {
        return status_in_steps(call, business_key);
    }
    plan::run_as_set(call, &STATUS, &[business_key.into()])?;
    Ok(())
}

/// Returns its rows through the call.
#[sql_function(
    "sturdy.stuck(older_than interval, max integer DEFAULT NULL)
     RETURNS TABLE (id bigint, process text, business_key text, workflow text, status text,
                    stalled_since timestamptz)
     STABLE PARALLEL UNSAFE",
    comment = "Pending or running instances with no progress (no status change, no checkpoint of any kind) for older_than, longest stalled first; the first max of them when max is given (NULL: all)."
)]
fn stuck(call: &Args, older_than: Option<Interval>, max: Option<i32>) -> Result<()> {
    let older_than = args::lease("older_than", older_than)?;
    let max = match max {
        None => None,
        Some(n) => Some(args::positive("max", Some(n))? as usize),
    };
    let found = stuck_walk(older_than, max)?;
    plan::begin_result(call);
    for s in &found {
        plan::append_row(
            call,
            &[
                s.id.into_datum(),
                Text::from_bytes(&s.process).into_datum(),
                Text::from_bytes(&s.business_key).into_datum(),
                Text::from_bytes(&s.workflow).into_datum(),
                Text::from_bytes(&s.status).into_datum(),
                Some(pg_sys::Datum::from(s.stalled_since)),
            ],
        )?;
    }
    Ok(())
}

/// A stalled instance `stuck` found.
struct Stalled {
    stalled_since: pg_sys::TimestampTz,
    id: i64,
    process: Vec<u8>,
    business_key: Vec<u8>,
    workflow: Vec<u8>,
    status: Vec<u8>,
}

/// How many instances one statement of `stuck`'s walk reads.
const STUCK_CHUNK: i32 = 500;

/// The stalled instances, longest stalled first, the first `max` of them.
/// An instance's stall begins at its last status change or its last
/// checkpoint, whichever is later, so never before its `updated_at`: the
/// walk reads the live instances in `updated_at` order, a chunk at a time,
/// and stops once the `max`-th longest stalled so far began before the
/// next instance it would read changed status. Bounded by `max` and the
/// instances with a later checkpoint passed on the way, never by how many
/// are stalled (a health check over two million stalled instances reads
/// the first chunk).
fn stuck_walk(older_than: Interval, max: Option<usize>) -> Result<Vec<Stalled>> {
    let mut found: Vec<Stalled> = Vec::new();
    let mut after: Option<(pg_sys::TimestampTz, i64)> = None;
    let chunk = max.map_or(STUCK_CHUNK, |m| {
        i32::try_from(m).unwrap_or(i32::MAX).clamp(64, STUCK_CHUNK)
    });
    let by_stall = |a: &Stalled, b: &Stalled| (a.stalled_since, a.id).cmp(&(b.stalled_since, b.id));
    loop {
        let (at, id) = after.map_or((None, None), |(at, id)| (Some(at), Some(id)));
        let read = plan::run_rows(
            &STUCK_WALK,
            &[
                older_than.into(),
                at.and_then(|t| TimestampWithTimeZone::try_from(t).ok())
                    .map_or_else(null::<TimestampWithTimeZone>, Into::into),
                id.map_or_else(null::<i64>, Into::into),
                chunk.into(),
            ],
            |rows| {
                let mut last = None;
                for r in 0..rows.len() {
                    let (Some(id), Some(updated_at)) =
                        (rows.get::<i64>(r, 1), rows.timestamptz(r, 7))
                    else {
                        continue;
                    };
                    last = Some((updated_at, id));
                    if rows.get::<bool>(r, 8) != Some(true) {
                        continue;
                    }
                    let bytes = |col| rows.text_bytes(r, col).unwrap_or_default().to_vec();
                    found.push(Stalled {
                        stalled_since: rows.timestamptz(r, 6).unwrap_or(updated_at),
                        id,
                        process: bytes(2),
                        business_key: bytes(3),
                        workflow: bytes(4),
                        status: bytes(5),
                    });
                }
                Ok((rows.len(), last))
            },
        )?;
        let (read, last) = read;
        found.sort_by(by_stall);
        if let Some(m) = max {
            found.truncate(m);
        }
        let Some(last) = last else { break };
        if read < chunk as usize {
            break;
        }
        after = Some(last);
        // every instance still to read stalled at its updated_at or later,
        // and comes after `last` in (updated_at, id) order
        if let Some(m) = max
            && found.len() >= m
            && (found[m - 1].stalled_since, found[m - 1].id) < last
        {
            break;
        }
    }
    Ok(found)
}

/// An instance whose workflow's queue row died (its passes failed the
/// queue's `max_attempts` times) fails with the row's error (any instance
/// of the workflow still pending or running).
static FAIL_INSTANCE: Statement = Statement {
    sql: concat!("UPDATE sturdy.instances
             SET status = 'failed', revision = revision OPERATOR(pg_catalog.+) 1, updated_at = pg_catalog.now(),
                 finished_at = pg_catalog.now(), last_error = COALESCE(pg_catalog.\"left\"($2, 1000), last_error)
           WHERE workflow OPERATOR(pg_catalog.=) $1
             AND status OPERATOR(pg_catalog.=) ANY ('{pending,running}'::pg_catalog.text[])
          RETURNING ", notify_watchers!()),
    args: &[pg_sys::TEXTOID, pg_sys::TEXTOID],
    writes: true,
    generic: false,
};

/// The instances of `workflows`, whose queue rows died, failed with
/// `error` (kept as the rows keep it: its first 1,000 characters).
pub(crate) fn fail_instances(workflows: &[Vec<u8>], error: Option<Text>) -> Result<()> {
    for workflow in workflows {
        run_one(
            &FAIL_INSTANCE,
            &[
                Text::from_bytes(workflow).into(),
                error.map_or_else(null::<Text>, Into::into),
            ],
            |_| Ok(()),
        )?;
    }
    Ok(())
}

/// The workflow name of instance `id`, as bytes; `None` for no such
/// instance.
pub(crate) fn workflow_of(id: i64) -> Result<Option<Vec<u8>>> {
    run_one(&INSTANCE_WORKFLOW, &[id.into()], |t| {
        Ok(first_value::<Text>(t)?.map(|w| w.bytes().to_vec()))
    })
}

/// `transition`'s compare-and-set, its arguments checked: whether the
/// instance moved.
pub(crate) fn move_instance(
    id: i64,
    from_status: &'static str,
    to_status: &'static str,
    expected_revision: Option<i64>,
    error: Option<Text>,
) -> Result<bool> {
    let revision = expected_revision.map_or_else(null::<i64>, Into::into);
    let error = error.map_or_else(null::<Text>, Into::into);
    Ok(run_one(
        &TRANSITION,
        &[
            id.into(),
            from_status.into(),
            to_status.into(),
            revision,
            error,
        ],
        first_value::<bool>,
    )?
    .is_some())
}

/// One bounded batch of `sweep` (see `compose`'s `sweep`, the SQL
/// function): at most `max` instances finished before `now() -
/// older_than` with their checkpoints, claims and queue rows, at most `max`
/// outbox messages that old whose deliveries are all done, and at most
/// `max` expired idempotency keys. How many of each kind went.
pub(crate) fn sweep_batch(older_than: Interval, max: i32) -> Result<[(&'static str, i64); 6]> {
    let counts = if crate::scaleout::distributed() {
        sweep_distributed(older_than, max)?
    } else {
        plan::run_generic(&SWEEP_INSTANCES, &[older_than.into(), max.into()], |rows| {
            Ok([1, 2, 3, 4].map(|col| rows.get::<i64>(0, col).unwrap_or(0)))
        })?
    };
    let outbox = plan::run_generic(&SWEEP_OUTBOX, &[older_than.into(), max.into()], |rows| {
        Ok(rows.get::<i64>(0, 1).unwrap_or(0))
    })?;
    let keys = plan::run_generic(&SWEEP_KEYS, &[max.into()], |rows| {
        Ok(rows.get::<i64>(0, 1).unwrap_or(0))
    })?;
    Ok([
        ("instances", counts[0]),
        ("checkpoints", counts[1]),
        ("claims", counts[2]),
        ("queue", counts[3]),
        ("outbox", outbox),
        ("idempotency_keys", keys),
    ])
}

/// [`SWEEP_INSTANCES`]'s batch in steps, for Citus (see [`SWEEP_FIND`]):
/// counts of instances, checkpoints, claims and queue rows removed.
fn sweep_distributed(older_than: Interval, max: i32) -> Result<[i64; 4]> {
    // (an instance started without a queue has none)
    let found: Vec<(i64, String, Option<String>)> =
        plan::run_rows(&SWEEP_FIND, &[older_than.into(), max.into()], |rows| {
            Ok((0..rows.len())
                .filter_map(|i| Some((rows.get(i, 1)?, rows.get(i, 2)?, rows.get(i, 3))))
                .collect())
        })?;
    if found.is_empty() {
        return Ok([0; 4]);
    }
    let workflows: Vec<String> = found.iter().map(|(_, w, _)| w.clone()).collect();
    let queues: Vec<String> = found.iter().filter_map(|(_, _, q)| q.clone()).collect();
    let busy: std::collections::HashSet<String> = plan::run_rows(
        &SWEEP_BUSY,
        &[workflows.clone().into(), queues.into()],
        |rows| Ok((0..rows.len()).filter_map(|i| rows.get(i, 1)).collect()),
    )?;
    let victims: Vec<&(i64, String, Option<String>)> =
        found.iter().filter(|(_, w, _)| !busy.contains(w)).collect();
    if victims.is_empty() {
        return Ok([0; 4]);
    }
    let ids: Vec<i64> = victims.iter().map(|(id, _, _)| *id).collect();
    let workflows: Vec<String> = victims.iter().map(|(_, w, _)| w.clone()).collect();
    let instances = run_one(&SWEEP_DELETE, &[ids.into()], first_value::<i64>)?.unwrap_or(0);
    let removed = |stmt: &'static Statement, args: &[pgrx::datum::DatumWithOid<'_>]| {
        run_one(stmt, args, |_| Ok(plan::last_rows().len() as i64))
    };
    let checkpoints = removed(&SWEEP_CHECKPOINTS, &[workflows.clone().into()])?;
    let claims = removed(&SWEEP_CLAIMS, &[workflows.into()])?;
    let mut by_queue: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for (_, w, q) in &victims {
        if let Some(q) = q {
            by_queue.entry(q.as_str()).or_default().push(w.clone());
        }
    }
    let mut queue = 0;
    for (q, ws) in by_queue {
        queue += removed(&SWEEP_QUEUE, &[q.into(), ws.into()])?;
    }
    Ok([instances, checkpoints, claims, queue])
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use crate::testing::{count, error_of, sqlstate_of};
    use pgrx::prelude::*;

    fn text(sql: &str) -> Option<String> {
        Spi::get_one::<String>(sql).unwrap()
    }

    fn id(sql: &str) -> i64 {
        Spi::get_one::<i64>(sql).unwrap().unwrap()
    }

    #[pg_test]
    fn start_writes_a_pending_instance_and_schedules_its_workflow() {
        let a = id("SELECT sturdy.start('ship', 'order-1', '{\"order\": 1}')");
        assert_eq!(
            text(&format!(
                "SELECT format('%s %s %s %s %s %s', process, business_key, workflow, queue, status, revision)
                   FROM sturdy.instances WHERE id = {a}"
            ))
            .as_deref(),
            Some(format!("ship order-1 ship/{a} ship pending 1").as_str())
        );
        assert_eq!(
            text(&format!(
                "SELECT format('%s %s', queue, visible_at <= now()) FROM sturdy.queue WHERE workflow = 'ship/{a}'"
            ))
            .as_deref(),
            Some("ship t")
        );
        let b = id("SELECT sturdy.start('ship', 'order-2', queue => 'express')");
        assert!(b > a);
        assert_eq!(
            text(&format!(
                "SELECT queue FROM sturdy.queue WHERE workflow = 'ship/{b}'"
            ))
            .as_deref(),
            Some("express")
        );
        assert_eq!(
            text(&format!(
                "SELECT variables::text FROM sturdy.instances WHERE id = {b}"
            ))
            .as_deref(),
            Some("{}")
        );
    }

    #[pg_test]
    fn an_idempotency_key_returns_the_first_instance_until_it_expires() {
        Spi::run("SET LOCAL sturdy.idempotency_ttl = '1h'").unwrap();
        let a = id("SELECT sturdy.start('pay', 'inv-1', idempotency_key => 'k1')");
        assert_eq!(
            id("SELECT sturdy.start('pay', 'inv-1', idempotency_key => 'k1')"),
            a
        );
        assert_eq!(
            id("SELECT sturdy.start('pay', 'other', '{\"x\": 1}', idempotency_key => 'k1')"),
            a,
            "the key decides, not the arguments"
        );
        assert_eq!(count("sturdy.instances"), 1);
        assert_eq!(
            text("SELECT (expires_at - created_at)::text FROM sturdy.idempotency_keys").as_deref(),
            Some("01:00:00")
        );
        // keys are per process
        let other = id("SELECT sturdy.start('refund', 'inv-1', idempotency_key => 'k1')");
        assert_ne!(other, a);
        // expired: the key is reused for a new instance
        Spi::run("UPDATE sturdy.idempotency_keys SET expires_at = now() - interval '1 s' WHERE process = 'pay'")
            .unwrap();
        let again = id("SELECT sturdy.start('pay', 'inv-1', idempotency_key => 'k1')");
        assert!(again > other);
        assert_eq!(
            id("SELECT sturdy.start('pay', 'inv-1', idempotency_key => 'k1')"),
            again
        );
        assert_eq!(count("sturdy.instances"), 3);
        assert_eq!(count("sturdy.idempotency_keys"), 2);
    }

    #[pg_test]
    fn status_shows_the_newest_instance_with_its_step_and_last_progress() {
        assert_eq!(count("sturdy.status('nobody')"), 0);
        id("SELECT sturdy.start('p', 'bk')");
        let b = id("SELECT sturdy.start('p', 'bk')");
        assert_eq!(
            text("SELECT format('%s %s %s %s %s %s', workflow, status, revision, step, last_error, updated_at = now()) FROM sturdy.status('bk')")
                .as_deref(),
            Some(format!("p/{b} pending 1 <NULL> <NULL> t").as_str())
                .map(|s| s.replace("<NULL>", ""))
                .as_deref()
        );
        Spi::run(&format!(
            "SELECT sturdy.claim('p/{b}'); SELECT sturdy.record('p/{b}', 'reserved', '1', 1);
             SELECT sturdy.transition({b}, 'pending', 'running', error => 'a retry')"
        ))
        .unwrap();
        assert_eq!(
            text("SELECT format('%s %s %s %s', status, revision, step, last_error) FROM sturdy.status('bk')")
                .as_deref(),
            Some("running 2 reserved a retry")
        );
    }

    #[pg_test]
    fn stuck_finds_exactly_the_live_instances_without_progress() {
        let old = id("SELECT sturdy.start('p', 'old')");
        let checkpointed = id("SELECT sturdy.start('p', 'cp')");
        let done = id("SELECT sturdy.start('p', 'done')");
        id("SELECT sturdy.start('p', 'fresh')");
        Spi::run(&format!(
            "UPDATE sturdy.instances SET updated_at = now() - interval '2 hours' WHERE id IN ({old}, {checkpointed}, {done});
             SELECT sturdy.transition({done}, 'pending', 'succeeded');
             UPDATE sturdy.instances SET updated_at = now() - interval '2 hours' WHERE id = {done};
             SELECT sturdy.supply('p/{checkpointed}', 'approval', '\"yes\"');"
        ))
        .unwrap();
        assert_eq!(
            text("SELECT string_agg(format('%s %s %s', business_key, status, stalled_since = now() - interval '2 hours'), ',') FROM sturdy.stuck('1 hour')")
                .as_deref(),
            Some("old pending t")
        );
        // an old checkpoint is no progress either
        Spi::run(&format!(
            "UPDATE sturdy.checkpoints SET recorded_at = now() - interval '90 minutes' WHERE workflow = 'p/{checkpointed}'"
        ))
        .unwrap();
        assert_eq!(
            text("SELECT string_agg(business_key, ',' ORDER BY stalled_since) FROM sturdy.stuck('1 hour')")
                .as_deref(),
            Some("old,cp")
        );
        assert_eq!(sqlstate_of("SELECT * FROM sturdy.stuck('0 s')"), "22023");
        assert_eq!(sqlstate_of("SELECT * FROM sturdy.stuck(NULL)"), "22004");
        assert_eq!(
            sqlstate_of("SELECT * FROM sturdy.stuck('1 hour', 0)"),
            "22023"
        );
    }

    /// `stuck(older_than, max)` walks the live instances by their last
    /// status change and stops early; what it returns must still be the
    /// first `max` of the whole list, longest stalled first. 1,500 stalled
    /// instances over several of its chunks, many sharing one `updated_at`
    /// (a bulk start), a third with a later checkpoint that moves them
    /// back in the order, some of those no longer stalled at all.
    #[pg_test]
    fn stuck_with_a_max_returns_the_first_of_the_whole_list() {
        Spi::run(
            "SELECT count(sturdy.start('p', 'k' || g)) FROM generate_series(1, 1500) g;
             UPDATE sturdy.instances
                SET updated_at = now() - interval '3 hours' + (id % 97) * interval '1 minute';
             INSERT INTO sturdy.checkpoints (workflow, step, value, recorded_at)
             SELECT workflow, 'late', '1', now() - interval '3 hours' + (id % 193) * interval '1 minute'
               FROM sturdy.instances WHERE id % 3 = 0",
        )
        .unwrap();
        let all = count("sturdy.stuck('1 hour')");
        assert!((1000..1500).contains(&all), "{all} stalled");
        for max in [1, 7, 63, 64, 65, 499, 500, 501, 1000, 1499, 1500, 5000] {
            let differs = count(&format!(
                "(SELECT row_number() OVER (), s.id, s.stalled_since FROM sturdy.stuck('1 hour', {max}) s
                  EXCEPT
                  SELECT * FROM (SELECT row_number() OVER (), s.id, s.stalled_since FROM sturdy.stuck('1 hour') s
                                  LIMIT {max}) f) d"
            ));
            assert_eq!(differs, 0, "max {max}");
            assert_eq!(
                count(&format!("sturdy.stuck('1 hour', {max})")),
                all.min(max),
                "max {max}"
            );
        }
    }

    #[pg_test]
    fn transition_is_compare_and_set_and_never_leaves_a_terminal_status() {
        let i = id("SELECT sturdy.start('p', 't')");
        let t = |sql: &str| {
            Spi::get_one::<bool>(&format!("SELECT sturdy.transition({i}, {sql})")).unwrap()
        };
        assert_eq!(t("'running', 'succeeded'"), Some(false), "not running");
        assert_eq!(
            t("'pending', 'running', expected_revision => 2"),
            Some(false),
            "stale revision"
        );
        assert_eq!(
            t("'pending', 'running', expected_revision => 1"),
            Some(true)
        );
        assert_eq!(
            t("'running', 'running'"),
            Some(true),
            "a move to itself bumps the revision"
        );
        assert_eq!(t("'running', 'failed', expected_revision => 3"), Some(true));
        assert_eq!(
            t("'failed', 'running'"),
            Some(false),
            "terminal is never left"
        );
        assert_eq!(t("'failed', 'failed'"), Some(false), "not even for itself");
        assert_eq!(
            text(&format!("SELECT format('%s %s %s', status, revision, finished_at = now()) FROM sturdy.instances WHERE id = {i}"))
                .as_deref(),
            Some("failed 4 t")
        );
        assert_eq!(
            Spi::get_one::<bool>("SELECT sturdy.transition(987654, 'pending', 'running')").unwrap(),
            Some(false)
        );
        for (sql, state) in [
            (
                format!("SELECT sturdy.transition({i}, 'pending', 'done')"),
                "22023",
            ),
            (
                format!("SELECT sturdy.transition({i}, 'PENDING', 'running')"),
                "22023",
            ),
            (
                format!("SELECT sturdy.transition({i}, NULL, 'running')"),
                "22004",
            ),
            (
                "SELECT sturdy.transition(NULL, 'pending', 'running')".into(),
                "22004",
            ),
        ] {
            assert_eq!(sqlstate_of(&sql), state, "{sql}");
        }
        assert!(
            error_of(&format!("SELECT sturdy.transition({i}, 'pending', 'done')")).contains(
                "to_status must be one of pending, running, succeeded, failed, cancelled"
            )
        );
    }

    #[pg_test]
    fn a_fenced_transition_refuses_a_stale_token() {
        let i = id("SELECT sturdy.start('p', 'f')");
        Spi::run(&format!(
            "SELECT sturdy.claim('p/{i}');
             UPDATE sturdy.claims SET held_until = now() WHERE workflow = 'p/{i}';
             SELECT sturdy.claim('p/{i}');"
        ))
        .unwrap();
        assert_eq!(
            sqlstate_of(&format!(
                "SELECT sturdy.transition({i}, 'pending', 'running', token => 1)"
            )),
            "SD001"
        );
        assert_eq!(
            Spi::get_one::<bool>(&format!(
                "SELECT sturdy.transition({i}, 'pending', 'running', token => 2)"
            ))
            .unwrap(),
            Some(true)
        );
        assert_eq!(
            text(&format!(
                "SELECT status FROM sturdy.instances WHERE id = {i}"
            ))
            .as_deref(),
            Some("running")
        );
    }

    /// The two-call pass: take with a claim, then finish.
    #[pg_test]
    fn finish_records_moves_releases_and_removes_in_one_call() {
        let i = id("SELECT sturdy.start('p', 'fin', queue => 'fq')");
        let w = format!("p/{i}");
        let (token, receipt) = Spi::get_two::<i64, String>(
            "SELECT token, receipt::text FROM sturdy.take('fq', claim => true)",
        )
        .unwrap();
        let (token, receipt) = (token.unwrap(), receipt.unwrap());
        let finish = |tok: i64, extra: &str| {
            format!("SELECT sturdy.finish('{w}', {tok}, '{receipt}', {extra} queue => 'fq')")
        };
        // a stale token: SD001, nothing happens
        assert_eq!(
            sqlstate_of(&finish(token + 1, "'s', '1', 'succeeded',")),
            "SD001"
        );
        assert_eq!(
            count(&format!("sturdy.checkpoints WHERE workflow = '{w}'")),
            0
        );
        assert_eq!(count(&format!("sturdy.queue WHERE workflow = '{w}'")), 1);
        // a step without a value
        assert_eq!(sqlstate_of(&finish(token, "step => 's',")), "22004");
        assert_eq!(
            Spi::get_one::<bool>(&finish(
                token,
                "step => 'shipped', value => '{\"by\": \"ups\"}', status => 'succeeded',"
            ))
            .unwrap(),
            Some(true)
        );
        assert_eq!(
            text(&format!(
                "SELECT format('%s %s %s', i.status, i.revision, c.held_until <= now())
                   FROM sturdy.instances i JOIN sturdy.claims c USING (workflow) WHERE i.id = {i}"
            ))
            .as_deref(),
            Some("succeeded 2 t")
        );
        assert_eq!(
            text(&format!("SELECT value::text FROM sturdy.checkpoints WHERE workflow = '{w}' AND step = 'shipped'")).as_deref(),
            Some("{\"by\": \"ups\"}")
        );
        assert_eq!(count(&format!("sturdy.queue WHERE workflow = '{w}'")), 0);
    }

    #[pg_test]
    fn finish_keeps_a_row_woken_during_the_pass_and_refuses_to_leave_a_terminal_status() {
        let i = id("SELECT sturdy.start('p', 'wake', queue => 'wq')");
        let w = format!("p/{i}");
        let (token, receipt) = Spi::get_two::<i64, String>(
            "SELECT token, receipt::text FROM sturdy.take('wq', claim => true)",
        )
        .unwrap();
        let (token, receipt) = (token.unwrap(), receipt.unwrap());
        Spi::run(&format!("SELECT sturdy.schedule('{w}', now(), 'wq')")).unwrap();
        assert_eq!(
            Spi::get_one::<bool>(&format!(
                "SELECT sturdy.finish('{w}', {token}, '{receipt}', status => 'running', queue => 'wq')"
            ))
            .unwrap(),
            Some(false),
            "a wakeup arrived: the row stays"
        );
        assert_eq!(count(&format!("sturdy.queue WHERE workflow = '{w}'")), 1);
        assert_eq!(
            text(&format!(
                "SELECT status FROM sturdy.instances WHERE id = {i}"
            ))
            .as_deref(),
            Some("running")
        );
        // taken again, and this time the instance is already terminal
        Spi::run(&format!(
            "SELECT sturdy.transition({i}, 'running', 'cancelled')"
        ))
        .unwrap();
        let (token, receipt) = Spi::get_two::<i64, String>(
            "SELECT token, receipt::text FROM sturdy.take('wq', claim => true)",
        )
        .unwrap();
        let (token, receipt) = (token.unwrap(), receipt.unwrap());
        let e = error_of(&format!(
            "SELECT sturdy.finish('{w}', {token}, '{receipt}', 'late', '1', 'succeeded', 'wq')"
        ));
        assert!(e.starts_with("SD002 | "), "{e}");
        assert!(e.contains("is cancelled, a terminal status"), "{e}");
        assert_eq!(
            count(&format!("sturdy.checkpoints WHERE workflow = '{w}'")),
            0
        );
        // without a status the pass may still end
        assert_eq!(
            Spi::get_one::<bool>(&format!(
                "SELECT sturdy.finish('{w}', {token}, '{receipt}', queue => 'wq')"
            ))
            .unwrap(),
            Some(true)
        );
    }

    /// `finish` without a status through `access` (no statement): the fence,
    /// the step kept where it is there, the release and the done; and its
    /// statement where a table asks for more (a trigger), with the same end.
    #[pg_test]
    fn finish_without_a_status_goes_without_a_statement_and_with_one_where_a_trigger_must_fire() {
        let served = crate::access::served;
        Spi::run(
            "SELECT sturdy.schedule(w, now() - interval '1 second', 'fq') FROM unnest(array['f1', 'f2', 'f3']) w;
             CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('fq', max => 3, claim => true);
             SELECT sturdy.record('f1', 'final', '\"first\"', (SELECT token FROM t WHERE workflow = 'f1'));",
        )
        .unwrap();
        let finish = |w: &str| {
            format!(
                "SELECT sturdy.finish(workflow, token, receipt, 'final', '\"second\"', queue => 'fq')
                   FROM t WHERE workflow = '{w}'"
            )
        };
        let state = |w: &str| {
            text(&format!(
                "SELECT concat_ws(' ', (SELECT value::text FROM sturdy.checkpoints WHERE workflow = '{w}' AND step = 'final'),
                                       (SELECT held_until <= now() FROM sturdy.claims WHERE workflow = '{w}'),
                                       (SELECT count(*) FROM sturdy.queue WHERE queue = 'fq' AND workflow = '{w}'))"
            ))
        };
        let before = served();
        assert_eq!(Spi::get_one::<bool>(&finish("f1")).unwrap(), Some(true));
        assert_eq!(
            served(),
            before + 4,
            "lock, record, release, done: no statement"
        );
        assert_eq!(
            state("f1").as_deref(),
            Some("\"first\" t 0"),
            "the step recorded before is kept, the claim released, the row gone"
        );
        Spi::run(
            "CREATE TEMP TABLE noted (workflow text);
             CREATE FUNCTION pg_temp.note_step() RETURNS trigger LANGUAGE plpgsql AS
               $f$BEGIN INSERT INTO noted VALUES (NEW.workflow); RETURN NEW; END$f$;
             CREATE TRIGGER noted AFTER INSERT ON sturdy.checkpoints
               FOR EACH ROW EXECUTE FUNCTION pg_temp.note_step();",
        )
        .unwrap();
        let before = served();
        assert_eq!(Spi::get_one::<bool>(&finish("f2")).unwrap(), Some(true));
        assert_eq!(
            served(),
            before + 1,
            "the claim's part through the statement, the row's end without one"
        );
        assert_eq!(
            text("SELECT string_agg(workflow, ',') FROM noted").as_deref(),
            Some("f2")
        );
        assert_eq!(state("f2").as_deref(), Some("\"second\" t 0"));
        Spi::run("DROP TRIGGER noted ON sturdy.checkpoints").unwrap();
        assert_eq!(Spi::get_one::<bool>(&finish("f3")).unwrap(), Some(true));
        assert_eq!(served(), before + 5, "without it again");
        assert_eq!(state("f3").as_deref(), Some("\"second\" t 0"));
    }

    /// A `CHECK` constraint on `sturdy.claims` (which only the executor
    /// tests) sends `finish`'s part on the claim to its statement before
    /// anything is locked or written without it (the queue row, another
    /// table, still goes without one); the pass ends as it would.
    #[pg_test]
    fn finish_goes_to_its_statement_before_writing_where_the_claims_table_has_a_check() {
        let served = crate::access::served;
        Spi::run(
            "ALTER TABLE sturdy.claims ADD CONSTRAINT positive CHECK (token > 0);
             SELECT sturdy.schedule('fk', now() - interval '1 second', 'fkq');
             CREATE TEMP TABLE t AS SELECT * FROM sturdy.take('fkq', claim => true);",
        )
        .unwrap();
        let before = served();
        assert_eq!(
            Spi::get_one::<bool>(
                "SELECT sturdy.finish(workflow, token, receipt, 'final', '1', queue => 'fkq') FROM t"
            )
            .unwrap(),
            Some(true)
        );
        assert_eq!(
            served(),
            before + 1,
            "the claim's part through the statement, the row's end (the queue's table) without one"
        );
        assert_eq!(
            text(
                "SELECT concat_ws(' ', (SELECT value::text FROM sturdy.checkpoints WHERE workflow = 'fk'),
                                       (SELECT held_until <= now() FROM sturdy.claims WHERE workflow = 'fk'),
                                       (SELECT count(*) FROM sturdy.queue WHERE queue = 'fkq'))"
            )
            .as_deref(),
            Some("1 t 0")
        );
    }

    /// The shapes of `finish` without a status (each its own statement): the
    /// instance is left as it is, everything else happens as with one.
    #[pg_test]
    fn finish_without_a_status_records_releases_and_removes_and_leaves_the_instance() {
        let i = id("SELECT sturdy.start('p', 'plain', queue => 'nq')");
        let w = format!("p/{i}");
        Spi::run("SELECT sturdy.schedule('bare', now(), 'nq')").unwrap();
        for (workflow, step) in [(w.as_str(), "'s', '{\"n\": 1}',"), ("bare", "")] {
            let (token, receipt) = Spi::get_two::<i64, String>(&format!(
                "SELECT token, receipt::text FROM sturdy.take('nq', claim => true)
                  WHERE workflow = '{workflow}'"
            ))
            .unwrap();
            let (token, receipt) = (token.unwrap(), receipt.unwrap());
            let finish = |tok: i64| {
                format!(
                    "SELECT sturdy.finish('{workflow}', {tok}, '{receipt}', {step} queue => 'nq')"
                )
            };
            let held =
                format!("sturdy.claims WHERE workflow = '{workflow}' AND held_until > now()");
            let queued = format!("sturdy.queue WHERE workflow = '{workflow}'");
            let recorded = format!("sturdy.checkpoints WHERE workflow = '{workflow}'");
            assert_eq!(sqlstate_of(&finish(token + 1)), "SD001", "{workflow}");
            assert_eq!((count(&held), count(&queued), count(&recorded)), (1, 1, 0));
            assert_eq!(
                Spi::get_one::<bool>(&finish(token)).unwrap(),
                Some(true),
                "{workflow}"
            );
            let steps = i64::from(!step.is_empty());
            assert_eq!(
                (count(&held), count(&queued), count(&recorded)),
                (0, 0, steps)
            );
        }
        assert_eq!(
            text(&format!(
                "SELECT format('%s %s', status, revision) FROM sturdy.instances WHERE id = {i}"
            ))
            .as_deref(),
            Some("pending 1")
        );
    }

    #[pg_test]
    fn sweep_removes_exactly_what_is_finished_and_old_a_bounded_batch_at_a_time() {
        // three old finished instances with a checkpoint each, one finished
        // recently, one still running, one finished but claimed, one
        // finished but with its queue row leased to a pass
        let ids: Vec<i64> = (0..7)
            .map(|n| id(&format!("SELECT sturdy.start('p', 'sw-{n}')")))
            .collect();
        for (n, i) in ids.iter().enumerate() {
            Spi::run(&format!("SELECT sturdy.supply('p/{i}', 's', '1')")).unwrap();
            if n != 4 {
                Spi::run(&format!(
                    "SELECT sturdy.transition({i}, 'pending', 'succeeded')"
                ))
                .unwrap();
            }
        }
        Spi::run(&format!(
            "UPDATE sturdy.instances SET finished_at = now() - interval '8 days' WHERE id NOT IN ({}, {})",
            ids[3], ids[4]
        ))
        .unwrap();
        Spi::run(&format!("SELECT sturdy.claim('p/{}', '1 hour')", ids[5])).unwrap();
        Spi::run(&format!(
            "UPDATE sturdy.queue SET taken_at = now(), leased_until = now() + interval '1 hour' WHERE workflow = 'p/{}'",
            ids[6]
        ))
        .unwrap();
        Spi::run(
            "INSERT INTO sturdy.idempotency_keys VALUES ('p', 'old', 1, now() - interval '2 days', now() - interval '1 day'),
                                                        ('p', 'live', 2, now(), now() + interval '1 day')",
        )
        .unwrap();
        let sweep = |max: i32| {
            text(&format!(
                "SELECT string_agg(kind || '=' || deleted, ' ' ORDER BY kind) FROM sturdy.sweep('7 days', {max})"
            ))
            .unwrap()
        };
        assert_eq!(
            sweep(2),
            "checkpoints=2 claims=0 dead=0 idempotency_keys=1 instances=2 key_places=0 lapsed=0 outbox=0 queue=2 samples=0"
        );
        assert_eq!(
            sweep(2),
            "checkpoints=1 claims=0 dead=0 idempotency_keys=0 instances=1 key_places=0 lapsed=0 outbox=0 queue=1 samples=0"
        );
        assert_eq!(
            sweep(2),
            "checkpoints=0 claims=0 dead=0 idempotency_keys=0 instances=0 key_places=0 lapsed=0 outbox=0 queue=0 samples=0"
        );
        assert_eq!(
            text("SELECT string_agg(business_key, ',' ORDER BY id) FROM sturdy.instances")
                .as_deref(),
            Some("sw-3,sw-4,sw-5,sw-6"),
            "recent, running, claimed and leased stay"
        );
        assert_eq!(count("sturdy.checkpoints"), 4);
        assert_eq!(count("sturdy.idempotency_keys"), 1);
        for (sql, state) in [
            ("SELECT * FROM sturdy.sweep('0 s')", "22023"),
            ("SELECT * FROM sturdy.sweep('1 day', 0)", "22023"),
            ("SELECT * FROM sturdy.sweep(NULL)", "22004"),
        ] {
            assert_eq!(sqlstate_of(sql), state, "{sql}");
        }
    }

    /// `sample` keeps what the dashboard shows with history; `sweep`
    /// trims it.
    #[pg_test]
    fn sample_records_queues_subscriptions_jobs_statuses_and_signals_and_sweep_trims_it() {
        Spi::run(
            "SELECT sturdy.schedule('s' || i, now() - interval '1 minute' + i * interval '1 second', 'sq')
               FROM generate_series(1, 5) i;
             SELECT count(*) FROM sturdy.take('sq', '1 minute', 2);
             SELECT sturdy.start('ship', 'order-1');",
        )
        .unwrap();
        let sample = || {
            Spi::get_one::<i32>("SELECT sturdy.sample()")
                .unwrap()
                .unwrap()
        };
        let written = sample();
        let figure = |kind: &str, name: &str, f: &str| {
            text(&format!(
                "SELECT figures->>'{f}' FROM sturdy.samples WHERE kind = '{kind}' AND name = '{name}'
                  ORDER BY sampled_at DESC LIMIT 1"
            ))
        };
        assert_eq!(figure("queue", "sq", "ready").as_deref(), Some("3"));
        assert_eq!(figure("queue", "sq", "leased").as_deref(), Some("2"));
        assert_eq!(figure("queue", "sq", "ended"), None, "no sample before it");
        assert_eq!(
            figure("instances", "pending", "count").as_deref(),
            Some("1")
        );
        assert_eq!(figure("instances", "stuck", "count").as_deref(), Some("0"));
        assert_eq!(
            figure("health", "lapsed leases", "ok").as_deref(),
            Some("true")
        );
        assert_eq!(count("sturdy.samples"), i64::from(written));
        assert_eq!(sample(), 0, "one sample a transaction");
        // a minute later: two rows done, one new; the queue `ship` emptied
        Spi::run(
            "UPDATE sturdy.samples SET sampled_at = sampled_at - interval '1 minute';
             DELETE FROM sturdy.queue WHERE workflow IN ('s1', 's4') OR queue = 'ship';
             SELECT sturdy.schedule('s9', now(), 'sq');",
        )
        .unwrap();
        sample();
        assert_eq!(figure("queue", "sq", "ended").as_deref(), Some("2"));
        assert_eq!(figure("queue", "sq", "rows").as_deref(), Some("4"));
        assert_eq!(
            figure("queue", "ship", "rows").as_deref(),
            Some("0"),
            "a queue sampled within the hour and empty now"
        );
        assert_eq!(figure("queue", "ship", "ended").as_deref(), Some("1"));
        // sweep: samples older than a day, or than older_than where shorter
        let swept = |older_than: &str| {
            Spi::get_one::<i64>(&format!(
                "SELECT deleted FROM sturdy.sweep('{older_than}', 1000) WHERE kind = 'samples'"
            ))
            .unwrap()
            .unwrap()
        };
        let first = count("sturdy.samples WHERE sampled_at < now()");
        assert_eq!(swept("7 days"), 0);
        assert_eq!(swept("30 seconds"), first);
        assert!(count("sturdy.samples") > 0);
        Spi::run("UPDATE sturdy.samples SET sampled_at = sampled_at - interval '25 hours'")
            .unwrap();
        let all = count("sturdy.samples");
        assert_eq!(
            Spi::get_one::<i64>(
                "SELECT deleted FROM sturdy.sweep('7 days', 3) WHERE kind = 'samples'"
            )
            .unwrap(),
            Some(3),
            "at most max"
        );
        assert_eq!(swept("7 days"), all - 3);
    }

    #[pg_test]
    fn sweep_removes_outbox_messages_only_when_every_delivery_is_done() {
        Spi::run(
            "CREATE FUNCTION public.sw_ok(m sturdy.outbox, attempt int) RETURNS void LANGUAGE sql AS 'SELECT';
             CREATE FUNCTION public.sw_bad(m sturdy.outbox, attempt int) RETURNS void LANGUAGE plpgsql
               AS $$BEGIN RAISE 'no'; END$$;
             SELECT sturdy.subscribe('done.e', 'public.sw_ok(sturdy.outbox, integer)');
             SELECT sturdy.subscribe('mixed.e', 'public.sw_ok(sturdy.outbox, integer)');
             SELECT sturdy.subscribe('mixed.e', 'public.sw_bad(sturdy.outbox, integer)', 1);
             SELECT sturdy.emit('done.e', '1'); SELECT sturdy.emit('mixed.e', '2');
             SELECT sturdy.emit('done.e', '3');
             SELECT * FROM sturdy.pump(10);
             UPDATE sturdy.outbox SET created_at = now() - interval '8 days' WHERE payload <> '3';",
        )
        .unwrap();
        assert_eq!(
            text("SELECT deleted::text FROM sturdy.sweep('7 days') WHERE kind = 'outbox'")
                .as_deref(),
            Some("1")
        );
        assert_eq!(
            text("SELECT string_agg(payload::text, ',' ORDER BY id) FROM sturdy.outbox").as_deref(),
            Some("2,3"),
            "a dead delivery keeps its message; a recent one stays"
        );
        assert_eq!(count("sturdy.deliveries"), 3);
    }

    /// sturdy.health: each signal flips when its condition appears.
    #[pg_test]
    fn health_flags_what_an_operator_must_look_at() {
        let bad = || {
            text("SELECT string_agg(signal, ',' ORDER BY signal) FROM sturdy.health WHERE NOT ok")
                .unwrap_or_default()
        };
        // the dead tuples the other tests' rolled-back writes left in the
        // statistics are theirs, not this test's
        Spi::run(
            "SELECT pg_stat_reset_single_table_counters(relid) FROM pg_stat_user_tables WHERE schemaname = 'sturdy'",
        )
        .unwrap();
        assert_eq!(bad(), "");
        Spi::run(
            "SELECT sturdy.schedule('h-1', now() - interval '10 minutes', 'hq');
             INSERT INTO sturdy.queue (queue, workflow, visible_at, taken_at, leased_until, takes, scheduled_at)
             VALUES ('hq', 'h-2', now() - interval '2 min', now() - interval '1 min', now() - interval '1 s', 1, now());
             CREATE FUNCTION public.h_fail(m sturdy.outbox, attempt int) RETURNS void LANGUAGE plpgsql
               AS $$BEGIN RAISE 'down'; END$$;
             SELECT sturdy.subscribe('h.e', 'public.h_fail(sturdy.outbox, integer)', 1);
             SELECT sturdy.emit('h.e', '1'); SELECT * FROM sturdy.pump();
             SELECT sturdy.emit('h.e', '2');
             UPDATE sturdy.outbox SET created_at = now() - interval '1 hour' WHERE payload = '2';
             SELECT sturdy.start('h', 'stalled');
             UPDATE sturdy.instances SET updated_at = now() - interval '2 hours';",
        )
        .unwrap();
        assert_eq!(
            bad(),
            "dead deliveries,lapsed leases,oldest pending delivery,oldest ready job,stuck instances"
        );
        assert_eq!(
            text("SELECT value FROM sturdy.health WHERE signal = 'oldest ready job'").as_deref(),
            Some("00:10:00")
        );
    }

    #[pg_test]
    fn workflow_bad_input_gets_a_clear_error_and_writes_nothing() {
        for (sql, state) in [
            ("SELECT sturdy.start('p', 'k', '[1, 2]')", "22023"),
            ("SELECT sturdy.start('p', 'k', '\"s\"')", "22023"),
            ("SELECT sturdy.start('p', 'k', 'null')", "22023"),
            ("SELECT sturdy.start('p', 'k', NULL)", "22004"),
            ("SELECT sturdy.start('', 'k')", "22023"),
            ("SELECT sturdy.start(NULL, 'k')", "22004"),
            ("SELECT sturdy.start('p', '')", "22023"),
            (
                "SELECT sturdy.start('p', 'k', idempotency_key => '')",
                "22023",
            ),
            ("SELECT sturdy.start('p', 'k', queue => '')", "22023"),
            ("SELECT sturdy.start(repeat('p', 1010), 'k')", "22023"),
            ("SELECT sturdy.status('')", "22023"),
            (
                "SELECT sturdy.finish('w', 1, now(), status => 'over')",
                "22023",
            ),
            ("SELECT sturdy.finish('w', NULL, now())", "22004"),
            ("SELECT sturdy.finish('w', 1, NULL)", "22004"),
        ] {
            assert_eq!(sqlstate_of(sql), state, "{sql}");
        }
        assert!(
            error_of("SELECT sturdy.start('p', 'k', '[1, 2]')")
                .contains("variables must be a JSON object, got a JSON array")
        );
        assert_eq!(count("sturdy.instances"), 0);
        assert_eq!(count("sturdy.queue"), 0);
        assert_eq!(count("sturdy.idempotency_keys"), 0);
    }
}
