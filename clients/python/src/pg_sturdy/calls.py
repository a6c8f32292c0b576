"""One builder per SQL function of the extension: the statement that calls
it and how its rows become Python values (named tuples: a worker builds
several a pass, and they are the cheapest to make). `Sturdy` and `AsyncSturdy`
(`client.py`) run them on a connection; each builder's signature is the
SQL function's, with its defaults.

An argument left at None is not sent: the function's own default applies
(for the optional arguments whose default is NULL, the same thing). Every
argument is cast to its declared type in the statement, so each call
resolves to one function whatever the driver sends (`redrive(delivery)`
and `redrive(workflow, queue)` included).

Receipts are kept as the server's text: `receipt::text` out, `::timestamptz`
in, so the value `done` compares is the one `take` wrote, to the
microsecond, in any session time zone.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Callable, Generic, NamedTuple, Sequence, TypeVar

from psycopg.types.json import Jsonb

R = TypeVar("R")

Interval = dt.timedelta | str
Receipt = str


class Statement(NamedTuple, Generic[R]):
    """A call: its SQL, its parameters, and how its rows are read."""

    sql: str
    params: tuple[Any, ...]
    read: Callable[[list[tuple[Any, ...]]], R]


class Taken(NamedTuple):
    workflow: str
    receipt: Receipt
    token: int | None
    attempt: int
    input: Any = None


class Recorded(NamedTuple):
    value: Any
    first: bool


class Checkpoint(NamedTuple):
    step: str
    value: Any
    recorded_at: dt.datetime


class Emitted(NamedTuple):
    outbox: int
    deliveries: int


class Pumped(NamedTuple):
    seen: int
    delivered: int
    retrying: int
    dead_letter: int


class Chunk(NamedTuple):
    done: int
    remaining: int
    seconds: float
    complete: bool


class BatchRun(NamedTuple):
    done: int
    remaining: int
    chunks: int
    complete: bool


class Status(NamedTuple):
    id: int
    process: str
    workflow: str
    status: str
    revision: int
    step: str | None
    last_error: str | None
    updated_at: dt.datetime


class Stuck(NamedTuple):
    id: int
    process: str
    business_key: str
    workflow: str
    status: str
    stalled_since: dt.datetime


class Node(NamedTuple):
    host: str
    port: int


class QueueStats(NamedTuple):
    queue: str
    ready: int
    leased: int
    sleeping: int
    oldest_ready_age: dt.timedelta | None
    paused: bool
    running: int | None
    per_key: int | None
    per_second: float | None
    burst: int | None
    held_back: int
    failing: int
    dead: int


class Signal(NamedTuple):
    signal: str
    value: str | None
    ok: bool
    meaning: str


# The SQL of each call by the arguments it sends: a worker's calls send the
# same ones every time, and building the text is a share of what the client
# adds to a call.
_SQL: dict[tuple[Any, ...], str] = {}


def _call(name: str, *args: tuple[str, str, Any], shape: str = "scalar", columns: str = "*",
          required: int = 0) -> tuple[str, tuple[Any, ...]]:
    """The SQL of `sturdy.<name>(...)`: the first `required` arguments
    always sent, in order; the rest by name, only where given."""
    given = tuple(i < required or value is not None for i, (_, _, value) in enumerate(args))
    params = tuple(Jsonb(value) if cast == "jsonb" and value is not None and not isinstance(value, Jsonb) else value
                   for (_, cast, value), sent in zip(args, given) if sent)
    key = (name, shape, columns, required, given)
    sql = _SQL.get(key)
    if sql is None:
        sent = [f"%s::{cast}" if i < required else f"{arg} => %s::{cast}"
                for i, ((arg, cast, _), g) in enumerate(zip(args, given)) if g]
        call = f"sturdy.{name}({', '.join(sent)})"
        sql = {"scalar": f"SELECT {call}", "call": f"CALL {call}"}.get(shape, f"SELECT {columns} FROM {call}")
        _SQL[key] = sql
    return sql, params


def _json(value: Any) -> Jsonb:
    """A jsonb argument (None: JSON null), or one already made."""
    return value if isinstance(value, Jsonb) else Jsonb(value)


def _scalar(rows: list[tuple[Any, ...]]) -> Any:
    return rows[0][0] if rows else None


def _none(rows: list[tuple[Any, ...]]) -> None:
    return None


def _one(cls: type[R]) -> Callable[[list[tuple[Any, ...]]], R | None]:
    return lambda rows: cls(*rows[0]) if rows else None


def _all(cls: type[R]) -> Callable[[list[tuple[Any, ...]]], list[R]]:
    return lambda rows: [cls(*r) for r in rows]


def _statement(read: Callable[[list[tuple[Any, ...]]], R], sql_params: tuple[str, tuple[Any, ...]]) -> Statement[R]:
    return Statement(sql_params[0], sql_params[1], read)


# Claims and checkpoints

def claim(workflow: str, lease: Interval | None = None, owner: str | None = None) -> Statement[int | None]:
    """`sturdy.claim`: Take the workflow if nobody holds it (never claimed, released, or lease
    lapsed). Returns the new fencing token, higher than every earlier one, or NULL when someone
    else holds it."""
    return _statement(_scalar, _call("claim", ("workflow", "text", workflow), ("lease", "interval", lease),
                                     ("owner", "text", owner), required=1))


def renew(workflow: str, token: int, lease: Interval) -> Statement[dt.datetime | None]:
    """`sturdy.renew`: Extend a live claim to now() + lease. Returns the new expiry, or NULL when
    the token is no longer current or its lease already lapsed."""
    return _statement(_scalar, _call("renew", ("workflow", "text", workflow), ("token", "bigint", token),
                                     ("lease", "interval", lease), required=3))


def release(workflow: str, token: int) -> Statement[bool]:
    """`sturdy.release`: Hand a live claim back early, keeping its token so the next claim gets the
    next number. True when this call let go of a live claim."""
    return _statement(_scalar, _call("release", ("workflow", "text", workflow), ("token", "bigint", token),
                                     required=2))


def fence(workflow: str, token: int) -> Statement[None]:
    """`sturdy.fence`: Lock the claim row (FOR UPDATE) and raise SD001 unless token is the current
    one: the first statement of a hand-written exactly-once transaction."""
    return _statement(_none, _call("fence", ("workflow", "text", workflow), ("token", "bigint", token),
                                   required=2))


def record(workflow: str, step: str, value: Any, token: int) -> Statement[Recorded]:
    """`sturdy.record`: Fenced first-writer-wins checkpoint: the value stored after the call and
    whether this call stored it. Raises SD001 when token is not the current claim."""
    return _statement(_one(Recorded), _call("record", ("workflow", "text", workflow), ("step", "text", step),
                                            ("value", "jsonb", _json(value)), ("token", "bigint", token),
                                            shape="table", required=4))


def load(workflow: str) -> Statement[list[Checkpoint]]:
    """`sturdy.load`: A workflow's recorded steps, oldest first."""
    return _statement(_all(Checkpoint), _call("load", ("workflow", "text", workflow), shape="table", required=1))


