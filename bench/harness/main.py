"""pg_sturdy as a system of the public job-queue harness
(hardbyte/postgresql-job-queue-benchmarking, its CONTRIBUTING_ADAPTERS.md):
one long-running process that enqueues jobs with a payload and works them,
printing the harness's JSONL records on stdout (logs on stderr).

Through pg_sturdy's public API, as a user would write it, on the Python
client (`pg_sturdy.AsyncSturdy`): a producer enqueues up to
`PRODUCER_BATCH_MAX` jobs a call with `schedule_many`, each job one row whose
input is its payload; `WORKER_COUNT` workers each take what the rate gives
them in a 50 ms poll interval and a quarter more (1 to 64 rows, as pgmq's
adapter sizes its reads; one job each, their inputs with them), do
`JOB_WORK_MS` of work on each and acknowledge each job by its own receipt
as its work ends: `PG_STURDY_ACK=batched` (the default) hands each to the
client's `AsyncAcks`, which sends what gathered as one `done_many` while the
worker goes on (as awa's and River's runtimes batch their completions);
`PG_STURDY_ACK=each` sends each job's own `done` and waits for its commit.
Retries are on (the queue's default policy: a job whose worker dies is
taken again once its lease runs out, up to 25 attempts). A job counts as
completed only once its acknowledgement has committed.

Pacing: `PRODUCER_MODE=fixed` credits `rate x` real elapsed time (the rate
re-read from `PRODUCER_RATE_CONTROL_FILE` every tick), or with
`PRODUCER_PACING=harness` (the harness's default) sends what the `ENQUEUE
<n>` lines on stdin ask; `PRODUCER_MODE=depth-target` keeps the ready
backlog at `TARGET_DEPTH`.

    python3 bench/harness/main.py      (the harness sets the environment)
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import os
import signal
import sys
import time
from collections import deque
from typing import Any, Callable
from urllib.parse import urlparse

SYSTEM = "pg_sturdy"
QUEUE = "long_horizon_bench"
EVENT_TABLES = ["sturdy.queue", "sturdy.queue_waiters"]
EXTENSIONS = ["pg_sturdy"]
CLAIM_WINDOW_S = 30


def log(*parts: Any) -> None:
    print(f"[{SYSTEM}]", *parts, file=sys.stderr, flush=True)


def iso(t: float) -> str:
    """A wall-clock time as the harness writes it: UTC, milliseconds, Z."""
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# -- the records -------------------------------------------------------------

def descriptor(version: str, schema_version: str, db_name: str, instance_id: int, started: float) -> dict:
    return {"kind": "descriptor", "system": SYSTEM, "event_tables": EVENT_TABLES, "extensions": EXTENSIONS,
            "version": version, "schema_version": schema_version, "db_name": db_name,
            "started_at": iso(started), "instance_id": instance_id}


def samples(t: float, instance_id: int, metrics: list[tuple[str, float, float]]) -> list[dict]:
    """One record a metric: (name, value, window_s)."""
    return [{"t": iso(t), "system": SYSTEM, "kind": "adapter", "subject_kind": "adapter", "subject": "",
             "metric": name, "value": float(value), "window_s": float(window), "instance_id": instance_id}
            for name, value, window in metrics]


# -- latency: bounded memory, 3 significant figures ----------------------------

class Histogram:
    """Counts of values (ms) kept at 3 significant figures: a key is the
    value's exponent and its first three digits, so a histogram holds at
    most 900 keys a decade however many values it saw."""

    def __init__(self) -> None:
        self.counts: dict[tuple[int, int], int] = {}
        self.n = 0

    @staticmethod
    def key(ms: float) -> tuple[int, int]:
        if ms <= 0:
            return (-9, 0)
        e = math.floor(math.log10(ms)) - 2
        return (e, int(ms / 10 ** e))

    @staticmethod
    def value(key: tuple[int, int]) -> float:
        e, m = key
        return 0.0 if e == -9 else float(f"{m}e{e}")

    def add(self, ms: float) -> None:
        k = self.key(ms)
        self.counts[k] = self.counts.get(k, 0) + 1
        self.n += 1

    def merge(self, other: "Histogram") -> None:
        for k, c in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + c
        self.n += other.n

    def percentile(self, p: float) -> float:
        if not self.n:
            return 0.0
        rank = math.ceil(p / 100 * self.n)
        seen = 0
        for k in sorted(self.counts):
            seen += self.counts[k]
            if seen >= rank:
                return self.value(k)
        return self.value(max(self.counts))


class Rolling:
    """The last `window_s` seconds of latencies, as one histogram per tick."""

    def __init__(self, window_s: float, tick_s: float) -> None:
        self.ticks: deque[Histogram] = deque(maxlen=max(1, math.ceil(window_s / tick_s)))
        self.current = Histogram()

    def add(self, ms: float) -> None:
        self.current.add(ms)

    def roll(self) -> Histogram:
        """Close the tick: the window's histogram."""
        self.ticks.append(self.current)
        self.current = Histogram()
        whole = Histogram()
        for h in self.ticks:
            whole.merge(h)
        return whole


