"""A worker: takes passes from a queue and runs a handler on each, with
steps that replay from the workflow's checkpoints.

    def handle(p: Pass) -> dict:
        charge = p.step("charge", lambda: payments.charge(p.variables["order"]))
        approval = p.wait_for("approval", within=timedelta(days=2))
        p.step("ship", lambda: shipping.ship(p.workflow, charge, approval))
        return {"charged": charge}

    Worker(dsn, "orders", handle, concurrency=4, status="succeeded").run()

Each pass is taken with a claim (its token fences every write the pass
makes) and ends in one of these ways:

- the handler returns: `finish` (with `status` for a workflow instance),
  its return value, where not None, recorded as the checkpoint `$result`
  in the same commit;
- it raises `Fenced` (its claim went to another pass, say after a stall):
  the pass is dropped, nothing more written;
- it waits (`wait_for` of a value not there yet, `sleep`): `wake_at` the
  deadline, and its claim released; `arrive` or `supply` of the value
  schedules the workflow at once, and the next pass replays the steps;
- it raises `DoNotRetry`, `NotJSON`, or lets a `WaitTimeout` out: the
  workflow ends failed now (an instance `failed`; a workflow of your own
  removed from the queue, the error kept as its `$error` checkpoint);
- it raises `RetryAfter`: `fail` with that retry time;
- it raises anything else (any `BaseException` but the process being
  told to stop): `fail` with the exception's type and text and its SQLSTATE
  where it has one, the traceback logged; the queue's retry policy decides
  when the workflow is taken again, and when it is dead.

Nothing a handler raises, nothing ending a pass raises, and no error of
the server's ends a worker thread: a pass that cannot be failed (its error
text refused, the connection lost) is handed back and logged; a lost
connection is connected again with backoff and jitter. A thread that ends
all the same is started again. `run()` raises `WorkerFailed` (the command
exits 1) when no thread could take for `give_up` seconds.

While a handler runs, a heartbeat keeps the pass's row (`extend`) and its
claim (`renew`) every third of the lease. On SIGTERM (or `stop()`) the
worker takes nothing more and lets the passes in flight finish for up to
`drain` seconds; then it hands back what is left (`wake_at` a second on,
its heartbeat stopped, its claim released) and returns, so the process
ends before another worker takes the pass. A second signal hands back at
once.

On Citus, `on_queue_node=True` takes and ends the passes on the node that
holds the queue (`sturdy.queue_node`); the worker still connects to the dsn
(the coordinator) to `LISTEN`, to hand passes back, and to `fail` or
`finish` a pass that moves its instance (the instances are there).

An idle worker sleeps on `LISTEN sturdy` (woken by the `schedule` that makes
a row ready) and looks again at least every `poll[1]` seconds (rows that
become due by the clock send nothing). Behind a pooler that cannot LISTEN,
pass `listen=False`: it polls, from `poll[0]` seconds doubling to
`poll[1]`, back to `poll[0]` once it finds work.
"""
from __future__ import annotations

import datetime as dt
import inspect
import logging
import random
import re
import signal
import threading
import time
from typing import Any, Callable, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from .calls import Receipt, Taken
from .client import Sturdy
from .errors import Conflict, Fenced
from .passes import (INSTANCE_SQL, NO_DEADLINE, RESULT_STEP, DoNotRetry, Instance, Json, NotJSON, PassBase,
                     RetryAfter, Waiting, WaitTimeout, encode)

T = TypeVar("T")
log = logging.getLogger("pg_sturdy.worker")

_SQLSTATE = re.compile(r"^[0-9A-Z]{5}$")

# A worker on the queue's node asks again where the queue is after this many
# seconds (when idle): a shard moved since goes on working through Citus,
# at Citus's cost, until then.
_NODE_AGAIN = 60.0

# A pass handed back at a stop is visible again this long after: the
# process that stopped is gone by then, so its handler never runs beside
# the next one.
_HAND_BACK_DELAY = dt.timedelta(seconds=1)


class WorkerFailed(RuntimeError):
    """No thread of the worker could take for `give_up` seconds (the
    server unreachable, the extension missing, no privilege): the last
    error is the cause."""


