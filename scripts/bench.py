#!/usr/bin/env python3
"""pg_sturdy's benchmark: pgbench scripts side by side, in one run, on one
scratch cluster, as ratios. Not a test: it measures and reports.

Each case is a pair of pgbench scripts (pg_sturdy's and a baseline) run at
1, 4 and 16 clients, interleaved and repeated, from a steady state with
history (bench/setup.sql). After every run it reads pg_stat_user_tables and
reports any sequential scan on a hot table: a plan gone bad shows up there.
Before every run of a queue case its queues (and pgmq's) are vacuumed: the
top-ups' ANALYZE would otherwise cancel autovacuum on them every time.

Every case runs in both commit regimes, side by side: synchronous_commit on
(the disk's flush sets the pace) and off (the CPU does: what a server with a
fast disk or heavy group commit sees).

The job cycle runs two more sides: the trivial write, a third of whose rate
is the ceiling of any cycle of three commits, and the same cycle with a
queue per client, which tells what the takers meeting at one queue's head
cost from how the cycle itself scales with clients. Its output ends with
each cell against the target as docs/benchmarks.md states it: in each repetition
the lower of 1.3x the plain cycle and 0.8x the ceiling.

The batch case compares with pgmq 1.5.1, loaded from its SQL script into a
database of its own. The script is read from PGMQ_SQL, or from a pgmq
checkout at PGMQ_REPO (tag v1.5.1); without either, that column is skipped.

  scripts/bench.py            (via `make bench`)
  BENCH_SECONDS=5 BENCH_REPS=6 BENCH_CLIENTS=1,4,16 BENCH_REGIMES=on,off (the defaults)
  BENCH_CASES=1,4             (only these cases, 1-based)
  BENCH_SWEEP_ROWS=1000000    (finished instances for the sweep rate; 0 skips it)
  BENCH_PER_CALL=0            (skip the per-call pgbench -r table and the A/Bs)
  BENCH_PER_CALL_ROUNDS=3     (rounds of the per-call table; each statement's median over them)
  BENCH_AB=/path/to/pg_sturdy.so
                              (A/B a change: every pg_sturdy side runs again with that build of the
                              library, B, beside the installed one, A, in the same repetition; the
                              server restarts with the build it is to run before each pg_sturdy
                              side, both queues are vacuumed before every side, and the installed
                              library is put back at the end)
"""
import os
import re
import statistics
import subprocess
import sys
import time

import installed_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.path.join(ROOT, "target", "bench")
PORT = os.environ.get("BENCH_PORT", "55435")
SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
REPS = int(os.environ.get("BENCH_REPS", "6"))
CLIENTS = [int(c) for c in os.environ.get("BENCH_CLIENTS", "1,4,16").split(",")]
HOT = ["sturdy.claims", "sturdy.checkpoints", "sturdy.queue",
       "seed.workflow_claim", "seed.workflow_checkpoint", "seed.workflow_queue"]


def backlog(n, queue="bench"):
    """SQL that tops a queue (ours and the seed's of that name) up to n ready rows."""
    fill = ("SELECT '{q}', 'q-' || gen_random_uuid(), now() - interval '1 second'{extra} "
            "FROM generate_series(1, greatest(0, {n} - (SELECT count(*) FROM {t} WHERE {col} = '{q}' "
            "AND visible_at <= now(){free})))")
    return (f"INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at) "
            + fill.format(q=queue, extra=", now()", n=n, t="sturdy.queue", col="queue",
                          free=" AND (leased_until IS NULL OR leased_until <= now())") + "; "
            + "INSERT INTO seed.workflow_queue (namespace, workflow, visible_at) "
            + fill.format(q=queue, extra="", n=n, t="seed.workflow_queue", col="namespace", free="")
            # a steady state: statistics that know the backlog is there (the
            # seed's TAKE joins back by key and degrades badly without them)
            + "; ANALYZE sturdy.queue, seed.workflow_queue")


