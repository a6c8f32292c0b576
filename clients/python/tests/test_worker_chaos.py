"""The worker against what a real deployment throws at it: handlers that
raise what `fail` cannot store or no `except Exception` catches, results
that are not JSON, its connections terminated mid-pass and mid-idle a
hundred times, a server restart, an instance an operator cancelled under
a pass. Every workflow ends as the contract says, each `transact` effect
once, the worker still serving at the end, and its threads and
connections back to where they started."""
import datetime as dt
import logging
import os
import shutil
import pathlib
import subprocess
import tempfile
import threading
import time
import uuid

import psycopg
import pytest

from pg_sturdy import DoNotRetry, Pass, RetryAfter, Sturdy, WaitTimeout, Worker, WorkerFailed

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def until(what, seconds=60, why="not within the time allowed"):
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


class Boom(BaseException):
    """Not an Exception: what `except Exception` lets through."""


def row(conn, wf):
    return conn.execute("SELECT attempts, visible_at = 'infinity', last_error FROM sturdy.queue WHERE workflow = %s",
                        (wf,)).fetchone()


def worker_threads(queue):
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(f"sturdy-{queue}-"))


def fast(dsn, q, handler, **kw):
    kw.setdefault("lease", dt.timedelta(seconds=3))
    kw.setdefault("backoff", (0.01, 0.2))
    kw.setdefault("poll", (0.05, 0.5))
    return Worker(dsn, q, handler, **kw)


def test_no_handler_error_stops_a_thread_and_each_failure_is_counted_as_the_policy_says(dsn, conn):
    """NUL bytes, a 10 MB message, a result that is not JSON, BaseException
    subclasses, a `__str__` that raises, DoNotRetry, RetryAfter and an
    uncaught WaitTimeout: one worker thread takes them all, one after
    another, and still finishes a plain workflow at the end."""
    q = unique("chaos")
    s = Sturdy(conn)
    s.retry_queue(q, max_attempts=2, backoff="10 ms", jitter=0)

    class BadStr(Exception):
        def __str__(self):
            raise RuntimeError("no text")

    behaviours = {
        "nul": lambda p: (_ for _ in ()).throw(ValueError("bad\x00byte")),
        "huge": lambda p: (_ for _ in ()).throw(ValueError("x" * 10_000_000)),
        "notjson": lambda p: {1, object()},
        "base": lambda p: (_ for _ in ()).throw(Boom("base")),
        "exit": lambda p: (_ for _ in ()).throw(SystemExit(3)),
        "badstr": lambda p: (_ for _ in ()).throw(BadStr()),
        "never": lambda p: (_ for _ in ()).throw(DoNotRetry("card stolen")),
        "later": lambda p: (_ for _ in ()).throw(RetryAfter(0.05, "busy")),
        "timeout": lambda p: p.wait_for("approval", until=dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)),
        "ok": lambda p: "fine",
    }
    wfs = {k: f"{k}/{unique('w')}" for k in behaviours}
    for k in behaviours:
        s.schedule(wfs[k], queue=q)
    w = fast(dsn, q, lambda p: behaviours[p.workflow.split("/")[0]](p))
    w.start()
    try:
        # dead after two attempts: what fail can store, and what it cannot
        for k in ("nul", "huge", "base", "exit", "badstr", "later"):
            until(lambda: (row(conn, wfs[k]) or (0, False, ""))[1], 30, f"{k} dead")
        attempts, dead, error = row(conn, wfs["nul"])
        assert (attempts, dead, error) == (2, True, "ValueError: bad\\x00byte")
        attempts, dead, error = row(conn, wfs["huge"])
        assert (attempts, dead, len(error)) == (2, True, 1000)
        assert row(conn, wfs["base"])[2] == "Boom: base"
        assert row(conn, wfs["exit"])[2] == "SystemExit: 3"
        assert row(conn, wfs["badstr"])[2] == "BadStr: <message could not be read>"
        assert row(conn, wfs["later"])[2] == "RetryAfter: busy"
        # not retried: gone from the queue after one attempt, the error kept
        for k, error in (("notjson", "NotJSON: the handler's result is not JSON"),
                         ("never", "DoNotRetry: card stolen"), ("timeout", "WaitTimeout: ")):
            until(lambda: row(conn, wfs[k]) is None, 30, f"{k} ended")
            kept = dict(c[:2] for c in s.load(wfs[k]))["$error"]
            assert kept["error"].startswith(error), kept
        until(lambda: row(conn, wfs["ok"]) is None, 30, "the plain workflow finished")
        assert dict(c[:2] for c in s.load(wfs["ok"]))["$result"] == "fine"
        assert len(worker_threads(q)) == 2, worker_threads(q)  # the thread and its heartbeat, never restarted
        assert w.restarts == 0
    finally:
        w.stop()
        w.join(0)


