"""A worker: takes passes from a queue and runs a handler on each, with
steps that replay from the workflow's checkpoints.

    def handle(p: Pass) -> None:
        charge = p.step("charge", lambda: payments.charge(p.workflow))
        approval = p.wait_for("approval", within=timedelta(days=2))
        p.step("ship", lambda: shipping.ship(p.workflow, charge, approval))

    Worker(dsn, "orders", handle, concurrency=4).run()

Each pass is taken with a claim (its token fences every write the pass
makes) and ends in one of four ways:

- the handler returns: `finish` (with `status` for a workflow instance);
- it raises `Fenced` (its claim went to another pass, say after a stall):
  the pass is dropped, nothing more written;
- it waits (`wait_for` of a value not there yet): `wake_at` the deadline,
  and its claim released; `arrive` or `supply` of the value schedules the
  workflow at once, and the next pass replays the steps to the wait;
- it raises anything else: `fail` with the exception's text (and its
  SQLSTATE where it has one); the queue's retry policy decides when the
  workflow is taken again, and when it is dead.

While a handler runs, a heartbeat keeps the pass's row (`extend`) and its
claim (`renew`) every third of the lease, so a long pass neither loses its
row to another worker nor counts as failed. On SIGTERM (or `stop()`) the
worker takes nothing more and hands each pass in flight back: `wake_at` now
and its claim released, so another worker takes it at once and replays it
from its checkpoints.

On Citus, `on_queue_node=True` takes and ends the passes on the node that
holds the queue (`sturdy.queue_node`), where they cost what they cost on one
server; the worker still connects to the dsn (the coordinator) to `LISTEN`,
to hand passes back, and to `fail` or `finish` a pass that moves its
instance (the instances are there).

An idle worker sleeps on `LISTEN sturdy` (woken by the `schedule` that makes
a row ready) and looks again at least every `poll[1]` seconds (rows that
become due by the clock send nothing). Behind a pooler that cannot LISTEN,
pass `listen=False`: it polls, from `poll[0]` seconds doubling to
`poll[1]`, back to `poll[0]` once it finds work.
"""
from __future__ import annotations

import datetime as dt
import logging
import re
import signal
import threading
import time
from typing import Any, Callable, TypeVar

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import tuple_row

from .calls import Receipt
from .client import Sturdy
from .errors import Fenced

T = TypeVar("T")
log = logging.getLogger("pg_sturdy.worker")

_SQLSTATE = re.compile(r"^[0-9A-Z]{5}$")

# A worker on the queue's node asks again where the queue is after this many
# seconds (when idle): a shard moved since goes on working through Citus,
# at Citus's cost, until then.
_NODE_AGAIN = 60.0

# A wait with no deadline sleeps this long at most between looks: a value
# that arrives wakes it at once (`arrive` schedules the workflow).
_NO_DEADLINE = dt.timedelta(days=3650)


def _now(conn: psycopg.Connection[Any]) -> dt.datetime:
    """The server's time (a tuple row whatever the connection makes)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


class WaitTimeout(Exception):
    """`wait_for`'s deadline passed with no value."""


class _Waiting(BaseException):
    """Raised by `wait_for` to end the pass until the value or the
    deadline (a BaseException, so a handler's `except Exception` does not
    swallow it)."""

    def __init__(self, at: dt.datetime):
        self.at = at


