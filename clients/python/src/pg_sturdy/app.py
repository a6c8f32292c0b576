"""The task model: an `App` registers one handler per process, starts
workflows and hands back a `Handle` on each; its worker dispatches every
pass of its queue to the process's handler.

    app = App(dsn, queue="orders")

    @app.workflow("order")
    def order(p: Pass) -> dict:
        charge = p.step("charge", lambda: payments.charge(p.variables["total"]))
        p.sleep(timedelta(hours=1))
        return {"charge": charge}

    handle = app.start("order", "order-77", {"total": 120})
    handle.result(timeout=30)          # {'charge': ...}, or WorkflowFailed
    app.worker(concurrency=8).run()    # (or: python -m pg_sturdy worker mymodule:app)

A handler's return value is recorded with the pass's end (`finish`, the
checkpoint `$result`), in the commit that moves the instance to
`succeeded`. `Handle.result()` waits on the server's notification of the
instance's end (`sturdy.watch`): no polling, four statements however long
it waits.
"""
from __future__ import annotations

import datetime as dt
import inspect
import time
from typing import Any, Callable, Generic, TypeVar

import psycopg
from psycopg.rows import tuple_row

from .client import AsyncSturdy, Sturdy
from .errors import MissingObject, SturdyError
from .passes import RESULT_STEP, process_of

H = TypeVar("H", bound=Callable[..., Any])
PassT = TypeVar("PassT")

TERMINAL = ("succeeded", "failed", "cancelled")


class WorkflowFailed(SturdyError):
    """The instance ended `failed` (its handler raised past its retries, or
    `DoNotRetry`); the message is its last error."""


class WorkflowCancelled(SturdyError):
    """The instance ended `cancelled`."""


class NoHandler(LookupError):
    """A pass of a process no handler is registered for (a newer worker's,
    say): the pass fails and the queue's policy retries it later."""


def _outcome(id: int, status: str, last_error: str | None, value: Any) -> Any:
    if status == "succeeded":
        return value
    if status == "failed":
        raise WorkflowFailed(f"instance {id} failed: {last_error}")
    raise WorkflowCancelled(f"instance {id} was cancelled")


_RESULT_SQL = "SELECT value FROM sturdy.load(%s) WHERE step = %s"


class Handle:
    """A started instance: its `id` and `workflow`; `status()` now, and
    `result(timeout)`, waiting for its end."""

    def __init__(self, app: "App", id: int, workflow: str):
        self.app, self.id, self.workflow = app, id, workflow

    def __repr__(self) -> str:
        return f"Handle(id={self.id}, workflow={self.workflow!r})"

    def status(self) -> str:
        """The instance's status: pending, running, succeeded, failed or
        cancelled."""
        with self.app.connect() as conn, conn.cursor(row_factory=tuple_row) as cur:
            row = cur.execute("SELECT status FROM sturdy.instances WHERE id = %s", (self.id,)).fetchone()
        if row is None:
            raise MissingObject(f"no instance {self.id}", "42704")
        return row[0]

    def result(self, timeout: float | dt.timedelta | None = None) -> Any:
        """The handler's return value once the instance succeeded (None
        where it returned None); `WorkflowFailed` or `WorkflowCancelled`
        where it ended otherwise; `TimeoutError` where it has not ended
        within `timeout` seconds (None: wait as long as it takes). Waits on
        `LISTEN sturdy_instance` for the notification its end sends."""
        seconds = timeout.total_seconds() if isinstance(timeout, dt.timedelta) else timeout
        deadline = None if seconds is None else time.monotonic() + seconds
        with self.app.connect() as conn:
            s = Sturdy(conn)
            conn.execute("LISTEN sturdy_instance")
            now = s.watch(self.id)
            if now is None:
                raise MissingObject(f"no instance {self.id}", "42704")
            status, last_error = now.status, now.last_error
            mine = str(self.id)
            while status not in TERMINAL:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise TimeoutError(f"instance {self.id} still {status} after {seconds:g} s")
                if any(n.payload == mine for n in conn.notifies(timeout=wait, stop_after=1)):
                    with conn.cursor(row_factory=tuple_row) as cur:
                        row = cur.execute("SELECT status, last_error FROM sturdy.instances WHERE id = %s",
                                          (self.id,)).fetchone()
                    if row is None:
                        raise MissingObject(f"instance {self.id} was swept away", "42704")
                    status, last_error = row
            value = None
            if status == "succeeded":
                with conn.cursor(row_factory=tuple_row) as cur:
                    row = cur.execute(_RESULT_SQL, (self.workflow, RESULT_STEP)).fetchone()
                value = row[0] if row else None
        return _outcome(self.id, status, last_error, value)