def supply(workflow: str, step: str, value: Any) -> Statement[Any]:
    """`sturdy.supply`: Unfenced first-writer-wins checkpoint for a value from outside any pass (an
    approval, a webhook). Returns the value stored after the call."""
    return _statement(_scalar, _call("supply", ("workflow", "text", workflow), ("step", "text", step),
                                     ("value", "jsonb", _json(value)), required=3))


def transact(workflow: str, token: int, step: str, effect: str, arg: Any = None) -> Statement[Any]:
    """`sturdy.transact`: Exactly-once in-database effect: fence, return the step if recorded, else
    call effect(arg) (jsonb -> jsonb, with the caller's rights and search_path) and record its
    result in this transaction. If supply lands the step meanwhile, the effect is rolled back and
    the supplied value returned."""
    return _statement(_scalar, _call("transact", ("workflow", "text", workflow), ("token", "bigint", token),
                                     ("step", "text", step), ("effect", "regprocedure", effect),
                                     ("arg", "jsonb", None if arg is None else _json(arg)), required=4))


# The queue

def schedule(workflow: str, visible_at: dt.datetime | None = None, queue: str | None = None,
             priority: int | None = None, key: str | None = None) -> Statement[None]:
    """`sturdy.schedule`: Make the workflow visible in queue at visible_at (upsert: lands on top of
    a pass in flight, keeping its lease, so the wakeup survives its done; a dead row stays dead;
    'infinity' is refused), at priority (take hands out higher first; 0 or above) and in the
    group key for the queue's per_key limit; a reschedule sets both. When visible now and a take
    found the queue empty since the last notification, NOTIFY sturdy with the queue name,
    delivered at commit."""
    return _statement(_none, _call("schedule", ("workflow", "text", workflow),
                                   ("visible_at", "timestamptz", visible_at), ("queue", "text", queue),
                                   ("priority", "integer", priority), ("key", "text", key), required=1))