# name, pg_sturdy script, baseline script (None: report pg_sturdy alone),
# transactions per pg_sturdy script, per baseline script, SQL before each run,
# and what one script execution is worth in the unit reported.
# `wrapper`: a third side, the same baseline statements called through a
# PL/pgSQL function (reported as its own ratio to the baseline): what any
# function layer costs over sending the statement.
# `ceiling`: (script, n): another side, the trivial write, whose
# transactions/s divided by n is the most any cycle of n commits can do on
# this cluster now; both sides are reported as a share of it.
CASES = [
    dict(name="claim + record, passes/s", sturdy="bench/sturdy_pass.sql", base="bench/seed_pass.sql",
         wrapper="bench/plpgsql_pass.sql"),
    dict(name="take(claim) + record + done vs TAKE + CLAIM + RECORD + FINISH, passes/s",
         sturdy="bench/sturdy_worker_pass.sql", base="bench/seed_worker_pass.sql", before=backlog(200000)),
    dict(name="take(claim) + finish vs TAKE + CLAIM + RECORD + FINISH, passes/s",
         sturdy="bench/sturdy_finish_pass.sql", base="bench/seed_worker_pass.sql", before=backlog(200000)),
    dict(name="take and done vs trivial write, transactions/s", sturdy="bench/sturdy_take_done.sql",
         base="bench/trivial_write.sql", sturdy_per=2,
         # 5 s of takes at 4 clients without the flush ran past 200,000 rows on 18
         before=backlog(500000)),
    dict(name="job cycle: schedule + take + done vs plain INSERT + TAKE + DELETE, cycles/s",
         sturdy="bench/sturdy_cycle.sql", base="bench/plain_cycle.sql", before=backlog(1000, "cycle"),
         # three commits a cycle on both sides, each one that DESIGN.md's
         # Reliability needs durable: a third of the commit-rate floor bounds both
         ceiling=("bench/trivial_write.sql", 3),
         # the target: 1.3x the baseline, or 0.8x the ceiling where that asks
         # less (docs/benchmarks.md, "The job cycle's target")
         target=(1.3, 0.8),
         # the same cycle with a queue per client: what meeting at one head costs
         own="bench/sturdy_cycle_own_queue.sql"),
    dict(name="start vs trivial write, transactions/s", sturdy="bench/sturdy_start.sql",
         base="bench/trivial_write.sql"),
    dict(name="start with an idempotency key vs trivial write, transactions/s",
         sturdy="bench/sturdy_start_key.sql", base="bench/trivial_write.sql"),
    dict(name="batches of 100: take + done_many vs pgmq read + delete(bigint[]), jobs/s",
         sturdy="bench/sturdy_batch.sql", base="bench/pgmq_batch.sql", base_db="pgmq", sturdy_per=100,
         base_per=100, before=backlog(1500000), before_base="pgmq"),
    dict(name="jobs of 256 bytes, 100 a batch: schedule_many + take + done_many vs pgmq send_batch + read +"
              " delete(bigint[]), jobs/s",
         sturdy="bench/sturdy_jobs.sql", base="bench/pgmq_jobs.sql", base_db="pgmq", sturdy_per=100,
         base_per=100,
         # each side's table vacuumed before its run: the cycle leaves every
         # row it makes dead, and a run after an unvacuumed one measures the
         # last run's bloat
         vacuum={"sturdy": ("VACUUM sturdy.queue", "postgres"), "base": ("VACUUM pgmq.q_jobs", "pgmq")}),
]
REGIMES = os.environ.get("BENCH_REGIMES", "on,off").split(",")
PGMQ_REPO = os.environ.get("PGMQ_REPO", "/work/.mirror/pgmq+pgmq/repo")
PGMQ_BACKLOG = 1500000
ONLY = os.environ.get("BENCH_CASES")  # e.g. "1,2": run only these (1-based)
AB = os.environ.get("BENCH_AB")

