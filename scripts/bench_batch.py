#!/usr/bin/env python3
"""The batch benchmark: draining a backlog of BENCH_BATCH_ROWS rows (primary
key `id`, no index on the predicate) in chunks of 1,000, each chunk its own
transaction, side by side in one run with
  - the floor: one UPDATE of all the rows;
  - the same keyset chunk written by hand, sent from the client (the
    per-chunk overhead of going through sturdy.batch);
  - aflib 0.0.7's PL/Python `Batch.run`, one chunk per call as the seed
    runs it (skipped when PL/Python or aflib is missing; stopped after
    BENCH_BATCH_AFLIB_SECONDS, its progress reported).
Reports the seconds of chunks 1, 100, 500 and the last, and the total, with
synchronous_commit on and off. Not a test: it measures and reports.

  scripts/bench_batch.py       (part of `make bench`; alone: `make bench-batch`)
  BENCH_BATCH_ROWS=1000000 BENCH_BATCH_AFLIB_SECONDS=300 BENCH_REGIMES=on,off (the defaults)
"""
import os
import statistics
import subprocess
import time

import psycopg

import installed_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.path.join(ROOT, "target", "bench_batch")
PORT = os.environ.get("BENCH_BATCH_PORT", "55437")
ROWS = int(os.environ.get("BENCH_BATCH_ROWS", "1000000"))
AFLIB_SECONDS = float(os.environ.get("BENCH_BATCH_AFLIB_SECONDS", "300"))
REGIMES = os.environ.get("BENCH_REGIMES", "on,off").split(",")
AFLIB_DIR = os.environ.get("AFLIB_DIR", "/opt/pg_sturdy/aflib")
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
DSN = f"host={os.path.join(DIR, 'cluster')} port={PORT} user=postgres dbname=postgres"
CHUNK = 1000

AFLIB_SETUP = """
CREATE EXTENSION IF NOT EXISTS plpython3u;
CREATE OR REPLACE FUNCTION public.aflib_chunk(lim int) RETURNS TABLE (done int, remaining int, complete boolean)
LANGUAGE plpython3u AS $py$
import sys
if %(dir)r not in sys.path:
    sys.path.insert(0, %(dir)r)
from aflib.batch import Batch
p = Batch(plpy).run(table='public.receipts', set_clause='status = $1', pending='status = $2',
                    args=['pending', 'planned'], types=['text', 'text'], limit=lim)
return [(p.done, p.remaining, p.complete)]
$py$;
"""


def cluster(cmd, *extra):
    subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), cmd, os.path.join(DIR, "cluster"), *extra],
                   check=True)


def fresh(c):
    """A new backlog: ROWS rows 'planned', primary key only, vacuumed."""
    c.execute("DROP TABLE IF EXISTS public.receipts")
    c.execute("DELETE FROM sturdy.batches")
    c.execute("CREATE TABLE public.receipts (id int PRIMARY KEY, status text NOT NULL, amount numeric NOT NULL)")
    c.execute("INSERT INTO public.receipts SELECT i, 'planned', i %% 1000 FROM generate_series(1, %s) i", (ROWS,))
    c.execute("VACUUM ANALYZE public.receipts")
    c.execute("CHECKPOINT")


def floor(c):
    start = time.perf_counter()
    c.execute("UPDATE public.receipts SET status = 'pending' WHERE status = 'planned'")
    return {"total": time.perf_counter() - start, "chunks": []}


def drain(c, call, budget=None):
    """Call `call()` (one chunk, returning whether the batch is complete)
    until complete; the seconds of every chunk."""
    chunks, start = [], time.perf_counter()
    while True:
        t = time.perf_counter()
        complete = call()
        chunks.append(time.perf_counter() - t)
        if complete:
            return {"total": time.perf_counter() - start, "chunks": chunks}
        if budget and time.perf_counter() - start > budget:
            return {"total": time.perf_counter() - start, "chunks": chunks, "stopped": True}