def schedule_many(workflows: Sequence[str], inputs: Sequence[Any] | None = None, queue: str | None = None,
                  visible_at: dt.datetime | None = None, priority: int | None = None,
                  keys: Sequence[str | None] | None = None) -> Statement[int]:
    """`sturdy.schedule_many`: `schedule` for a batch in one call, each
    workflow with the input (JSON; None: none) and key at its position of
    `inputs` and `keys`, which `take` hands out with each pass. At most
    10000 a call. Returns how many rows were scheduled."""
    sent = None if inputs is None else [None if v is None else _json(v) for v in inputs]
    return _statement(_scalar, _call("schedule_many", ("workflows", "text[]", list(workflows)),
                                     ("inputs", "jsonb[]", sent), ("queue", "text", queue),
                                     ("visible_at", "timestamptz", visible_at), ("priority", "integer", priority),
                                     ("keys", "text[]", None if keys is None else list(keys)), required=1))


def take(queue: str | None = None, lease: Interval | None = None, max: int | None = None,
         claim: bool | None = None, wake: bool | None = None) -> Statement[list[Taken]]:
    """`sturdy.take`: Lease up to max of the oldest visible rows of queue for lease (FOR UPDATE SKIP
    LOCKED: concurrent takers never share a row). receipt is the lease's end (leased_until),
    which done and wake_at must match. With claim, each workflow is also claimed for the same
    lease (token NULL where someone still holds it). attempt says which attempt this pass is: 1,
    or one more than the passes of the row that failed (fail, retry_queue). Finding nothing marks
    the queue as having a waiter, so the next schedule there notifies; with wake false (a worker
    that polls and cannot LISTEN, as behind PgBouncer in transaction mode) it marks nothing."""
    return _statement(_all(Taken), _call("take", ("queue", "text", queue), ("lease", "interval", lease),
                                         ("max", "integer", max), ("claim", "boolean", claim),
                                         ("wake", "boolean", wake), shape="table",
                                         columns="workflow, receipt::text, token, attempt, input"))


def done(workflow: str, receipt: Receipt | dt.datetime, queue: str | None = None) -> Statement[bool]:
    """`sturdy.done`: Remove the workflow from queue if nothing rescheduled it since take (the
    receipt still matches). False means it was rescheduled: it stays, and will be taken again."""
    return _statement(_scalar, _call("done", ("workflow", "text", workflow), ("receipt", "timestamptz", receipt),
                                     ("queue", "text", queue), required=2))


def done_many(workflows: Sequence[str], receipts: Sequence[Receipt | dt.datetime],
              queue: str | None = None) -> Statement[int]:
    """`sturdy.done_many`: done for a batch in one statement: removes each workflow whose receipt
    (same position) still matches, and returns how many were removed. NULL elements match
    nothing."""
    return _statement(_scalar, _call("done_many", ("workflows", "text[]", list(workflows)),
                                     ("receipts", "timestamptz[]", list(receipts)), ("queue", "text", queue),
                                     required=2))