def test_a_hundred_reconnects_leak_no_thread_and_no_connection(dsn, conn):
    q = unique("rc")
    s = Sturdy(conn)
    done = []
    w = fast(dsn, q, lambda p: done.append(p.workflow), concurrency=2)
    before = threading.active_count()
    w.start()
    app = f"pg_sturdy worker {q}"[:63]

    def pids():
        return {r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,))}

    try:
        for i in range(100):
            s.schedule(f"{q}/{i}", queue=q)
            until(lambda: f"{q}/{i}" in done, 30, f"pass {i}")
            old = pids()
            assert old
            # mid-idle on even rounds; mid-pass on odd ones a pass is in flight
            conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", (list(old),))
            until(lambda: len(pids() - old) >= 2, 30, f"reconnected after round {i}")
        s.schedule(f"{q}/last", queue=q)
        until(lambda: f"{q}/last" in done, 30)
        # two serving threads, at most one heartbeat each, one connection each
        # beside at most one heartbeat connection each
        assert threading.active_count() - before <= 4, threading.enumerate()
        assert len(pids()) <= 4, pids()
    finally:
        w.stop()
        w.join(0)
    until(lambda: threading.active_count() <= before, 10, "the worker's threads ended")
    until(lambda: not pids(), 10, "the worker's connections closed")


def test_a_pass_whose_connection_is_terminated_mid_pass_is_handed_back_and_done_once(dsn, conn, effects):
    q = unique("mid")
    s = Sturdy(conn)
    wf = f"mid/{unique('w')}"
    s.schedule(wf, queue=q)
    runs = []

    def handle(p: Pass):
        runs.append(p.attempt)
        p.transact("one", "client_test.effect(jsonb)", {"workflow": p.workflow, "step": "one"})
        if len(runs) == 1:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s"
                         " AND pid <> pg_backend_pid()", (f"pg_sturdy worker {q}"[:63],))
            time.sleep(0.2)
        p.transact("two", "client_test.effect(jsonb)", {"workflow": p.workflow, "step": "two"})

    w = fast(dsn, q, handle)
    w.start()
    try:
        until(lambda: row(conn, wf) is None, 60, "finished")
    finally:
        w.stop()
        w.join(0)
    assert conn.execute("SELECT step, count(*) FROM client_test.effects WHERE workflow = %s GROUP BY step"
                        " ORDER BY step", (wf,)).fetchall() == [("one", 1), ("two", 1)]
    assert len(runs) >= 2


@pytest.mark.parametrize("operator", ["cancelled", "succeeded"])
def test_a_finish_meeting_an_instance_an_operator_ended_ends_the_pass_and_the_thread_serves_on(dsn, conn, operator):
    q = unique("op")
    s = Sturdy(conn)
    gate = threading.Event()
    first = s.start("op", unique("bk"), queue=q)
    second = s.start("op", unique("bk"), queue=q)

    def handle(p: Pass):
        if p.workflow == f"op/{first}":
            gate.wait(30)
        return "done"

    w = fast(dsn, q, handle, status="succeeded")
    w.start()
    try:
        until(lambda: conn.execute("SELECT leased_until IS NOT NULL FROM sturdy.queue WHERE workflow = %s",
                                   (f"op/{first}",)).fetchone() in ((True,), None), 30)
        assert s.transition(first, "pending", operator)
        gate.set()
        until(lambda: conn.execute("SELECT count(*) FROM sturdy.queue WHERE queue = %s", (q,)).fetchone()[0] == 0,
              30, "both passes ended")
        statuses = dict(conn.execute("SELECT id, status FROM sturdy.instances WHERE id IN (%s, %s)",
                                     (first, second)).fetchall())
        assert statuses == {first: operator, second: "succeeded"}
        assert w.restarts == 0 and not w.errors
    finally:
        gate.set()
        w.stop()
        w.join(0)


