"""Crash: a load of workers (take with a claim, record, finish; one
workflow in five fails its first two passes) and pumps (emit, pump with a
subscriber that inserts a row), killed with `kill -9`, once of one backend
(the postmaster then resets every backend and recovers) and once of the
postmaster itself (restarted here). After each: every write a commit
acknowledged is there, nothing half-done is visible, leases held at the
crash lapse and their rows are taken again, and the load drains; over it
all, each workflow's attempts were counted once each, none lost and none
invented (`sturdy.attempt_problems`).

Run last by scripts/suites.sh, on its own: it kills the suites' cluster.
Its tests run in order, each on what the one before left.
"""
import os
import signal
import subprocess
import threading
import time

import psycopg
import pytest

from sturdy import SERVER as CONN, Finishes, attempt_problems, failing_pass, lost_connection, needs

DB = "sturdy_crash"
JOBS, EVENTS, LEASE = 6000, 400, 2

SETUP = f"""
CREATE EXTENSION pg_sturdy;
CREATE TABLE public.sink (outbox bigint PRIMARY KEY);
CREATE FUNCTION public.to_sink(m sturdy.outbox, attempt int) RETURNS void LANGUAGE sql
  AS 'INSERT INTO public.sink VALUES (m.id)';
SELECT sturdy.subscribe('crash.e', 'public.to_sink(sturdy.outbox, integer)', 20);
SELECT sturdy.retry_queue('crash', backoff => '0 seconds', jitter => 0);
SELECT sturdy.schedule('job-' || i, now() - interval '1 s', 'crash') FROM generate_series(1, {JOBS}) i;
SELECT sturdy.emit('crash.e', to_jsonb(i)) FROM generate_series(1, {EVENTS}) i;
"""


def connect():
    return psycopg.connect(f"{CONN} dbname={DB}", autocommit=True, connect_timeout=5)


def as_pg(*cmd):
    if os.getuid() == 0:
        cmd = ("runuser", "-u", "postgres", "--", *cmd)
    return subprocess.run(cmd, capture_output=True, text=True)


