"""`Sturdy` and `AsyncSturdy`: every SQL function of the extension as a
method on a psycopg connection, sync and async.

A call runs in the connection's current transaction (or commits by itself
on a connection in autocommit mode), so `record` and the application's own
writes commit or roll back together. Statements are not prepared unless
asked (`prepare=True`): behind PgBouncer in transaction mode a prepared
statement may not be on the next server connection.

The calls are described once (`_Calls`, each a builder of `calls`), and
each class makes them its methods: plain ones on `Sturdy`, coroutines on
`AsyncSturdy`, with the builder's signature and docstring.
"""
from __future__ import annotations

import inspect
import types
from typing import Any, Callable, Coroutine, Generic, NoReturn, ParamSpec, TypeVar, overload

import psycopg
from psycopg.rows import tuple_row

from . import calls
from .calls import Statement
from .errors import translate

P = ParamSpec("P")
R = TypeVar("R")


class _Call(Generic[P, R]):
    """One call of the extension: a method that builds its statement and
    runs it with the class's `run` (a coroutine method where `run` is
    one)."""

    def __init__(self, build: Callable[P, Statement[R]]):
        self.build = build
        self.name = build.__name__
        self._methods: dict[type, Callable[..., Any]] = {}

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def method(self, owner: type) -> Callable[..., Any]:
        """The function the class `owner` has for this call: its signature
        the builder's with `self` first, its docstring the builder's."""
        found = self._methods.get(owner)
        if found is not None:
            return found
        build = self.build
        if inspect.iscoroutinefunction(owner.run):
            async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
                return await self.run(build(*args, **kwargs))
        else:
            def method(self: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                return self.run(build(*args, **kwargs))
        sig = inspect.signature(build)
        returns = sig.return_annotation
        if isinstance(returns, str) and returns.startswith("Statement[") and returns.endswith("]"):
            returns = returns[len("Statement["):-1]
        self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        method.__signature__ = sig.replace(parameters=[self_param, *sig.parameters.values()],  # type: ignore[attr-defined]
                                           return_annotation=returns)
        method.__name__ = self.name
        method.__qualname__ = f"{owner.__name__}.{self.name}"
        method.__doc__ = build.__doc__
        method.__module__ = owner.__module__
        self._methods[owner] = method
        return method

    @overload
    def __get__(self, obj: None, owner: type) -> Callable[..., Any]: ...

    @overload
    def __get__(self, obj: "Sturdy", owner: type) -> Callable[P, R]: ...

    @overload
    def __get__(self, obj: "AsyncSturdy", owner: type) -> Callable[P, Coroutine[Any, Any, R]]: ...

    def __get__(self, obj: Any, owner: type) -> Any:
        method = self.method(owner)
        if obj is None:
            return method
        bound = types.MethodType(method, obj)
        # (kept on the instance: the next look-up finds it there)
        obj.__dict__[self.name] = bound
        return bound


def wrapped(cls: type) -> dict[str, Callable[..., Statement[Any]]]:
    """The calls a class wraps, by method name (a test checks them against
    the catalog: `redrive` is two functions, told apart by their arguments,
    and two methods here, `redrive` and `redrive_workflow`)."""
    return {name: m.build for klass in cls.__mro__ for name, m in vars(klass).items() if isinstance(m, _Call)}


class _Calls:
    """Every call of the extension, for `Sturdy` and `AsyncSturdy` alike."""

    claim = _Call(calls.claim)
    renew = _Call(calls.renew)
    release = _Call(calls.release)
    fence = _Call(calls.fence)
    record = _Call(calls.record)
    load = _Call(calls.load)
    supply = _Call(calls.supply)
    transact = _Call(calls.transact)
    schedule = _Call(calls.schedule)
    schedule_many = _Call(calls.schedule_many)
    take = _Call(calls.take)
    done = _Call(calls.done)
    done_many = _Call(calls.done_many)
    wake_at = _Call(calls.wake_at)
    extend = _Call(calls.extend)
    fail = _Call(calls.fail)
    retry_queue = _Call(calls.retry_queue)
    redrive_workflow = _Call(calls.redrive_workflow)
    cancel = _Call(calls.cancel)
    arrive = _Call(calls.arrive)
    limit_queue = _Call(calls.limit_queue)
    pause = _Call(calls.pause)
    resume = _Call(calls.resume)
    subscribe = _Call(calls.subscribe)
    unsubscribe = _Call(calls.unsubscribe)
    emit = _Call(calls.emit)
    pump = _Call(calls.pump)
    redrive = _Call(calls.redrive)
    start = _Call(calls.start)
    status = _Call(calls.status)
    stuck = _Call(calls.stuck)
    transition = _Call(calls.transition)
    finish = _Call(calls.finish)
    watch = _Call(calls.watch)
    sweep = _Call(calls.sweep)
    batch = _Call(calls.batch)
    batch_start = _Call(calls.batch_start)
    batch_tick = _Call(calls.batch_tick)
    batch_all = _Call(calls.batch_all)
    sample = _Call(calls.sample)
    distribute = _Call(calls.distribute)
    workflow_place = _Call(calls.workflow_place)
    queue_changed = _Call(calls.queue_changed)
    queue_backdated = _Call(calls.queue_backdated)
    queue_node = _Call(calls.queue_node)
    grant_usage = _Call(calls.grant_usage)
    queue_stats = _Call(calls.queue_stats)
    health = _Call(calls.health)


def _raise_translated(e: psycopg.Error) -> NoReturn:
    mapped = translate(e)
    if mapped is e:
        raise e
    raise mapped from e


class Sturdy(_Calls):
    """pg_sturdy's functions on a psycopg connection."""

    def __init__(self, conn: psycopg.Connection[Any], *, prepare: bool = False):
        self.conn = conn
        self.prepare: bool | None = True if prepare else False
        # one cursor for every call, making tuples whatever the connection's
        # row factory (a pool may hand out connections that make dicts)
        self._cursor = conn.cursor(row_factory=tuple_row)

    def run(self, stmt: Statement[R]) -> R:
        """Run one built call (`calls`) and read its result."""
        cur = self._cursor
        try:
            cur.execute(stmt.sql, stmt.params, prepare=self.prepare)
            # (the result's field count, not `description`, which builds a
            # column object per field on every call)
            res = cur.pgresult
            rows = cur.fetchall() if res is not None and res.nfields else []
        except psycopg.Error as e:
            _raise_translated(e)
        return stmt.read(rows)


class AsyncSturdy(_Calls):
    """pg_sturdy's functions on a psycopg async connection: each a
    coroutine."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], *, prepare: bool = False):
        self.conn = conn
        self.prepare: bool | None = True if prepare else False
        self._cursor = conn.cursor(row_factory=tuple_row)

    async def run(self, stmt: Statement[R]) -> R:
        """Run one built call (`calls`) and read its result."""
        cur = self._cursor
        try:
            await cur.execute(stmt.sql, stmt.params, prepare=self.prepare)
            res = cur.pgresult
            rows = await cur.fetchall() if res is not None and res.nfields else []
        except psycopg.Error as e:
            _raise_translated(e)
        return stmt.read(rows)