def wake_at(workflow: str, receipt: Receipt | dt.datetime, at: dt.datetime,
            queue: str | None = None) -> Statement[bool]:
    """`sturdy.wake_at`: Suspend the workflow until at, under the same receipt rule as done (a
    wakeup that landed meanwhile wins). When at is already past, wakes a waiting worker as
    schedule does."""
    return _statement(_scalar, _call("wake_at", ("workflow", "text", workflow),
                                     ("receipt", "timestamptz", receipt), ("at", "timestamptz", at),
                                     ("queue", "text", queue), required=3))


def extend(workflow: str, receipt: Receipt | dt.datetime, lease: Interval,
           queue: str | None = None) -> Statement[Receipt | None]:
    """`sturdy.extend`: Keep a pass's row for lease from now: where the receipt still matches and
    has not passed, the row's lease (and any place a running or per_key limit holds for the pass)
    ends at now() + lease, returned as the pass's new receipt for done, finish, wake_at, fail and
    the next extend. NULL, and nothing written, for a stale receipt, a lease that ran out by the
    clock, or a place of the pass that a take reused meanwhile."""
    sql, params = _call("extend", ("workflow", "text", workflow), ("receipt", "timestamptz", receipt),
                        ("lease", "interval", lease), ("queue", "text", queue), required=3)
    return Statement(sql + "::text", params, _scalar)


def fail(workflow: str, receipt: Receipt | dt.datetime, error: str | None, queue: str | None = None,
         retry_at: dt.datetime | None = None, code: str | None = None) -> Statement[bool]:
    """`sturdy.fail`: The pass failed: under the receipt rule of done, count one more attempt, keep
    error (its first 1000 characters) and code, and make the row visible again at retry_at, or
    after the queue's backoff (retry_queue), or, at its max_attempts, dead (never handed out
    again; its instance failed). The pass is over: the workflow's claim is fenced (the failed
    pass's writes raise SD001; the retry claims at once). False for a stale receipt: nothing
    counted, and the place the receipt held freed, as done frees it."""
    return _statement(_scalar, _call("fail", ("workflow", "text", workflow), ("receipt", "timestamptz", receipt),
                                     ("error", "text", error), ("queue", "text", queue),
                                     ("retry_at", "timestamptz", retry_at), ("code", "text", code), required=3))


def retry_queue(queue: str, max_attempts: int | None = None, backoff: Interval | None = None,
                max_backoff: Interval | None = None, jitter: float | None = None) -> Statement[None]:
    """`sturdy.retry_queue`: Set how the queue retries a failed pass: visible again after backoff
    doubled for each failure before it, at most max_backoff, moved by up to jitter of itself
    either way; dead at max_attempts failures. A NULL argument is its default (25, 1 second, 1
    hour, 0.1), which a queue without a policy has."""
    return _statement(_none, _call("retry_queue", ("queue", "text", queue), ("max_attempts", "integer", max_attempts),
                                   ("backoff", "interval", backoff), ("max_backoff", "interval", max_backoff),
                                   ("jitter", "float8", jitter), required=1))


def redrive_workflow(workflow: str, queue: str) -> Statement[bool]:
    """`redrive(workflow, queue)`: a dead queue row ready again."""
    return _statement(_scalar, _call("redrive", ("workflow", "text", workflow), ("queue", "text", queue),
                                     required=2))


def cancel(workflow: str, queue: str | None = None) -> Statement[bool]:
    """`sturdy.cancel`: Remove the workflow's row from queue, whether waiting, sleeping, failing,
    dead or in a pass, and fence the workflow's claim: any pass still running (its writes raise
    SD001; its done and wake_at answer false) and every place it holds in the queue's limits is
    free at once. False, and nothing done, when there is no such row."""
    return _statement(_scalar, _call("cancel", ("workflow", "text", workflow), ("queue", "text", queue),
                                     required=1))


