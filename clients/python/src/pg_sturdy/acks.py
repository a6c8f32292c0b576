"""Acknowledgements sent together: a worker that takes jobs with
`take(max => n)` and ends each one on its own hands each job's `done` to an
`AsyncAcks`, which sends what has gathered as one `done_many` (one
statement, one commit) while the worker goes on to its next job.

Each job is still acknowledged on its own, by its own receipt: a job whose
row was rescheduled or taken again since its take is not removed, whatever
the others in its flush. Nothing is lost by waiting: a job whose
acknowledgement never reaches the server (the process dies first) is taken
again once its lease runs out, as if its worker had died before `done`.
"""
from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any, Awaitable, Callable

import psycopg

from .calls import Receipt
from .client import AsyncSturdy

# the largest batch done_many accepts (docs/reference.md, done_many)
MAX_BATCH = 10_000


class AsyncAcks:
    """Gathers `done(workflow, receipt)` calls for `queue` and sends them
    with `done_many`, on `flushers` connections of their own from
    `connect()`: a flush starts as soon as there is something to send and a
    flusher is free, so at a low rate each acknowledgement goes out at once,
    and under load a flush carries what arrived during the last one's
    commit (at most `max_batch`).

    A flush the connection lost is sent again on a new connection (a
    receipt removes its row once, so sending it twice is safe); `removed`
    then also counts the jobs of that flush no longer in the queue, which
    the lost commit removed. A flush the server refuses (anything but a
    lost connection: a privilege, say) is not sent again: `failed` counts
    its jobs and `last_error` says why, and the jobs are taken again once
    their leases run out. `on_removed(n)` is called after each flush with
    the rows it removed.

        async with AsyncAcks(connect, "emails") as acks:
            for job in await s.take("emails", lease, max=16):
                await send(job.input)
                acks.done(job.workflow, job.receipt)
    """

    def __init__(self, connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]], queue: str = "default", *,
                 flushers: int = 2, max_batch: int = 1000, retry: tuple[float, float] = (0.1, 2.0),
                 on_removed: Callable[[int], None] | None = None):
        if flushers < 1:
            raise ValueError("flushers must be at least 1")
        if not 1 <= max_batch <= MAX_BATCH:
            raise ValueError(f"max_batch must be between 1 and {MAX_BATCH}")
        self.connect, self.queue, self.flushers, self.max_batch = connect, queue, flushers, max_batch
        self.retry, self.on_removed = retry, on_removed
        self.removed = 0
        # acknowledgements the server refused (not a lost connection: a
        # privilege, a dropped queue); their jobs are taken again once their
        # leases run out. `last_error` says why.
        self.failed = 0
        self.last_error: BaseException | None = None
        self._pending: list[tuple[str, Receipt | dt.datetime]] = []
        self._ready: asyncio.Event | None = None
        self._in_flight = 0
        self._idle: asyncio.Condition | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False

    async def __aenter__(self) -> "AsyncAcks":
        self.start()
        return self

    async def __aexit__(self, et: Any, *exc: Any) -> None:
        # (leaving on an exception, a cancellation included, does not wait
        # for the server: what was not sent comes back with its lease)
        await self.close(flush=et is None)

    def start(self) -> None:
        """Start the flushers (in the running event loop)."""
        if self._tasks:
            return
        self._ready, self._idle = asyncio.Event(), asyncio.Condition()
        self._tasks = [asyncio.create_task(self._flusher()) for _ in range(self.flushers)]

    @property
    def pending(self) -> int:
        """Acknowledgements not yet committed (queued or in a flush)."""
        return len(self._pending) + self._in_flight

    def done(self, workflow: str, receipt: Receipt | dt.datetime) -> None:
        """Queue one job's acknowledgement; returns at once."""
        if self._ready is None:
            raise RuntimeError("AsyncAcks.done before start() (or `async with`)")
        if self._closing:
            raise RuntimeError("AsyncAcks.done after close()")
        self._pending.append((workflow, receipt))
        self._ready.set()

    async def flush(self) -> None:
        """Wait until every acknowledgement queued so far has committed."""
        if self._idle is None:
            return
        async with self._idle:
            await self._idle.wait_for(lambda: not self._pending and not self._in_flight)

    async def close(self, flush: bool = True) -> None:
        """Send what is queued (unless `flush` is false), then stop the
        flushers."""
        if not self._tasks:
            return
        self._closing = True
        if flush:
            await self.flush()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _flusher(self) -> None:
        assert self._ready is not None and self._idle is not None
        conn: psycopg.AsyncConnection[Any] | None = None
        delay = self.retry[0]
        try:
            while True:
                if not self._pending:
                    self._ready.clear()
                    await self._ready.wait()
                    continue
                batch = self._pending[:self.max_batch]
                del self._pending[:self.max_batch]
                self._in_flight += len(batch)
                lost = False
                while True:
                    try:
                        if conn is None or conn.closed:
                            conn = await self.connect()
                            if not conn.autocommit:
                                await conn.set_autocommit(True)  # (each flush its own commit)
                        n = await self._send(conn, batch, lost)
                        delay = self.retry[0]
                        break
                    except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as e:
                        # no connection, or the commit's fate is unknown:
                        # send it again
                        self.last_error, lost = e, lost or conn is not None
                        if conn is not None:
                            await conn.close()
                        conn = None
                        await asyncio.sleep(delay)
                        delay = min(self.retry[1], delay * 2)
                    except Exception as e:  # noqa: BLE001 - refused: the leases bring the jobs back
                        self.last_error, n = e, 0
                        self.failed += len(batch)
                        break
                self._in_flight -= len(batch)
                self.removed += n
                if self.on_removed is not None:
                    self.on_removed(n)
                async with self._idle:
                    self._idle.notify_all()
        finally:
            if conn is not None:
                await conn.close()

    async def _send(self, conn: psycopg.AsyncConnection[Any], batch: list[tuple[str, Any]], lost: bool) -> int:
        ws, rs = [w for w, _ in batch], [r for _, r in batch]
        s = AsyncSturdy(conn)
        n = await s.done_many(ws, rs, self.queue)
        if not lost:
            return n
        # after a lost commit: the jobs no longer in the queue were removed
        # by it or by this one
        try:
            cur = conn.cursor()
            row = await (await cur.execute(
                "SELECT count(*) FROM unnest(%s::text[]) w"
                " WHERE NOT EXISTS (SELECT FROM sturdy.queue q WHERE q.queue = %s AND q.workflow = w)",
                (ws, self.queue))).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            return n  # (a role that may not read the queue: this flush's count only)
        return int(row[0]) if row else n