class Pass:
    """One pass of a workflow: what `take` handed out, and the steps."""

    def __init__(self, sturdy: Sturdy, queue: str, workflow: str, receipt: Receipt, token: int | None,
                 attempt: int):
        self.sturdy = sturdy
        self.queue = queue
        self.workflow = workflow
        self.receipt = receipt
        self.token = token
        self.attempt = attempt
        self.status: str | None = None
        self._lock = threading.Lock()
        self._ended = False
        self._steps: dict[str, Any] | None = None

    @property
    def conn(self) -> psycopg.Connection[Any]:
        """The pass's connection (autocommit): for the handler's own
        statements, and `with p.conn.transaction():` around several."""
        return self.sturdy.conn

    def _checkpoints(self) -> dict[str, Any]:
        if self._steps is None:
            self._steps = {c.step: c.value for c in self.sturdy.load(self.workflow)}
        return self._steps

    def _token(self) -> int:
        if self.token is None:
            raise RuntimeError("steps need the pass's claim: take with claim=True")
        return self.token

    def step(self, name: str, fn: Callable[[], T]) -> T:
        """The step's recorded value where the workflow has it; else run
        `fn` and record its result (JSON) under the pass's token. Two passes
        racing on one step: the first record wins, and the other gets the
        winner's value. A pass whose claim was taken over raises `Fenced`."""
        steps = self._checkpoints()
        if name in steps:
            return steps[name]
        value = fn()
        recorded = self.sturdy.record(self.workflow, name, value, self._token())
        steps[name] = recorded.value
        return recorded.value

    def transact(self, name: str, effect: str, arg: Any = None) -> Any:
        """`transact`: the effect (a function `(jsonb) -> jsonb`, by its
        signature, e.g. `'app.charge(jsonb)'`) runs in the same transaction
        that records its result, once; a replay returns the result."""
        steps = self._checkpoints()
        if name in steps:
            return steps[name]
        value = self.sturdy.transact(self.workflow, self._token(), name, effect, arg)
        steps[name] = value
        return value

    def wait_for(self, name: str, *, until: dt.datetime | None = None,
                 within: dt.timedelta | None = None) -> Any:
        """The value `arrive` or `supply` gave the step `name`; where there
        is none yet, the pass ends here and the workflow sleeps until it
        comes or the deadline (`until`, or `within` from the first time this
        wait was reached, kept as the checkpoint `<name>.deadline`) passes,
        when `WaitTimeout` is raised."""
        steps = self._checkpoints()
        if name in steps:
            return steps[name]
        # (it may have arrived since the checkpoints were read)
        fresh = {c.step: c.value for c in self.sturdy.load(self.workflow)}
        steps.update(fresh)
        if name in steps:
            return steps[name]
        deadline: dt.datetime | None = until
        if deadline is None and within is not None:
            now = _now(self.conn)
            first = self.step(f"{name}.deadline", lambda: (now + within).isoformat())
            deadline = dt.datetime.fromisoformat(first)
        if deadline is not None:
            now = _now(self.conn)
            if now >= deadline:
                raise WaitTimeout(f"{self.workflow}: no {name!r} by {deadline.isoformat()}")
            raise _Waiting(deadline)
        now = _now(self.conn)
        raise _Waiting(now + _NO_DEADLINE)

    def _end(self, how: Callable[[], Any]) -> bool:
        """Run one way of ending the pass, the first one only."""
        with self._lock:
            if self._ended:
                return False
            self._ended = True
            how()
            return True


