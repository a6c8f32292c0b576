#!/usr/bin/env python3
"""The churn soak (`make soak`, not in CI): a long run of take/record/done at
16 clients over a steady backlog, once as is and once while a session holds a
REPEATABLE READ transaction open the whole time (a pinned xmin: vacuum can
remove nothing any pass deleted or updated). pg_sturdy's pass
(bench/soak_sturdy.sql) and the same pass written by hand with the seed's
statements (bench/soak_seed.sql) run one after the other, each in a fresh
database of one scratch cluster, so the four phases differ only in the side
and the pin.

Every minute it records passes/s (pgbench --progress), and for each table of
the side its heap and index sizes, live and dead tuples and how often
autovacuum has run. It writes target/soak/soak.json, prints a Markdown table
per phase, and draws bench/soak/*.png when matplotlib is importable.

  SOAK_MINUTES=30 SOAK_CLIENTS=16 SOAK_BACKLOG=10000 (the defaults)
  SOAK_PHASES=sturdy,seed,sturdy-pinned,seed-pinned (the default order; a
      phase may carry its own length in minutes: sturdy:20)
  scripts/soak.py report      (the table and plots again from soak.json)
"""
import json
import os
import re
import subprocess
import sys
import threading
import time

import installed_build

import psycopg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.path.join(ROOT, "target", "soak")
PLOTS = os.path.join(ROOT, "bench", "soak")
PORT = os.environ.get("SOAK_PORT", "55437")
MINUTES = float(os.environ.get("SOAK_MINUTES", "30"))
CLIENTS = int(os.environ.get("SOAK_CLIENTS", "16"))
BACKLOG = int(os.environ.get("SOAK_BACKLOG", "10000"))
PHASES = os.environ.get("SOAK_PHASES", "sturdy,seed,sturdy-pinned,seed-pinned").split(",")
INTERVAL = int(os.environ.get("SOAK_INTERVAL", "60"))  # seconds between samples
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
BINDIR = subprocess.run([PG_CONFIG, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
PGBENCH = os.path.join(BINDIR, "pgbench")

SIDES = {
    "sturdy": dict(script="bench/soak_sturdy.sql",
                   tables=["sturdy.queue", "sturdy.claims", "sturdy.checkpoints"]),
    "seed": dict(script="bench/soak_seed.sql",
                 tables=["seed.workflow_queue", "seed.workflow_claim", "seed.workflow_checkpoint"]),
}

# The seed's tables, as bench/setup.sql makes them.
SEED_DDL = """
CREATE SCHEMA seed;
CREATE TABLE seed.workflow_checkpoint (workflow text NOT NULL, step text NOT NULL, value jsonb NOT NULL,
                                       PRIMARY KEY (workflow, step));
CREATE TABLE seed.workflow_claim (workflow text PRIMARY KEY, token bigint NOT NULL, held_until timestamptz NOT NULL);
CREATE TABLE seed.workflow_queue (namespace text NOT NULL, workflow text NOT NULL, visible_at timestamptz NOT NULL,
                                  PRIMARY KEY (namespace, workflow));
CREATE INDEX workflow_queue_visible_at ON seed.workflow_queue (namespace, visible_at);
"""

# A steady state to start from: the backlog, and 100,000 rows sleeping far in
# the future in another queue (a real queue table is never only the hot rows).
FILL = {
    "sturdy": """
INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)
SELECT 'history', 'hist-' || i, now() + interval '10 years', now() FROM generate_series(1, 100000) i;
INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)
SELECT 'soak', 'soak-' || gen_random_uuid(), now() - interval '1 second', now() FROM generate_series(1, {n});
VACUUM ANALYZE sturdy.queue, sturdy.claims, sturdy.checkpoints;
""",
    "seed": """
INSERT INTO seed.workflow_queue SELECT 'history', 'hist-' || i, now() + interval '10 years'
  FROM generate_series(1, 100000) i;
INSERT INTO seed.workflow_queue SELECT 'soak', 'soak-' || gen_random_uuid(), now() - interval '1 second'
  FROM generate_series(1, {n});
VACUUM ANALYZE seed.workflow_queue, seed.workflow_claim, seed.workflow_checkpoint;
""",
}


def connect(db="postgres"):
    return psycopg.connect(host=os.path.join(DIR, "cluster"), port=PORT, user="postgres", dbname=db,
                           autocommit=True)


def sample(conn, tables):
    """Sizes and tuple counts of the side's tables, now."""
    out = {}
    for t in tables:
        row = conn.execute(
            """SELECT pg_table_size(c.oid), pg_indexes_size(c.oid), s.n_live_tup, s.n_dead_tup,
                      s.autovacuum_count, s.autoanalyze_count
                 FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
                WHERE c.oid = %s::regclass""", (t,)).fetchone()
        out[t] = dict(heap=row[0], indexes=row[1], live=row[2], dead=row[3], autovacuums=row[4],
                      autoanalyzes=row[5])
    return out


def phase(name, minutes):
    side, pinned = name.split("-")[0], name.endswith("-pinned")
    db = "soak_" + name.replace("-", "_")
    with connect() as c:
        c.execute(f"DROP DATABASE IF EXISTS {db}")
        c.execute(f"CREATE DATABASE {db}")
    with connect(db) as c:
        c.execute("CREATE EXTENSION pg_sturdy")
        c.execute(SEED_DDL)
        for statement in FILL[side].format(n=BACKLOG).split(";\n"):
            if statement.strip():
                c.execute(statement)
    pin = None
    if pinned:
        # The forgotten BEGIN: a snapshot taken and kept, in the same database.
        pin = psycopg.connect(host=os.path.join(DIR, "cluster"), port=PORT, user="postgres", dbname=db)
        pin.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        pin.execute("SELECT count(*) FROM pg_class").fetchone()
    monitor = connect(db)
    tables = SIDES[side]["tables"]
    samples = [dict(minute=0.0, tables=sample(monitor, tables))]
    seconds = int(minutes * 60)
    cmd = [PGBENCH, "-h", os.path.join(DIR, "cluster"), "-p", PORT, "-U", "postgres", "-n", "-M", "prepared",
           "-c", str(CLIENTS), "-j", "2", "-T", str(seconds), "-P", str(INTERVAL),
           "-f", os.path.join(ROOT, SIDES[side]["script"]), db]
    bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rates = []

    def read_progress():
        for line in bench.stderr:
            m = re.match(r"progress: ([0-9.]+) s, ([0-9.]+) tps, lat ([0-9.]+) ms", line)
            if m:
                rates.append(dict(at=float(m.group(1)), tps=float(m.group(2)), latency_ms=float(m.group(3))))
            elif line.strip():
                print("  pgbench:", line.rstrip(), flush=True)

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    start = time.monotonic()
    k = 1
    while bench.poll() is None:
        wait = start + k * INTERVAL - time.monotonic()
        if wait > 0:
            time.sleep(min(wait, 1.0))
            continue
        s = dict(minute=k * INTERVAL / 60, tables=sample(monitor, tables))
        if pin is not None:
            s["xmin_age"] = monitor.execute(
                "SELECT max(age(backend_xmin)) FROM pg_stat_activity WHERE datname = current_database()"
            ).fetchone()[0]
        samples.append(s)
        last = f"{rates[-1]['tps']:8.1f}" if rates else "       -"
        q = s["tables"][tables[0]]
        print(f"  {name} {s['minute']:5.1f} min: {last} passes/s, queue heap "
              f"{q['heap'] / 2**20:7.1f} MB, indexes {q['indexes'] / 2**20:7.1f} MB, dead {q['dead']:>9}",
              flush=True)
        k += 1
    out, _ = bench.communicate()
    reader.join(timeout=5)
    if bench.returncode != 0:
        sys.exit(f"pgbench failed ({name}):\n{out}")
    total = float(re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out).group(1))
    samples.append(dict(minute=minutes, tables=sample(monitor, tables)))
    if pin is not None:
        pin.rollback()
        pin.close()
    monitor.close()
    return dict(name=name, side=side, pinned=pinned, minutes=minutes, clients=CLIENTS, backlog=BACKLOG,
                passes_per_s=total, rates=rates, samples=samples)


def summary(r):
    """One phase's row: its first interval, the mean of its first and of its
    last five minutes (single minutes swing by ±20% on a 2-core machine), and
    the queue table at the end."""
    rates = r["rates"]
    span = r["minutes"] * 60
    first5 = [x["tps"] for x in rates if x["at"] <= 300]
    last5 = [x["tps"] for x in rates if x["at"] > span - 300]
    start, end = sum(first5) / len(first5), sum(last5) / len(last5)
    q = r["samples"][-1]["tables"][SIDES[r["side"]]["tables"][0]]
    return (f"| {r['name']} | {r['minutes']:g} | {r['passes_per_s']:,.0f} | {rates[0]['tps']:,.0f} | {start:,.0f} | "
            f"{end:,.0f} | {end / start:.2f} | {q['heap'] / 2**20:,.0f} + {q['indexes'] / 2**20:,.0f} | "
            f"{q['dead']:,} |")


def report(results):
    print(f"\n| phase | minutes | passes/s, whole run | first {INTERVAL} s | mean of the first 5 min "
          "| mean of the last 5 min | last / first 5 min | queue heap + indexes at the end, MB "
          "| queue dead tuples at the end |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(summary(r))
    plot(results)


def plot(results):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not importable: no plots (apt-get install python3-matplotlib)")
        return
    os.makedirs(PLOTS, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in results:
        ax.plot([x["at"] / 60 for x in r["rates"]], [x["tps"] for x in r["rates"]], label=r["name"],
                linestyle="--" if r["pinned"] else "-", color="C0" if r["side"] == "sturdy" else "C1")
    ax.set_xlabel("minute")
    ax.set_ylabel("passes/s")
    ax.set_title(f"take/record/done, {CLIENTS} clients, backlog {BACKLOG:,}")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "throughput.png"), dpi=100)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for r in results:
        queue = SIDES[r["side"]]["tables"][0]
        style = dict(linestyle="--" if r["pinned"] else "-", color="C0" if r["side"] == "sturdy" else "C1",
                     label=r["name"])
        minutes = [s["minute"] for s in r["samples"]]
        axes[0].plot(minutes, [(s["tables"][queue]["heap"] + s["tables"][queue]["indexes"]) / 2**20
                               for s in r["samples"]], **style)
        axes[1].plot(minutes, [s["tables"][queue]["dead"] for s in r["samples"]], **style)
    axes[0].set_title("queue table + indexes, MB")
    axes[1].set_title("queue dead tuples")
    for a in axes:
        a.set_xlabel("minute")
        a.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(PLOTS, "queue.png"), dpi=100)
    print(f"plots: {PLOTS}/throughput.png, {PLOTS}/queue.png")


def main():
    installed_build.require_release(PG_CONFIG)
    subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "start", os.path.join(DIR, "cluster"), PORT,
                    "max_connections = 60", "log_autovacuum_min_duration = 0", "checkpoint_timeout = '5min'",
                    "max_wal_size = '4GB'",
                    # as docs/operations.md advises (on 15 the takes' shared floors need it)
                    "shared_preload_libraries = 'pg_sturdy'"], check=True)
    results = []
    try:
        for spec in PHASES:
            name, _, minutes = spec.partition(":")
            minutes = float(minutes) if minutes else MINUTES
            print(f"phase {name}: {minutes:g} min, {CLIENTS} clients, backlog {BACKLOG:,}", flush=True)
            results.append(phase(name, minutes))
            with open(os.path.join(DIR, "soak.json"), "w") as f:
                json.dump(results, f, indent=1)
    finally:
        subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "stop", os.path.join(DIR, "cluster")])
    report(results)


if __name__ == "__main__":
    if sys.argv[1:] == ["report"]:  # the table and plots again, from target/soak/soak.json
        with open(os.path.join(DIR, "soak.json")) as f:
            report(json.load(f))
    else:
        main()
