#!/usr/bin/env python3
"""A one-row take of a queue with per_key = 1 whose first rows are all of a
key at its limit (one pass of it running): the take passes over that key's
backlog to reach the one row of another key behind it. Reports the time a
take (rolled back, so every take does the same walk) by pgbench at one
client, for backlogs of 0, 1,000, 10,000 and 100,000 rows of the full key,
and what each row passed over costs. With BENCH_AB=/path/to/pg_sturdy.so
(a release build of another version), the same for that build, each after a
restart with it.

  scripts/bench_key_backlog.py
  BENCH_AB=/tmp/old/pg_sturdy.so BENCH_KEY_SECONDS=5 scripts/bench_key_backlog.py
"""
import os
import re
import subprocess
import sys
import tempfile

import installed_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.environ.get("BENCH_KEY_DIR", "/tmp/pg_sturdy_bench_key")
PORT = os.environ.get("BENCH_KEY_PORT", "55443")
SECONDS = int(os.environ.get("BENCH_KEY_SECONDS", "5"))
BACKLOGS = [int(n) for n in os.environ.get("BENCH_KEY_BACKLOGS", "0,1000,10000,100000").split(",")]
AB = os.environ.get("BENCH_AB")
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
BINDIR = subprocess.run([PG_CONFIG, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
CONN = ["-h", os.path.join(DIR, "cluster"), "-p", PORT, "-U", "postgres"]
AS_PG = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
TAKE = "BEGIN;\nSELECT count(*) FROM sturdy.take('kb', '1 minute');\nROLLBACK;\n"


def psql(sql, db="bench"):
    """`sql`'s statements one after another (each in its own transaction
    unless the script says BEGIN), and what they printed."""
    run = subprocess.run([*AS_PG, os.path.join(BINDIR, "psql"), *CONN, "-X", "-q", "-v", "ON_ERROR_STOP=1",
                          "-At", "-f", "-", db], input=sql, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"psql: {run.stderr[-2000:]}")
    return run.stdout.strip()


def restart():
    subprocess.run([*AS_PG, os.path.join(BINDIR, "pg_ctl"), "-D", os.path.join(DIR, "cluster", "data"), "-w",
                    "-m", "fast", "restart", "-l", os.path.join(DIR, "cluster", "server.log")],
                   check=True, capture_output=True)


def fill(backlog):
    """per_key = 1; one pass of key big running; `backlog` ready rows of big,
    then one of small."""
    psql("SELECT sturdy.limit_queue('kb');\n DELETE FROM sturdy.queue WHERE queue = 'kb';\n"
         "SELECT sturdy.limit_queue('kb', per_key => 1);\n"
         "SELECT sturdy.schedule('running', now() - interval '2 hours', 'kb', key => 'big');\n"
         "SELECT count(*) FROM sturdy.take('kb', '1 day');\n"
         f"SELECT count(sturdy.schedule('big-' || i, now() - interval '1 hour' + i * interval '1 ms', 'kb',"
         f" key => 'big')) FROM generate_series(1, {backlog}) i;\n"
         "SELECT sturdy.schedule('small', now() - interval '1 minute', 'kb', key => 'small');\n"
         "VACUUM ANALYZE sturdy.queue;\n")


def per_take_ms():
    with tempfile.NamedTemporaryFile("w", suffix=".sql", dir=DIR, delete=False) as f:
        f.write(TAKE)
    os.chmod(f.name, 0o644)
    out = subprocess.run([*AS_PG, os.path.join(BINDIR, "pgbench"), *CONN, "-n", "-M", "prepared", "-c", "1",
                          "-T", str(SECONDS), "-f", f.name, "bench"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"pgbench: {out.stdout}\n{out.stderr}")
    return 1000.0 / float(re.search(r"tps = ([0-9.]+)", out.stdout).group(1))


def main():
    installed_build.require_release(PG_CONFIG)
    library = installed_build.library(PG_CONFIG)
    subprocess.run(["scripts/cluster.sh", "start", os.path.join(DIR, "cluster"), PORT], cwd=ROOT, check=True,
                   capture_output=True)
    builds = {"installed": library}
    if AB and installed_build.refused(AB):
        sys.exit(f"{AB} (BENCH_AB) is a debug build: build it with --release")
    if AB:
        keep = os.path.join(DIR, "installed.so")
        subprocess.run(["install", "-m", "755", library, keep], check=True)
        builds = {"installed": keep, "BENCH_AB": AB}
    results = {}
    try:
        for name, so in builds.items():
            subprocess.run(["install", "-m", "755", so, library + ".ab"], check=True)
            os.rename(library + ".ab", library)
            restart()
            psql("DROP DATABASE IF EXISTS bench", "postgres")
            psql("CREATE DATABASE bench", "postgres")
            psql("CREATE EXTENSION pg_sturdy")
            for backlog in BACKLOGS:
                fill(backlog)
                assert psql(TAKE) == "1", "the take did not reach the row behind"
                results[(name, backlog)] = per_take_ms()
    finally:
        if AB:
            subprocess.run(["install", "-m", "755", builds["installed"], library + ".ab"], check=True)
            os.rename(library + ".ab", library)
        subprocess.run(["scripts/cluster.sh", "stop", os.path.join(DIR, "cluster")], cwd=ROOT, capture_output=True)
    print(f"One-row take past a full key's backlog (per_key = 1), one client, {SECONDS} s each:\n")
    print("| build | rows of the full key | ms a take | µs a row passed over |")
    print("|---|---:|---:|---:|")
    for (name, backlog), ms in results.items():
        base = results[(name, 0)]
        per_row = f"{(ms - base) * 1000 / backlog:.2f}" if backlog else ""
        print(f"| {name} | {backlog:,} | {ms:.3f} | {per_row} |")


if __name__ == "__main__":
    main()
