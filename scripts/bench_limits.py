#!/usr/bin/env python3
"""What flow control costs a queue whose limits never bind, and the same
limits written as teams write them today: the job cycle at 1, 4 and 16
clients, side by side in one run of one cluster, alternating:
  - pg_sturdy (bench/sturdy_cycle_queue.sql: schedule, take, done) on a queue
    with no limit; with running = 64 (above the 4 workers: every take locks
    a place and writes it, every done frees it); with per_second = burst =
    1e6 (every take refills and spends the bucket, the takes of the queue
    one at a time through its row lock); with per_key = 1 over 1,000 keys
    (bench/sturdy_cycle_keyed.sql: every row has a key, every take goes by
    its key's places), against the same cycle on rows with keys and no
    limit (the key's index and wider rows cost the schedule either way);
  - the plain statements of bench/plain_cycle.sql on a table of the seed's
    shape, without a limit, and with a counter row raised before the take
    and lowered after the delete (bench/plain_cycle_counter.sql), and with a
    counter row per key at 1 over 1,000 keys (bench/plain_cycle_keyed.sql).
Each queue keeps a backlog, so a take always finds work. Reports cycles a
second (median of BENCH_LIMITS_REPS) and the ratio to the same side's
unlimited queue, with synchronous_commit on and off.

  scripts/bench_limits.py        (part of `make bench`)
  BENCH_LIMITS_REPS=2 BENCH_LIMITS_SECONDS=6 BENCH_LIMITS_CLIENTS=1,4,16
"""
import os
import re
import statistics
import subprocess