def arrive(workflow: str, step: str, value: Any, queue: str | None = None) -> Statement[Any]:
    """`sturdy.arrive`: supply the step and schedule the workflow now, in one transaction: a value's
    arrival and the workflow's wakeup commit together. Returns the value stored."""
    return _statement(_scalar, _call("arrive", ("workflow", "text", workflow), ("step", "text", step),
                                     ("value", "jsonb", _json(value)), ("queue", "text", queue), required=3))


def limit_queue(queue: str, running: int | None = None, per_key: int | None = None,
                per_second: float | None = None, burst: int | None = None) -> Statement[None]:
    """`sturdy.limit_queue`: Set the queue's limits; a NULL clears that limit. running (at most
    10000): at most this many of its rows leased at once; per_key (at most 1000): at most this
    many leased at once for one key (schedule's key; rows without one are not limited by it);
    per_second (at most 1000000) with burst (at most 1000000): at most burst takes at once and
    per_second on average (burst defaults to one second's worth). Passes already running count
    against a new limit until they end. A take over a limit hands out fewer rows, never an error."""
    return _statement(_none, _call("limit_queue", ("queue", "text", queue), ("running", "integer", running),
                                   ("per_key", "integer", per_key), ("per_second", "float8", per_second),
                                   ("burst", "integer", burst), required=1))


def pause(queue: str) -> Statement[bool]:
    """`sturdy.pause`: Pause the queue: take hands out nothing from it until resume; schedules,
    wakeups and done go on. False when it was paused already."""
    return _statement(_scalar, _call("pause", ("queue", "text", queue), required=1))


def resume(queue: str) -> Statement[bool]:
    """`sturdy.resume`: Resume a paused queue, and wake its listening workers at commit. False when
    it was not paused."""
    return _statement(_scalar, _call("resume", ("queue", "text", queue), required=1))


# The outbox

def subscribe(event: str, subscriber: str, max_attempts: int | None = None) -> Statement[None]:
    """`sturdy.subscribe`: Deliver every later emit of event to subscriber, a function (message
    sturdy.outbox, attempt integer) whose result is ignored; a delivery that fails max_attempts
    times is dead. Subscribing again changes max_attempts for later emits."""
    return _statement(_none, _call("subscribe", ("event", "text", event), ("subscriber", "regprocedure", subscriber),
                                   ("max_attempts", "integer", max_attempts), required=2))


def unsubscribe(event: str, subscriber: str) -> Statement[bool]:
    """`sturdy.unsubscribe`: Stop creating deliveries of event for subscriber. Deliveries already
    created still go out. False when there was no such subscription."""
    return _statement(_scalar, _call("unsubscribe", ("event", "text", event),
                                     ("subscriber", "regprocedure", subscriber), required=2))


def emit(event: str, payload: Any, aggregate_id: str | None = None) -> Statement[Emitted]:
    """`sturdy.emit`: Write event with payload to the outbox and one pending delivery per
    subscriber, in this transaction. Deliveries with the same aggregate_id go out to each
    subscriber in emit order. When a pump waits, NOTIFY sturdy_outbox with the event name at
    commit."""
    return _statement(_one(Emitted), _call("emit", ("event", "text", event), ("payload", "jsonb", _json(payload)),
                                           ("aggregate_id", "text", aggregate_id), shape="table", required=2))


def pump(max: int | None = None) -> Statement[Pumped]:
    """`sturdy.pump`: Deliver up to max due deliveries (SKIP LOCKED: pumps share the work), each
    subscriber in its own subtransaction, with the caller's rights and search_path. A failure
    rolls back that subscriber's effects, keeps the error and its SQLSTATE, and retries after
    2^attempt seconds, or marks the delivery dead at max_attempts. Per aggregate_id and
    subscriber, in emit order."""
    return _statement(_one(Pumped), _call("pump", ("max", "integer", max), shape="table"))