def _now(conn: psycopg.Connection[Any]) -> dt.datetime:
    """The server's time (a tuple row whatever the connection makes)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


def describe(e: BaseException, limit: int = 1000) -> str:
    """`Type: message` for the row's error, at most `limit` characters,
    with no NUL (text cannot hold one) and whatever `str()` raises
    survived."""
    try:
        text = str(e)
    except BaseException:  # noqa: BLE001 - a __str__ that raises still names the type
        text = "<message could not be read>"
    return f"{type(e).__name__}: {text[:limit]}".replace("\x00", "\\x00")[:limit]


def code_of(e: BaseException) -> str | None:
    code = getattr(e, "sqlstate", None)
    return code if isinstance(code, str) and _SQLSTATE.match(code) else None


def connection_defaults(dsn: str, queue: str) -> dict[str, Any]:
    """What a worker's connections set where the dsn sets nothing: its
    name (`pg_stat_activity` shows whose they are) and TCP keepalives, so
    a server gone without a word (a failover, a cable) is noticed in about
    a minute instead of blocking a thread until the kernel gives up."""
    given = conninfo_to_dict(dsn)
    wanted: dict[str, Any] = {"application_name": f"pg_sturdy worker {queue}"[:63], "keepalives": 1,
                              "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
    return {k: v for k, v in wanted.items() if k not in given}


class Backoff:
    """Reconnect delays: from `first` doubling to `most`, each drawn at
    random between half of it and all of it (so workers that lost one
    server come back spread out)."""

    def __init__(self, first: float, most: float):
        self.first, self.most, self.next_ = first, most, first

    def next(self) -> float:
        d = self.next_
        self.next_ = min(self.most, self.next_ * 2)
        return d * (0.5 + random.random() / 2)

    def reset(self) -> None:
        self.next_ = self.first


class Pass(PassBase):
    """One pass of a workflow: what `take` handed out, and the steps."""

    def __init__(self, sturdy: Sturdy, queue: str, workflow: str, receipt: Receipt, token: int | None,
                 attempt: int, json_: Json | None = None, input: Any = None):
        super().__init__(queue, workflow, receipt, token, attempt, json_ or Json(), input)
        self.sturdy = sturdy

    @property
    def conn(self) -> psycopg.Connection[Any]:
        """The pass's connection (autocommit): for the handler's own
        statements, and `with p.conn.transaction():` around several."""
        return self.sturdy.conn

    @property
    def instance(self) -> Instance | None:
        """The instance this pass runs (`sturdy.start`'s row), read once
        (one statement), None for a workflow of your own."""
        if self._instance is False:
            with self.conn.cursor(row_factory=tuple_row) as cur:
                row = cur.execute(INSTANCE_SQL, (self.workflow,)).fetchone()
            self._instance = Instance(*row) if row else None
        return self._instance  # type: ignore[return-value]

    @property
    def business_key(self) -> str | None:
        i = self.instance
        return i.business_key if i else None

    @property
    def variables(self) -> dict[str, Any]:
        """The instance's variables (`{}` for a workflow of your own)."""
        i = self.instance
        return i.variables if i else {}

    def _checkpoints(self) -> dict[str, Any]:
        if self._steps is None:
            self._steps = {c.step: c.value for c in self.sturdy.load(self.workflow)}
        return self._steps

    def step(self, name: str, fn: Callable[[], T]) -> T:
        """The step's recorded value where the workflow has it; else run
        `fn` and record its result (JSON, through the worker's encoder)
        under the pass's token. A result that cannot be JSON raises
        `NotJSON` before anything is recorded. Two passes racing on one
        step: the first record wins, and the other gets the winner's value.
        A pass whose claim was taken over raises `Fenced`."""
        steps = self._checkpoints()
        if name in steps:
            return steps[name]
        token = self._token()
        value = self.json.dumps(fn(), f"step {name!r}'s result")
        recorded = self.sturdy.record(self.workflow, name, value, token)
        steps[name] = recorded.value
        return recorded.value

    def transact(self, name: str, effect: str, arg: Any = None) -> Any:
        """`transact`: the effect (a function `(jsonb) -> jsonb`, by its
        signature, e.g. `'app.charge(jsonb)'`) runs in the same transaction
        that records its result, once; a replay returns the result. An
        `arg` that cannot be JSON raises `NotJSON` before the effect runs."""
        steps = self._checkpoints()
        if name in steps:
            return steps[name]
        sent = None if arg is None else self.json.dumps(arg, f"step {name!r}'s argument")
        value = self.sturdy.transact(self.workflow, self._token(), name, effect, sent)
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
        steps.update({c.step: c.value for c in self.sturdy.load(self.workflow)})
        if name in steps:
            return steps[name]
        deadline: dt.datetime | None = until
        if deadline is None and within is not None:
            now = _now(self.conn)
            deadline = dt.datetime.fromisoformat(self.step(f"{name}.deadline", lambda: self._deadline(now, within)))
        now = _now(self.conn)
        if deadline is None:
            raise Waiting(now + NO_DEADLINE)
        if now >= deadline:
            raise WaitTimeout(f"{self.workflow}: no {name!r} by {deadline.isoformat()}")
        raise Waiting(deadline)

    def sleep(self, duration: dt.timedelta | float, *, name: str | None = None) -> None:
        """A durable sleep: the first time the pass reaches it, its end
        (now + `duration`) is recorded as a step (`name`, by default
        `sleep.<n>` for the n-th sleep the pass reaches), and the pass ends
        until then; the pass that runs after it replays to here and goes
        on. A worker that stops meanwhile loses nothing."""
        key = self._sleep_name(name)
        now = _now(self.conn)
        end = dt.datetime.fromisoformat(self.step(key, lambda: self._deadline(now, duration)))
        if _now(self.conn) < end:
            raise Waiting(end)

    def _end(self, how: Callable[[], Any]) -> bool:
        """Run one way of ending the pass, the first one only: False where
        the pass already ended; where `how` raises, it has not (a hand-back
        may follow)."""
        with self._lock:
            if self._ended:
                return False
            how()
            self._ended = True
            return True


class Worker:
    """Runs `handler(p: Pass)` on passes taken from `queue`, `concurrency`
    at a time, each thread on its own connection.

    `drain`: seconds a stop waits for passes in flight. `connect_timeout`:
    seconds a connection attempt may take. `backoff`: the first and the
    longest wait before connecting again. `give_up`: seconds without a
    successful take before `run()` raises `WorkerFailed` (None: never).
    `encoder`: what makes step values JSON beyond `json`'s own types
    (`json.dumps`'s `default`)."""

    def __init__(self, dsn: str, queue: str, handler: Callable[[Pass], Any], *, concurrency: int = 1,
                 lease: dt.timedelta = dt.timedelta(seconds=30), claim: bool = True, listen: bool = True,
                 poll: tuple[float, float] = (0.05, 1.0), status: str | None = None, prepare: bool = False,
                 connect: Callable[[], psycopg.Connection[Any]] | None = None, on_queue_node: bool = False,
                 drain: float = 30.0, connect_timeout: float = 10.0, backoff: tuple[float, float] = (0.1, 30.0),
                 give_up: float | None = 300.0, encoder: Callable[[Any], Any] | None = encode):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lease <= dt.timedelta(0):
            raise ValueError("lease must be positive")
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None)):
            raise TypeError("an async def handler needs pg_sturdy.AsyncWorker; Worker runs plain functions")
        self.dsn, self.queue, self.handler = dsn, queue, handler
        self.concurrency, self.lease, self.claim, self.listen = concurrency, lease, claim, listen
        self.poll, self.status, self.prepare = poll, status, prepare
        self.on_queue_node, self.drain, self.give_up = on_queue_node, drain, give_up
        self.connect_timeout, self.backoff = connect_timeout, backoff
        self.json = Json(encoder)
        # the node the last takes went to (on_queue_node), None for the dsn's
        self.node: tuple[str, int] | None = None
        self._connect = connect or self._connect_dsn
        self._stop = threading.Event()      # take nothing more
        self._abandon = threading.Event()   # hand back what is in flight, now
        self._passes: set[Pass] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._served = time.monotonic()
        self.last_error: BaseException | None = None
        self.restarts = 0
        # errors after which a thread connected again, a lost connection
        # aside (kept for whoever runs the worker)
        self.errors: list[BaseException] = []

    def _connect_dsn(self, host: str | None = None, port: int | None = None) -> psycopg.Connection[Any]:
        """A connection of the worker's: autocommit, no statement prepared
        unless asked (psycopg's automatic preparing would leave named
        statements a pooler cannot carry across), named for the queue where
        the dsn names nothing."""
        extra = connection_defaults(self.dsn, self.queue)
        if host is not None:
            extra.update(host=host, port=port)
        return psycopg.connect(make_conninfo(self.dsn, **extra), autocommit=True,
                               connect_timeout=max(1, round(self.connect_timeout)),
                               prepare_threshold=5 if self.prepare else None)

    # Running

    def run(self, *, install_signals: bool = True) -> None:
        """Serve until `stop()` (or SIGTERM/SIGINT, where called from the
        main thread: the first drains, the second hands back at once), then
        return. Raises `WorkerFailed` when the worker cannot serve."""
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop())
        self.start()
        failed: WorkerFailed | None = None
        while not self._stop.wait(0.2):
            self._supervise()
            if self.give_up is not None and time.monotonic() - self._served > self.give_up:
                failed = WorkerFailed(f"no take for {self.give_up:g} s: {self.last_error!r}")
                log.error("worker on %s cannot serve, stopping: %s", self.queue, self.last_error)
                self._abandon.set()
                self._stop.set()
        self.join(self.drain if failed is None else 0.0)
        if failed is not None:
            raise failed from self.last_error

    def start(self) -> None:
        """Start the threads and return (`stop()` ends them)."""
        self._served = time.monotonic()
        self._threads = [self._thread(i) for i in range(self.concurrency)]

    def _thread(self, i: int) -> threading.Thread:
        t = threading.Thread(target=self._loop, name=f"sturdy-{self.queue}-{i}", daemon=True)
        t.start()
        return t

    def _supervise(self) -> None:
        """Start again a thread that ended while the worker serves."""
        for i, t in enumerate(self._threads):
            if not t.is_alive() and not self._stop.is_set():
                self.restarts += 1
                log.warning("worker thread %s ended; starting it again", t.name)
                self._threads[i] = self._thread(i)

    def stop(self) -> None:
        """Take nothing more (the passes in flight go on, for `drain`); a
        second call hands them back at once."""
        if self._stop.is_set():
            self._abandon.set()
        self._stop.set()

    def join(self, drain: float | None = None) -> None:
        """After `stop()`: wait up to `drain` seconds (default the
        worker's) for the passes in flight to end, hand back those still
        running (visible again a second on, their heartbeats stopped, their
        claims released), then wait briefly for the threads. A thread still
        in a handler is a daemon thread: the process can end without it,
        and should, before the second is up."""
        deadline = time.monotonic() + (self.drain if drain is None else drain)
        while not self._abandon.is_set() and time.monotonic() < deadline:
            with self._lock:
                if not self._passes:
                    break
            self._abandon.wait(0.05)
        with self._lock:
            running = list(self._passes)
        for p in running:
            self._hand_back(p, _HAND_BACK_DELAY)
        until = time.monotonic() + 1.0 + self.poll[1]
        for t in self._threads:
            t.join(max(0.0, until - time.monotonic()))

    def _hand_back(self, p: Pass, delay: dt.timedelta = dt.timedelta(0)) -> None:
        try:
            with self._connect() as conn:
                s = Sturdy(conn, prepare=self.prepare)

                def back() -> None:
                    s.wake_at(p.workflow, p.receipt, _now(conn) + delay, self.queue)
                    if p.token is not None:
                        s.release(p.workflow, p.token)

                if p._end(back):
                    log.warning("%s handed back", p.workflow)
        except Exception as e:  # noqa: BLE001 - its lease runs out instead (a counted lapse)
            log.warning("could not hand %s back: %s", p.workflow, e)

    def _loop(self) -> None:
        backoff = Backoff(*self.backoff)
        while not self._stop.is_set():
            try:
                self._serve(backoff)
            except BaseException as e:  # noqa: BLE001 - the thread goes on serving
                if self._stop.is_set():
                    return
                self.last_error = e
                if isinstance(e, psycopg.OperationalError):
                    log.warning("worker connection lost, connecting again: %s", e)
                else:
                    self.errors.append(e)
                    log.error("worker on %s: connecting again after", self.queue, exc_info=e)
                self._stop.wait(backoff.next())

    def _serve(self, backoff: Backoff) -> None:
        idle = self.poll[0]
        with self._connect() as conn:
            s = Sturdy(conn, prepare=self.prepare)
            beat = _Heartbeat(self)
            work: psycopg.Connection[Any] | None = None
            try:
                if self.listen:
                    conn.execute("LISTEN sturdy")
                work, found = self._queue_node(s), time.monotonic()
                ws = Sturdy(work, prepare=self.prepare) if work is not None else s
                while not self._stop.is_set():
                    taken = ws.take(self.queue, self.lease, 1, self.claim, self.listen)
                    self._served = time.monotonic()
                    backoff.reset()
                    if not taken:
                        self._idle(conn, idle)
                        idle = min(idle * 2, self.poll[1])
                        if work is not None and time.monotonic() - found > _NODE_AGAIN:
                            return  # (connected again: the queue's shard may have moved)
                        continue
                    idle = self.poll[0]
                    self._pass(ws, beat, taken[0], s)
            finally:
                beat.close()
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
        conn = self._connect_dsn(node.host, node.port)
        self.node = (node.host, node.port)
        return conn

    def _idle(self, conn: psycopg.Connection[Any], seconds: float) -> None:
        if not self.listen:
            self._stop.wait(seconds)
            return
        # woken by a notify, or at the poll ceiling for rows due by the clock
        for _ in conn.notifies(timeout=self.poll[1], stop_after=1):
            pass

    def _pass(self, s: Sturdy, beat: "_Heartbeat", t: Taken, home: Sturdy) -> None:
        """One pass on `s`; `home` is the dsn's connection (the coordinator
        where `s` is the queue's node), where `fail` and a `finish` that
        moves the instance go: the instances are on the coordinator."""
        p = Pass(s, self.queue, t.workflow, t.receipt, t.token, t.attempt, self.json, t.input)
        if self.claim and t.token is None:
            # its claim is held (a pass that outlived its lease, or a claim
            # of the application's): hand the row back rather than let its
            # lease run out, which would count as a failed attempt
            s.wake_at(p.workflow, p.receipt, _now(s.conn) + min(self.lease, dt.timedelta(seconds=1)), self.queue)
            return
        with self._lock:
            self._passes.add(p)
        try:
            if self._stop.is_set():
                # taken as the worker stopped: back at once (join may be
                # doing it too; the first end wins)
                self._hand_back(p)
                return
            beat.arm(p)
            try:
                outcome: BaseException | None = None
                try:
                    p.result = self.handler(p)
                    if inspect.isawaitable(p.result):
                        close = getattr(p.result, "close", None)
                        if close is not None:
                            close()
                        raise DoNotRetry("the handler returned an awaitable: run async handlers on AsyncWorker")
                    if p.result is not None:
                        p.result = self.json.dumps(p.result, "the handler's result")
                except BaseException as e:  # noqa: BLE001 - every way a handler ends ends the pass
                    outcome = e
            finally:
                beat.disarm()
            if s.conn.info.transaction_status != TransactionStatus.IDLE:
                s.conn.rollback()  # (a transaction the handler left open)
            self._conclude(p, s, home, outcome)
        except Fenced:
            p._end(lambda: None)
        except psycopg.OperationalError:
            # the connection went: hand the pass back on a new one (where
            # the server answers), then connect again
            self._hand_back(p)
            raise
        except Exception as e:  # noqa: BLE001 - a pass that cannot be ended goes back; the thread goes on
            log.error("could not end %s; handing it back", p.workflow, exc_info=e)
            self.last_error = e
            self._hand_back(p, self.lease)  # (not at once: what failed may fail again)
        finally:
            with self._lock:
                self._passes.discard(p)

    def _conclude(self, p: Pass, s: Sturdy, home: Sturdy, outcome: BaseException | None) -> None:
        """End the pass as its handler ended."""
        if outcome is None:
            # (a pass that moves its instance finishes where the instance is)
            status = p.status or self.status
            end = home if status else s
            if p.token is None:
                p._end(lambda: end.done(p.workflow, p.receipt, self.queue))
                return
            result = p.result
            try:
                p._end(lambda: end.finish(p.workflow, p.token, p.receipt, step=None if result is None else RESULT_STEP,
                                          value=result, status=status, queue=self.queue))
            except Conflict:
                self._ended_elsewhere(p, end)
            return
        if isinstance(outcome, Fenced):
            p._end(lambda: None)
            return
        if isinstance(outcome, Waiting):
            at = outcome.at

            def sleep() -> None:
                s.wake_at(p.workflow, p.receipt, at, self.queue)
                if p.token is not None:
                    s.release(p.workflow, p.token)

            p._end(sleep)
            return
        text, code = describe(outcome), code_of(outcome)
        log.error("%s failed on attempt %d", p.workflow, p.attempt, exc_info=outcome)
        if isinstance(outcome, (DoNotRetry, WaitTimeout)) and p.token is not None:
            try:
                p._end(lambda: self._give_up(p, s, home, text, code))
            except Conflict:
                self._ended_elsewhere(p, home)
            return
        retry_at = outcome.at(_now(home.conn)) if isinstance(outcome, RetryAfter) else None
        try:
            p._end(lambda: home.fail(p.workflow, p.receipt, text, self.queue, retry_at=retry_at, code=code))
        except (psycopg.DataError, UnicodeError):
            # the text refused after all (in an encoding the server cannot
            # hold it): the failure counted without it
            p._end(lambda: home.fail(p.workflow, p.receipt, f"{type(outcome).__name__} (message not stored)",
                                     self.queue, retry_at=retry_at, code=code))

    def _give_up(self, p: Pass, s: Sturdy, home: Sturdy, text: str, code: str | None) -> None:
        """A failure no retry mends: an instance ends `failed`; a workflow
        of one's own leaves the queue with its error as `$error`."""
        assert p.token is not None
        with home.conn.cursor(row_factory=tuple_row) as cur:
            instance = cur.execute("SELECT 1 FROM sturdy.instances WHERE workflow = %s", (p.workflow,)).fetchone()
        if instance:
            home.finish(p.workflow, p.token, p.receipt, status="failed", queue=self.queue, error=text)
        else:
            s.finish(p.workflow, p.token, p.receipt, step="$error", value={"error": text, "code": code},
                     queue=self.queue)

    def _ended_elsewhere(self, p: Pass, end: Sturdy) -> None:
        """`finish` met an instance already ended (an operator cancelled
        it, say): the pass ends without moving it."""
        log.warning("%s: its instance already ended; the pass ends without moving it", p.workflow)
        assert p.token is not None
        p._end(lambda: end.finish(p.workflow, p.token, p.receipt, queue=self.queue))