class Worker:
    """Runs `handler(p: Pass)` on passes taken from `queue`, `concurrency`
    at a time, each thread on its own connection."""

    def __init__(self, dsn: str, queue: str, handler: Callable[[Pass], Any], *, concurrency: int = 1,
                 lease: dt.timedelta = dt.timedelta(seconds=30), claim: bool = True, listen: bool = True,
                 poll: tuple[float, float] = (0.05, 1.0), status: str | None = None, prepare: bool = False,
                 connect: Callable[[], psycopg.Connection[Any]] | None = None, on_queue_node: bool = False):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lease <= dt.timedelta(0):
            raise ValueError("lease must be positive")
        self.dsn, self.queue, self.handler = dsn, queue, handler
        self.concurrency, self.lease, self.claim, self.listen = concurrency, lease, claim, listen
        self.poll, self.status, self.prepare = poll, status, prepare
        self.on_queue_node = on_queue_node
        # the node the last takes went to (on_queue_node), None for the dsn's
        self.node: tuple[str, int] | None = None
        # (no statement prepared unless asked: psycopg's automatic preparing
        # would leave named statements a pooler cannot carry across)
        self._connect = connect or (lambda: psycopg.connect(self.dsn, autocommit=True,
                                                            prepare_threshold=5 if prepare else None))
        self._stop = threading.Event()
        self._passes: set[Pass] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    # Running

    def run(self, *, install_signals: bool = True) -> None:
        """Run until `stop()` (or SIGTERM/SIGINT, where called from the main
        thread), then hand the passes in flight back and return."""
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop())
        self.start()
        while not self._stop.wait(0.2):
            pass
        self.join()

    def start(self) -> None:
        """Start the threads and return (`stop()` ends them)."""
        self._threads = [threading.Thread(target=self._loop, name=f"sturdy-{self.queue}-{i}", daemon=True)
                         for i in range(self.concurrency)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Take nothing more; hand back the passes in flight."""
        self._stop.set()

    def join(self, timeout: float = 3.0) -> None:
        """After `stop()`: hand every pass in flight back, and wait up to
        `timeout` seconds in all for the threads to leave their loops (an
        idle one looks at least every `poll[1]` seconds). A thread still in
        a handler then is not waited for: its pass is back in the queue,
        and it is a daemon thread, so the process can end without it."""
        with self._lock:
            running = list(self._passes)
        for p in running:
            self._hand_back(p)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _hand_back(self, p: Pass) -> None:
        try:
            with self._connect() as conn:
                s = Sturdy(conn, prepare=self.prepare)

                def back() -> None:
                    now = _now(conn)
                    s.wake_at(p.workflow, p.receipt, now, self.queue)
                    if p.token is not None:
                        s.release(p.workflow, p.token)

                p._end(back)
        except psycopg.Error as e:
            log.warning("could not hand %s back: %s", p.workflow, e)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._serve()
            except psycopg.OperationalError as e:
                # the server went away (a restart, a failover): again,
                # on a new connection, once it answers
                if not self._stop.is_set():
                    log.warning("worker connection lost, connecting again: %s", e)
                    self._stop.wait(self.poll[1])
            except BaseException as e:  # noqa: BLE001 - kept for whoever runs the worker
                if not self._stop.is_set():
                    log.exception("worker thread ended")
                    self.errors.append(e)
                return

    def _serve(self) -> None:
        idle = self.poll[0]
        with self._connect() as conn:
            s = Sturdy(conn, prepare=self.prepare)
            beat = _Heartbeat(self)
            if self.listen:
                conn.execute("LISTEN sturdy")
            work, found = self._queue_node(s), time.monotonic()
            try:
                ws = Sturdy(work, prepare=self.prepare) if work is not None else s
                while not self._stop.is_set():
                    taken = ws.take(self.queue, self.lease, 1, self.claim, self.listen)
                    if not taken:
                        self._idle(conn, idle)
                        idle = min(idle * 2, self.poll[1])
                        if work is not None and time.monotonic() - found > _NODE_AGAIN:
                            return  # (connected again: the queue's shard may have moved)
                        continue
                    idle = self.poll[0]
                    self._pass(ws, beat, taken[0], s)
            finally:
                if work is not None:
                    work.close()

    def _queue_node(self, s: Sturdy) -> psycopg.Connection[Any] | None:
        """With `on_queue_node`, a connection to the node that holds the
        queue (`sturdy.queue_node`), where a take and its done cost what
        they cost on one server; None on one server (or not asked)."""
        self.node = None
        if not self.on_queue_node:
            return None
        node = s.queue_node(self.queue)
        if node is None:
            return None
        conn = psycopg.connect(make_conninfo(self.dsn, host=node.host, port=node.port), autocommit=True,
                               prepare_threshold=5 if self.prepare else None)
        self.node = (node.host, node.port)
        return conn

    def _idle(self, conn: psycopg.Connection[Any], seconds: float) -> None:
        if not self.listen:
            self._stop.wait(seconds)
            return
        # woken by a notify, or at the poll ceiling for rows due by the clock
        for _ in conn.notifies(timeout=self.poll[1], stop_after=1):
            pass

    def _pass(self, s: Sturdy, beat: "_Heartbeat", t: Any, home: Sturdy) -> None:
        """One pass on `s`; `home` is the dsn's connection (the coordinator
        where `s` is the queue's node), where `fail` and a `finish` that
        moves the instance go: the instances are on the coordinator."""
        p = Pass(s, self.queue, t.workflow, t.receipt, t.token, t.attempt)
        if self.claim and t.token is None:
            # its claim is held (a pass that outlived its lease, or a claim
            # of the application's): hand the row back rather than let its
            # lease run out, which would count as a failed attempt
            now = _now(s.conn)
            s.wake_at(p.workflow, p.receipt, now + min(self.lease, dt.timedelta(seconds=1)), self.queue)
            return
        with self._lock:
            self._passes.add(p)
        if self._stop.is_set():
            # taken as the worker stopped: back at once (join may be doing
            # it too; the first end wins)
            self._hand_back(p)
            with self._lock:
                self._passes.discard(p)
            return
        beat.arm(p)
        try:
            self.handler(p)
        except Fenced:
            beat.disarm()
            p._end(lambda: None)
        except _Waiting as waiting:
            beat.disarm()
            at = waiting.at

            def sleep() -> None:
                s.wake_at(p.workflow, p.receipt, at, self.queue)
                if p.token is not None:
                    s.release(p.workflow, p.token)

            self._ending(p, sleep)
        except Exception as e:  # the pass failed: the queue's policy decides what next
            beat.disarm()
            code = getattr(e, "sqlstate", None)
            code = code if isinstance(code, str) and _SQLSTATE.match(code) else None
            text = f"{type(e).__name__}: {e}"[:1000]
            self._ending(p, lambda: home.fail(p.workflow, p.receipt, text, self.queue, code=code))
        else:
            beat.disarm()
            # (a pass that moves its instance finishes where the instance is)
            end = home if p.status or self.status else s
            self._ending(p, lambda: end.finish(p.workflow, p.token, p.receipt, status=p.status or self.status,
                                              queue=self.queue) if p.token is not None
                         else end.done(p.workflow, p.receipt, self.queue))
        finally:
            beat.disarm()
            with self._lock:
                self._passes.discard(p)

    def _ending(self, p: Pass, how: Callable[[], Any]) -> None:
        try:
            p._end(how)
        except Fenced:
            pass


class _Heartbeat:
    """Keeps the pass of one worker thread while its handler runs: a third
    of the lease after it began and every third after, `extend` (the row)
    and `renew` (the claim), on a connection of its own (the handler's may
    be in a transaction). One thread for all the passes of its worker
    thread, armed for each: a pass pays two lock operations for it, not a
    thread's start nor a wakeup."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.every = worker.lease.total_seconds() / 3
        self.cv = threading.Condition()
        self.p: Pass | None = None
        self.since = 0.0
        self.beating = False
        self.thread: threading.Thread | None = None

    def arm(self, p: Pass) -> None:
        # (no notify: the thread looks at least every third of the lease, so
        # its first beat for the pass comes within two thirds of it, and a
        # pass costs no wakeup of another thread)
        with self.cv:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True)
                self.thread.start()
            self.p, self.since = p, time.monotonic()

    def disarm(self) -> None:
        """No more beats for the pass, and none under way: its end needs
        the receipt the last beat wrote."""
        with self.cv:
            self.p = None
            while self.beating:
                self.cv.wait()

    def _run(self) -> None:
        conn = None
        try:
            while True:
                with self.cv:
                    while self.p is None or time.monotonic() < self.since + self.every:
                        wait = self.every if self.p is None else self.since + self.every - time.monotonic()
                        self.cv.wait(max(wait, 0.0))
                    p, self.beating = self.p, True
                try:
                    if conn is None or conn.closed:
                        conn = self.worker._connect()
                    self._beat(Sturdy(conn, prepare=self.worker.prepare), p)
                except psycopg.Error as e:
                    log.warning("heartbeat of %s: %s", p.workflow, e)
                    if conn is not None:
                        conn.close()
                        conn = None
                finally:
                    with self.cv:
                        self.beating, self.since = False, time.monotonic()
                        if self.p is p and p._ended:
                            self.p = None
                        self.cv.notify_all()
        finally:
            if conn is not None:
                conn.close()

    def _beat(self, s: Sturdy, p: Pass) -> None:
        with p._lock:
            if p._ended:
                return
            receipt = s.extend(p.workflow, p.receipt, self.worker.lease, self.worker.queue)
            if receipt is None:
                # rescheduled, cancelled or run out: nothing to keep
                with self.cv:
                    if self.p is p:
                        self.p = None
                return
            p.receipt = receipt
            if p.token is not None:
                s.renew(p.workflow, p.token, self.worker.lease)
