"""The task model as a user writes it: an App with a handler per process on
one queue, a start's handle waiting for the result on the server's
notification, a durable sleep, the errors that say how to retry, an
asyncio worker, and the `python -m pg_sturdy worker` command."""
import asyncio
import datetime as dt
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import psycopg
import pytest

from pg_sturdy import (App, AsyncPass, AsyncWorker, Pass, Sturdy, Worker, WorkflowCancelled, WorkflowFailed)

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def serving(worker):
    worker.start()
    return worker


def test_one_worker_serves_every_process_of_its_queue_and_the_handle_gets_each_result(dsn):
    app = App(dsn, queue=unique("app"))
    seen = []

    @app.workflow("order")
    def order(p: Pass):
        seen.append(("order", p.business_key, p.variables["total"]))
        charge = p.step("charge", lambda: {"charged": p.variables["total"], "at": dt.date(2026, 12, 7)})
        return {"order": p.business_key, "charge": charge}

    @app.workflow("refund")
    def refund(p: Pass):
        seen.append(("refund", p.business_key, p.instance.id))
        return None

    w = serving(app.worker(concurrency=2, lease=dt.timedelta(seconds=5)))
    try:
        o = app.start("order", "o-1", {"total": 120})
        r = app.start("refund", "r-1")
        assert o.result(timeout=30) == {"order": "o-1", "charge": {"charged": 120, "at": "2026-12-07"}}
        assert r.result(timeout=30) is None
        assert o.status() == "succeeded" and r.status() == "succeeded"
        assert app.handle(o.id).result(timeout=1) == o.result(timeout=1)
    finally:
        w.stop()
        w.join(0)
    assert sorted(seen) == [("order", "o-1", 120), ("refund", "r-1", r.id)]


def test_the_result_wait_is_a_notification_not_a_poll(dsn, conn):
    """A wait of three seconds costs the same statements as none: LISTEN,
    watch, one read when the end is announced, one read of the result."""
    app = App(dsn, queue=unique("wait"))

    @app.workflow("slow")
    def slow(p: Pass):
        time.sleep(3)
        return 7

    h = app.start("slow", "s-1")
    counted = []

    class Counting(psycopg.Cursor):
        def execute(self, query, *a, **k):
            counted.append(query)
            return super().execute(query, *a, **k)

    waiter = App(dsn, queue=app.queue, connect=lambda: psycopg.connect(dsn, autocommit=True, cursor_factory=Counting))
    w = serving(app.worker(lease=dt.timedelta(seconds=10)))
    try:
        started = time.monotonic()
        assert waiter.handle(h.id).result(timeout=30) == 7
        assert time.monotonic() - started >= 2
    finally:
        w.stop()
        w.join(0)
    # handle(): its workflow; result(): LISTEN, watch, the status once the end
    # was announced, the result
    assert len(counted) == 5, counted
    assert "sturdy.watch" in counted[2]


def test_a_durable_sleep_ends_the_pass_and_the_next_goes_on_after_it(dsn, conn):
    app = App(dsn, queue=unique("sleep"))
    passes = []

    @app.workflow("nap")
    def nap(p: Pass):
        passes.append(p.attempt)
        p.step("before", lambda: len(passes))
        p.sleep(dt.timedelta(seconds=1.5))
        p.sleep(0.2, name="short")
        return p.step("after", lambda: len(passes))

    w = serving(app.worker(lease=dt.timedelta(seconds=5)))
    try:
        h = app.start("nap", "n-1")
        started = time.monotonic()
        assert h.result(timeout=30) == 3, "three passes: the start, after each sleep"
        assert time.monotonic() - started >= 1.6
    finally:
        w.stop()
        w.join(0)
    steps = [c.step for c in Sturdy(conn).load(h.workflow)]
    assert steps[:2] == ["before", "sleep.1"] and "short" in steps and "$result" in steps


def test_failures_reach_the_handle_as_the_instance_ended(dsn):
    from pg_sturdy import DoNotRetry

    app = App(dsn, queue=unique("fails"))

    @app.workflow("never")
    def never(p):
        raise DoNotRetry("address unknown")

    @app.workflow("hang")
    def hang(p):
        p.wait_for("approval")

    w = serving(app.worker(lease=dt.timedelta(seconds=5)))
    try:
        with pytest.raises(WorkflowFailed, match="DoNotRetry: address unknown"):
            app.start("never", "n-1").result(timeout=30)
        h = app.start("hang", "h-1")
        with pytest.raises(TimeoutError):
            h.result(timeout=0.5)
        with psycopg.connect(dsn, autocommit=True) as c:
            assert Sturdy(c).transition(h.id, "pending", "cancelled")
        with pytest.raises(WorkflowCancelled):
            h.result(timeout=30)
    finally:
        w.stop()
        w.join(0)


