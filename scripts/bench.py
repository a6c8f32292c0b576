#!/usr/bin/env python3
"""pg_sturdy's benchmark: pgbench scripts side by side, in one run, on one
scratch cluster, as ratios. Not a test: it measures and reports.

Each case is a pair of pgbench scripts (pg_sturdy's and a baseline) run at
1, 4 and 16 clients, interleaved and repeated, from a steady state with
history (bench/setup.sql). After every run it reads pg_stat_user_tables and
reports any sequential scan on a hot table: a plan gone bad shows up there.

  scripts/bench.py            (via `make bench`)
  BENCH_SECONDS=5 BENCH_REPS=6 BENCH_CLIENTS=1,4,16 (the defaults)
"""
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.path.join(ROOT, "target", "bench")
PORT = os.environ.get("BENCH_PORT", "55435")
SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
REPS = int(os.environ.get("BENCH_REPS", "6"))
CLIENTS = [int(c) for c in os.environ.get("BENCH_CLIENTS", "1,4,16").split(",")]
HOT = ["sturdy.claims", "sturdy.checkpoints", "sturdy.queue",
       "seed.workflow_claim", "seed.workflow_checkpoint", "seed.workflow_queue"]


def backlog(n):
    """SQL that tops the 'bench' queues (ours and the seed's) up to n ready rows."""
    fill = ("SELECT 'bench', 'q-' || gen_random_uuid(), now() - interval '1 second'{extra} "
            "FROM generate_series(1, greatest(0, {n} - (SELECT count(*) FROM {t} WHERE {col} = 'bench')))")
    return (f"INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at) "
            + fill.format(extra=", now()", n=n, t="sturdy.queue", col="queue") + "; "
            + "INSERT INTO seed.workflow_queue (namespace, workflow, visible_at) "
            + fill.format(extra="", n=n, t="seed.workflow_queue", col="namespace")
            # a steady state: statistics that know the backlog is there (the
            # seed's TAKE joins back by key and degrades badly without them)
            + "; ANALYZE sturdy.queue, seed.workflow_queue")


# name, pg_sturdy script, baseline script (None: report pg_sturdy alone),
# transactions per pg_sturdy script, per baseline script, SQL before each run,
# and what one script execution is worth in the unit reported.
# `wrapper`: a third side, the same baseline statements called through a
# PL/pgSQL function (reported as its own ratio to the baseline): what any
# function layer costs over sending the statement.
CASES = [
    dict(name="claim + record, passes/s", sturdy="bench/sturdy_pass.sql", base="bench/seed_pass.sql",
         wrapper="bench/plpgsql_pass.sql"),
    dict(name="take(claim) + record + done vs TAKE + CLAIM + RECORD + FINISH, passes/s",
         sturdy="bench/sturdy_worker_pass.sql", base="bench/seed_worker_pass.sql", before=backlog(50000)),
    dict(name="take and done vs trivial write, transactions/s", sturdy="bench/sturdy_take_done.sql",
         base="bench/trivial_write.sql", sturdy_per=2, before=backlog(60000)),
    dict(name="take(max => 100) + batched done, jobs/s", sturdy="bench/sturdy_batch.sql", base=None,
         sturdy_per=100, before=backlog(600000)),
]
ONLY = os.environ.get("BENCH_CASES")  # e.g. "1,2": run only these (1-based)

