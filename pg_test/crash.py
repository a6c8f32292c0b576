#!/usr/bin/env python3
"""Crash: a load of workers (take with a claim, record, finish) and pumps
(emit, pump with a subscriber that inserts a row), killed with `kill -9`,
once of one backend (the postmaster then resets every backend and recovers)
and once of the postmaster itself (restarted here). After each: every write
a commit acknowledged is there, nothing half-done is visible, leases held at
the crash lapse and their rows are taken again, and the load drains.

Run last by scripts/suites.sh (it kills the suites' cluster):
  pg_test/crash.py BINDIR DATADIR "host=... port=... user=postgres"
"""
import os
import signal
import subprocess
import sys
import threading
import time

import psycopg

BINDIR, DATADIR, CONN = sys.argv[1], sys.argv[2], sys.argv[3]
DB = "sturdy_crash"
JOBS, EVENTS, LEASE = 6000, 400, 2

SETUP = f"""
CREATE EXTENSION pg_sturdy;
CREATE TABLE public.sink (outbox bigint PRIMARY KEY);
CREATE FUNCTION public.to_sink(m sturdy.outbox, attempt int) RETURNS void LANGUAGE sql
  AS 'INSERT INTO public.sink VALUES (m.id)';
SELECT sturdy.subscribe('crash.e', 'public.to_sink(sturdy.outbox, integer)', 20);
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


def lost_connection(e):
    """Whether `e` is the connection going with the server (what a kill
    does), not an error of a statement."""
    return (e.sqlstate is None and isinstance(e, psycopg.OperationalError)) or \
        (e.sqlstate or "").startswith("08") or e.sqlstate in ("57P01", "57P02", "57P03")


class Load:
    """Workers and pumps until stopped or their connection dies; every
    finish acknowledged by its commit is noted. With `killed`, a lost
    connection ends a thread quietly; any other error is noted in `errors`
    (and every error is, without `killed`)."""

    def __init__(self, killed=True):
        self.finished, self.lock, self.stop = set(), threading.Lock(), threading.Event()
        self.killed, self.errors = killed, []

    def failed(self, e):
        if not (self.killed and lost_connection(e)):
            with self.lock:
                self.errors.append(f"{e.sqlstate}: {e}")

    def until_finished(self, n, seconds=60):
        """Wait until `n` finishes were acknowledged: the kill comes mid-load."""
        deadline = time.monotonic() + seconds
        while len(self.finished) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(self.finished) >= n

    def worker(self):
        try:
            with connect() as c:
                while not self.stop.is_set():
                    row = c.execute(f"SELECT workflow, receipt, token FROM sturdy.take('crash', '{LEASE} s', 1, true)"
                                    ).fetchone()
                    if row is None:
                        return
                    workflow, receipt, token = row
                    if token is None:  # its claim is still held: leave it for later
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
        return load.errors, c.execute("SELECT (SELECT count(*) FROM sturdy.queue WHERE queue = 'crash'),"
                         " (SELECT count(DISTINCT workflow) FROM sturdy.checkpoints WHERE step = 'final'),"
                         " (SELECT count(*) FROM sturdy.deliveries WHERE state <> 'done'),"
                         " (SELECT count(*) FROM public.sink)").fetchone()


def main():
    results = []

    def check(name, problems):
        results.append(not problems)
        print(("ok   " if not problems else "FAIL ") + name + ("" if not problems else f": {problems}"), flush=True)

    with psycopg.connect(f"{CONN} dbname=postgres", autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB}")
        c.execute(f"CREATE DATABASE {DB}")
    with connect() as c:
        c.execute(SETUP)

    # 1. kill -9 of one backend: the postmaster resets all of them
    load = Load()
    load.run()
    check("the load works before the first kill (100 finishes)", [] if load.until_finished(100) else
          [f"{len(load.finished)} finishes", *load.errors[:3]])
    with connect() as c:
        victim = c.execute(f"SELECT pid FROM pg_stat_activity WHERE datname = '{DB}'"
                           " AND pid <> pg_backend_pid() AND state IS NOT NULL ORDER BY pid LIMIT 1").fetchone()
    if victim is None:
        check("a backend to kill under load", ["the load had ended"])
        sys.exit(1)
    os.kill(victim[0], signal.SIGKILL)
    load.join()
    wait_up()
    check(f"kill -9 of a backend mid-load: {len(load.finished)} acknowledged finishes kept, nothing half-done",
          check_consistent(load.finished) + load.errors[:3])
    acked = set(load.finished)

    # 2. kill -9 of the postmaster, and a restart
    load = Load()
    load.run()
    check("the load works again before the second kill (100 more finishes)", [] if load.until_finished(100) else
          [f"{len(load.finished)} finishes", *load.errors[:3]])
    with open(os.path.join(DATADIR, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    os.kill(postmaster, signal.SIGKILL)
    load.join()
    # its backends notice the postmaster is gone and exit; then start again
    for _ in range(60):
        if as_pg(os.path.join(BINDIR, "pg_ctl"), "-D", DATADIR, "status").returncode != 0:
            break
        time.sleep(0.5)
    time.sleep(1)
    started = as_pg(os.path.join(BINDIR, "pg_ctl"), "-D", DATADIR, "-l", os.path.join(DATADIR, "..", "server.log"),
                    "-w", "-t", "60", "start")
    if started.returncode != 0:
        check("restart after kill -9 of the postmaster", [started.stderr or started.stdout])
    else:
        wait_up()
        acked |= load.finished
        check(f"kill -9 of the postmaster mid-load: {len(acked)} acknowledged finishes kept, nothing half-done",
              check_consistent(acked) + load.errors[:3])
        errors, (queued, finals, undelivered, sink) = drain()
        check("leases held at the crash lapse, the load resumes and drains, without an error",
              ([] if (queued, finals, undelivered, sink) == (0, JOBS, 0, EVENTS)
               else [f"{queued} still queued, {finals} finished of {JOBS}, {undelivered} undelivered, "
                     f"{sink} subscriber rows of {EVENTS}"]) + errors[:3])
    print(f"crash: {sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
