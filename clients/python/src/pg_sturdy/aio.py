"""`AsyncWorker`: the worker for `async def` handlers, on asyncio and
`AsyncSturdy`; its passes end as `Worker`'s do (see `worker`), and the
same things never stop it.

    async def order(p: AsyncPass) -> dict:
        i = await p.instance()
        charge = await p.step("charge", lambda: payments.charge(i.variables["total"]))
        await p.sleep(60)
        return {"charge": charge}

    asyncio.run(AsyncWorker(dsn, "orders", order, concurrency=16, status="succeeded").serve())

Each of `concurrency` tasks has its connection and takes one pass at a
time; a pass's heartbeat is a task beside its handler. A step's function
may be plain or a coroutine function.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import logging
import signal
import time
from typing import Any, Awaitable, Callable, TypeVar

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from .calls import Receipt, Taken
from .client import AsyncSturdy
from .errors import Conflict, Fenced
from .passes import (INSTANCE_SQL, NO_DEADLINE, RESULT_STEP, DoNotRetry, Instance, Json, PassBase, RetryAfter,
                     Waiting, WaitTimeout, encode)
from .worker import Backoff, WorkerFailed, code_of, connection_defaults, describe

T = TypeVar("T")
log = logging.getLogger("pg_sturdy.worker")


async def _now(conn: psycopg.AsyncConnection[Any]) -> dt.datetime:
    cur = conn.cursor(row_factory=tuple_row)
    row = await (await cur.execute("SELECT now()")).fetchone()
    assert row is not None
    return row[0]


class AsyncPass(PassBase):
    """One pass, for an `async def` handler: the steps are coroutines."""

    def __init__(self, sturdy: AsyncSturdy, queue: str, workflow: str, receipt: Receipt, token: int | None,
                 attempt: int, json_: Json | None = None, input: Any = None):
        super().__init__(queue, workflow, receipt, token, attempt, json_ or Json(), input)
        self.sturdy = sturdy
        self._alock = asyncio.Lock()

    @property
    def conn(self) -> psycopg.AsyncConnection[Any]:
        return self.sturdy.conn

    async def instance(self) -> Instance | None:
        """The instance this pass runs, read once (one statement); None
        for a workflow of your own."""
        if self._instance is False:
            cur = self.conn.cursor(row_factory=tuple_row)
            row = await (await cur.execute(INSTANCE_SQL, (self.workflow,))).fetchone()
            self._instance = Instance(*row) if row else None
        return self._instance  # type: ignore[return-value]

    async def _checkpoints(self) -> dict[str, Any]:
        if self._steps is None:
            self._steps = {c.step: c.value for c in await self.sturdy.load(self.workflow)}
        return self._steps

    async def step(self, name: str, fn: Callable[[], T | Awaitable[T]]) -> T:
        """As `Pass.step`; `fn` may return an awaitable."""
        steps = await self._checkpoints()
        if name in steps:
            return steps[name]
        token = self._token()
        out = fn()
        value = self.json.dumps(await out if inspect.isawaitable(out) else out, f"step {name!r}'s result")
        recorded = await self.sturdy.record(self.workflow, name, value, token)
        steps[name] = recorded.value
        return recorded.value

    async def transact(self, name: str, effect: str, arg: Any = None) -> Any:
        """As `Pass.transact`."""
        steps = await self._checkpoints()
        if name in steps:
            return steps[name]
        sent = None if arg is None else self.json.dumps(arg, f"step {name!r}'s argument")
        value = await self.sturdy.transact(self.workflow, self._token(), name, effect, sent)
        steps[name] = value
        return value

    async def wait_for(self, name: str, *, until: dt.datetime | None = None,
                       within: dt.timedelta | None = None) -> Any:
        """As `Pass.wait_for`."""
        steps = await self._checkpoints()
        if name not in steps:
            steps.update({c.step: c.value for c in await self.sturdy.load(self.workflow)})
        if name in steps:
            return steps[name]
        deadline = until
        if deadline is None and within is not None:
            now = await _now(self.conn)
            deadline = dt.datetime.fromisoformat(await self.step(f"{name}.deadline",
                                                                 lambda: self._deadline(now, within)))
        now = await _now(self.conn)
        if deadline is None:
            raise Waiting(now + NO_DEADLINE)
        if now >= deadline:
            raise WaitTimeout(f"{self.workflow}: no {name!r} by {deadline.isoformat()}")
        raise Waiting(deadline)

    async def sleep(self, duration: dt.timedelta | float, *, name: str | None = None) -> None:
        """As `Pass.sleep`."""
        key = self._sleep_name(name)
        now = await _now(self.conn)
        end = dt.datetime.fromisoformat(await self.step(key, lambda: self._deadline(now, duration)))
        if await _now(self.conn) < end:
            raise Waiting(end)

    async def _end(self, how: Callable[[], Awaitable[Any]]) -> bool:
        async with self._alock:
            if self._ended:
                return False
            await how()
            self._ended = True
            return True


class AsyncWorker:
    """Runs `await handler(p: AsyncPass)` on passes taken from `queue`,
    `concurrency` at a time. The options are `Worker`'s."""

    def __init__(self, dsn: str, queue: str, handler: Callable[[AsyncPass], Awaitable[Any]], *,
                 concurrency: int = 1, lease: dt.timedelta = dt.timedelta(seconds=30), claim: bool = True,
                 listen: bool = True, poll: tuple[float, float] = (0.05, 1.0), status: str | None = None,
                 prepare: bool = False, drain: float = 30.0, connect_timeout: float = 10.0,
                 backoff: tuple[float, float] = (0.1, 30.0), give_up: float | None = 300.0,
                 encoder: Callable[[Any], Any] | None = encode):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lease <= dt.timedelta(0):
            raise ValueError("lease must be positive")
        self.dsn, self.queue, self.handler = dsn, queue, handler
        self.concurrency, self.lease, self.claim, self.listen = concurrency, lease, claim, listen
        self.poll, self.status, self.prepare, self.drain = poll, status, prepare, drain
        self.connect_timeout, self.backoff, self.give_up = connect_timeout, backoff, give_up
        self.json = Json(encoder)
        self._passes: set[AsyncPass] = set()
        self._served = time.monotonic()
        self.last_error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._abandon: asyncio.Event | None = None

    async def connect(self) -> psycopg.AsyncConnection[Any]:
        extra = connection_defaults(self.dsn, self.queue)
        return await psycopg.AsyncConnection.connect(make_conninfo(self.dsn, **extra), autocommit=True,
                                                     connect_timeout=max(1, round(self.connect_timeout)),
                                                     prepare_threshold=5 if self.prepare else None)

    def run(self) -> None:
        """`asyncio.run(self.serve())`."""
        asyncio.run(self.serve())

    def stop(self) -> None:
        """Take nothing more; a second call hands passes back at once."""
        if self._stop is None or self._abandon is None:
            return
        if self._stop.is_set():
            self._abandon.set()
        self._stop.set()

    async def serve(self, *, install_signals: bool = True) -> None:
        """Serve until `stop()` (or SIGTERM/SIGINT), drain, hand back what
        is left, return; `WorkerFailed` where it cannot serve."""
        self._stop, self._abandon = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, self.stop)
        self._served = time.monotonic()
        tasks = [asyncio.create_task(self._loop(), name=f"sturdy-{self.queue}-{i}") for i in range(self.concurrency)]
        failed: WorkerFailed | None = None
        try:
            while not self._stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 0.2)
                for i, t in enumerate(tasks):
                    if t.done() and not self._stop.is_set():
                        log.warning("worker task %s ended; starting it again", t.get_name())
                        tasks[i] = asyncio.create_task(self._loop(), name=t.get_name())
                if self.give_up is not None and time.monotonic() - self._served > self.give_up:
                    failed = WorkerFailed(f"no take for {self.give_up:g} s: {self.last_error!r}")
                    self._stop.set()
                    self._abandon.set()
            deadline = time.monotonic() + (0 if failed else self.drain)
            while self._passes and not self._abandon.is_set() and time.monotonic() < deadline:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._abandon.wait(), 0.05)
            # the handlers still running are cancelled first, so a pass
            # handed back is taken again only once its handler is gone
            left = list(self._passes)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for p in left:
                await self._hand_back(p)
        finally:
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    with contextlib.suppress(NotImplementedError, RuntimeError):
                        loop.remove_signal_handler(sig)
        if failed is not None:
            raise failed from self.last_error

    async def _hand_back(self, p: AsyncPass, delay: dt.timedelta = dt.timedelta(0)) -> None:
        try:
            async with await self.connect() as conn:
                s = AsyncSturdy(conn)

                async def back() -> None:
                    await s.wake_at(p.workflow, p.receipt, await _now(conn) + delay, self.queue)
                    if p.token is not None:
                        await s.release(p.workflow, p.token)

                if await p._end(back):
                    log.warning("%s handed back", p.workflow)
        except Exception as e:  # noqa: BLE001 - its lease runs out instead
            log.warning("could not hand %s back: %s", p.workflow, e)

    async def _loop(self) -> None:
        assert self._stop is not None
        backoff = Backoff(*self.backoff)
        while not self._stop.is_set():
            try:
                async with await self.connect() as conn:
                    s = AsyncSturdy(conn, prepare=self.prepare)
                    if self.listen:
                        await conn.execute("LISTEN sturdy")
                    idle = self.poll[0]
                    while not self._stop.is_set():
                        taken = await s.take(self.queue, self.lease, 1, self.claim, self.listen)
                        self._served = time.monotonic()
                        backoff.reset()
                        if not taken:
                            await self._idle(conn, idle)
                            idle = min(idle * 2, self.poll[1])
                            continue
                        idle = self.poll[0]
                        await self._pass(s, taken[0])
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # noqa: BLE001 - the task goes on serving
                if self._stop.is_set():
                    return
                self.last_error = e
                log.warning("worker connection: %s; connecting again", e, exc_info=not isinstance(
                    e, psycopg.OperationalError))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), backoff.next())

    async def _idle(self, conn: psycopg.AsyncConnection[Any], seconds: float) -> None:
        assert self._stop is not None
        if not self.listen:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), seconds)
            return
        async for _ in conn.notifies(timeout=self.poll[1], stop_after=1):
            pass

    async def _beat(self, p: AsyncPass) -> None:
        """Every third of the lease, `extend` and `renew` on a connection
        of the heartbeat's own, until cancelled."""
        every = self.lease.total_seconds() / 3
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            while True:
                await asyncio.sleep(every)
                try:
                    if conn is None or conn.closed:
                        conn = await self.connect()
                    s = AsyncSturdy(conn)
                    async with p._alock:
                        if p._ended:
                            return
                        receipt = await s.extend(p.workflow, p.receipt, self.lease, self.queue)
                        if receipt is None:
                            return
                        p.receipt = receipt
                        if p.token is not None:
                            await s.renew(p.workflow, p.token, self.lease)
                except Exception as e:  # noqa: BLE001 - the next beat tries again
                    log.warning("heartbeat of %s: %s", p.workflow, e)
                    if conn is not None:
                        await conn.close()
                        conn = None
        finally:
            if conn is not None:
                await conn.close()

    async def _pass(self, s: AsyncSturdy, t: Taken) -> None:
        assert self._stop is not None
        p = AsyncPass(s, self.queue, t.workflow, t.receipt, t.token, t.attempt, self.json, t.input)
        if self.claim and t.token is None:
            await s.wake_at(p.workflow, p.receipt, await _now(s.conn) + min(self.lease, dt.timedelta(seconds=1)),
                            self.queue)
            return
        self._passes.add(p)
        try:
            if self._stop.is_set():
                await self._hand_back(p)
                return
            beat = asyncio.create_task(self._beat(p))
            outcome: BaseException | None = None
            try:
                p.result = await self.handler(p)
                if p.result is not None:
                    p.result = self.json.dumps(p.result, "the handler's result")
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # noqa: BLE001 - every way a handler ends ends the pass
                outcome = e
            finally:
                beat.cancel()
                await asyncio.gather(beat, return_exceptions=True)
            if s.conn.info.transaction_status != TransactionStatus.IDLE:
                await s.conn.rollback()
            await self._conclude(p, s, outcome)
        except Fenced:
            p._ended = True
        except psycopg.OperationalError:
            await self._hand_back(p)
            raise
        except Exception as e:  # noqa: BLE001 - a pass that cannot be ended goes back
            log.error("could not end %s; handing it back", p.workflow, exc_info=e)
            self.last_error = e
            await self._hand_back(p, self.lease)
        finally:
            self._passes.discard(p)

    async def _conclude(self, p: AsyncPass, s: AsyncSturdy, outcome: BaseException | None) -> None:
        token = p.token
        if outcome is None:
            status = p.status or self.status
            if token is None:
                await p._end(lambda: s.done(p.workflow, p.receipt, self.queue))
                return
            result = p.result
            try:
                await p._end(lambda: s.finish(p.workflow, token, p.receipt, step=None if result is None
                                              else RESULT_STEP, value=result, status=status, queue=self.queue))
            except Conflict:
                log.warning("%s: its instance already ended; the pass ends without moving it", p.workflow)
                await p._end(lambda: s.finish(p.workflow, token, p.receipt, queue=self.queue))
            return
        if isinstance(outcome, Fenced):
            p._ended = True
            return
        if isinstance(outcome, Waiting):
            at = outcome.at

            async def sleep() -> None:
                await s.wake_at(p.workflow, p.receipt, at, self.queue)
                if token is not None:
                    await s.release(p.workflow, token)

            await p._end(sleep)
            return
        text, code = describe(outcome), code_of(outcome)
        log.error("%s failed on attempt %d", p.workflow, p.attempt, exc_info=outcome)
        if isinstance(outcome, (DoNotRetry, WaitTimeout)) and token is not None:
            async def give_up() -> None:
                if await p.instance() is not None:
                    await s.finish(p.workflow, token, p.receipt, status="failed", queue=self.queue, error=text)
                else:
                    await s.finish(p.workflow, token, p.receipt, step="$error",
                                   value={"error": text, "code": code}, queue=self.queue)
            try:
                await p._end(give_up)
            except Conflict:
                await p._end(lambda: s.finish(p.workflow, token, p.receipt, queue=self.queue))
            return
        retry_at = outcome.at(await _now(s.conn)) if isinstance(outcome, RetryAfter) else None
        try:
            await p._end(lambda: s.fail(p.workflow, p.receipt, text, self.queue, retry_at=retry_at, code=code))
        except (psycopg.DataError, UnicodeError):
            await p._end(lambda: s.fail(p.workflow, p.receipt, f"{type(outcome).__name__} (message not stored)",
                                        self.queue, retry_at=retry_at, code=code))