CONN = ["-h", os.path.join(DIR, "cluster"), "-p", PORT, "-U", "postgres"]
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
BINDIR = subprocess.run([PG_CONFIG, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
PSQL, PGBENCH = os.path.join(BINDIR, "psql"), os.path.join(BINDIR, "pgbench")


def psql(sql):
    out = subprocess.run([PSQL, *CONN, "-X", "-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql, "postgres"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def seq_scans():
    rows = psql("SELECT schemaname || '.' || relname, seq_scan FROM pg_stat_user_tables")
    return {r.split("|")[0]: int(r.split("|")[1]) for r in rows.splitlines()}


def pgbench(script, clients):
    cmd = [PGBENCH, *CONN, "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
           "-T", str(SECONDS), "-f", os.path.join(ROOT, script), "postgres"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"pgbench failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out.stdout)
    return float(m.group(1))


def main():
    subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "start", os.path.join(DIR, "cluster"), PORT,
                    "shared_buffers = 512MB", "max_wal_size = 4GB", "checkpoint_timeout = 30min"], check=True)
    try:
        subprocess.run([PSQL, *CONN, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f",
                        os.path.join(ROOT, "bench", "setup.sql"), "postgres"], check=True)
        # the search-path choice (plan.rs), in-server: no pin vs a GUC nest level
        ab = subprocess.run([PSQL, *CONN, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f",
                             os.path.join(ROOT, "bench", "search_path_ab.sql"), "postgres"],
                            check=True, capture_output=True, text=True)
        search_path = " ".join(line.split("NOTICE:", 1)[1].strip() for line in ab.stderr.splitlines()
                               if "NOTICE:  search path:" in line)
        print(search_path, flush=True)
        results = {}  # (case, clients) -> {"sturdy": [rate], "base": [rate]}
        seq = {}
        cases = [c for i, c in enumerate(CASES, 1) if not ONLY or str(i) in ONLY.split(",")]
        for rep in range(REPS):
            for case in cases:
                for clients in CLIENTS:
                    # alternate which goes first, so drift favours neither
                    order = [("sturdy", case["sturdy"], case.get("sturdy_per", 1))]
                    if case["base"]:
                        order.append(("base", case["base"], case.get("base_per", 1)))
                    if case.get("wrapper"):
                        order.append(("wrapper", case["wrapper"], case.get("base_per", 1)))
                    if rep % 2:
                        order.reverse()
                    for side, script, per in order:
                        if case.get("before"):
                            psql(case["before"])
                        before = seq_scans()
                        rate = pgbench(script, clients) * per
                        after = seq_scans()
                        results.setdefault((case["name"], clients), {"sturdy": [], "base": [], "wrapper": []})[side].append(rate)
                        for t in HOT:
                            seq[t] = seq.get(t, 0) + after.get(t, 0) - before.get(t, 0)
                        print(f"rep {rep + 1} {case['name'][:40]:40} {clients:3} clients {side:6} {rate:10.0f}",
                              flush=True)
        report(results, seq, search_path)
    finally:
        subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "stop", os.path.join(DIR, "cluster")])


def fmt(xs):
    return f"{statistics.median(xs):,.0f} ({min(xs):,.0f}..{max(xs):,.0f})"


def report(results, seq, search_path):
    lines = [
        f"pgbench -M prepared, {SECONDS} s per run, {REPS} runs each (median, min..max), "
        f"{os.cpu_count()} cores, one scratch cluster, synchronous_commit on, "
        + subprocess.run([PG_CONFIG, "--version"], capture_output=True, text=True).stdout.strip(),
        "",
        "The ratio is taken within each repetition, where the two sides ran back to back",
        "(the machine drifts more between repetitions than between neighbours), then the",
        "median of those ratios, with their min..max.",
        "",
        "| case | clients | pg_sturdy | baseline | ratio | PL/pgSQL wrapper | its ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def ratio(xs, base):
        rs = [a / b for a, b in zip(xs, base)]
        return f"{statistics.median(rs):.2f}x ({min(rs):.2f}..{max(rs):.2f})"

    for (case, clients), r in results.items():
        if not r["base"]:
            lines.append(f"| {case} | {clients} | {fmt(r['sturdy'])} | | | | |")
            continue
        wrapper = f"{fmt(r['wrapper'])} | {ratio(r['wrapper'], r['base'])}" if r["wrapper"] else " | "
        lines.append(f"| {case} | {clients} | {fmt(r['sturdy'])} | {fmt(r['base'])} | "
                     f"{ratio(r['sturdy'], r['base'])} | {wrapper} |")
    lines += ["", "Sequential scans on hot tables during the runs: "
              + ", ".join(f"{t} {n}" for t, n in seq.items()), "", search_path]
    text = "\n".join(lines)
    os.makedirs(DIR, exist_ok=True)
    with open(os.path.join(DIR, "results.md"), "w") as f:
        f.write(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
