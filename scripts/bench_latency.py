#!/usr/bin/env python3
"""How long a job waits between its schedule and a worker's take, for a worker
that sleeps on LISTEN and for one that polls (through PgBouncer in
transaction mode, where it cannot LISTEN), both idle when each job arrives.

A producer schedules JOBS jobs one at a time, each at a random moment 0-2 s
after the one before was taken; the worker loops as examples/ do:
- listening: take; when empty, wait on LISTEN sturdy up to a second;
- polling: take(wake => false); when empty, sleep 50 ms, doubling up to 1 s.
The wait is from the schedule call's start to the take that returned the job
(one clock, one process). Prints the median and the 99th percentile of each,
with the producer's synchronous_commit on and off.

  scripts/bench_latency.py          (via `make bench`; PG=18 for the other version)
  LATENCY_JOBS=100                  (jobs per worker)
"""
import os
import random
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.environ.get("LATENCY_DIR", "/tmp/pg_sturdy_latency")
PORT = os.environ.get("LATENCY_PORT", "55439")
JOBS = int(os.environ.get("LATENCY_JOBS", "100"))
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
BINDIR = subprocess.run([PG_CONFIG, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()

os.environ["STURDY_SERVER"] = f"host={DIR}/cluster port={PORT} user=postgres"
os.environ["STURDY_DB"] = "latency"
os.environ.setdefault("STURDY_POOLER_PORT", str(int(PORT) + 21))
sys.path.insert(0, os.path.join(ROOT, "pg_test"))
import psycopg  # noqa: E402
from pooler import Bouncer  # noqa: E402
from sturdy import DSN  # noqa: E402


def worker(dsn, poll, queue, taken, stop):
    """The examples' idle loop; `taken[workflow]` is when its take returned."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as c:
        if not poll:
            c.execute("LISTEN sturdy")
        backoff = 0.05
        while not stop.is_set():
            row = c.execute("SELECT workflow, receipt FROM sturdy.take(%s, wake => %s)", (queue, not poll)).fetchone()
            if row is None:
                if poll:
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                else:
                    for _ in c.notifies(timeout=1, stop_after=1):
                        pass
                continue
            backoff = 0.05
            taken[row[0]] = time.monotonic()
            c.execute("SELECT sturdy.done(%s, %s, %s)", (row[0], row[1], queue))


def waits(dsn, poll, queue, regime):
    """Each job's wait, in seconds."""
    taken, stop = {}, threading.Event()
    t = threading.Thread(target=worker, args=(dsn, poll, queue, taken, stop))
    t.start()
    rng = random.Random(7)
    out = []
    with psycopg.connect(DSN, autocommit=True, options=f"-c synchronous_commit={regime}") as producer:
        for i in range(JOBS):
            time.sleep(rng.uniform(0, 2))
            job = f"{queue}-{i}"
            start = time.monotonic()
            producer.execute("SELECT sturdy.schedule(%s, now(), %s)", (job, queue))
            while job not in taken:
                time.sleep(0.001)
            out.append(taken[job] - start)
    stop.set()
    t.join()
    return out


def main():
    cluster = os.path.join(DIR, "cluster")
    subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "start", cluster, PORT,
                    "shared_preload_libraries = 'pg_sturdy'"], check=True)
    bouncer = Bouncer()
    try:
        subprocess.run([os.path.join(BINDIR, "psql"), "-X", "-q", "-h", cluster, "-p", PORT, "-U", "postgres",
                        "-c", "CREATE DATABASE latency", "postgres"], check=True)
        subprocess.run([os.path.join(BINDIR, "psql"), "-X", "-q", "-h", cluster, "-p", PORT, "-U", "postgres",
                        "-c", "CREATE EXTENSION pg_sturdy", "latency"], check=True)
        if bouncer.binary is None:
            sys.exit("pgbouncer is not installed (scripts/bootstrap.sh installs it)")
        bouncer.start()
        rows = []
        for regime in ("on", "off"):
            for name, dsn, poll in (("listening (LISTEN sturdy, direct)", DSN, False),
                                    ("polling (wake => false, through PgBouncer)", bouncer.dsn(), True)):
                queue = f"latency-{'poll' if poll else 'listen'}-{regime}"
                w = sorted(waits(dsn, poll, queue, regime))
                p99 = w[min(len(w) - 1, int(round(0.99 * (len(w) - 1))))]
                rows.append(f"| {name} | {regime} | {statistics.median(w) * 1000:.1f} ms | {p99 * 1000:.0f} ms "
                            f"| {len(w)} |")
                print(rows[-1], flush=True)
    finally:
        bouncer.stop()
        subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "stop", cluster], check=True)
    version = subprocess.run([PG_CONFIG, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"\nFrom schedule to take, an idle worker ({version}; jobs 0-2 s apart):\n")
    print("| worker | producer's synchronous_commit | median | 99th percentile | jobs |\n|---|---|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
