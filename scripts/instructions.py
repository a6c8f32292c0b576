#!/usr/bin/env python3
"""Instructions per call: each pg_sturdy call against the plain statement it
replaces, counted by callgrind in a single-user backend (no client, no
network, no other process), so the count is the same run after run and a
regression shows as a number, not as noise. Not a test: it measures and
reports (docs/benchmarks.md keeps the figures).

Each call is run twice in its own single-user backend, 200 times and 1,200
times (different keys); the difference divided by 1,000 is the cost of one
call with everything the backend does once (start-up, catalog caches, the
first plan) taken out. Both sides run as prepared statements (PREPARE once,
EXECUTE per call), as `pgbench -M prepared` and pooled drivers do; every
EXECUTE is its own transaction, committed with fsync off. `done` reads its
receipt with a sub-select on both sides. Each run's output is checked for
errors: a statement that fails costs little and would count as a cheap call;
and the runs over a backlog (the batch, the pass) for the rows they must have
removed (LEFT).

A single-user backend has no client: it prints each result row to its
terminal with printf (`debugtup`), about 5,000 instructions for a one-column
row, where a connection sends the row in a message for a few hundred. That
printing is taken out of both sides' counts (TERMINAL) and reported beside
them: left in, it charged a `SELECT sturdy.schedule(...)` 5,000 instructions
its plain `INSERT`, which returns no row, never paid.

`schedule` is counted in the steady state of a busy queue: a ready schedule
probes `sturdy.queue_waiters` for an idle worker until one probe made a
second after the backend first read the idle epoch finds none (queue/wakeups.rs,
`Unmarked`); from then on it does not look. Under callgrind that second is a
few hundred calls, a different share of each run, so both runs of both sides
start with one call and a pause past it (WARMUP), and the counted calls are
the ones a server sees after its first second.

`schedule`, `claim` and `record` work on new keys, and a backend whose
upserts into a table have seldom found a row inserts before it looks
(access/insert.rs, FOUND_AT_MOST). Two more cases count the other side of that
bet: every `schedule` onto a row already there (the backend looks first
throughout), and one call in nine onto a row there among new keys (the
backend inserts first and, for the row there, pays a row inserted and taken
back).

  scripts/instructions.py      (via `make instructions`; PG=18 for the other version)
  INSTR_CASES=3,7              (only these calls, 1-based as listed in CASES, for an A/B of one
                               change; keep the calls a case works on: done needs schedule's rows)
  INSTR_STATEMENTS=1           (every pg_sturdy call through its statement: each table the fast path
                               serves gets an expression index, which it refuses)
"""
import os
import re
import subprocess
import sys

