#!/usr/bin/env python3
"""What flow control costs a queue whose limits never bind: the job cycle
(bench/sturdy_cycle_queue.sql: schedule, take, done) at 4 clients on three
queues of one cluster, side by side in one run, alternating, 10 s each:
  - no limit;
  - running = 64 (above the 4 workers: every take locks a place, writes it,
    and every done frees it);
  - per_second = 1e6, burst = 1e6 (every take refills and spends the bucket,
    and the takes of the queue go one at a time through its row lock).
Each queue keeps a backlog, so a take always finds work. Reports cycles a
second (median of BENCH_LIMITS_REPS) and the ratio to the unlimited queue,
with synchronous_commit on and off.

  scripts/bench_limits.py        (part of `make bench`)
  BENCH_LIMITS_REPS=3 BENCH_LIMITS_SECONDS=10 BENCH_LIMITS_CLIENTS=4
"""
import os
import re
import statistics
import subprocess

import installed_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.environ.get("BENCH_LIMITS_DIR", "/tmp/pg_sturdy_bench_limits")
PORT = os.environ.get("BENCH_LIMITS_PORT", "55441")
REPS = int(os.environ.get("BENCH_LIMITS_REPS", "3"))
SECONDS = int(os.environ.get("BENCH_LIMITS_SECONDS", "10"))
CLIENTS = int(os.environ.get("BENCH_LIMITS_CLIENTS", "4"))
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
BINDIR = subprocess.run([PG_CONFIG, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
CONN = ["-h", os.path.join(DIR, "cluster"), "-p", PORT, "-U", "postgres"]
QUEUES = [
    ("no limit", "free", None),
    ("running = 64", "capped", "SELECT sturdy.limit_queue('capped', running => 64)"),
    ("per_second = burst = 1e6", "rated", "SELECT sturdy.limit_queue('rated', per_second => 1e6, burst => 1000000)"),
]


def as_pg(cmd, **kw):
    if os.getuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    run = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {run.stderr[-2000:]}")
    return run


def psql(sql):
    as_pg([os.path.join(BINDIR, "psql"), *CONN, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql, "postgres"])


def cycles(queue, regime):
    out = as_pg([os.path.join(BINDIR, "pgbench"), *CONN, "-n", "-M", "prepared", "-c", str(CLIENTS),
                 "-j", str(CLIENTS), "-T", str(SECONDS), "-D", f"q={queue}",
                 "-f", os.path.join(DIR, "sturdy_cycle_queue.sql"), "postgres"],
                env=dict(os.environ, PGOPTIONS=f"-c synchronous_commit={regime}")).stdout
    return float(re.search(r"tps = ([\d.]+)", out).group(1))


def main():
    installed_build.require_release(PG_CONFIG)
    cluster = os.path.join(DIR, "cluster")
    subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "start", cluster, PORT,
                    "shared_preload_libraries = 'pg_sturdy'", "max_wal_size = 4GB"], check=True)
    try:
        subprocess.run(["cp", os.path.join(ROOT, "bench", "sturdy_cycle_queue.sql"), DIR], check=True)
        psql("CREATE EXTENSION pg_sturdy")
        for _, queue, limit in QUEUES:
            psql(f"SELECT sturdy.schedule('backlog-' || i, now() - interval '1 minute', '{queue}')"
                 " FROM generate_series(1, 1000) i")
            if limit:
                psql(limit)
        lines = []
        for regime in ("on", "off"):
            rates = {queue: [] for _, queue, _ in QUEUES}
            for _ in range(REPS):
                for _, queue, _ in QUEUES:
                    psql("VACUUM sturdy.queue, sturdy.queue_places, sturdy.queue_limits")
                    rates[queue].append(cycles(queue, regime))
            free = statistics.median(rates["free"])
            for name, queue, _ in QUEUES:
                r = statistics.median(rates[queue])
                lines.append(f"| {name} | {regime} | {r:,.0f} ({min(rates[queue]):,.0f}..{max(rates[queue]):,.0f}) "
                             f"| {r / free:.2f}x |")
                print(lines[-1], flush=True)
    finally:
        subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "stop", cluster], check=True)
    version = subprocess.run([PG_CONFIG, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"\nThe job cycle at {CLIENTS} clients, cycles a second, median of {REPS} x {SECONDS} s ({version}):\n")
    print("| queue | synchronous_commit | cycles/s (range) | of the unlimited queue |\n|---|---|---:|---:|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