def test_an_unknown_process_fails_its_pass_and_is_retried(dsn, conn):
    app = App(dsn, queue=unique("unk"))

    @app.workflow("known")
    def known(p):
        return 1

    s = Sturdy(conn)
    s.retry_queue(app.queue, backoff="1 hour")
    i = s.start("stranger", unique("bk"), queue=app.queue)
    w = serving(app.worker())
    try:
        deadline = time.monotonic() + 30
        while conn.execute("SELECT attempts FROM sturdy.queue WHERE workflow = %s",
                           (f"stranger/{i}",)).fetchone()[0] is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        error = conn.execute("SELECT last_error FROM sturdy.queue WHERE workflow = %s",
                             (f"stranger/{i}",)).fetchone()[0]
        assert error.startswith("NoHandler: stranger/") and "registered: known" in error
    finally:
        w.stop()
        w.join(0)


def test_async_handlers_run_on_the_async_worker_with_steps_sleep_and_results(dsn):
    app = App(dsn, queue=unique("async"))

    @app.workflow("fetch")
    async def fetch(p: AsyncPass):
        i = await p.instance()

        async def slow_double():
            await asyncio.sleep(0.01)
            return i.variables["n"] * 2

        doubled = await p.step("double", slow_double)
        await p.sleep(0.3)
        return {"doubled": doubled, "key": i.business_key}

    async def main():
        w = app.worker(concurrency=4, lease=dt.timedelta(seconds=5))
        assert isinstance(w, AsyncWorker)
        serving_ = asyncio.create_task(w.serve(install_signals=False))
        try:
            handles = [await app.start_async("fetch", f"f-{n}", {"n": n}) for n in range(8)]
            return [await h.result(timeout=30) for h in handles]
        finally:
            w.stop()
            await serving_

    results = asyncio.run(main())
    assert results == [{"doubled": n * 2, "key": f"f-{n}"} for n in range(8)]


def test_the_command_runs_an_apps_worker_and_drains_on_sigterm(dsn, conn, tmp_path):
    q = unique("cmd")
    (tmp_path / "cmdapp.py").write_text(textwrap.dedent(f"""
        import time
        from pg_sturdy import App
        app = App({dsn!r}, queue={q!r})

        @app.workflow("job")
        def job(p):
            if p.variables.get("fail"):
                raise ValueError("bad input")
            time.sleep(p.variables.get("sleep", 0))
            return p.variables
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, str(tmp_path)]))
    proc = subprocess.Popen([sys.executable, "-m", "pg_sturdy", "worker", "cmdapp:app", "--concurrency", "2",
                             "--drain", "20s", "--lease", "10s"], env=env, cwd=str(tmp_path),
                            stderr=subprocess.PIPE, text=True)
    try:
        app = App(dsn, queue=q)  # (starts only: the handlers are the command's)
        assert app.start("job", "j-1", {"x": 1}).result(timeout=30) == {"x": 1}
        bad = app.start("job", "j-2", {"fail": True})
        long = app.start("job", "j-3", {"sleep": 2})
        deadline = time.monotonic() + 30
        while conn.execute("SELECT leased_until IS NULL FROM sturdy.queue WHERE workflow = %s",
                           (long.workflow,)).fetchone()[0]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert long.status() == "succeeded", "the pass in flight finished within the drain"
        assert bad.status() == "pending"
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert "job/%d failed on attempt 1" % bad.id in err and "Traceback" in err and "ValueError: bad input" in err


def test_the_command_exits_one_when_the_worker_cannot_serve(tmp_path):
    env = dict(os.environ, PYTHONPATH=SRC)
    (tmp_path / "h.py").write_text("def handle(p):\n    pass\n")
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    out = subprocess.run([sys.executable, "-m", "pg_sturdy", "worker", "h:handle", "--queue", "q", "--dsn",
                          "host=/nonexistent port=1", "--give-up", "1s"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "no take for 1 s" in out.stderr


def test_the_readmes_first_workflow_runs_as_written(dsn, tmp_path):
    """The README's `shop.py`, its DSN line the one thing changed, run as
    it says: the command in one process, the script in another."""
    readme = open(os.path.join(os.path.dirname(HERE), "README.md")).read()
    first = readme.split("## A first workflow", 1)[1]
    code = first.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'DSN = "dbname=app"' in code
    (tmp_path / "shop.py").write_text(code.replace('DSN = "dbname=app"', f"DSN = {dsn!r}"))
    commands = first.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    env = dict(os.environ, PYTHONPATH=SRC)
    worker = subprocess.Popen([sys.executable, "-m", *commands[0].split()[2:]], cwd=str(tmp_path), env=env,
                              stderr=subprocess.DEVNULL)
    try:
        out = subprocess.run([sys.executable, *commands[1].split()[1:]], cwd=str(tmp_path), env=env,
                             capture_output=True, text=True, timeout=90)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == "{'order': 'order-42', 'charged': 120}"
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