CONN = ["-h", os.path.join(DIR, "cluster"), "-p", PORT, "-U", "postgres"]
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
BINDIR = subprocess.run([PG_CONFIG, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
PSQL, PGBENCH = os.path.join(BINDIR, "psql"), os.path.join(BINDIR, "pgbench")


def psql(sql, db="postgres"):
    out = subprocess.run([PSQL, *CONN, "-X", "-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql, db],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def pgmq_sql():
    """pgmq 1.5.1's SQL-only install script, or None when it is not here."""
    if os.environ.get("PGMQ_SQL"):
        with open(os.environ["PGMQ_SQL"]) as f:
            return f.read()
    out = subprocess.run(["git", "-C", PGMQ_REPO, "show", "v1.5.1:pgmq-extension/sql/pgmq.sql"],
                         capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def setup_pgmq():
    script = pgmq_sql()
    if script is None:
        print("pgmq 1.5.1 not found (PGMQ_SQL, PGMQ_REPO): its column is skipped", flush=True)
        return False
    psql("CREATE DATABASE pgmq")
    subprocess.run([PSQL, *CONN, "-X", "-q", "-v", "ON_ERROR_STOP=1", "pgmq"], input=script, text=True,
                   check=True, capture_output=True)
    psql("SELECT pgmq.create('bench')", "pgmq")
    psql("SELECT pgmq.create('jobs')", "pgmq")
    return True


def own_queues_backlog(clients, n=200):
    """SQL that tops each client's own queue ('cq0' ... as pgbench numbers
    its clients) up to n ready rows."""
    return ("INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at) "
            "SELECT 'cq' || c, 'q-' || gen_random_uuid(), now() - interval '1 second', now() "
            f"FROM generate_series(0, {clients - 1}) c CROSS JOIN LATERAL generate_series(1, greatest(0, {n} - "
            "(SELECT count(*) FROM sturdy.queue WHERE queue = 'cq' || c AND visible_at <= now() "
            "AND (leased_until IS NULL OR leased_until <= now())))); ANALYZE sturdy.queue")


def pgmq_backlog():
    return (f"SELECT count(*) FROM pgmq.send_batch('bench', array_fill('{{}}'::jsonb, ARRAY[greatest(0, "
            f"{PGMQ_BACKLOG} - (SELECT count(*) FROM pgmq.q_bench WHERE vt <= now()))::int])); "
            "ANALYZE pgmq.q_bench")


def seq_scans():
    rows = psql("SELECT schemaname || '.' || relname, seq_scan FROM pg_stat_user_tables")
    return {r.split("|")[0]: int(r.split("|")[1]) for r in rows.splitlines()}


class Builds:
    """For BENCH_AB: the installed library (A) and the other build (B), one
    of them in the server at a time. A library is swapped by a rename of a
    copy into place, never written over (a backend that has it mapped would
    crash), and the server restarts to load it."""

    def __init__(self, other):
        self.path = installed_build.library(PG_CONFIG)
        self.builds = {"A": os.path.join(DIR, "a.so"), "B": other}
        subprocess.run(["install", "-m", "755", self.path, self.builds["A"]], check=True)
        self.loaded = "A"

    def put(self, build):
        if build != self.loaded:
            subprocess.run(["install", "-m", "755", self.builds[build], self.path + ".ab"], check=True)
            os.rename(self.path + ".ab", self.path)
            self.loaded = build

    def use(self, build):
        self.put(build)
        # every pg_sturdy side from a fresh start, so neither build runs warm after the other
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*as_postgres, os.path.join(BINDIR, "pg_ctl"), "-D",
                        os.path.join(DIR, "cluster", "data"), "-w", "-m", "fast", "restart", "-l",
                        os.path.join(DIR, "cluster", "server.log")], check=True, capture_output=True)

    def restore(self):
        self.put("A")


def pgbench(script, clients, db, regime):
    cmd = [PGBENCH, *CONN, "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
           "-T", str(SECONDS), "-f", os.path.join(ROOT, script), db]
    env = dict(os.environ, PGOPTIONS=f"-c synchronous_commit={regime}")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"pgbench failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out.stdout)
    return float(m.group(1))


def take_plan_ab():
    """take(max => 100)'s statement under the plan cache's own choice and under
    a forced generic plan (what take does), 1 client, synchronous_commit off,
    3 alternating runs each: ms per call."""
    psql(backlog(50000, "plan"))
    runs = {"auto": [], "force_generic_plan": []}
    for _ in range(3):
        for mode in runs:
            cmd = [PGBENCH, *CONN, "-n", "-M", "prepared", "-c", "1", "-T", str(SECONDS),
                   "-f", os.path.join(ROOT, "bench", "take_many_plan.sql"), "postgres"]
            env = dict(os.environ, PGOPTIONS=f"-c plan_cache_mode={mode} -c synchronous_commit=off")
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            runs[mode].append(float(re.search(r"latency average = ([0-9.]+) ms", out.stdout).group(1)))
    return ("take(max => 100)'s statement, ms per call (median of 3): plan cache's choice (re-plans each call) "
            f"{statistics.median(runs['auto']):.3f}, forced generic plan (as take runs it) "
            f"{statistics.median(runs['force_generic_plan']):.3f}")


PER_CALL = [("pg_sturdy worker pass", "bench/sturdy_worker_pass.sql", 50000),
            ("pg_sturdy two-call pass", "bench/sturdy_finish_pass.sql", 50000),
            ("plain worker pass", "bench/seed_worker_pass.sql", 50000),
            ("pg_sturdy claim + record", "bench/sturdy_pass.sql", 0),
            ("plain claim + record", "bench/seed_pass.sql", 0),
            ("pg_sturdy job cycle", "bench/sturdy_cycle.sql", 1000),
            ("plain job cycle", "bench/plain_cycle.sql", 1000),
            ("trivial write", "bench/trivial_write.sql", 0)]


PER_CALL_ROUNDS = int(os.environ.get("BENCH_PER_CALL_ROUNDS", "3"))


def per_call():
    """Each statement's latency (pgbench -r), 1 client, synchronous_commit off:
    where a pass's time goes, call by call, including the round trip. One
    client's latency follows the machine's drift, so the scripts run in
    rounds, one after another within a round (the order reversed every other
    round), and each statement shows its median over the rounds with the
    min..max: compare neighbours within the table, not across runs."""
    latencies = {}  # (name, statement) -> [µs]; round 0 runs in PER_CALL's order, which the table keeps
    for round_ in range(PER_CALL_ROUNDS):
        for name, script, rows in (PER_CALL if round_ % 2 == 0 else PER_CALL[::-1]):
            if rows:
                psql(backlog(rows, "cycle" if "cycle" in script else "bench"))
            cmd = [PGBENCH, *CONN, "-n", "-r", "-M", "prepared", "-c", "1", "-T", str(SECONDS),
                   "-f", os.path.join(ROOT, script), "postgres"]
            env = dict(os.environ, PGOPTIONS="-c synchronous_commit=off")
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
            stmts = out.split("statement latencies in milliseconds", 1)[1].splitlines()[1:]
            for line in stmts:
                m = re.match(r"\s+([0-9.]+)\s+(?:[0-9]+\s+)?(.*)", line)
                if m and not m.group(2).startswith("\\set"):
                    key = (name, m.group(2).strip()[:90])
                    latencies.setdefault(key, []).append(float(m.group(1)) * 1000)
    lines = [f"| script | statement | µs, median of {PER_CALL_ROUNDS} rounds (min..max) |", "|---|---|---:|"]
    for (name, stmt), xs in latencies.items():
        lines.append(f"| {name} | `{stmt}` | {statistics.median(xs):.0f} ({min(xs):.0f}..{max(xs):.0f}) |")
    return "\n".join(lines)


SWEEP_ROWS = int(os.environ.get("BENCH_SWEEP_ROWS", "1000000"))


def sweep_rate():
    """sweep's rate on SWEEP_ROWS finished instances (30 days old), each with
    one checkpoint: sweep('7 days', 10000) called until it deletes nothing,
    each call its own transaction."""
    if SWEEP_ROWS <= 0:
        return "sweep: skipped (BENCH_SWEEP_ROWS=0)"
    psql(f"""INSERT INTO sturdy.instances (process, business_key, workflow, queue, status, variables,
                                           created_at, updated_at, finished_at)
             SELECT 'sweep', 'sweep-' || i, 'sweep/' || i, 'sweep', 'succeeded', '{{}}',
                    now() - interval '30 days', now() - interval '30 days', now() - interval '30 days'
               FROM generate_series(1, {SWEEP_ROWS}) i;
             INSERT INTO sturdy.checkpoints (workflow, step, value, token, recorded_at)
             SELECT 'sweep/' || i, 'done', '1', NULL, now() - interval '30 days'
               FROM generate_series(1, {SWEEP_ROWS}) i""")
    psql("VACUUM ANALYZE sturdy.instances, sturdy.checkpoints")
    calls, instances, start = 0, 0, time.perf_counter()
    while True:
        n = int(psql("SELECT deleted FROM sturdy.sweep('7 days', 10000) WHERE kind = 'instances'"))
        calls += 1
        instances += n
        if n == 0:
            break
    seconds = time.perf_counter() - start
    return (f"sweep: {instances:,} finished instances (and as many checkpoints) in {calls} calls of "
            f"sweep('7 days', 10000), {seconds:.1f} s: {instances / seconds:,.0f} instances/s")


def main():
    installed_build.require_release(PG_CONFIG)
    if AB and installed_build.refused(AB):
        sys.exit(f"{AB} (BENCH_AB) is a debug build: build it with --release")
    subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "start", os.path.join(DIR, "cluster"), PORT,
                    "shared_buffers = 512MB", "max_wal_size = 4GB", "checkpoint_timeout = 30min",
                    # as docs/operations.md advises (on 15 the takes' shared floors need it)
                    "shared_preload_libraries = 'pg_sturdy'"], check=True)
    builds = Builds(AB) if AB else None
    try:
        subprocess.run([PSQL, *CONN, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f",
                        os.path.join(ROOT, "bench", "setup.sql"), "postgres"], check=True)
        extras = []
        if os.environ.get("BENCH_PER_CALL", "1") != "0":
            # the search-path choice (plan.rs), in-server: no pin vs a GUC nest level
            ab = subprocess.run([PSQL, *CONN, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f",
                                 os.path.join(ROOT, "bench", "search_path_ab.sql"), "postgres"],
                                check=True, capture_output=True, text=True)
            extras.append(" ".join(line.split("NOTICE:", 1)[1].strip() for line in ab.stderr.splitlines()
                                   if "NOTICE:  search path:" in line))
            print(extras[-1], flush=True)
            extras.append(take_plan_ab())
            print(extras[-1], flush=True)
            extras.append(per_call())
            print(extras[-1], flush=True)
        extras.append(sweep_rate())
        print(extras[-1], flush=True)
        results = {}  # (case, regime, clients) -> {"sturdy": [rate], "base": [rate], "wrapper": [rate]}
        seq = {}
        cases = [c for i, c in enumerate(CASES, 1) if not ONLY or str(i) in ONLY.split(",")]
        have_pgmq = any(c.get("base_db") == "pgmq" for c in cases) and setup_pgmq()
        for rep in range(REPS):
            for case in cases:
                for regime in REGIMES:
                    for clients in CLIENTS:
                        # alternate which goes first, so drift favours neither
                        order = [("sturdy", case["sturdy"], case.get("sturdy_per", 1), "postgres")]
                        if builds:
                            order.append(("ab", case["sturdy"], case.get("sturdy_per", 1), "postgres"))
                        if case["base"] and (case.get("base_db") != "pgmq" or have_pgmq):
                            order.append(("base", case["base"], case.get("base_per", 1),
                                          case.get("base_db", "postgres")))
                        if case.get("wrapper"):
                            order.append(("wrapper", case["wrapper"], case.get("base_per", 1), "postgres"))
                        if case.get("own"):
                            order.append(("own", case["own"], 1, "postgres"))
                        if case.get("ceiling"):
                            script, commits = case["ceiling"]
                            order.append(("ceiling", script, 1 / commits, "postgres"))
                        if rep % 2:
                            order.reverse()
                        for side, script, per, db in order:
                            if side == "own":
                                psql(own_queues_backlog(clients))
                            elif case.get("before"):
                                psql(case["before"])
                            if side in case.get("vacuum", {}):
                                psql(*case["vacuum"][side])
                            if side == "base" and case.get("before_base") == "pgmq":
                                psql(pgmq_backlog(), "pgmq")
                                psql("VACUUM pgmq.q_bench", "pgmq")  # as ours, below
                            if builds and side in ("sturdy", "ab", "own"):
                                builds.use("B" if side == "ab" else "A")
                            if builds or case.get("before") or side == "own":
                                # the top-up's ANALYZE cancels autovacuum on
                                # the queues every time (and with BENCH_AB a
                                # restart puts its first round a minute off):
                                # unvacuumed, they bloat run after run, which
                                # no server with a working autovacuum sees
                                psql("VACUUM sturdy.queue, seed.workflow_queue")
                            before = seq_scans()
                            rate = pgbench(script, clients, db, regime) * per
                            after = seq_scans()
                            results.setdefault((case["name"], regime, clients),
                                               {"sturdy": [], "base": [], "wrapper": [], "ceiling": [],
                                                "own": [], "ab": []}
                                               )[side].append(rate)
                            for t in HOT:
                                seq[t] = seq.get(t, 0) + after.get(t, 0) - before.get(t, 0)
                            print(f"rep {rep + 1} {case['name'][:40]:40} sync {regime:3} {clients:3} clients "
                                  f"{side:7} {rate:10.0f}", flush=True)
        report(results, seq, "\n\n".join(extras))
    finally:
        if builds:
            builds.restore()
        subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "stop", os.path.join(DIR, "cluster")])


