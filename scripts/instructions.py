#!/usr/bin/env python3
"""Instructions per call: each pg_sturdy call against the plain statement it
replaces, counted by callgrind in a single-user backend (no client, no
network, no other process), so the count is the same run after run and a
regression shows as a number, not as noise. Not a test: it measures and
reports (bench/README.md keeps the figures).

Each call is run twice in its own single-user backend, 200 times and 1,200
times (different keys); the difference divided by 1,000 is the cost of one
call with everything the backend does once (start-up, catalog caches, the
first plan) taken out. Every statement is its own transaction, committed
with fsync off.

  scripts/instructions.py      (via `make instructions`; PG=18 for the other version)
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.environ.get("INSTR_DIR", "/tmp/pg_sturdy_instructions")
PORT = os.environ.get("INSTR_PORT", "55436")
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
BINDIR = subprocess.run([PG_CONFIG, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
SMALL, LARGE = 200, 1200

# call, pg_sturdy statement, the plain statement, for key i; in this order,
# since each call works on what the ones before it left (claims to record
# under, rows to take and finish).
CASES = [
    ("claim",
     "SELECT sturdy.claim('i-{i}', '1 minute');",
     "INSERT INTO seed.workflow_claim AS held (workflow, token, held_until) "
     "VALUES ('i-{i}', 1, now() + interval '1 minute') ON CONFLICT (workflow) DO UPDATE "
     "SET token = held.token + 1, held_until = now() + interval '1 minute' "
     "WHERE held.held_until <= now() RETURNING token;"),
    ("record",
     "SELECT recorded, first FROM sturdy.record('i-{i}', 'step', '{{\"ok\": true}}', 1);",
     "WITH fence AS (SELECT token FROM seed.workflow_claim WHERE workflow = 'i-{i}' FOR UPDATE) "
     "INSERT INTO seed.workflow_checkpoint AS recorded (workflow, step, value) "
     "SELECT 'i-{i}', 'step', '{{\"ok\": true}}'::jsonb FROM fence WHERE fence.token <= 1 "
     "ON CONFLICT (workflow, step) DO UPDATE SET value = recorded.value "
     "RETURNING recorded.value::text, recorded.value = '{{\"ok\": true}}'::jsonb;"),
    ("schedule",
     "SELECT sturdy.schedule('j-{i}', now(), 'instr');",
     "INSERT INTO seed.workflow_queue (namespace, workflow, visible_at) VALUES ('instr', 'j-{i}', now()) "
     "ON CONFLICT (namespace, workflow) DO UPDATE SET visible_at = EXCLUDED.visible_at;"),
    ("take",
     "SELECT workflow, receipt FROM sturdy.take('instr', '1 minute');",
     "WITH due AS MATERIALIZED (SELECT workflow FROM seed.workflow_queue WHERE namespace = 'instr' "
     "AND visible_at <= now() ORDER BY visible_at FOR UPDATE SKIP LOCKED LIMIT 1) "
     "UPDATE seed.workflow_queue AS entry SET visible_at = now() + interval '1 minute' FROM due "
     "WHERE entry.namespace = 'instr' AND entry.workflow = due.workflow "
     "RETURNING entry.workflow, entry.visible_at;"),
    ("done",
     "SELECT sturdy.done(workflow, visible_at, 'instr') FROM sturdy.queue "
     "WHERE queue = 'instr' AND workflow = 'j-{i}';",
     "DELETE FROM seed.workflow_queue WHERE namespace = 'instr' AND workflow = 'j-{i}' AND visible_at = "
     "(SELECT visible_at FROM seed.workflow_queue WHERE namespace = 'instr' AND workflow = 'j-{i}');"),
]


def as_pg(cmd, **kw):
    if os.getuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    return subprocess.run(cmd, **kw)


def instructions(name, statements):
    """Instructions a single-user backend spends on `statements`, one per line."""
    out = os.path.join(DIR, f"{name}.callgrind")
    script = "\n".join(statements) + "\n"
    as_pg(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
           os.path.join(BINDIR, "postgres"), "--single", "-D", os.path.join(DIR, "cluster", "data"),
           "-c", "fsync=off", "-c", "synchronous_commit=off", "postgres"],
          input=script, text=True, check=True, capture_output=True)
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    sys.exit(f"no instruction total in {out}")


def main():
    cluster = os.path.join(DIR, "cluster")
    subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "start", cluster, PORT], check=True)
    try:
        subprocess.run([os.path.join(BINDIR, "psql"), "-h", cluster, "-p", PORT, "-U", "postgres", "-X", "-q",
                        "-v", "ON_ERROR_STOP=1", "-f", os.path.join(ROOT, "bench", "setup.sql"), "postgres"],
                       check=True, capture_output=True)
    finally:
        subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "stop", cluster], check=True)
    os.makedirs(DIR, exist_ok=True)
    if os.getuid() == 0:
        subprocess.run(["chown", "-R", "postgres:", DIR], check=True)
    version = subprocess.run([PG_CONFIG, "--version"], capture_output=True, text=True).stdout.strip()
    lines = [f"Instructions per call (callgrind, single-user backend, {version}, "
             f"({LARGE} calls - {SMALL} calls) / {LARGE - SMALL}, each its own transaction):", "",
             "| call | pg_sturdy | the plain statement | pg_sturdy / plain |", "|---|---:|---:|---:|"]
    for call, ours, plain in CASES:
        per = {}
        for side, template in (("sturdy", ours), ("plain", plain)):
            small = instructions(f"{call}-{side}-small", [template.format(i=i) for i in range(SMALL)])
            large = instructions(f"{call}-{side}-large",
                                 [template.format(i=i) for i in range(SMALL, SMALL + LARGE)])
            per[side] = (large - small) / (LARGE - SMALL)
            print(f"{call:9} {side:7} {per[side]:12,.0f} instructions/call", flush=True)
        lines.append(f"| `{call}` | {per['sturdy']:,.0f} | {per['plain']:,.0f} | "
                     f"{per['sturdy'] / per['plain']:.2f}x |")
    text = "\n".join(lines)
    with open(os.path.join(DIR, "results.md"), "w") as f:
        f.write(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
