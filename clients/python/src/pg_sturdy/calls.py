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
    return _statement(_scalar, _call("claim", ("workflow", "text", workflow), ("lease", "interval", lease),
                                     ("owner", "text", owner), required=1))


def renew(workflow: str, token: int, lease: Interval) -> Statement[dt.datetime | None]:
    return _statement(_scalar, _call("renew", ("workflow", "text", workflow), ("token", "bigint", token),
                                     ("lease", "interval", lease), required=3))


def release(workflow: str, token: int) -> Statement[bool]:
    return _statement(_scalar, _call("release", ("workflow", "text", workflow), ("token", "bigint", token),
                                     required=2))


def fence(workflow: str, token: int) -> Statement[None]:
    return _statement(_none, _call("fence", ("workflow", "text", workflow), ("token", "bigint", token),
                                   required=2))


def record(workflow: str, step: str, value: Any, token: int) -> Statement[Recorded]:
    return _statement(_one(Recorded), _call("record", ("workflow", "text", workflow), ("step", "text", step),
                                            ("value", "jsonb", Jsonb(value)), ("token", "bigint", token),
                                            shape="table", required=4))


def load(workflow: str) -> Statement[list[Checkpoint]]:
    return _statement(_all(Checkpoint), _call("load", ("workflow", "text", workflow), shape="table", required=1))


def supply(workflow: str, step: str, value: Any) -> Statement[Any]:
    return _statement(_scalar, _call("supply", ("workflow", "text", workflow), ("step", "text", step),
                                     ("value", "jsonb", Jsonb(value)), required=3))


def transact(workflow: str, token: int, step: str, effect: str, arg: Any = None) -> Statement[Any]:
    return _statement(_scalar, _call("transact", ("workflow", "text", workflow), ("token", "bigint", token),
                                     ("step", "text", step), ("effect", "regprocedure", effect),
                                     ("arg", "jsonb", None if arg is None else Jsonb(arg)), required=4))


# The queue

def schedule(workflow: str, visible_at: dt.datetime | None = None, queue: str | None = None,
             priority: int | None = None, key: str | None = None) -> Statement[None]:
    return _statement(_none, _call("schedule", ("workflow", "text", workflow),
                                   ("visible_at", "timestamptz", visible_at), ("queue", "text", queue),
                                   ("priority", "integer", priority), ("key", "text", key), required=1))


def take(queue: str | None = None, lease: Interval | None = None, max: int | None = None,
         claim: bool | None = None, wake: bool | None = None) -> Statement[list[Taken]]:
    return _statement(_all(Taken), _call("take", ("queue", "text", queue), ("lease", "interval", lease),
                                         ("max", "integer", max), ("claim", "boolean", claim),
                                         ("wake", "boolean", wake), shape="table",
                                         columns="workflow, receipt::text, token, attempt"))


def done(workflow: str, receipt: Receipt | dt.datetime, queue: str | None = None) -> Statement[bool]:
    return _statement(_scalar, _call("done", ("workflow", "text", workflow), ("receipt", "timestamptz", receipt),
                                     ("queue", "text", queue), required=2))


def done_many(workflows: Sequence[str], receipts: Sequence[Receipt | dt.datetime],
              queue: str | None = None) -> Statement[int]:
    return _statement(_scalar, _call("done_many", ("workflows", "text[]", list(workflows)),
                                     ("receipts", "timestamptz[]", list(receipts)), ("queue", "text", queue),
                                     required=2))


def wake_at(workflow: str, receipt: Receipt | dt.datetime, at: dt.datetime,
            queue: str | None = None) -> Statement[bool]:
    return _statement(_scalar, _call("wake_at", ("workflow", "text", workflow),
                                     ("receipt", "timestamptz", receipt), ("at", "timestamptz", at),
                                     ("queue", "text", queue), required=3))


def extend(workflow: str, receipt: Receipt | dt.datetime, lease: Interval,
           queue: str | None = None) -> Statement[Receipt | None]:
    sql, params = _call("extend", ("workflow", "text", workflow), ("receipt", "timestamptz", receipt),
                        ("lease", "interval", lease), ("queue", "text", queue), required=3)
    return Statement(sql + "::text", params, _scalar)


