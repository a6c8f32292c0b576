#!/usr/bin/env python3
"""What the Python client (clients/python) adds to a pass: passes a second
on one connection, side by side in one run, of

  by hand   psycopg with the client's statements written out: take(claim)
            + load + record + finish, nothing prepared (as behind a pooler)
  calls     the same four calls through `Sturdy`
  worker    `Worker(concurrency=1)` with a handler of one `p.step`: the same
            statements, plus what the worker does around a pass (its
            heartbeat armed and disarmed, the pass's bookkeeping)
  app       `App.worker(concurrency=1)`: the handler registered for the
            workflows' process, dispatched by name, its result recorded
            (None here, so nothing more is sent)
  command   `python -m pg_sturdy worker bench_app:app` in a process of its
            own, the same App: counted by the rows it removed in the window

Each side runs BENCH_CLIENT_SECONDS (default 5) at a time on a queue of its
own kept full, the sides interleaved (each repetition starting with the
next side), six repetitions (BENCH_CLIENT_REPS), with
synchronous_commit on and off; the ratio to "by hand" is taken within each
repetition. Beside the rates, the CPU time this process spent a pass on
each side (time.process_time: the client's own cost, which the rates only
show through the server's noise). Not a test: it measures and reports (docs/benchmarks.md).

  scripts/bench_client.py         (the release build installed: make install)
"""
import datetime as dt
import os
import signal
import statistics
import subprocess
import sys
import time

import psycopg
from psycopg.types.json import Jsonb

import installed_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python", "src"))
from pg_sturdy import Pass, Sturdy, Worker  # noqa: E402

DIR = os.environ.get("BENCH_CLIENT_DIR", "/tmp/pg_sturdy_bench_client")
PORT = os.environ.get("BENCH_CLIENT_PORT", "55449")
SECONDS = float(os.environ.get("BENCH_CLIENT_SECONDS", "5"))
REPS = int(os.environ.get("BENCH_CLIENT_REPS", "6"))
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
DSN = f"host={os.path.join(DIR, 'cluster')} port={PORT} user=postgres dbname=bench"
LEASE = dt.timedelta(seconds=30)


def top_up(c, queue, n=30_000):
    have = c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = %s", (queue,)).fetchone()[0]
    if have < n:
        c.execute("SELECT count(sturdy.schedule(%s || '/' || g, now() - interval '1 hour', %s))"
                  " FROM generate_series(%s, %s) g", (queue, queue, int(time.time() * 1e6), int(time.time() * 1e6) + n))
    c.execute("VACUUM sturdy.queue")


def by_hand(seconds):
    # the statements the client sends, written out (parameters cast, by name
    # after the first skipped argument)
    with psycopg.connect(DSN, autocommit=True, prepare_threshold=None) as c:
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            workflow, receipt, token, attempt = c.execute(
                "SELECT workflow, receipt::text, token, attempt FROM sturdy.take(queue => %s::text,"
                " lease => %s::interval, max => %s::integer, claim => %s::boolean)", ("hand", LEASE, 1, True)).fetchone()
            done = {s for (s, *_) in c.execute("SELECT * FROM sturdy.load(%s::text)", (workflow,))}
            if "work" not in done:
                c.execute("SELECT * FROM sturdy.record(%s::text, %s::text, %s::jsonb, %s::bigint)",
                          (workflow, "work", Jsonb({"n": n}), token)).fetchall()
            c.execute("SELECT sturdy.finish(%s::text, %s::bigint, %s::timestamptz, queue => %s::text)",
                      (workflow, token, receipt, "hand")).fetchone()
            n += 1
        return n


def calls(seconds):
    with psycopg.connect(DSN, autocommit=True) as c:
        s = Sturdy(c)
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            [t] = s.take("calls", LEASE, 1, True)
            if "work" not in {x.step for x in s.load(t.workflow)}:
                s.record(t.workflow, "work", {"n": n}, t.token)
            s.finish(t.workflow, t.token, t.receipt, queue="calls")
            n += 1
        return n


def worker(seconds):
    count = [0]

    def handle(p: Pass):
        p.step("work", lambda: {"n": count[0]})
        count[0] += 1

    w = Worker(DSN, "worker", handle, lease=LEASE)
    w.start()
    time.sleep(seconds)
    w.stop()
    w.join()
    return count[0]


APP_MODULE = """
import functools
from pg_sturdy import App
app = App({dsn!r}, queue="command")
# (the rows are workflows of one's own, as the other sides': its finish
# moves no instance, so it sends what by hand sends)
app.worker = functools.partial(App.worker, app, status=None)
count = [0]

@app.workflow("command")
def handle(p):
    p.step("work", lambda: {{"n": count[0]}})
    count[0] += 1
"""