import installed_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.environ.get("INSTR_DIR", "/tmp/pg_sturdy_instructions")
PORT = os.environ.get("INSTR_PORT", "55436")
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
BINDIR = subprocess.run([PG_CONFIG, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
SMALL, LARGE = 200, 1200
BACKLOG = 1500  # rows BEFORE schedules for the batch and the pass

# call, then for pg_sturdy and for the plain statement: the statement as a
# PREPARE (so both sides run cached plans, as `pgbench -M prepared` and any
# driver with prepared statements do) and its EXECUTE for key i (n: the
# EXECUTE's place in its run, from 1). In this
# order: each call works on what the ones before it left (claims to record
# under, rows to take and finish).
RESCHEDULE, MIX = "schedule onto its row", "schedule, one in nine onto its row"
CASES = [
    ("claim",
     ("PREPARE q(text) AS SELECT sturdy.claim($1, '1 minute');", "EXECUTE q('i-{i}');"),
     ("PREPARE q(text) AS INSERT INTO seed.workflow_claim AS held (workflow, token, held_until) "
      "VALUES ($1, 1, now() + interval '1 minute') ON CONFLICT (workflow) DO UPDATE "
      "SET token = held.token + 1, held_until = now() + interval '1 minute' "
      "WHERE held.held_until <= now() RETURNING token;", "EXECUTE q('i-{i}');")),
    ("record",
     ("PREPARE q(text) AS SELECT recorded, first FROM sturdy.record($1, 'step', '{\"ok\": true}', 1);",
      "EXECUTE q('i-{i}');"),
     ("PREPARE q(text) AS WITH fence AS (SELECT token FROM seed.workflow_claim WHERE workflow = $1 FOR UPDATE) "
      "INSERT INTO seed.workflow_checkpoint AS recorded (workflow, step, value) "
      "SELECT $1, 'step', '{\"ok\": true}'::jsonb FROM fence WHERE fence.token <= 1 "
      "ON CONFLICT (workflow, step) DO UPDATE SET value = recorded.value "
      "RETURNING recorded.value::text, recorded.value = '{\"ok\": true}'::jsonb;", "EXECUTE q('i-{i}');")),
    ("schedule",
     ("PREPARE q(text) AS SELECT sturdy.schedule($1, now(), 'instr');", "EXECUTE q('j-{i}');"),
     ("PREPARE q(text) AS INSERT INTO seed.workflow_queue (namespace, workflow, visible_at) "
      "VALUES ('instr', $1, now()) ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = EXCLUDED.visible_at;",
      "EXECUTE q('j-{i}');")),
    ("take",
     ("PREPARE q AS SELECT workflow, receipt FROM sturdy.take('instr', '1 minute');",
      "EXECUTE q;"),
     ("PREPARE q AS WITH due AS MATERIALIZED (SELECT workflow FROM seed.workflow_queue WHERE namespace = 'instr' "
      "AND visible_at <= now() ORDER BY visible_at FOR UPDATE SKIP LOCKED LIMIT 1) "
      "UPDATE seed.workflow_queue AS entry SET visible_at = now() + interval '1 minute' FROM due "
      "WHERE entry.namespace = 'instr' AND entry.workflow = due.workflow "
      "RETURNING entry.workflow, entry.visible_at;", "EXECUTE q;")),
    # a backlog scheduled in one transaction (one visible_at for every row),
    # each row taken and then done, as a worker does: each take walks past the
    # entries of the rows done before it (see sql/queue.sql). Both sides take
    # in arrival order, so the n-th call of a run takes b-n; the done reads
    # that row's receipt by key, the same way on both sides.
    ("take + done, a batch",
     ("PREPARE q AS SELECT workflow, receipt FROM sturdy.take('batch', '1 minute');\n"
      "PREPARE d(text) AS SELECT sturdy.done($1, (SELECT leased_until FROM sturdy.queue "
      "WHERE queue = 'batch' AND workflow = $1), 'batch');",
      "EXECUTE q;\nEXECUTE d('b-{n}');"),
     ("PREPARE q AS WITH due AS MATERIALIZED (SELECT workflow FROM seed.workflow_queue WHERE namespace = 'batch' "
      "AND visible_at <= now() ORDER BY visible_at FOR UPDATE SKIP LOCKED LIMIT 1) "
      "UPDATE seed.workflow_queue AS entry SET visible_at = now() + interval '1 minute' FROM due "
      "WHERE entry.namespace = 'batch' AND entry.workflow = due.workflow "
      "RETURNING entry.workflow, entry.visible_at;\n"
      "PREPARE d(text) AS DELETE FROM seed.workflow_queue WHERE namespace = 'batch' AND workflow = $1 "
      "AND visible_at = (SELECT visible_at FROM seed.workflow_queue WHERE namespace = 'batch' AND workflow = $1);",
      "EXECUTE q;\nEXECUTE d('b-{n}');")),
    # a worker's pass over a backlog like the batch's: take with a claim and
    # finish recording one step, against the seed's TAKE, CLAIM, RECORD and
    # FINISH; the n-th pass works on p-n, and what a client would carry from
    # one call to the next (token, receipt) is read by key on both sides.
    ("pass: take(claim) + finish",
     ("PREPARE q AS SELECT workflow, receipt, token FROM sturdy.take('pass', '1 minute', 1, true);\n"
      "PREPARE f(text) AS SELECT sturdy.finish($1, (SELECT token FROM sturdy.claims WHERE workflow = $1), "
      "(SELECT leased_until FROM sturdy.queue WHERE queue = 'pass' AND workflow = $1), 'step-1', "
      "'{\"ok\": true}', queue => 'pass');",
      "EXECUTE q;\nEXECUTE f('p-{n}');"),
     ("PREPARE q AS WITH due AS MATERIALIZED (SELECT workflow FROM seed.workflow_queue WHERE namespace = 'pass' "
      "AND visible_at <= now() ORDER BY visible_at FOR UPDATE SKIP LOCKED LIMIT 1) "
      "UPDATE seed.workflow_queue AS entry SET visible_at = now() + interval '1 minute' FROM due "
      "WHERE entry.namespace = 'pass' AND entry.workflow = due.workflow "
      "RETURNING entry.workflow, entry.visible_at;\n"
      "PREPARE c(text) AS INSERT INTO seed.workflow_claim AS held (workflow, token, held_until) "
      "VALUES ($1, 1, now() + interval '1 minute') ON CONFLICT (workflow) DO UPDATE "
      "SET token = held.token + 1, held_until = now() + interval '1 minute' "
      "WHERE held.held_until <= now() RETURNING token;\n"
      "PREPARE r(text) AS WITH fence AS (SELECT token FROM seed.workflow_claim WHERE workflow = $1 FOR UPDATE) "
      "INSERT INTO seed.workflow_checkpoint AS recorded (workflow, step, value) "
      "SELECT $1, 'step-1', '{\"ok\": true}'::jsonb FROM fence "
      "WHERE fence.token <= (SELECT token FROM seed.workflow_claim WHERE workflow = $1) "
      "ON CONFLICT (workflow, step) DO UPDATE SET value = recorded.value "
      "RETURNING recorded.value::text, recorded.value = '{\"ok\": true}'::jsonb;\n"
      "PREPARE d(text) AS DELETE FROM seed.workflow_queue WHERE namespace = 'pass' AND workflow = $1 "
      "AND visible_at = (SELECT visible_at FROM seed.workflow_queue WHERE namespace = 'pass' AND workflow = $1);",
      "EXECUTE q;\nEXECUTE c('p-{n}');\nEXECUTE r('p-{n}');\nEXECUTE d('p-{n}');")),
    ("done",
     ("PREPARE q(text) AS SELECT sturdy.done($1, (SELECT leased_until FROM sturdy.queue "
      "WHERE queue = 'instr' AND workflow = $1), 'instr');", "EXECUTE q('j-{i}');"),
     ("PREPARE q(text) AS DELETE FROM seed.workflow_queue WHERE namespace = 'instr' AND workflow = $1 "
      "AND visible_at = (SELECT visible_at FROM seed.workflow_queue WHERE namespace = 'instr' AND workflow = $1);",
      "EXECUTE q('j-{i}');")),
    # schedule onto a row there (BEFORE makes r-0 ... of queue 'resched'),
    # every call, and one call in nine among new keys: a backend whose last
    # upserts into a table seldom found a row inserts before it looks
    # (access/insert.rs, FOUND_AT_MOST), so a row among new keys costs an insert
    # taken back
    (RESCHEDULE,
     ("PREPARE q(text) AS SELECT sturdy.schedule($1, now(), 'resched');", "EXECUTE q('r-{i}');"),
     ("PREPARE q(text) AS INSERT INTO seed.workflow_queue (namespace, workflow, visible_at) "
      "VALUES ('resched', $1, now()) ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = EXCLUDED.visible_at;",
      "EXECUTE q('r-{i}');")),
    (MIX,
     ("PREPARE q(text) AS SELECT sturdy.schedule($1, now(), 'resched');", lambda i, n: one_in_nine(i)),
     ("PREPARE q(text) AS INSERT INTO seed.workflow_queue (namespace, workflow, visible_at) "
      "VALUES ('resched', $1, now()) ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = EXCLUDED.visible_at;",
      lambda i, n: one_in_nine(i))),
]


def one_in_nine(i):
    """The i-th call of the mix: a row there (r-i) every ninth, else a new key."""
    return f"EXECUTE q('{'r' if i % 9 == 8 else 'm'}-{i}');"


def line(execute, i, n):
    """The i-th EXECUTE of a case (`n`: its place in the run, from 1)."""
    return execute(i, n) if callable(execute) else execute.format(i=i, n=n)


# What a call's large run must have left, per side: a call that did not do
# its work (a take that found nothing, a finish refused) costs little and
# would count as a cheap call, like a failed statement. Checked after the
# large run, before the next run's BEFORE resets the rows.
LEFT = {
    "take + done, a batch": {"sturdy": "SELECT count(*) FROM sturdy.queue WHERE queue = 'batch'",
                             "plain": "SELECT count(*) FROM seed.workflow_queue WHERE namespace = 'batch'"},
    "pass: take(claim) + finish": {
        "sturdy": "SELECT count(*) FROM sturdy.queue WHERE queue = 'pass'",
        "plain": "SELECT count(*) FROM seed.workflow_queue WHERE namespace = 'pass'"},
}


def rows_left(call, side):
    """The count LEFT asks for, read in a single-user backend."""
    out = single_user([LEFT[call][side]]).stdout
    m = re.search(r'1: count = "(\d+)"', out)
    if not m:
        sys.exit(f"{call} {side}: no count in\n{out}")
    return int(m.group(1))


# Run after the PREPARE in both runs of both sides of a call (the same
# statements, so they cancel in the difference): see the docstring.
# The warm-up row is removed again, so the calls after schedule's find only
# the rows they expect.
WARMUP = {"schedule": ["EXECUTE q('warm-0');", "SELECT pg_sleep(1.2);",
                       "DELETE FROM sturdy.queue WHERE workflow = 'warm-0';",
                       "DELETE FROM seed.workflow_queue WHERE workflow = 'warm-0';"]}
WARMUP[RESCHEDULE] = WARMUP[MIX] = WARMUP["schedule"]


def as_pg(cmd, **kw):
    if os.getuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    return subprocess.run(cmd, **kw)


# Run before each measured backend, in a backend of its own (not counted: its
# cost depends on what the run before left): a fresh batch for "take, a
# batch" and for the pass, and statistics that know the backlog, as
# autovacuum would keep them (the hand-written TAKE joins back by key and
# scans the whole queue per call without them).
BEFORE = [
    "DELETE FROM sturdy.queue WHERE queue = 'batch';",
    "DELETE FROM seed.workflow_queue WHERE namespace = 'batch';",
    "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at) "
    f"SELECT 'batch', 'b-' || i, now() - interval '1 second', now() FROM generate_series(1, {BACKLOG}) i;",
    "INSERT INTO seed.workflow_queue (namespace, workflow, visible_at) "
    f"SELECT 'batch', 'b-' || i, now() - interval '1 second' FROM generate_series(1, {BACKLOG}) i;",
    "DELETE FROM sturdy.queue WHERE queue = 'pass';",
    "DELETE FROM seed.workflow_queue WHERE namespace = 'pass';",
    "DELETE FROM sturdy.claims WHERE workflow LIKE 'p-%';",
    "DELETE FROM sturdy.checkpoints WHERE workflow LIKE 'p-%';",
    "DELETE FROM seed.workflow_claim WHERE workflow LIKE 'p-%';",
    "DELETE FROM seed.workflow_checkpoint WHERE workflow LIKE 'p-%';",
    "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at) "
    f"SELECT 'pass', 'p-' || i, now() - interval '1 second', now() FROM generate_series(1, {BACKLOG}) i;",
    "INSERT INTO seed.workflow_queue (namespace, workflow, visible_at) "
    f"SELECT 'pass', 'p-' || i, now() - interval '1 second' FROM generate_series(1, {BACKLOG}) i;",
    "DELETE FROM sturdy.queue WHERE queue = 'resched';",
    "DELETE FROM seed.workflow_queue WHERE namespace = 'resched';",
    "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at) "
    f"SELECT 'resched', 'r-' || i, now() - interval '1 second', now() FROM generate_series(0, {SMALL + LARGE}) i;",
    "INSERT INTO seed.workflow_queue (namespace, workflow, visible_at) "
    f"SELECT 'resched', 'r-' || i, now() - interval '1 second' FROM generate_series(0, {SMALL + LARGE}) i;",
    "VACUUM ANALYZE sturdy.queue, seed.workflow_queue, sturdy.claims, sturdy.checkpoints, "
    "seed.workflow_claim, seed.workflow_checkpoint;",
]


# INSTR_STATEMENTS: an index the fast path refuses (an expression) on each
# table it serves, so every call runs its statement.
STATEMENTS_ONLY = "; ".join(
    f"CREATE INDEX IF NOT EXISTS {t}_refused ON sturdy.{t} ((workflow OPERATOR(pg_catalog.||) 'x'))"
    for t in ("queue", "claims", "checkpoints"))


def single_user(statements, valgrind=()):
    return as_pg([*valgrind, os.path.join(BINDIR, "postgres"), "--single", "-D", os.path.join(DIR, "cluster", "data"),
                  "-c", "fsync=off", "-c", "synchronous_commit=off", "postgres"],
                 input="\n".join(statements) + "\n", text=True, check=True, capture_output=True)


# The single-user backend's printing of result rows to its terminal, which a
# connection does not do (it sends them with printtup).
TERMINAL = ("debugStartup", "debugtup")


def instructions(name, statements):
    """Instructions a single-user backend spends on `statements`, one per line:
    (all of them, those spent printing result rows to the terminal)."""
    out = os.path.join(DIR, f"{name}.callgrind")
    single_user(BEFORE)
    run = single_user(statements, valgrind=("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"))
    errors = [line for line in (run.stdout + run.stderr).splitlines() if "ERROR:" in line]
    if errors:
        sys.exit(f"{name}: {len(errors)} statements failed, first: {errors[0]}")
    total = None
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                total = int(line.split()[1])
                break
    if total is None:
        sys.exit(f"no instruction total in {out}")
    annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
                               check=True, capture_output=True, text=True).stdout
    terminal = 0
    for line in annotated.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+\S*:(\w+) \[", line)
        if m and m.group(2) in TERMINAL:
            terminal += int(m.group(1).replace(",", ""))
    return total, terminal


def main():
    installed_build.require_release(PG_CONFIG)
    cluster = os.path.join(DIR, "cluster")
    subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "start", cluster, PORT], check=True)
    try:
        subprocess.run([os.path.join(BINDIR, "psql"), "-h", cluster, "-p", PORT, "-U", "postgres", "-X", "-q",
                        "-v", "ON_ERROR_STOP=1", "-f", os.path.join(ROOT, "bench", "setup.sql"), "postgres"],
                       check=True, capture_output=True)
        if os.environ.get("INSTR_STATEMENTS"):
            subprocess.run([os.path.join(BINDIR, "psql"), "-h", cluster, "-p", PORT, "-U", "postgres", "-X", "-q",
                            "-v", "ON_ERROR_STOP=1", "-c", STATEMENTS_ONLY, "postgres"],
                           check=True, capture_output=True)
    finally:
        subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "stop", cluster], check=True)
    os.makedirs(DIR, exist_ok=True)
    if os.getuid() == 0:
        subprocess.run(["chown", "-R", "postgres:", DIR], check=True)
    version = subprocess.run([PG_CONFIG, "--version"], capture_output=True, text=True).stdout.strip()
    lines = [f"Instructions per call (callgrind, single-user backend, {version}, "
             f"prepared statements, ({LARGE} calls - {SMALL} calls) / {LARGE - SMALL}, each its own transaction):", "",
             "| call | pg_sturdy | the plain statement | pg_sturdy / plain | terminal output taken out (ours, plain) |",
             "|---|---:|---:|---:|---:|"]
    only = os.environ.get("INSTR_CASES")
    for n, (call, ours, plain) in enumerate(CASES, 1):
        if only and str(n) not in only.split(","):
            continue
        per, shown = {}, {}
        for side, (prepare, execute) in (("sturdy", ours), ("plain", plain)):
            warmup = WARMUP.get(call, [])
            small = instructions(f"{call}-{side}-small",
                                 [prepare, *warmup] + [line(execute, i, i + 1) for i in range(SMALL)])
            large = instructions(f"{call}-{side}-large",
                                 [prepare, *warmup] + [line(execute, i, i - SMALL + 1)
                                                       for i in range(SMALL, SMALL + LARGE)])
            if call in LEFT and rows_left(call, side) != BACKLOG - LARGE:
                sys.exit(f"{call} {side}: {rows_left(call, side)} rows left after {LARGE} calls, "
                         f"not {BACKLOG - LARGE}: the calls did not all do their work")
            printed = (large[1] - small[1]) / (LARGE - SMALL)
            per[side] = (large[0] - small[0]) / (LARGE - SMALL) - printed
            shown[side] = printed
            print(f"{call:9} {side:7} {per[side]:12,.0f} instructions/call "
                  f"(and {printed:,.0f} printing its result)", flush=True)
        lines.append(f"| `{call}` | {per['sturdy']:,.0f} | {per['plain']:,.0f} | "
                     f"{per['sturdy'] / per['plain']:.2f}x | {shown['sturdy']:,.0f}, {shown['plain']:,.0f} |")
    text = "\n".join(lines)
    with open(os.path.join(DIR, "results.md"), "w") as f:
        f.write(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