def sturdy(c):
    sql = ("SELECT complete FROM sturdy.batch('public.receipts', 'status = $1', 'status = $2',"
           f" ARRAY['pending', 'planned'], {CHUNK})")
    return drain(c, lambda: c.execute(sql).fetchone()[0])


def by_hand(c):
    """The same keyset chunk, sent from the client: the cursor kept there."""
    cursor = [0]

    def chunk():
        rows = c.execute(
            "WITH picked AS MATERIALIZED (SELECT id FROM public.receipts WHERE status = 'planned' AND id > %s"
            " ORDER BY id LIMIT %s) "
            "UPDATE public.receipts SET status = 'pending' WHERE status = 'planned'"
            " AND id = ANY (ARRAY(SELECT id FROM picked)) RETURNING id", (cursor[0], CHUNK)).fetchall()
        if rows:
            cursor[0] = max(r[0] for r in rows)
        return len(rows) < CHUNK

    return drain(c, chunk)


def aflib(c):
    return drain(c, lambda: c.execute(f"SELECT complete FROM public.aflib_chunk({CHUNK})").fetchone()[0],
                 budget=AFLIB_SECONDS)


def main():
    installed_build.require_release(PG_CONFIG)
    cluster("start", PORT, "shared_buffers = 512MB", "max_wal_size = 8GB", "checkpoint_timeout = 30min")
    try:
        with psycopg.connect(DSN, autocommit=True) as c:
            c.execute("CREATE EXTENSION pg_sturdy")
            have_aflib = False
            if not os.path.isfile(os.path.join(AFLIB_DIR, "aflib", "batch.py")):
                print(f"aflib not found in {AFLIB_DIR}: its column is skipped", flush=True)
            elif not c.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'plpython3u'").fetchone()[0]:
                print("plpython3u is not installed: aflib's column is skipped", flush=True)
            else:
                c.execute(AFLIB_SETUP % {"dir": AFLIB_DIR})
                have_aflib = True
        sides = [("floor: one UPDATE", floor), ("pg_sturdy batch", sturdy), ("the same chunk by hand", by_hand)]
        if have_aflib:
            sides.append(("aflib Batch.run", aflib))
        results = {}
        for regime in REGIMES:
            with psycopg.connect(DSN, autocommit=True, options=f"-c synchronous_commit={regime}") as c:
                for name, run in sides:
                    fresh(c)
                    r = run(c)
                    results[(regime, name)] = r
                    print(f"sync {regime:3} {name:25} total {r['total']:8.2f} s, {len(r['chunks'])} chunks"
                          + (" (stopped)" if r.get("stopped") else ""), flush=True)
        report(results, [n for n, _ in sides])
    finally:
        cluster("stop")


def report(results, names):
    def at(chunks, i):
        return f"{chunks[i - 1] * 1000:.1f}" if len(chunks) >= i else "-"

    lines = [f"Batch: draining {ROWS:,} rows (primary key only) in chunks of {CHUNK:,}, each its own transaction; "
             "ms per chunk and total seconds. "
             + subprocess.run([PG_CONFIG, "--version"], capture_output=True, text=True).stdout.strip(), "",
             "| synchronous_commit | side | chunk 1 | chunk 100 | chunk 500 | last chunk | median chunk | chunks "
             "| total s | total / floor |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for regime in REGIMES:
        base = results[(regime, names[0])]["total"]
        for name in names:
            r = results[(regime, name)]
            ch = r["chunks"]
            stopped = " (stopped at the time limit)" if r.get("stopped") else ""
            median = f"{statistics.median(ch) * 1000:.1f}" if ch else "-"
            last = f"{ch[-1] * 1000:.1f}" if ch else "-"
            lines.append(f"| {regime} | {name}{stopped} | {at(ch, 1)} | {at(ch, 100)} | {at(ch, 500)} | {last} "
                         f"| {median} | {len(ch) or 1} | {r['total']:.2f} | {r['total'] / base:.2f}x |")
    text = "\n".join(lines)
    os.makedirs(DIR, exist_ok=True)
    with open(os.path.join(DIR, "results.md"), "w") as f:
        f.write(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