def fail(workflow: str, receipt: Receipt | dt.datetime, error: str | None, queue: str | None = None,
         retry_at: dt.datetime | None = None, code: str | None = None) -> Statement[bool]:
    return _statement(_scalar, _call("fail", ("workflow", "text", workflow), ("receipt", "timestamptz", receipt),
                                     ("error", "text", error), ("queue", "text", queue),
                                     ("retry_at", "timestamptz", retry_at), ("code", "text", code), required=3))


def retry_queue(queue: str, max_attempts: int | None = None, backoff: Interval | None = None,
                max_backoff: Interval | None = None, jitter: float | None = None) -> Statement[None]:
    return _statement(_none, _call("retry_queue", ("queue", "text", queue), ("max_attempts", "integer", max_attempts),
                                   ("backoff", "interval", backoff), ("max_backoff", "interval", max_backoff),
                                   ("jitter", "float8", jitter), required=1))


def redrive_workflow(workflow: str, queue: str) -> Statement[bool]:
    """`redrive(workflow, queue)`: a dead queue row ready again."""
    return _statement(_scalar, _call("redrive", ("workflow", "text", workflow), ("queue", "text", queue),
                                     required=2))


def cancel(workflow: str, queue: str | None = None) -> Statement[bool]:
    return _statement(_scalar, _call("cancel", ("workflow", "text", workflow), ("queue", "text", queue),
                                     required=1))


def arrive(workflow: str, step: str, value: Any, queue: str | None = None) -> Statement[Any]:
    return _statement(_scalar, _call("arrive", ("workflow", "text", workflow), ("step", "text", step),
                                     ("value", "jsonb", Jsonb(value)), ("queue", "text", queue), required=3))


def limit_queue(queue: str, running: int | None = None, per_key: int | None = None,
                per_second: float | None = None, burst: int | None = None) -> Statement[None]:
    return _statement(_none, _call("limit_queue", ("queue", "text", queue), ("running", "integer", running),
                                   ("per_key", "integer", per_key), ("per_second", "float8", per_second),
                                   ("burst", "integer", burst), required=1))


def pause(queue: str) -> Statement[bool]:
    return _statement(_scalar, _call("pause", ("queue", "text", queue), required=1))


def resume(queue: str) -> Statement[bool]:
    return _statement(_scalar, _call("resume", ("queue", "text", queue), required=1))


# The outbox

def subscribe(event: str, subscriber: str, max_attempts: int | None = None) -> Statement[None]:
    return _statement(_none, _call("subscribe", ("event", "text", event), ("subscriber", "regprocedure", subscriber),
                                   ("max_attempts", "integer", max_attempts), required=2))


def unsubscribe(event: str, subscriber: str) -> Statement[bool]:
    return _statement(_scalar, _call("unsubscribe", ("event", "text", event),
                                     ("subscriber", "regprocedure", subscriber), required=2))


def emit(event: str, payload: Any, aggregate_id: str | None = None) -> Statement[Emitted]:
    return _statement(_one(Emitted), _call("emit", ("event", "text", event), ("payload", "jsonb", Jsonb(payload)),
                                           ("aggregate_id", "text", aggregate_id), shape="table", required=2))


def pump(max: int | None = None) -> Statement[Pumped]:
    return _statement(_one(Pumped), _call("pump", ("max", "integer", max), shape="table"))


def redrive(delivery: int) -> Statement[bool]:
    """`redrive(delivery)`: a dead outbox delivery pending again."""
    return _statement(_scalar, _call("redrive", ("delivery", "bigint", delivery), required=1))


# Workflow instances

def start(process: str, business_key: str, variables: Any = None, idempotency_key: str | None = None,
          queue: str | None = None) -> Statement[int]:
    return _statement(_scalar, _call("start", ("process", "text", process), ("business_key", "text", business_key),
                                     ("variables", "jsonb", None if variables is None else Jsonb(variables)),
                                     ("idempotency_key", "text", idempotency_key), ("queue", "text", queue),
                                     required=2))


def status(business_key: str) -> Statement[Status | None]:
    return _statement(_one(Status), _call("status", ("business_key", "text", business_key), shape="table",
                                          required=1))