def redrive(delivery: int) -> Statement[bool]:
    """`redrive(delivery)`: a dead outbox delivery pending again."""
    return _statement(_scalar, _call("redrive", ("delivery", "bigint", delivery), required=1))


# Workflow instances

def start(process: str, business_key: str, variables: Any = None, idempotency_key: str | None = None,
          queue: str | None = None) -> Statement[int]:
    """`sturdy.start`: Start a pending instance of process for business_key and schedule its
    workflow (process/id) on queue (default: the process name), in this transaction. With an
    idempotency_key (per process), a start while the key lives (sturdy.idempotency_ttl) returns
    the first instance's id instead, also when two race."""
    return _statement(_scalar, _call("start", ("process", "text", process), ("business_key", "text", business_key),
                                     ("variables", "jsonb", None if variables is None else _json(variables)),
                                     ("idempotency_key", "text", idempotency_key), ("queue", "text", queue),
                                     required=2))


def status(business_key: str) -> Statement[Status | None]:
    """`sturdy.status`: The newest instance for business_key: its workflow name, status and
    revision, its current step (its newest checkpoint), last error, and last progress (status
    change or checkpoint). No row when there is none."""
    return _statement(_one(Status), _call("status", ("business_key", "text", business_key), shape="table",
                                          required=1))


def stuck(older_than: Interval, max: int | None = None) -> Statement[list[Stuck]]:
    """`sturdy.stuck`: Pending or running instances with no progress (no status change, no
    checkpoint of any kind) for older_than, longest stalled first; the first max of them when max
    is given (NULL: all)."""
    return _statement(_all(Stuck), _call("stuck", ("older_than", "interval", older_than), ("max", "integer", max),
                                         shape="table", required=1))


def transition(id: int, from_status: str, to_status: str, expected_revision: int | None = None,
               token: int | None = None, error: str | None = None) -> Statement[bool]:
    """`sturdy.transition`: Move instance id from from_status to to_status (and from
    expected_revision, when given), adding one to its revision and keeping error as its last
    error when given. False when refused: another status or revision, a terminal status (never
    left), or no such instance. With a token, fenced like record: a stale token raises SD001."""
    return _statement(_scalar, _call("transition", ("id", "bigint", id), ("from_status", "text", from_status),
                                     ("to_status", "text", to_status), ("expected_revision", "bigint", expected_revision),
                                     ("token", "bigint", token), ("error", "text", error), required=3))


def finish(workflow: str, token: int, receipt: Receipt | dt.datetime, step: str | None = None, value: Any = None,
           status: str | None = None, queue: str | None = None, error: str | None = None) -> Statement[bool]:
    """`sturdy.finish`: End a pass in one call: fenced like record (a stale token raises SD001 and
    nothing happens), record step = value when given, move the workflow's instance to status when
    given (SD002 from a terminal status), release the claim, and remove the queue row under
    done's receipt rule, whose answer it returns (false: a wakeup arrived during the pass and the
    row stays)."""
    return _statement(_scalar, _call("finish", ("workflow", "text", workflow), ("token", "bigint", token),
                                     ("receipt", "timestamptz", receipt), ("step", "text", step),
                                     ("value", "jsonb", None if step is None else _json(value)),
                                     ("status", "text", status), ("queue", "text", queue), ("error", "text", error),
                                     required=3))


def sweep(older_than: Interval | None = None, max: int | None = None) -> Statement[dict[str, int]]:
    """`sturdy.sweep`: Delete one bounded batch: at most max instances finished before now() -
    older_than with their checkpoints, claims and queue rows (skipping any a live pass holds), at
    most max outbox messages that old whose deliveries are all done, at most max expired
    idempotency keys, the free per_key places of at most max keys with no row left in their
    queue, at most max leases run out with no take to meet them counted as failed passes (lapsed:
    among the first max ready rows of each queue), at most max dead queue rows that died before
    now() - older_than, and at most max of the dashboard's samples older than a day (or than
    older_than, where shorter). Counts per kind; call it again (pg_cron) until the counts are
    zero."""
    return _statement(lambda rows: dict(rows), _call("sweep", ("older_than", "interval", older_than),
                                                     ("max", "integer", max), shape="table"))