def fmt(xs):
    return f"{statistics.median(xs):,.0f} ({min(xs):,.0f}..{max(xs):,.0f})"


def scaling(ceilings):
    """From the second-largest client count to the largest (4 -> 16 by
    default), each side's change, and pg_sturdy's change over the ceiling's
    (the trivial write's): the runs at both counts of one repetition are
    paired, as the ratios above are. Below 1.00x ours fell further, or rose
    less, than the commit-rate floor did."""
    counts = sorted({clients for (_, _, clients), _ in ceilings})
    if len(counts) < 2:
        return []
    lo, hi = counts[-2], counts[-1]
    by = {key: r for key, r in ceilings}
    ab_lines = []
    lines = ["", f"From {lo} to {hi} clients: each side's rate at {hi} over its rate at {lo} "
             "(median of the repetitions), and pg_sturdy's change (one queue; a queue per client) over the",
             "ceiling's within each repetition:", "",
             "| case | synchronous_commit | pg_sturdy | baseline | a queue per client | ceiling "
             "| pg_sturdy's change / the ceiling's | a queue per client's / the ceiling's |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (case, regime, clients), r in ceilings:
        low = by.get((case, regime, lo))
        if clients != hi or not low:
            continue

        def change(side):
            rs = [b / a for a, b in zip(low[side], r[side])]
            return f"{statistics.median(rs) - 1:+.0%}" if rs else ""

        def over_ceiling(side):
            rel = [(s_hi / s_lo) / (c_hi / c_lo) for s_lo, s_hi, c_lo, c_hi
                   in zip(low[side], r[side], low["ceiling"], r["ceiling"])]
            return f"{statistics.median(rel):.2f}x ({min(rel):.2f}..{max(rel):.2f})" if rel else ""

        lines.append(f"| {case.split(':')[0]} | {regime} | {change('sturdy')} | {change('base')} | "
                     f"{change('own')} | {change('ceiling')} | {over_ceiling('sturdy')} | {over_ceiling('own')} |")
        if r["ab"]:
            ab_lines.append(f"| {case.split(':')[0]} | {regime} | {change('sturdy')} | {change('ab')} | "
                            f"{change('ceiling')} | {over_ceiling('sturdy')} | {over_ceiling('ab')} |")
    if ab_lines:
        lines += ["", f"The same, A (the installed build) against B (BENCH_AB), from {lo} to {hi} clients:", "",
                  "| case | synchronous_commit | A | B | ceiling | A's change / the ceiling's "
                  "| B's change / the ceiling's |", "|---|---|---:|---:|---:|---:|---:|"] + ab_lines
    return lines


def report(results, seq, search_path):
    lines = [
        f"pgbench -M prepared, {SECONDS} s per run, {REPS} runs each (median, min..max), "
        f"{os.cpu_count()} cores, one scratch cluster, synchronous_commit as the column says, "
        + subprocess.run([PG_CONFIG, "--version"], capture_output=True, text=True).stdout.strip(),
        "",
        "The ratio is taken within each repetition, where the two sides ran back to back",
        "(the machine drifts more between repetitions than between neighbours), then the",
        "median of those ratios, with their min..max.",
        "",
        "| case | synchronous_commit | clients | pg_sturdy | baseline | ratio | PL/pgSQL wrapper | its ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]

    def ratio(xs, base):
        rs = [a / b for a, b in zip(xs, base)]
        return f"{statistics.median(rs):.2f}x ({min(rs):.2f}..{max(rs):.2f})"

    for (case, regime, clients), r in results.items():
        if not r["base"]:
            lines.append(f"| {case} | {regime} | {clients} | {fmt(r['sturdy'])} | | | | |")
            continue
        wrapper = f"{fmt(r['wrapper'])} | {ratio(r['wrapper'], r['base'])}" if r["wrapper"] else " | "
        lines.append(f"| {case} | {regime} | {clients} | {fmt(r['sturdy'])} | {fmt(r['base'])} | "
                     f"{ratio(r['sturdy'], r['base'])} | {wrapper} |")
    if any(r["ab"] for r in results.values()):
        lines += ["", f"A/B: the installed build (A) against {AB} (B), each run after a restart of the server",
                  "with it, beside each other in every repetition:", "",
                  "| case | synchronous_commit | clients | A | B | B / A |", "|---|---|---:|---:|---:|---:|"]
        lines += [f"| {case.split(':')[0]} | {regime} | {clients} | {fmt(r['sturdy'])} | {fmt(r['ab'])} | "
                  f"{ratio(r['ab'], r['sturdy'])} |" for (case, regime, clients), r in results.items() if r["ab"]]
    ceilings = [(key, r) for key, r in results.items() if r["ceiling"]]
    if ceilings:
        lines += ["", "Against the ceiling of the case's commits: the trivial write's transactions/s divided by",
                  "the commits a cycle makes (three for the job cycle), run beside the other sides in each",
                  "repetition; each side as a share of it (median of the repetitions' shares). The last",
                  "column is pg_sturdy's cycle with a queue per client, where no two clients meet at one",
                  "queue's head:", "",
                  "| case | synchronous_commit | clients | ceiling | pg_sturdy / ceiling | baseline / ceiling "
                  "| a queue per client / ceiling |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        targets = []
        for (case, regime, clients), r in ceilings:
            base = ratio(r["base"], r["ceiling"]) if r["base"] else ""
            own = ratio(r["own"], r["ceiling"]) if r["own"] else ""
            lines.append(f"| {case.split(':')[0]} | {regime} | {clients} | {fmt(r['ceiling'])} | "
                         f"{ratio(r['sturdy'], r['ceiling'])} | {base} | {own} |")
            target = next((c.get("target") for c in CASES if c["name"] == case), None)
            if target and r["base"]:
                of_base, of_ceiling = target
                pairs = [(of_base * b, of_ceiling * c) for b, c in zip(r["base"], r["ceiling"])]
                goal = [min(pair) for pair in pairs]
                binding = sum(b <= c for b, c in pairs)
                targets.append(f"| {case.split(':')[0]} | {regime} | {clients} | {fmt(goal)} | "
                               f"{binding} of {len(goal)} | {ratio(r['sturdy'], goal)} |")
        if targets:
            lines += ["", f"Against the target, in each repetition the lower of {of_base}x the baseline and "
                      f"{of_ceiling}x the ceiling", "(met where pg_sturdy / target is 1.00x or more):", "",
                      "| case | synchronous_commit | clients | target | repetitions where the baseline "
                      "sets it | pg_sturdy / target |", "|---|---|---:|---:|---:|---:|"] + targets
        lines += scaling(ceilings)
    lines += ["", "Sequential scans on hot tables during the runs: "
              + ", ".join(f"{t} {n}" for t, n in seq.items()), "", search_path]
    text = "\n".join(lines)
    os.makedirs(DIR, exist_ok=True)
    with open(os.path.join(DIR, "results.md"), "w") as f:
        f.write(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