def stuck(older_than: Interval, max: int | None = None) -> Statement[list[Stuck]]:
    return _statement(_all(Stuck), _call("stuck", ("older_than", "interval", older_than), ("max", "integer", max),
                                         shape="table", required=1))


def transition(id: int, from_status: str, to_status: str, expected_revision: int | None = None,
               token: int | None = None, error: str | None = None) -> Statement[bool]:
    return _statement(_scalar, _call("transition", ("id", "bigint", id), ("from_status", "text", from_status),
                                     ("to_status", "text", to_status), ("expected_revision", "bigint", expected_revision),
                                     ("token", "bigint", token), ("error", "text", error), required=3))


def finish(workflow: str, token: int, receipt: Receipt | dt.datetime, step: str | None = None, value: Any = None,
           status: str | None = None, queue: str | None = None, error: str | None = None) -> Statement[bool]:
    return _statement(_scalar, _call("finish", ("workflow", "text", workflow), ("token", "bigint", token),
                                     ("receipt", "timestamptz", receipt), ("step", "text", step),
                                     ("value", "jsonb", None if step is None else Jsonb(value)),
                                     ("status", "text", status), ("queue", "text", queue), ("error", "text", error),
                                     required=3))


def sweep(older_than: Interval | None = None, max: int | None = None) -> Statement[dict[str, int]]:
    return _statement(lambda rows: dict(rows), _call("sweep", ("older_than", "interval", older_than),
                                                     ("max", "integer", max), shape="table"))


# Batch chunks

def batch(target: str, set_clause: str, pending: str, args: Sequence[str] | None = None, chunk: int | None = None,
          key: str | None = None, order_by: str | None = None) -> Statement[Chunk]:
    return _statement(_one(Chunk), _call("batch", ("target", "regclass", target), ("set_clause", "text", set_clause),
                                         ("pending", "text", pending),
                                         ("args", "text[]", None if args is None else list(args)),
                                         ("chunk", "integer", chunk), ("key", "name", key), ("order_by", "text", order_by),
                                         shape="table", required=3))


def batch_start(name: str, target: str, set_clause: str, pending: str, args: Sequence[str] | None = None,
                chunk: int | None = None, key: str | None = None, order_by: str | None = None,
                target_seconds: float | None = None) -> Statement[None]:
    return _statement(_none, _call("batch_start", ("name", "text", name), ("target", "regclass", target),
                                   ("set_clause", "text", set_clause), ("pending", "text", pending),
                                   ("args", "text[]", None if args is None else list(args)),
                                   ("chunk", "integer", chunk), ("key", "name", key), ("order_by", "text", order_by),
                                   ("target_seconds", "float8", target_seconds), required=4))


def batch_tick(name: str) -> Statement[Chunk]:
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
    return _statement(_scalar, _call("sample"))


def distribute(workflows_with_queues: bool | None = None) -> Statement[None]:
    return _statement(_none, _call("distribute", ("workflows_with_queues", "boolean", workflows_with_queues)))


def workflow_place(workflow: str) -> Statement[str]:
    return _statement(_scalar, _call("workflow_place", ("workflow", "text", workflow), required=1))


def queue_node(queue: str) -> Statement[Node | None]:
    return _statement(_one(Node), _call("queue_node", ("queue", "text", queue), shape="table", required=1))


def queue_changed(queue: str) -> Statement[None]:
    return _statement(_none, _call("queue_changed", ("queue", "text", queue), required=1))


def queue_backdated(queue: str) -> Statement[None]:
    return _statement(_none, _call("queue_backdated", ("queue", "text", queue), required=1))


def grant_usage(role: str) -> Statement[None]:
    return _statement(_none, _call("grant_usage", ("role", "name", role), required=1))


def queue_stats() -> Statement[list[QueueStats]]:
    """The view `sturdy.queue_stats`, one row per queue."""
    return Statement("SELECT queue, ready, leased, sleeping, oldest_ready_age, paused, running, per_key,"
                     " per_second, burst, held_back, failing, dead FROM sturdy.queue_stats ORDER BY queue",
                     (), _all(QueueStats))


def health() -> Statement[list[Signal]]:
    """The view `sturdy.health`: each signal, its value, and whether it is ok."""
    return Statement("SELECT signal, value, ok, meaning FROM sturdy.health", (), _all(Signal))
