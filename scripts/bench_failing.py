#!/usr/bin/env python3
"""What a failing pass costs: pgbench transactions of a take and the pass's
end, over 1,000 ready rows of a queue, side by side in one run:

  wake_at   take, then wake_at(workflow, receipt, now()): a pass that hands
            its row back (the healthy cycle a failure replaces)
  fail      take, then fail(workflow, receipt, 'x', retry_at => now()): the
            same row back, its failure counted and its error kept
  lapse     take with a lease of a microsecond: each take meets rows whose
            lease ran out, counts each failure and leases it again (a
            backoff of 0), through its statement

Each for one and four clients, synchronous_commit on and off; median of
three runs of BENCH_FAILING_SECONDS each (default 5). Prints a table for
docs/benchmarks.md.

  scripts/bench_failing.py
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile

import installed_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.environ.get("BENCH_FAILING_DIR", "/tmp/pg_sturdy_bench_failing")
PORT = os.environ.get("BENCH_FAILING_PORT", "55448")
SECONDS = int(os.environ.get("BENCH_FAILING_SECONDS", "5"))
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
BINDIR = subprocess.run([PG_CONFIG, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
CONN = ["-h", os.path.join(DIR, "cluster"), "-p", PORT, "-U", "postgres"]
AS_PG = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

SCRIPTS = {
    "wake_at": "SELECT workflow, receipt FROM sturdy.take('fb', '1 minute') \\gset\n"
               "SELECT sturdy.wake_at(:workflow, :receipt, now(), 'fb');\n",
    "fail": "SELECT workflow, receipt FROM sturdy.take('fb', '1 minute') \\gset\n"
            "SELECT sturdy.fail(:workflow, :receipt, 'x', 'fb', retry_at => now());\n",
    "lapse": "SELECT count(*) FROM sturdy.take('fl', '1 microsecond');\n",
}


def psql(sql, db="bench"):
    run = subprocess.run([*AS_PG, os.path.join(BINDIR, "psql"), *CONN, "-X", "-q", "-v", "ON_ERROR_STOP=1",
                          "-At", "-f", "-", db], input=sql, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"psql: {run.stderr[-2000:]}")
    return run.stdout.strip()


def tps(script, clients):
    with tempfile.NamedTemporaryFile("w", suffix=".sql", dir=DIR, delete=False) as f:
        f.write(script)
    os.chmod(f.name, 0o644)
    out = subprocess.run([*AS_PG, os.path.join(BINDIR, "pgbench"), *CONN, "-n", "-M", "prepared",
                          "-c", str(clients), "-j", str(clients), "-T", str(SECONDS), "-f", f.name, "bench"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"pgbench: {out.stdout}\n{out.stderr}")
    return float(re.search(r"tps = ([0-9.]+)", out.stdout).group(1))


def main():
    installed_build.require_release(PG_CONFIG)
    os.makedirs(DIR, exist_ok=True)
    subprocess.run(["scripts/cluster.sh", "start", os.path.join(DIR, "cluster"), PORT,
                    "shared_preload_libraries = 'pg_sturdy'"], cwd=ROOT, check=True, capture_output=True)
    results = {}
    try:
        psql("DROP DATABASE IF EXISTS bench", "postgres")
        psql("CREATE DATABASE bench", "postgres")
        psql("CREATE EXTENSION pg_sturdy;\n"
             "SELECT sturdy.retry_queue('fb', max_attempts => 1000000);\n"
             "SELECT sturdy.retry_queue('fl', max_attempts => 1000000, backoff => '0 seconds');\n"
             "SELECT count(sturdy.schedule('w' || i, now() - interval '1 hour', 'fb')) FROM generate_series(1, 1000) i;\n"
             "SELECT count(sturdy.schedule('w' || i, now() - interval '1 hour', 'fl')) FROM generate_series(1, 1000) i;\n"
             "VACUUM ANALYZE sturdy.queue;\n")
        for commit in ("on", "off"):
            psql(f"ALTER SYSTEM SET synchronous_commit = {commit}; SELECT pg_reload_conf();")
            for clients in (1, 4):
                for name, script in SCRIPTS.items():
                    runs = [tps(script, clients) for _ in range(3)]
                    results[(commit, clients, name)] = runs
                    print(commit, clients, name, runs, file=sys.stderr)
        counted = psql("SELECT sum(attempts) FROM sturdy.queue WHERE queue = 'fl'")
    finally:
        subprocess.run(["scripts/cluster.sh", "stop", os.path.join(DIR, "cluster")], cwd=ROOT, capture_output=True)
    print(f"Passes a second (median, range of three {SECONDS} s runs), pgbench -M prepared:\n")
    print("| synchronous_commit | clients | take + wake_at | take + fail | take of lapsed leases | fail / wake_at |")
    print("|---|---:|---:|---:|---:|---:|")
    for commit in ("on", "off"):
        for clients in (1, 4):
            cell = {}
            for name in SCRIPTS:
                runs = results[(commit, clients, name)]
                cell[name] = (statistics.median(runs), min(runs), max(runs))
            fmt = lambda c: f"{c[0]:,.0f} ({c[1]:,.0f}..{c[2]:,.0f})"
            print(f"| {commit} | {clients} | {fmt(cell['wake_at'])} | {fmt(cell['fail'])} | {fmt(cell['lapse'])} | "
                  f"{cell['fail'][0] / cell['wake_at'][0]:.2f} |")
    print(f"\nFailures the lapse runs counted: {counted}.")


if __name__ == "__main__":
    main()