# Batch chunks

def batch(target: str, set_clause: str, pending: str, args: Sequence[str] | None = None, chunk: int | None = None,
          key: str | None = None, order_by: str | None = None) -> Statement[Chunk]:
    """`sturdy.batch`: One chunk: UPDATE target SET set_clause on up to chunk rows where pending
    holds, pending re-checked on each row as updated; each call goes on after the last key of the
    one before. set_clause, pending and order_by are caller-written SQL (never build them from
    request data), run with your rights and search_path; $1..$n in them are bound from args.
    remaining is exact at the start and end of a pass, carried forward between; complete only on
    an exact zero."""
    return _statement(_one(Chunk), _call("batch", ("target", "regclass", target), ("set_clause", "text", set_clause),
                                         ("pending", "text", pending),
                                         ("args", "text[]", None if args is None else list(args)),
                                         ("chunk", "integer", chunk), ("key", "name", key), ("order_by", "text", order_by),
                                         shape="table", required=3))


def batch_start(name: str, target: str, set_clause: str, pending: str, args: Sequence[str] | None = None,
                chunk: int | None = None, key: str | None = None, order_by: str | None = None,
                target_seconds: float | None = None) -> Statement[None]:
    """`sturdy.batch_start`: Register a named batch job for sturdy.batch_tick (e.g. from pg_cron),
    checked as batch checks its arguments. chunk is the first chunk's size; each tick then sizes
    the next from the measured rate to take target_seconds (default: a fifth of
    statement_timeout, or 1 s without one)."""
    return _statement(_none, _call("batch_start", ("name", "text", name), ("target", "regclass", target),
                                   ("set_clause", "text", set_clause), ("pending", "text", pending),
                                   ("args", "text[]", None if args is None else list(args)),
                                   ("chunk", "integer", chunk), ("key", "name", key), ("order_by", "text", order_by),
                                   ("target_seconds", "float8", target_seconds), required=4))


def batch_tick(name: str) -> Statement[Chunk]:
    """`sturdy.batch_tick`: Run one chunk of the named job and size the next from its measured rate.
    A finished job does nothing (complete); a job another tick is running returns at once with
    nothing done."""
    return _statement(_one(Chunk), _call("batch_tick", ("name", "text", name), shape="table", required=1))


def batch_all(target: str, set_clause: str, pending: str, args: Sequence[str] | None = None,
              chunk: int | None = None, key: str | None = None, order_by: str | None = None,
              budget: Interval | None = None) -> Statement[BatchRun]:
    """A procedure that commits each chunk: run it on a connection in
    autocommit mode (no transaction of the caller's around it)."""
    return _statement(_one(BatchRun), _call("batch_all", ("target", "regclass", target),
                                            ("set_clause", "text", set_clause), ("pending", "text", pending),
                                            ("args", "text[]", None if args is None else list(args)),
                                            ("chunk", "integer", chunk), ("key", "name", key),
                                            ("order_by", "text", order_by), ("budget", "interval", budget),
                                            shape="call", required=3))


# Operations

def sample() -> Statement[int]:
    """`sturdy.sample`: Record the dashboard's history: one row in sturdy.samples per queue (and per
    queue sampled within the hour that is empty now), per outbox subscription, per named batch
    job running or finished within the hour, per instance status (and stuck) and per
    sturdy.health signal; returns how many. Call it once a minute (pg_cron, or sturdy-ui does);
    sweep trims the history."""
    return _statement(_scalar, _call("sample"))