def app(seconds):
    from pg_sturdy import App

    a = App(DSN, queue="app")
    count = [0]

    @a.workflow("app")
    def handle(p: Pass):
        p.step("work", lambda: {"n": count[0]})
        count[0] += 1

    # (the rows are workflows of one's own, as the other sides', so the
    # finish moves no instance: status None)
    w = a.worker(lease=LEASE, status=None)
    w.start()
    time.sleep(seconds)
    w.stop()
    w.join()
    return count[0]


def command(seconds):
    with open(os.path.join(DIR, "bench_app.py"), "w") as f:
        f.write(APP_MODULE.format(dsn=DSN))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "clients", "python", "src"), DIR]))
    proc = subprocess.Popen([sys.executable, "-m", "pg_sturdy", "worker", "bench_app:app", "--lease", "30s",
                             "--log-level", "WARNING"], env=env, cwd=DIR)
    with psycopg.connect(DSN, autocommit=True) as c:
        left = lambda: c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'command'").fetchone()[0]
        first = left()
        while left() == first:  # (started: its import and connection are not in the window)
            time.sleep(0.01)
        time.sleep(1.0)  # (nor its first second, as the other sides run in a process long warm)
        before = left()
        time.sleep(seconds)
        after = left()
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    return before - after


SIDES = {"by hand": by_hand, "calls": calls, "worker": worker, "app": app, "command": command}
QUEUES = {"by hand": "hand", "calls": "calls", "worker": "worker", "app": "app", "command": "command"}


def main():
    installed_build.require_release(PG_CONFIG)
    cluster = os.path.join(DIR, "cluster")
    os.makedirs(DIR, exist_ok=True)
    subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "start", cluster, PORT,
                    "shared_preload_libraries = 'pg_sturdy'"], check=True, capture_output=True)
    results, cpus = {}, {}
    try:
        with psycopg.connect(f"host={cluster} port={PORT} user=postgres dbname=postgres", autocommit=True) as c:
            c.execute("DROP DATABASE IF EXISTS bench")
            c.execute("CREATE DATABASE bench")
        with psycopg.connect(DSN, autocommit=True) as c:
            c.execute("CREATE EXTENSION pg_sturdy")
            for commit in ("on", "off"):
                c.execute(f"ALTER SYSTEM SET synchronous_commit = {commit}")
                c.execute("SELECT pg_reload_conf()")
                for rep in range(REPS):
                    # (each repetition starts with another side: the first
                    # run after a top-up is not always the same one)
                    order = list(SIDES.items())
                    order = order[rep % len(order):] + order[:rep % len(order)]
                    for side, run in order:
                        top_up(c, QUEUES[side])
                        cpu = time.process_time()
                        passes = run(SECONDS)
                        rate = passes / SECONDS
                        cpus.setdefault((commit, side), []).append((time.process_time() - cpu) / passes * 1e6)
                        results.setdefault((commit, side), []).append(rate)
                        print(f"{commit} rep {rep + 1} {side:8} {rate:8,.0f} passes/s", file=sys.stderr, flush=True)
    finally:
        subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "stop", cluster], capture_output=True)
    print(f"Passes a second on one connection (median, range of {REPS} runs of {SECONDS:g} s);"
          " the ratio to by hand taken within each repetition:\n")
    others = [side for side in SIDES if side != "by hand"]
    print("| synchronous_commit | by hand | " + " | ".join(f"{o} | {o} / by hand" for o in others) + " |")
    print("|---|---:|" + "---:|---:|" * len(others))
    for commit in ("on", "off"):
        hand = results[(commit, "by hand")]
        cell = lambda xs: f"{statistics.median(xs):,.0f} ({min(xs):,.0f}..{max(xs):,.0f})"
        ratio = lambda side: [a / b for a, b in zip(results[(commit, side)], hand)]
        cells = []
        for o in others:
            r = ratio(o)
            cells.append(f"{cell(results[(commit, o)])} | {statistics.median(r):.2f} ({min(r):.2f}..{max(r):.2f})")
        print(f"| {commit} | {cell(hand)} | " + " | ".join(cells) + " |")

    print("\nThe client process's CPU a pass (median of the runs, µs; the server's work is not in it):\n")
    inside = [side for side in SIDES if side != "command"]  # (the command's CPU is another process's)
    print("| synchronous_commit | " + " | ".join(inside) + " |")
    print("|---|" + "---:|" * len(inside))
    for commit in ("on", "off"):
        med = lambda side: statistics.median(cpus[(commit, side)])
        print(f"| {commit} | " + " | ".join(f"{med(side):.0f}" for side in inside) + " |")


if __name__ == "__main__":
    main()