# -- pacing ------------------------------------------------------------------

class Credit:
    """Offered load credited on real elapsed time (the harness's normative
    rule): each call adds rate x the time since the last, and hands out the
    whole jobs it holds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock, self.last, self.credit = clock, clock(), 0.0

    def take(self, rate: float) -> int:
        now = self.clock()
        self.credit += rate * max(0.0, now - self.last)
        self.last = now
        whole = int(self.credit)
        self.credit -= whole
        return whole


def read_rate(default: float) -> float:
    path = os.environ.get("PRODUCER_RATE_CONTROL_FILE")
    if path:
        try:
            with open(path) as f:
                return float(f.read().strip() or default)
        except (OSError, ValueError):
            pass
    return default


# -- the process -------------------------------------------------------------

class Adapter:
    def __init__(self) -> None:
        env = os.environ
        self.url = env.get("DATABASE_URL", "postgres://bench:bench@localhost:15555/pg_sturdy_bench")
        self.mode = env.get("PRODUCER_MODE", "fixed")
        self.pacing = env.get("PRODUCER_PACING", "adapter")
        self.ack = env.get("PG_STURDY_ACK", "batched")
        if self.ack not in ("batched", "each"):
            raise SystemExit(f"PG_STURDY_ACK must be batched or each, not {self.ack!r}")
        self.rate = float(env.get("PRODUCER_RATE", "800"))
        self.batch_max = max(1, int(env.get("PRODUCER_BATCH_MAX", "128")))
        self.batch_ms = float(env.get("PRODUCER_BATCH_MS", "25"))
        self.target_depth = int(env.get("TARGET_DEPTH", "1000"))
        self.workers = max(1, int(env.get("WORKER_COUNT", "32")))
        self.work_s = float(env.get("JOB_WORK_MS", "1")) / 1000
        self.payload = "x" * max(0, int(env.get("JOB_PAYLOAD_BYTES", "256")) - 96)
        self.every = float(env.get("SAMPLE_EVERY_S", "5"))
        self.instance = int(env.get("BENCH_INSTANCE_ID", "0"))
        # jobs a worker takes at once (each its own row, worked and
        # acknowledged on its own): as pgmq's adapter sizes its reads,
        # 1.25 x what the rate gives each worker in a 50 ms poll interval,
        # 1 to 64 (without that adapter's floor of 8)
        self.take_max = max(1, min(64, round(self.rate * 1.25 / self.workers * 0.05)))
        # a lease long enough for the work, short enough that a killed
        # worker's jobs come back within a recovery phase
        self.lease = dt.timedelta(seconds=max(5.0, 20 * self.work_s * self.take_max))
        self.claim = Rolling(CLAIM_WINDOW_S, self.every)
        self.enqueued = self.completed = 0
        self.depth = 0
        # a backlog is kept by four producers, each call's commit waited on
        # by its own connection (one alone, one commit at a time, fell
        # behind 64 workers); a rate by one
        self.producers = 4 if self.mode == "depth-target" else 1
        self.in_flight = 0
        self.seq = 0
        self.stop = asyncio.Event()
        # the producer starts once every worker has taken once (a burst of
        # the harness's tokens gathered at start-up then meets workers that
        # are connected, not ones still loading the extension)
        self.warm: set[int] = set()
        self.all_warm = asyncio.Event()
        self.acks: Any = None
        self.tokens: asyncio.Queue[int] = asyncio.Queue()
        # jobs of a `schedule_many` whose answer a lost connection took: each
        # counts as enqueued once seen (in the queue, or completed by a worker)
        self.maybe_enqueued: set[str] = set()

    async def connect(self) -> Any:
        import psycopg

        return await psycopg.AsyncConnection.connect(self.url, autocommit=True, connect_timeout=5)

    async def forever(self, name: str, body: Callable[[Any], Any]) -> None:
        """Run `body(conn)` on a connection of its own until the stop,
        connecting again (0.1 s doubling to 2 s) whatever it raises: a
        database error never ends the process."""
        delay = 0.1
        while not self.stop.is_set():
            try:
                async with await self.connect() as conn:
                    delay = 0.1
                    await body(conn)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - reconnect and go on
                if self.stop.is_set():
                    return
                log(f"{name}: {type(e).__name__}: {e}; connecting again in {delay:.1f} s")
                try:
                    await asyncio.wait_for(self.stop.wait(), delay)
                except asyncio.TimeoutError:
                    pass
                delay = min(2.0, delay * 2)

    # producer

    async def produce(self, conn: Any) -> None:
        from pg_sturdy import AsyncSturdy

        s = AsyncSturdy(conn, prepare=True)
        try:
            await asyncio.wait_for(self.all_warm.wait(), 10)
        except asyncio.TimeoutError:
            pass
        if self.maybe_enqueued:
            cur = conn.cursor()
            rows = await (await cur.execute(
                "SELECT w FROM unnest(%s::text[]) w WHERE EXISTS"
                " (SELECT FROM sturdy.queue q WHERE q.queue = %s AND q.workflow = w)",
                (list(self.maybe_enqueued), QUEUE))).fetchall()
            for (w,) in rows:
                self.seen_enqueued(w)
            self.maybe_enqueued.clear()  # (the rest were not enqueued, or are counted as they complete)
        credit = Credit()
        while not self.stop.is_set():
            if self.mode == "depth-target":
                # the depth read, and what it lacks of the target (less what
                # the other producers are enqueuing) enqueued at once,
                # `PRODUCER_BATCH_MAX` a call
                n = max(0, self.target_depth - await self.ready(conn) - self.in_flight)
                k = min(n, self.batch_max)
                if k:
                    self.in_flight += k
                    try:
                        await self.enqueue(s, k)
                    finally:
                        self.in_flight -= k
                    continue
                n = 0
            elif self.pacing == "harness":
                n = await self.next_tokens()  # (waits for them)
            else:
                n = credit.take(read_rate(self.rate))
            if n:
                while n > 0 and not self.stop.is_set():
                    k = min(n, self.batch_max)
                    await self.enqueue(s, k)
                    n -= k
                if self.mode == "depth-target" or self.pacing == "harness":
                    continue
            await asyncio.sleep(self.batch_ms / 1000)

    async def enqueue(self, s: Any, k: int) -> None:
        now_ms = time.time() * 1000
        first = self.seq
        self.seq += k
        names = [f"{QUEUE}/{self.instance}-{os.getpid()}-{first + i}" for i in range(k)]
        inputs = [{"seq": first + i, "enqueued_at_ms": now_ms, "padding": self.payload} for i in range(k)]
        try:
            await s.schedule_many(names, inputs, QUEUE)
        except Exception:
            self.maybe_enqueued.update(names)
            raise
        self.enqueued += k

    def seen_enqueued(self, workflow: str) -> None:
        if workflow in self.maybe_enqueued:
            self.maybe_enqueued.discard(workflow)
            self.enqueued += 1

    def count_completed(self, workflow: str) -> None:
        self.completed += 1

    async def next_tokens(self) -> int:
        """The jobs the harness's `ENQUEUE` lines asked for since the last
        call, waiting (up to a tick) for the next line when none has."""
        n = 0
        try:
            n = await asyncio.wait_for(self.tokens.get(), self.batch_ms / 1000)
            while not self.tokens.empty():
                n += self.tokens.get_nowait()
        except asyncio.TimeoutError:
            pass
        return n

    async def read_tokens(self) -> None:
        """`ENQUEUE <n>` lines from the harness on stdin."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while not self.stop.is_set():
            line = await reader.readline()
            if not line:
                return
            parts = line.decode().split()
            if len(parts) == 2 and parts[0] == "ENQUEUE" and parts[1].isdigit():
                self.tokens.put_nowait(int(parts[1]))

    # workers

    def worker(self, index: int) -> Callable[[Any], Any]:
        """One worker's body, with what it must settle after a lost
        connection: the jobs whose `done` was under way, which may or may
        not have committed. Once connected again, those no longer in the
        queue are counted completed (only a `done` removes a row here);
        the others come back when their lease runs out, and count then."""
        unsure: list[str] = []

        async def body(conn: Any) -> None:
            if unsure:
                cur = conn.cursor()
                row = await (await cur.execute(
                    "SELECT coalesce(array_agg(w), '{}') FROM unnest(%s::text[]) w WHERE NOT EXISTS"
                    " (SELECT FROM sturdy.queue q WHERE q.queue = %s AND q.workflow = w)",
                    (unsure, QUEUE))).fetchone()
                for w in row[0]:
                    self.count_completed(w)
                unsure.clear()
            await self.work(conn, unsure, index)

        return body

    async def work(self, conn: Any, unsure: list[str], index: int) -> None:
        from pg_sturdy import AsyncSturdy

        s = AsyncSturdy(conn, prepare=True)
        await conn.execute("LISTEN sturdy")
        while not self.stop.is_set():
            taken = await s.take(QUEUE, self.lease, self.take_max)
            if index not in self.warm:
                self.warm.add(index)
                if len(self.warm) == self.workers:
                    self.all_warm.set()
            if not taken:
                # woken by the schedule that makes a row ready, or at 50 ms (as
                # the peers poll): a wakeup a schedule cannot promise (docs
                # reference.md, Wakeups) costs at most that
                async for _ in conn.notifies(timeout=0.05, stop_after=1):
                    pass
                continue
            started = time.time() * 1000
            for t in taken:
                self.seen_enqueued(t.workflow)
                job = t.input or {}
                if "enqueued_at_ms" in job:
                    self.claim.add(max(0.0, started - job["enqueued_at_ms"]))
            # each job worked and acknowledged on its own, in turn; job i
            # of the batch ends `(i + 1) x JOB_WORK_MS` after the work
            # began (a sleep until then: the event loop's lateness on one
            # sleep is not added to every job after it)
            began = time.monotonic()
            for i, t in enumerate(taken):
                if self.work_s:
                    await asyncio.sleep(max(0.0, began + (i + 1) * self.work_s - time.monotonic()))
                if self.acks is not None:
                    self.acks.done(t.workflow, t.receipt)
                    continue
                try:
                    ended = await s.done(t.workflow, t.receipt, QUEUE)
                except Exception:
                    unsure.extend(u.workflow for u in taken[taken.index(t):])
                    raise
                if ended:
                    self.count_completed(t.workflow)

    def count_removed(self, n: int) -> None:
        self.completed += n

    # depth (instance 0)

    @staticmethod
    async def ready(conn: Any) -> int:
        cur = conn.cursor()
        row = await (await cur.execute("SELECT ready FROM sturdy.queue_stats WHERE queue = %s",
                                       (QUEUE,))).fetchone()
        return int(row[0]) if row else 0

    async def watch_depth(self, conn: Any) -> None:
        while not self.stop.is_set():
            self.depth = await self.ready(conn)
            await asyncio.sleep(0.25)

    # sampler

    def tick_records(self, t: float, enqueued: int, completed: int) -> list[dict]:
        window = self.claim.roll()
        metrics = [("claim_p50_ms", window.percentile(50), CLAIM_WINDOW_S),
                   ("claim_p95_ms", window.percentile(95), CLAIM_WINDOW_S),
                   ("claim_p99_ms", window.percentile(99), CLAIM_WINDOW_S),
                   ("enqueue_rate", enqueued / self.every, self.every),
                   ("completion_rate", completed / self.every, self.every)]
        if self.instance == 0:
            metrics += [("queue_depth", self.depth, 0),
                        ("producer_target_rate", read_rate(self.rate) if self.mode == "fixed" else 0, 0)]
        return samples(t, self.instance, metrics)

    async def sample(self) -> None:
        last_e, last_c = self.enqueued, self.completed
        while not self.stop.is_set():
            now = time.time()
            nxt = (math.floor(now / self.every) + 1) * self.every
            try:
                await asyncio.wait_for(self.stop.wait(), nxt - now)
            except asyncio.TimeoutError:
                pass
            e, c = self.enqueued, self.completed
            for r in self.tick_records(nxt, e - last_e, c - last_c):
                print(json.dumps(r), flush=True)
            last_e, last_c = e, c

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        started = time.time()
        version, schema_version = await self.versions()
        db = urlparse(self.url).path.lstrip("/") or "pg_sturdy_bench"
        print(json.dumps(descriptor(version, schema_version, db, self.instance, started)), flush=True)
        tasks = [asyncio.create_task(self.forever(f"producer {i}", self.produce)) for i in range(self.producers)]
        tasks.append(asyncio.create_task(self.sample()))
        if self.ack == "batched":
            from pg_sturdy import AsyncAcks

            self.acks = AsyncAcks(self.connect, QUEUE, on_removed=self.count_removed)
            self.acks.start()
        tasks += [asyncio.create_task(self.forever(f"worker {i}", self.worker(i))) for i in range(self.workers)]
        if self.instance == 0:
            tasks.append(asyncio.create_task(self.forever("depth", self.watch_depth)))
        if self.pacing == "harness" and self.mode == "fixed":
            tasks.append(asyncio.create_task(self.read_tokens()))
        await self.stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.acks is not None:
            try:
                await asyncio.wait_for(self.acks.close(), 3)
            except asyncio.TimeoutError:
                pass

    async def versions(self) -> tuple[str, str]:
        import pg_sturdy

        schema = "unknown"
        try:
            async with await self.connect() as conn:
                cur = conn.cursor()
                row = await (await cur.execute(
                    "SELECT extversion FROM pg_extension WHERE extname = 'pg_sturdy'")).fetchone()
                schema = row[0] if row else "not installed"
        except Exception as e:  # noqa: BLE001 - the descriptor still goes out
            log(f"versions: {e}")
        return f"pg_sturdy-client {pg_sturdy.__version__} {os.environ.get('PG_STURDY_REV', '')}".strip(), schema


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    client = os.path.join(os.path.dirname(os.path.dirname(here)), "clients", "python", "src")
    if os.path.isdir(client) and client not in sys.path:
        sys.path.insert(0, client)  # (the checkout's client where it is not installed)
    asyncio.run(Adapter().run())


if __name__ == "__main__":
    main()
