"""The worker: steps replayed from checkpoints, a wait for a value, a
failing handler, a long pass kept by its heartbeat, SIGTERM's hand-back,
a fenced pass dropped, and 200 workflows through workers killed with
SIGKILL, each step's effect once."""
import datetime as dt
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid

import psycopg
import pytest

from pg_sturdy import Pass, Sturdy, Worker

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def until(what, seconds=60):
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.05)


def running(worker):
    worker.start()
    return worker


def test_steps_replay_and_a_wait_ends_the_pass_until_the_value_arrives(dsn, conn, effects):
    q = unique("wq")
    calls = []

    def handle(p: Pass):
        a = p.step("one", lambda: calls.append(("one", p.workflow)) or 1)
        b = p.wait_for("approval")
        p.step("two", lambda: calls.append(("two", p.workflow)) or a + b)

    s = Sturdy(conn)
    i = s.start("flowp", unique("bk"), queue=q)
    workflow = s.status(conn.execute("SELECT business_key FROM sturdy.instances WHERE id = %s", (i,))
                        .fetchone()[0]).workflow
    w = running(Worker(dsn, q, handle, status="succeeded", lease=dt.timedelta(seconds=5)))
    try:
        until(lambda: [c.step for c in s.load(workflow)] == ["one"])
        # the pass ended at the wait: the row sleeps, the claim is free
        until(lambda: conn.execute("SELECT leased_until IS NULL AND visible_at > now() FROM sturdy.queue"
                                   " WHERE workflow = %s", (workflow,)).fetchone() == (True,))
        s.arrive(workflow, "approval", 41, q)
        until(lambda: s.status(conn.execute("SELECT business_key FROM sturdy.instances WHERE id = %s", (i,))
                               .fetchone()[0]).status == "succeeded")
    finally:
        w.stop()
        w.join()
    assert calls == [("one", workflow), ("two", workflow)], "each step ran once; the second pass replayed 'one'"
    assert [(c.step, c.value) for c in s.load(workflow)] == [("one", 1), ("approval", 41), ("two", 42)]
    assert not w.errors


def test_a_wait_past_its_deadline_raises_in_the_handler(dsn, conn):
    q = unique("dq")
    seen = []

    def handle(p: Pass):
        try:
            p.wait_for("never", until=dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1))
        except Exception as e:  # noqa: BLE001
            seen.append(type(e).__name__)

    Sturdy(conn).schedule(unique("w"), queue=q)
    w = running(Worker(dsn, q, handle))
    try:
        until(lambda: seen)
    finally:
        w.stop()
        w.join()
    assert seen == ["WaitTimeout"]


def test_a_handler_that_raises_fails_the_pass_and_the_policy_retries_then_kills(dsn, conn):
    q, wf = unique("fq"), unique("w")
    s = Sturdy(conn)
    s.retry_queue(q, max_attempts=3, backoff="0 seconds")
    s.schedule(wf, queue=q)
    attempts = []

    def handle(p: Pass):
        attempts.append(p.attempt)
        raise psycopg.errors.DivisionByZero("no")  # a handler's own error, with a SQLSTATE

    w = running(Worker(dsn, q, handle))
    try:
        until(lambda: conn.execute("SELECT visible_at = 'infinity' FROM sturdy.queue WHERE workflow = %s",
                                   (wf,)).fetchone() == (True,))
    finally:
        w.stop()
        w.join()
    assert attempts == [1, 2, 3]
    assert conn.execute("SELECT attempts, last_error, last_sqlstate FROM sturdy.queue WHERE workflow = %s",
                        (wf,)).fetchone() == (3, "DivisionByZero: no", "22012")


def test_a_pass_longer_than_its_lease_keeps_its_row_and_claim(dsn, conn):
    q, wf = unique("lq"), unique("w")
    Sturdy(conn).schedule(wf, queue=q)
    passes = []

    def handle(p: Pass):
        passes.append(p.attempt)
        time.sleep(3.5)  # a lease of 1 s, three times over
        p.step("done", lambda: True)

    workers = [running(Worker(dsn, q, handle, lease=dt.timedelta(seconds=1))) for _ in range(2)]
    try:
        until(lambda: conn.execute("SELECT count(*) FROM sturdy.queue WHERE workflow = %s",
                                   (wf,)).fetchone() == (0,), 30)
    finally:
        for w in workers:
            w.stop()
        for w in workers:
            w.join()
    assert passes == [1], "one pass: the other worker never took the row, and no lapse was counted"


def test_a_fenced_pass_is_dropped(dsn, conn):
    q, wf = unique("xq"), unique("w")
    s = Sturdy(conn)
    s.schedule(wf, queue=q)
    ended = []

    def handle(p: Pass):
        with psycopg.connect(dsn, autocommit=True) as other:
            Sturdy(other).cancel(p.workflow, q)  # fences the pass's claim
        try:
            p.step("late", lambda: 1)
        finally:
            ended.append(True)

    w = running(Worker(dsn, q, handle))
    try:
        until(lambda: ended)
        time.sleep(0.3)
    finally:
        w.stop()
        w.join()
    assert not w.errors and s.load(wf) == []
    assert conn.execute("SELECT count(*) FROM sturdy.queue WHERE workflow = %s", (wf,)).fetchone() == (0,)