class _Heartbeat:
    """Keeps the pass of one worker thread while its handler runs: a third
    of the lease after it began and every third after, `extend` (the row)
    and `renew` (the claim), on a connection of its own (the handler's may
    be in a transaction). One thread for all the passes of its worker
    thread, armed for each, closed with the worker thread's connection."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.every = worker.lease.total_seconds() / 3
        self.cv = threading.Condition()
        self.p: Pass | None = None
        self.since = 0.0
        self.beating = False
        self.closed = False
        self.thread: threading.Thread | None = None

    def arm(self, p: Pass) -> None:
        # (no notify: the thread looks at least every third of the lease, so
        # its first beat for the pass comes within two thirds of it, and a
        # pass costs no wakeup of another thread)
        with self.cv:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name=f"{threading.current_thread().name}-beat",
                                               daemon=True)
                self.thread.start()
            self.p, self.since = p, time.monotonic()

    def disarm(self) -> None:
        """No more beats for the pass, and none under way: its end needs
        the receipt the last beat wrote."""
        with self.cv:
            self.p = None
            while self.beating:
                self.cv.wait()

    def close(self) -> None:
        """Stop the thread and close its connection."""
        with self.cv:
            self.closed, self.p = True, None
            self.cv.notify_all()
            thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            # (a beat stuck on a dead connection ends with its keepalive
            # timeout; the serving thread does not wait for it past this)
            thread.join(self.every + 10.0)

    def _run(self) -> None:
        conn = None
        try:
            while True:
                with self.cv:
                    while not self.closed and (self.p is None or time.monotonic() < self.since + self.every):
                        wait = self.every if self.p is None else self.since + self.every - time.monotonic()
                        self.cv.wait(max(wait, 0.0))
                    if self.closed:
                        return
                    p, self.beating = self.p, True
                try:
                    if conn is None or conn.closed:
                        conn = self.worker._connect()
                    self._beat(Sturdy(conn, prepare=self.worker.prepare), p)
                except Exception as e:  # noqa: BLE001 - the next beat tries again
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


__all__ = ["Backoff", "Pass", "Worker", "WorkerFailed", "code_of", "connection_defaults", "describe"]