def test_a_worker_that_cannot_serve_fails_run(dsn):
    bad = dsn.replace("dbname=", "dbname=no_such_db_") if "dbname=" in dsn else dsn + " dbname=no_such_db"
    w = Worker(bad, unique("nq"), lambda p: None, backoff=(0.01, 0.05), give_up=1.0)
    started = time.monotonic()
    with pytest.raises(WorkerFailed) as e:
        w.run(install_signals=False)
    assert time.monotonic() - started < 20
    assert isinstance(e.value.__cause__, psycopg.OperationalError)


def test_an_async_handler_is_refused_by_the_sync_worker():
    async def handle(p):
        pass

    with pytest.raises(TypeError, match="AsyncWorker"):
        Worker("", "q", handle)


def test_a_server_restart_under_load_loses_nothing():
    """A scratch cluster of its own, restarted (fast shutdown) while a
    worker runs passes of three `transact` steps: every workflow ends
    done, each effect once, and the worker serves on."""
    port = 55470 + os.getpid() % 20
    d = pathlib.Path(tempfile.mkdtemp(prefix="sturdy_restart_"))  # (postgres must reach it: not pytest's tmp_path)
    os.chmod(d, 0o755)
    cluster = os.path.join(ROOT, "scripts", "cluster.sh")
    started = subprocess.run([cluster, "start", str(d), str(port)], capture_output=True, text=True)
    if started.returncode != 0:
        pytest.skip(f"no scratch cluster here: {started.stderr[-300:]}")
    dsn = f"host={d} port={port} user=postgres dbname=postgres"
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE EXTENSION pg_sturdy")
            c.execute("CREATE TABLE effects (workflow text, step text)")
            c.execute("CREATE FUNCTION effect(arg jsonb) RETURNS jsonb LANGUAGE sql AS"
                      " $$ INSERT INTO effects VALUES (arg->>'w', arg->>'s') RETURNING arg $$")
            s = Sturdy(c)
            for i in range(300):
                s.schedule(f"r/{i}", queue="r")

        def handle(p: Pass):
            for step in ("a", "b", "c"):
                p.transact(step, "public.effect(jsonb)", {"w": p.workflow, "s": step})
                time.sleep(0.002)

        w = fast(dsn, "r", handle, concurrency=3, lease=dt.timedelta(seconds=2))
        w.start()
        try:
            time.sleep(1.0)
            pg_ctl = os.path.join(subprocess.run([os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config"),
                                                  "--bindir"], capture_output=True, text=True).stdout.strip(), "pg_ctl")
            cmd = [pg_ctl, "-D", str(d / "data"), "-m", "fast", "-w", "restart", "-l", str(d / "server.log")]
            if os.getuid() == 0:
                cmd = ["runuser", "-u", "postgres", "--", "env", "-u", "RUST_BACKTRACE", *cmd]
            assert subprocess.run(cmd, capture_output=True).returncode == 0
            with psycopg.connect(dsn, autocommit=True) as c:
                until(lambda: c.execute("SELECT count(*) FROM sturdy.queue").fetchone()[0] == 0, 120, "drained")
                per_step = c.execute("SELECT count(*), count(DISTINCT (workflow, step)) FROM effects").fetchone()
                assert per_step == (900, 900), per_step
                s = Sturdy(c)
                s.schedule("r/after", queue="r")
                until(lambda: c.execute("SELECT count(*) FROM sturdy.queue").fetchone()[0] == 0, 30, "serving")
        finally:
            w.stop()
            w.join(0)
    finally:
        subprocess.run([cluster, "stop", str(d)], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def test_a_failed_pass_is_logged_with_its_traceback(dsn, conn, caplog):
    q = unique("log")
    Sturdy(conn).schedule(f"log/{unique('w')}", queue=q)

    def handle(p):
        raise KeyError("missing")

    w = fast(dsn, q, handle)
    with caplog.at_level(logging.ERROR, logger="pg_sturdy.worker"):
        w.start()
        try:
            until(lambda: any(r.exc_info for r in caplog.records), 30)
        finally:
            w.stop()
            w.join(0)
    failed = [r for r in caplog.records if "failed on attempt 1" in r.getMessage()]
    assert failed and failed[0].exc_info[0] is KeyError