@pytest.mark.parametrize("signals, drain", [(1, 2), (2, 60)])
def test_sigterm_drains_then_hands_the_pass_back_and_a_second_hands_it_back_at_once(dsn, conn, signals, drain):
    """One SIGTERM: the pass in flight may finish for `drain` seconds, then
    goes back (visible a second on, its claim released) and the process
    ends; a second SIGTERM does that at once."""
    q, wf = unique("tq"), unique("w")
    Sturdy(conn).schedule(wf, queue=q)
    script = ("import sys, time; sys.path.insert(0, sys.argv[3])\n"
              "from pg_sturdy import Worker\n"
              "def handle(p):\n"
              "    print('taken', flush=True); time.sleep(120)\n"
              "Worker(sys.argv[1], sys.argv[2], handle, drain=float(sys.argv[4]),\n"
              "       lease=__import__('datetime').timedelta(minutes=5)).run()\n")
    proc = subprocess.Popen([sys.executable, "-c", script, dsn, q, SRC, str(drain)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "taken"
        started = time.monotonic()
        for _ in range(signals):
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
        time.sleep(0.5)
        if signals == 1:
            assert proc.poll() is None, "draining: the pass may still finish"
        assert proc.wait(30) == 0
        took = time.monotonic() - started
        assert took >= (drain if signals == 1 else 0), took
        assert took < drain + 15 if signals == 1 else took < 15, took
    finally:
        if proc.poll() is None:
            proc.kill()
    until(lambda: conn.execute(
        "SELECT q.leased_until IS NULL AND q.visible_at <= now() AND c.held_until <= now()"
        " FROM sturdy.queue q JOIN sturdy.claims c USING (workflow) WHERE q.workflow = %s", (wf,)).fetchone()[0],
        10)


def test_two_hundred_workflows_through_workers_killed_mid_step_each_step_once(dsn, conn, effects):
    """The done-means scenario: three steps and a wait for an approval, 200
    workflow instances, 4 worker processes, a SIGKILL of one of them every
    second or so (a replacement started each time), approvals arriving
    meanwhile: every instance succeeds, each step's effect happened once."""
    q = unique("flow")
    s = Sturdy(conn)
    keys = [unique("order") for _ in range(200)]
    for k in keys:
        s.start("order", k, queue=q)
    workflows = {w for (w,) in conn.execute("SELECT workflow FROM sturdy.instances WHERE business_key = ANY(%s)",
                                            (keys,))}
    start = lambda: subprocess.Popen([sys.executable, os.path.join(HERE, "flow_worker.py"), dsn, q],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    workers = [start() for _ in range(4)]
    stop = threading.Event()

    def approver():
        with psycopg.connect(dsn, autocommit=True) as c:
            a = Sturdy(c)
            while not stop.is_set():
                waiting = [w for (w,) in c.execute(
                    "SELECT r.workflow FROM sturdy.checkpoints r WHERE r.workflow = ANY(%s) AND r.step = 'reserve'"
                    " AND NOT EXISTS (SELECT FROM sturdy.checkpoints a WHERE a.workflow = r.workflow"
                    " AND a.step = 'approval')", (list(workflows),))]
                for w in waiting:
                    a.arrive(w, "approval", True, q)
                time.sleep(0.1)

    approving = threading.Thread(target=approver)
    approving.start()
    killed = 0
    try:
        rng = random.Random(7)
        for _ in range(6):
            time.sleep(1.0)
            victim = workers.pop(rng.randrange(len(workers)))
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            killed += 1
            workers.append(start())
        until(lambda: conn.execute("SELECT count(*) FROM sturdy.instances WHERE business_key = ANY(%s)"
                                   " AND status = 'succeeded'", (keys,)).fetchone()[0] == len(keys), 180)
    finally:
        stop.set()
        approving.join()
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(20)
            except subprocess.TimeoutExpired:
                w.kill()
    effects_per_step = conn.execute(
        "SELECT count(*), count(DISTINCT (workflow, step)), max(n) FROM"
        " (SELECT workflow, step, count(*) AS n FROM client_test.effects WHERE workflow = ANY(%s)"
        "  GROUP BY workflow, step) e", (list(workflows),)).fetchone()
    assert killed == 6
    assert effects_per_step == (len(keys) * 3, len(keys) * 3, 1), \
        f"(steps with effects, distinct, most effects of one step): {effects_per_step}"
    left = conn.execute("SELECT count(*) FROM sturdy.queue WHERE queue = %s", (q,)).fetchone()[0]
    assert left == 0