class AsyncHandle(Handle):
    """`Handle` for asyncio: `await handle.result(timeout)`."""

    async def status(self) -> str:  # type: ignore[override]
        async with await self.app.connect_async() as conn:
            cur = conn.cursor(row_factory=tuple_row)
            row = await (await cur.execute("SELECT status FROM sturdy.instances WHERE id = %s",
                                           (self.id,))).fetchone()
        if row is None:
            raise MissingObject(f"no instance {self.id}", "42704")
        return row[0]

    async def result(self, timeout: float | dt.timedelta | None = None) -> Any:  # type: ignore[override]
        seconds = timeout.total_seconds() if isinstance(timeout, dt.timedelta) else timeout
        deadline = None if seconds is None else time.monotonic() + seconds
        async with await self.app.connect_async() as conn:
            s = AsyncSturdy(conn)
            await conn.execute("LISTEN sturdy_instance")
            now = await s.watch(self.id)
            if now is None:
                raise MissingObject(f"no instance {self.id}", "42704")
            status, last_error = now.status, now.last_error
            mine = str(self.id)
            cur = conn.cursor(row_factory=tuple_row)
            while status not in TERMINAL:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise TimeoutError(f"instance {self.id} still {status} after {seconds:g} s")
                heard = False
                async for n in conn.notifies(timeout=wait, stop_after=1):
                    heard = heard or n.payload == mine
                if heard:
                    row = await (await cur.execute("SELECT status, last_error FROM sturdy.instances WHERE id = %s",
                                                   (self.id,))).fetchone()
                    if row is None:
                        raise MissingObject(f"instance {self.id} was swept away", "42704")
                    status, last_error = row
            value = None
            if status == "succeeded":
                row = await (await cur.execute(_RESULT_SQL, (self.workflow, RESULT_STEP))).fetchone()
                value = row[0] if row else None
        return _outcome(self.id, status, last_error, value)


class App(Generic[PassT]):
    """A registry of workflow handlers by process, on one queue.

    `queue`: where `start` schedules and the worker takes (default
    `'default'`). `connect`: how it connects (default: `psycopg.connect(dsn,
    autocommit=True)`)."""

    def __init__(self, dsn: str, *, queue: str = "default",
                 connect: Callable[[], psycopg.Connection[Any]] | None = None):
        self.dsn, self.queue = dsn, queue
        self.handlers: dict[str, Callable[..., Any]] = {}
        self._connect = connect

    def connect(self) -> psycopg.Connection[Any]:
        if self._connect is not None:
            return self._connect()
        return psycopg.connect(self.dsn, autocommit=True)

    async def connect_async(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)

    def workflow(self, process: str) -> Callable[[H], H]:
        """Register the decorated function as the handler of `process`'s
        passes (`def f(p: Pass)`, or `async def` for `AsyncWorker`)."""
        if not process or "/" in process and process.rsplit("/", 1)[1].isdigit():
            raise ValueError(f"process {process!r}: a non-empty name, not ending in /<digits>")

        def register(fn: H) -> H:
            if process in self.handlers:
                raise ValueError(f"process {process!r} already has a handler: {self.handlers[process]!r}")
            self.handlers[process] = fn
            return fn

        return register

    def handler_of(self, workflow: str) -> Callable[..., Any]:
        process = process_of(workflow)
        fn = self.handlers.get(process)
        if fn is None:
            raise NoHandler(f"{workflow}: no handler for process {process!r} on queue {self.queue!r}"
                            f" (registered: {', '.join(sorted(self.handlers)) or 'none'})")
        return fn

    def dispatch(self, p: Any) -> Any:
        """The handler of the pass's process, run on the pass."""
        return self.handler_of(p.workflow)(p)

    async def dispatch_async(self, p: Any) -> Any:
        fn = self.handler_of(p.workflow)
        out = fn(p)
        return await out if inspect.isawaitable(out) else out

    def start(self, process: str, business_key: str, variables: dict[str, Any] | None = None, *,
              idempotency_key: str | None = None, conn: psycopg.Connection[Any] | None = None) -> Handle:
        """`sturdy.start` on the app's queue: the instance, pending, and a
        handle on it. On `conn` where given (in its transaction: the start
        commits with the caller's own writes), else on a connection of its
        own. The process need not have a handler here: the code that
        starts workflows is often not the process that runs them."""
        if conn is not None:
            return self._started(Sturdy(conn), process, business_key, variables, idempotency_key)
        with self.connect() as own:
            return self._started(Sturdy(own), process, business_key, variables, idempotency_key)

    def _started(self, s: Sturdy, process: str, business_key: str, variables: dict[str, Any] | None,
                 idempotency_key: str | None) -> Handle:
        id = s.start(process, business_key, variables, idempotency_key, self.queue)
        return Handle(self, id, f"{process}/{id}")

    async def start_async(self, process: str, business_key: str, variables: dict[str, Any] | None = None, *,
                          idempotency_key: str | None = None) -> AsyncHandle:
        """`start` for asyncio: an `AsyncHandle`."""
        async with await self.connect_async() as conn:
            id = await AsyncSturdy(conn).start(process, business_key, variables, idempotency_key, self.queue)
        return AsyncHandle(self, id, f"{process}/{id}")

    def handle(self, id: int) -> Handle:
        """A handle on an instance started before (by its id)."""
        with self.connect() as conn, conn.cursor(row_factory=tuple_row) as cur:
            row = cur.execute("SELECT workflow FROM sturdy.instances WHERE id = %s", (id,)).fetchone()
        if row is None:
            raise MissingObject(f"no instance {id}", "42704")
        return Handle(self, id, row[0])

    def worker(self, **options: Any) -> Any:
        """The worker of the app's queue: a `Worker` where every handler is
        a plain function, an `AsyncWorker` where any is `async def`; its
        passes finish their instances as `succeeded`. `options` go to the
        worker (`concurrency`, `lease`, `drain`, ...)."""
        from .aio import AsyncWorker
        from .worker import Worker

        options.setdefault("status", "succeeded")
        if any(inspect.iscoroutinefunction(h) for h in self.handlers.values()):
            return AsyncWorker(self.dsn, self.queue, self.dispatch_async, **options)
        return Worker(self.dsn, self.queue, self.dispatch, **options)