def distribute(workflows_with_queues: bool | None = None) -> Statement[None]:
    """`sturdy.distribute`: On a Citus coordinator, after CREATE EXTENSION pg_sturdy on every node:
    distribute the queue's tables by queue, and claims and checkpoints with queues (by
    sturdy.workflow_place(workflow): workflow orders/77 on the node of queue orders, so a pass is
    one node's) or, with workflows_with_queues => false, by the whole workflow name (the per-
    workflow claim and checkpoint calls then delegated to its node); the rest stay on the
    coordinator. queue_changed and queue_backdated are delegated to the node that holds the
    queue. Idempotent; 55000 when asked for the other placement than the one made. 0A000 without
    Citus. See docs/scale-out.md."""
    return _statement(_none, _call("distribute", ("workflows_with_queues", "boolean", workflows_with_queues)))


def workflow_place(workflow: str) -> Statement[str]:
    """`sturdy.workflow_place`: The value the workflow's claim and checkpoints are placed by under
    Citus, distributed with queues (sturdy.distribute()): its name up to the first /, or the
    whole name where it has none or starts with one. orders/77 is kept on the node of queue
    orders. The same on every server."""
    return _statement(_scalar, _call("workflow_place", ("workflow", "text", workflow), required=1))


def queue_node(queue: str) -> Statement[Node | None]:
    """`sturdy.queue_node`: Under Citus, after sturdy.distribute(): the node (host and port, as
    Citus knows it) that holds the queue's shard, where a worker's take and done on that queue
    cost what they cost on one server. No row on one server or before distribute(): call where
    you are. See docs/scale-out.md."""
    return _statement(_one(Node), _call("queue_node", ("queue", "text", queue), shape="table", required=1))


def queue_changed(queue: str) -> Statement[None]:
    """`sturdy.queue_changed`: Under Citus: the queue's limits, its pause or its prioritized rows
    changed, so this node's sessions read them again at their next take. limit_queue, pause,
    resume and a prioritized schedule call it on the node that holds the queue
    (sturdy.distribute() delegates it there); a call of your own only costs the next takes a
    read."""
    return _statement(_none, _call("queue_changed", ("queue", "text", queue), required=1))


def queue_backdated(queue: str) -> Statement[None]:
    """`sturdy.queue_backdated`: Under Citus: a row of the queue was made ready before now (a past-
    dated schedule, wake_at or retry, a redrive), so this node's takes of the queue look from its
    start at their next take, not from where they stood. Those calls make it on the node that
    holds the queue (sturdy.distribute() delegates it there); a call of your own only costs the
    next takes a scan from the start."""
    return _statement(_none, _call("queue_backdated", ("queue", "text", queue), required=1))


def grant_usage(role: str) -> Statement[None]:
    """`sturdy.grant_usage`: Grant a role what an application needs to call every pg_sturdy function
    (schema usage, the tables, execute). Run as the extension owner; call again after ALTER
    EXTENSION UPDATE."""
    return _statement(_none, _call("grant_usage", ("role", "name", role), required=1))


def queue_stats() -> Statement[list[QueueStats]]:
    """The view `sturdy.queue_stats`, one row per queue."""
    return Statement("SELECT queue, ready, leased, sleeping, oldest_ready_age, paused, running, per_key,"
                     " per_second, burst, held_back, failing, dead FROM sturdy.queue_stats ORDER BY queue",
                     (), _all(QueueStats))


def health() -> Statement[list[Signal]]:
    """The view `sturdy.health`: each signal, its value, and whether it is ok."""
    return Statement("SELECT signal, value, ok, meaning FROM sturdy.health", (), _all(Signal))


class Watched(NamedTuple):
    status: str
    revision: int
    last_error: str | None


def watch(id: int) -> Statement[Watched | None]:
    """`watch(id)`: the instance's status now, and its end announced by
    `NOTIFY sturdy_instance, '<id>'` (LISTEN first)."""
    return _statement(_one(Watched), _call("watch", ("id", "bigint", id), shape="table", required=1))