import installed_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.environ.get("BENCH_LIMITS_DIR", "/tmp/pg_sturdy_bench_limits")
PORT = os.environ.get("BENCH_LIMITS_PORT", "55441")
REPS = int(os.environ.get("BENCH_LIMITS_REPS", "2"))
SECONDS = int(os.environ.get("BENCH_LIMITS_SECONDS", "6"))
CLIENTS = [int(n) for n in os.environ.get("BENCH_LIMITS_CLIENTS", "1,4,16").split(",")]
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
BINDIR = subprocess.run([PG_CONFIG, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
CONN = ["-h", os.path.join(DIR, "cluster"), "-p", PORT, "-U", "postgres"]
# name, script, queue (-D q=), the limit set on it, the unlimited case it is compared with
CASES = [
    ("pg_sturdy, no limit", "sturdy_cycle_queue.sql", "free", None, "pg_sturdy, no limit"),
    ("pg_sturdy, running = 64", "sturdy_cycle_queue.sql", "capped",
     "SELECT sturdy.limit_queue('capped', running => 64)", "pg_sturdy, no limit"),
    ("pg_sturdy, per_second = burst = 1e6", "sturdy_cycle_queue.sql", "rated",
     "SELECT sturdy.limit_queue('rated', per_second => 1e6, burst => 1000000)", "pg_sturdy, no limit"),
    ("pg_sturdy, keys, no limit", "sturdy_cycle_keyed.sql", "keyfree", None, "pg_sturdy, keys, no limit"),
    ("pg_sturdy, per_key = 1 over 1,000 keys", "sturdy_cycle_keyed.sql", "keyed",
     "SELECT sturdy.limit_queue('keyed', per_key => 1)", "pg_sturdy, keys, no limit"),
    ("plain statements, no limit", "plain_cycle.sql", None, None, "plain statements, no limit"),
    ("plain statements, a counter row at 64", "plain_cycle_counter.sql", None, None, "plain statements, no limit"),
    ("plain statements, a counter row per key at 1", "plain_cycle_keyed.sql", None, None,
     "plain statements, no limit"),
]
SEED = """
CREATE SCHEMA seed;
CREATE TABLE seed.workflow_queue (namespace text NOT NULL, workflow text NOT NULL, visible_at timestamptz NOT NULL,
                                  PRIMARY KEY (namespace, workflow));
CREATE INDEX workflow_queue_visible_at ON seed.workflow_queue (namespace, visible_at);
CREATE TABLE seed.queue_running (namespace text PRIMARY KEY, running int NOT NULL);
INSERT INTO seed.queue_running VALUES ('counted', 0);
INSERT INTO seed.workflow_queue SELECT n, 'backlog-' || i, now() - interval '1 minute'
  FROM generate_series(1, 1000) i, unnest(ARRAY['cycle', 'counted']) n;
CREATE TABLE seed.keyed_queue (namespace text NOT NULL, workflow text NOT NULL, visible_at timestamptz NOT NULL,
                               key text NOT NULL, PRIMARY KEY (namespace, workflow));
CREATE INDEX keyed_queue_visible_at ON seed.keyed_queue (namespace, visible_at);
CREATE TABLE seed.key_running (key text PRIMARY KEY, running int NOT NULL);
INSERT INTO seed.keyed_queue SELECT 'keyed', 'backlog-' || i, now() - interval '1 minute', 'tenant-' || (i % 1000 + 1)
  FROM generate_series(1, 3000) i;
"""


def as_pg(cmd, **kw):
    if os.getuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    run = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {run.stderr[-2000:]}")
    return run


def psql(sql):
    as_pg([os.path.join(BINDIR, "psql"), *CONN, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql, "postgres"])


def cycles(script, queue, regime, clients):
    define = ["-D", f"q={queue}"] if queue else []
    out = as_pg([os.path.join(BINDIR, "pgbench"), *CONN, "-n", "-M", "prepared", "-c", str(clients),
                 "-j", str(min(clients, 4)), "-T", str(SECONDS), *define,
                 "-f", os.path.join(DIR, script), "postgres"],
                env=dict(os.environ, PGOPTIONS=f"-c synchronous_commit={regime}")).stdout
    return float(re.search(r"tps = ([\d.]+)", out).group(1))


def main():
    installed_build.require_release(PG_CONFIG)
    cluster = os.path.join(DIR, "cluster")
    subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "start", cluster, PORT,
                    "shared_preload_libraries = 'pg_sturdy'", "max_wal_size = 4GB"], check=True)
    try:
        for script in {c[1] for c in CASES}:
            subprocess.run(["cp", os.path.join(ROOT, "bench", script), DIR], check=True)
        psql("CREATE EXTENSION pg_sturdy")
        psql(SEED)
        for _, _, queue, limit, _ in CASES:
            if queue:
                # a backlog of 3,000, under 1,000 keys where the queue has them
                key = ", key => 'tenant-' || (i % 1000 + 1)" if queue in ("keyed", "keyfree") else ""
                psql(f"SELECT sturdy.schedule('backlog-' || i, now() - interval '1 minute', '{queue}'{key})"
                     " FROM generate_series(1, 3000) i")
            if limit:
                psql(limit)
        lines = []
        for clients in CLIENTS:
            for regime in ("on", "off"):
                rates = {name: [] for name, *_ in CASES}
                for _ in range(REPS):
                    for name, script, queue, _, _ in CASES:
                        psql("VACUUM ANALYZE sturdy.queue, sturdy.queue_places, sturdy.queue_key_places, sturdy.queue_limits,"
                             " seed.workflow_queue, seed.queue_running, seed.keyed_queue, seed.key_running")
                        rates[name].append(cycles(script, queue, regime, clients))
                for name, _, _, _, base in CASES:
                    r = statistics.median(rates[name])
                    lines.append(f"| {name} | {clients} | {regime} | {r:,.0f} "
                                 f"({min(rates[name]):,.0f}..{max(rates[name]):,.0f}) "
                                 f"| {r / statistics.median(rates[base]):.2f}x |")
                    print(lines[-1], flush=True)
    finally:
        subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "stop", cluster], check=True)
    version = subprocess.run([PG_CONFIG, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"\nThe job cycle, cycles a second, median of {REPS} x {SECONDS} s ({version}):\n")
    print("| queue | clients | synchronous_commit | cycles/s (range) | of the same side without a limit |\n"
          "|---|---:|---|---:|---:|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