def wait_up(seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with connect() as c:
                c.execute("SELECT 1")
                return
        except psycopg.Error:
            time.sleep(0.5)
    raise RuntimeError("the server did not come back")


class Load(Finishes):
    """Workers and pumps until stopped or their connection dies; every
    finish acknowledged by its commit is noted. With `killed`, a lost
    connection ends a thread quietly; any other error is noted in `errors`
    (and every error is, without `killed`)."""

    def __init__(self, killed=True):
        self.finished, self.lock, self.stop = set(), threading.Lock(), threading.Event()
        self.killed, self.errors, self.attempts = killed, [], {}

    def failed(self, e):
        if not (self.killed and lost_connection(e)):
            with self.lock:
                self.errors.append(f"{e.sqlstate}: {e}")


    def worker(self):
        try:
            with connect() as c:
                while not self.stop.is_set():
                    row = c.execute("SELECT workflow, receipt, token, attempt"
                                    f" FROM sturdy.take('crash', '{LEASE} s', 1, true)").fetchone()
                    if row is None:
                        return
                    workflow, receipt, token, attempt = row
                    with self.lock:
                        self.attempts.setdefault(workflow, []).append(attempt)
                    if token is None:  # its claim is still held: leave it for later
                        continue
                    if failing_pass(workflow, attempt):
                        c.execute("SELECT sturdy.fail(%s, %s, 'planned', 'crash')", (workflow, receipt))
                        continue
                    c.execute("SELECT * FROM sturdy.record(%s, 'work', '1', %s)", (workflow, token))
                    c.execute("SELECT sturdy.finish(%s, %s, %s, 'final', '\"done\"', queue => 'crash')",
                              (workflow, token, receipt))
                    with self.lock:
                        self.finished.add(workflow)
        except psycopg.Error as e:
            self.failed(e)

    def pump(self):
        try:
            with connect() as c:
                while not self.stop.is_set() and c.execute("SELECT seen FROM sturdy.pump(10)").fetchone()[0]:
                    pass
        except psycopg.Error as e:
            self.failed(e)

    def run(self, workers=3, pumps=1):
        self.threads = [threading.Thread(target=self.worker) for _ in range(workers)]
        self.threads += [threading.Thread(target=self.pump) for _ in range(pumps)]
        for t in self.threads:
            t.start()

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def check_consistent(acked):
    """What a crash must not lose or half-do."""
    problems = []
    with connect() as c:
        final = {w for (w,) in c.execute("SELECT workflow FROM sturdy.checkpoints WHERE step = 'final'")}
        queued = {w for (w,) in c.execute("SELECT workflow FROM sturdy.queue WHERE queue = 'crash'")}
        lost = acked - final
        if lost:
            problems.append(f"{len(lost)} acknowledged finishes lost, e.g. {sorted(lost)[:3]}")
        half = final & queued
        if half:
            problems.append(f"{len(half)} workflows recorded final but still queued (half a finish)")
        (sink, done) = c.execute("SELECT (SELECT count(*) FROM public.sink),"
                                 " (SELECT count(*) FROM sturdy.deliveries WHERE state = 'done')").fetchone()
        if sink != done:
            problems.append(f"{sink} subscriber rows for {done} done deliveries")
    return problems


def drain():
    """After the leases lapse, the load resumes and everything gets done."""
    time.sleep(LEASE + 0.5)
    load = Load(killed=False)
    load.run(workers=3, pumps=2)
    for t in load.threads:
        t.join()
    with connect() as c:
        return load, c.execute("SELECT (SELECT count(*) FROM sturdy.queue WHERE queue = 'crash'),"
                         " (SELECT count(DISTINCT workflow) FROM sturdy.checkpoints WHERE step = 'final'),"
                         " (SELECT count(*) FROM sturdy.deliveries WHERE state <> 'done'),"
                         " (SELECT count(*) FROM public.sink)").fetchone()


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.fixture(scope="module")
def state():
    """The database set up; what the tests hand on to the next."""
    needs("STURDY_BINDIR", "STURDY_DATADIR")
    with psycopg.connect(f"{CONN} dbname=postgres", autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB}")
        c.execute(f"CREATE DATABASE {DB}")
    with connect() as c:
        c.execute(SETUP)
    return {"acked": set(), "attempts": {}}


def keep_attempts(state, load):
    for workflow, attempts in load.attempts.items():
        state["attempts"].setdefault(workflow, []).extend(attempts)


def test_a_kill_of_a_backend_mid_load_loses_nothing_acknowledged(state):
    """kill -9 of one backend: the postmaster resets all of them."""
    load = Load()
    load.run()
    assert load.until_finished(100), f"the load did not work: {len(load.finished)} finishes, {load.errors[:3]}"
    with connect() as c:
        victim = c.execute(f"SELECT pid FROM pg_stat_activity WHERE datname = '{DB}'"
                           " AND pid <> pg_backend_pid() AND state IS NOT NULL ORDER BY pid LIMIT 1").fetchone()
    assert victim is not None, "the load had ended before the kill"
    os.kill(victim[0], signal.SIGKILL)
    load.join()
    wait_up()
    problems = check_consistent(load.finished) + load.errors[:3]
    keep_attempts(state, load)
    print(f"     {len(load.finished)} acknowledged finishes before the kill")
    assert not problems, problems
    state["acked"] |= load.finished


def test_a_kill_of_the_postmaster_mid_load_loses_nothing_acknowledged(state):
    """kill -9 of the postmaster, and a start once every process of the old
    one is gone (a start beside orphans still attached to the old shared
    memory is refused)."""
    bindir, datadir = needs("STURDY_BINDIR", "STURDY_DATADIR")
    load = Load()
    load.run()
    assert load.until_finished(100), f"the load did not work: {len(load.finished)} finishes, {load.errors[:3]}"
    with connect() as c:
        pids = [pid for (pid,) in c.execute("SELECT pid FROM pg_stat_activity")]
    with open(os.path.join(datadir, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    os.kill(postmaster, signal.SIGKILL)
    load.join()
    # its processes notice the postmaster is gone and exit
    deadline = time.monotonic() + 60
    while any(alive(p) for p in pids + [postmaster]) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids + [postmaster] if alive(p)]
    assert not left, f"processes of the killed server still running after 60 s: {left}"
    started = as_pg(os.path.join(bindir, "pg_ctl"), "-D", datadir, "-l", os.path.join(datadir, "..", "server.log"),
                    "-w", "-t", "60", "start")
    assert started.returncode == 0, started.stderr or started.stdout
    wait_up()
    state["acked"] |= load.finished
    keep_attempts(state, load)
    print(f"     {len(load.finished)} acknowledged finishes before the kill, {len(state['acked'])} in all")
    problems = check_consistent(state["acked"]) + load.errors[:3]
    assert not problems, problems


def test_leases_held_at_the_crash_lapse_and_the_load_drains_without_an_error(state):
    load, (queued, finals, undelivered, sink) = drain()
    assert (queued, finals, undelivered, sink) == (0, JOBS, 0, EVENTS) and not load.errors, \
        (f"{queued} still queued, {finals} finished of {JOBS}, {undelivered} undelivered, "
         f"{sink} subscriber rows of {EVENTS}; errors: {load.errors[:3]}")
    keep_attempts(state, load)


def test_each_attempt_was_counted_once_across_both_crashes(state):
    """Every workflow was taken (the drain finished them all); the failing
    ones at least three times, their two planned failures counted across
    the kills."""
    seen = state["attempts"]
    assert len(seen) == JOBS, f"{len(seen)} of {JOBS} workflows were ever taken"
    short = [w for w, a in seen.items() if failing_pass(w, 1) and max(a) < 3]
    problems = attempt_problems(seen, crashes=2, workers=3)
    retried = sum(1 for a in seen.values() if max(a) > 1)
    print(f"     {retried} workflows taken more than once")
    assert not short and not problems, (short[:3], problems[:5])
