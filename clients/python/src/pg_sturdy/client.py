"""`Sturdy` and `AsyncSturdy`: every SQL function of the extension as a
method on a psycopg connection, sync and async.

A call runs in the connection's current transaction (or commits by itself
on a connection in autocommit mode), so `record` and the application's own
writes commit or roll back together. Statements are not prepared unless
asked (`prepare=True`): behind PgBouncer in transaction mode a prepared
statement may not be on the next server connection.
"""
from __future__ import annotations

from typing import Any, Callable, Generic, ParamSpec, TypeVar, overload

import psycopg
from psycopg.rows import tuple_row

from . import calls
from .calls import Statement
from .errors import translate

P = ParamSpec("P")
R = TypeVar("R")


class _Sync(Generic[P, R]):
    """A method that builds a call's statement and runs it."""

    def __init__(self, build: Callable[P, Statement[R]]):
        self.build = build
        self.name = build.__name__
        self.__doc__ = build.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> "_Sync[P, R]": ...

    @overload
    def __get__(self, obj: "Sturdy", owner: type) -> Callable[P, R]: ...

    def __get__(self, obj: "Sturdy | None", owner: type) -> "Callable[P, R] | _Sync[P, R]":
        if obj is None:
            return self
        build = self.build

        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            return obj.run(build(*args, **kwargs))

        call.__name__ = build.__name__
        call.__doc__ = build.__doc__
        # (kept on the instance: the next look-up finds it there)
        obj.__dict__[self.name] = call
        return call


class _Async(Generic[P, R]):
    """A coroutine method that builds a call's statement and runs it."""

    def __init__(self, build: Callable[P, Statement[R]]):
        self.build = build
        self.name = build.__name__
        self.__doc__ = build.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> "_Async[P, R]": ...

    @overload
    def __get__(self, obj: "AsyncSturdy", owner: type) -> Callable[P, Any]: ...

    def __get__(self, obj: "AsyncSturdy | None", owner: type) -> Any:
        if obj is None:
            return self
        build = self.build

        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            return await obj.run(build(*args, **kwargs))

        call.__name__ = build.__name__
        call.__doc__ = build.__doc__
        obj.__dict__[self.name] = call
        return call


def wrapped(cls: type) -> dict[str, Callable[..., Statement[Any]]]:
    """The calls a class wraps, by method name (a test checks them against
    the catalog: `redrive` is two functions, told apart by their arguments,
    and two methods here, `redrive` and `redrive_workflow`)."""
    return {name: m.build for name, m in vars(cls).items() if isinstance(m, (_Sync, _Async))}


class Sturdy:
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
            rows = cur.fetchall() if cur.description else []
        except psycopg.Error as e:
            mapped = translate(e)
            if mapped is e:
                raise
            raise mapped from e
        return stmt.read(rows)

    claim = _Sync(calls.claim)
    renew = _Sync(calls.renew)
    release = _Sync(calls.release)
    fence = _Sync(calls.fence)
    record = _Sync(calls.record)
    load = _Sync(calls.load)
    supply = _Sync(calls.supply)
    transact = _Sync(calls.transact)
    schedule = _Sync(calls.schedule)
    take = _Sync(calls.take)
    done = _Sync(calls.done)
    done_many = _Sync(calls.done_many)
    wake_at = _Sync(calls.wake_at)
    extend = _Sync(calls.extend)
    fail = _Sync(calls.fail)
    retry_queue = _Sync(calls.retry_queue)
    redrive_workflow = _Sync(calls.redrive_workflow)
    cancel = _Sync(calls.cancel)
    arrive = _Sync(calls.arrive)
    limit_queue = _Sync(calls.limit_queue)
    pause = _Sync(calls.pause)
    resume = _Sync(calls.resume)
    subscribe = _Sync(calls.subscribe)
    unsubscribe = _Sync(calls.unsubscribe)
    emit = _Sync(calls.emit)
    pump = _Sync(calls.pump)
    redrive = _Sync(calls.redrive)
    start = _Sync(calls.start)
    status = _Sync(calls.status)
    stuck = _Sync(calls.stuck)
    transition = _Sync(calls.transition)
    finish = _Sync(calls.finish)
    sweep = _Sync(calls.sweep)
    batch = _Sync(calls.batch)
    batch_start = _Sync(calls.batch_start)
    batch_tick = _Sync(calls.batch_tick)
    batch_all = _Sync(calls.batch_all)
    sample = _Sync(calls.sample)
    distribute = _Sync(calls.distribute)
    workflow_place = _Sync(calls.workflow_place)
    queue_changed = _Sync(calls.queue_changed)
    queue_backdated = _Sync(calls.queue_backdated)
    queue_node = _Sync(calls.queue_node)
    grant_usage = _Sync(calls.grant_usage)
    queue_stats = _Sync(calls.queue_stats)
    health = _Sync(calls.health)


class AsyncSturdy:
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
            rows = await cur.fetchall() if cur.description else []
        except psycopg.Error as e:
            mapped = translate(e)
            if mapped is e:
                raise
            raise mapped from e
        return stmt.read(rows)

    claim = _Async(calls.claim)
    renew = _Async(calls.renew)
    release = _Async(calls.release)
    fence = _Async(calls.fence)
    record = _Async(calls.record)
    load = _Async(calls.load)
    supply = _Async(calls.supply)
    transact = _Async(calls.transact)
    schedule = _Async(calls.schedule)
    take = _Async(calls.take)
    done = _Async(calls.done)
    done_many = _Async(calls.done_many)
    wake_at = _Async(calls.wake_at)
    extend = _Async(calls.extend)
    fail = _Async(calls.fail)
    retry_queue = _Async(calls.retry_queue)
    redrive_workflow = _Async(calls.redrive_workflow)
    cancel = _Async(calls.cancel)
    arrive = _Async(calls.arrive)
    limit_queue = _Async(calls.limit_queue)
    pause = _Async(calls.pause)
    resume = _Async(calls.resume)
    subscribe = _Async(calls.subscribe)
    unsubscribe = _Async(calls.unsubscribe)
    emit = _Async(calls.emit)
    pump = _Async(calls.pump)
    redrive = _Async(calls.redrive)
    start = _Async(calls.start)
    status = _Async(calls.status)
    stuck = _Async(calls.stuck)
    transition = _Async(calls.transition)
    finish = _Async(calls.finish)
    sweep = _Async(calls.sweep)
    batch = _Async(calls.batch)
    batch_start = _Async(calls.batch_start)
    batch_tick = _Async(calls.batch_tick)
    batch_all = _Async(calls.batch_all)
    sample = _Async(calls.sample)
    distribute = _Async(calls.distribute)
    workflow_place = _Async(calls.workflow_place)
    queue_changed = _Async(calls.queue_changed)
    queue_backdated = _Async(calls.queue_backdated)
    queue_node = _Async(calls.queue_node)
    grant_usage = _Async(calls.grant_usage)
    queue_stats = _Async(calls.queue_stats)
    health = _Async(calls.health)
