#!/usr/bin/env python3
"""sturdy.sample() at scale: its time with 1M and 10M queue rows (one big
queue, 90% due and 10% sleeping, 16 of them leased, beside 20 queues of 100
rows), 100,000 instances and 1,000 deliveries, next to a read of
sturdy.queue_stats (the exact per-queue counts, one pass over the table) at
the same moment. Each figure is the median (and range) of five calls, each
in its own transaction; the sequential scans sample() started
(pg_stat_user_tables) are counted and must be none.

  scripts/bench_sample.py
  BENCH_SAMPLE_ROWS=1000000 scripts/bench_sample.py
"""
import os
import statistics
import subprocess
import sys
import time

import psycopg

import installed_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.environ.get("BENCH_SAMPLE_DIR", "/tmp/pg_sturdy_bench_sample")
PORT = os.environ.get("BENCH_SAMPLE_PORT", "55447")
ROWS = [int(n) for n in os.environ.get("BENCH_SAMPLE_ROWS", "1000000,10000000").split(",")]
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
DSN = f"host={os.path.join(DIR, 'cluster')} port={PORT} user=postgres dbname=bench"
RUNS = 5


def timed(conn, sql):
    """Median and range, in ms, of RUNS runs of `sql`, each committed."""
    ms = []
    for _ in range(RUNS):
        t = time.perf_counter()
        conn.execute(sql).fetchall()
        conn.commit()
        ms.append((time.perf_counter() - t) * 1000)
    return statistics.median(ms), min(ms), max(ms)


def seq_scans(conn):
    conn.commit()
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return dict(conn.execute("SELECT relname, seq_scan FROM pg_stat_user_tables WHERE schemaname = 'sturdy'"
                             " AND relname IN ('queue', 'instances', 'checkpoints')").fetchall())


def grow(conn, have, want):
    """Queue 'big' from `have` to `want` rows: 90% due over the last day,
    10% sleeping over the next."""
    conn.execute(
        "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)"
        " SELECT 'big', 'w' || g, CASE WHEN g %% 10 = 0 THEN now() + (g %% 86400) * interval '1 s'"
        "                              ELSE now() - interval '1 day' + (g %% 86400) * interval '1 s' END, now()"
        " FROM generate_series(%s, %s) g", (have + 1, want))
    conn.commit()


def main():
    installed_build.require_release(PG_CONFIG)
    subprocess.run(["scripts/cluster.sh", "start", os.path.join(DIR, "cluster"), PORT,
                    "shared_preload_libraries = 'pg_sturdy'\nmax_wal_size = '8GB'\nautovacuum = off"],
                   cwd=ROOT, check=True, capture_output=True)
    results = []
    try:
        with psycopg.connect(DSN.replace("dbname=bench", "dbname=postgres"), autocommit=True) as c:
            c.execute("DROP DATABASE IF EXISTS bench")
            c.execute("CREATE DATABASE bench")
        with psycopg.connect(DSN) as conn:
            conn.execute("CREATE EXTENSION pg_sturdy")
            conn.execute("SELECT count(sturdy.schedule('s' || g, now() - interval '1 minute', 'small' || (g % 20)))"
                         " FROM generate_series(1, 2000) g")
            conn.execute("SELECT count(sturdy.start('p', 'k' || g)) FROM generate_series(1, 100000) g")
            conn.execute("CREATE FUNCTION public.sink(m sturdy.outbox, attempt int) RETURNS void"
                         " LANGUAGE sql AS 'SELECT'")
            conn.execute("SELECT sturdy.subscribe('e', 'public.sink(sturdy.outbox, int)'::regprocedure)")
            conn.execute("SELECT count(*) FROM generate_series(1, 1000), sturdy.emit('e', '{}')")
            conn.commit()
            have = 0
            for want in ROWS:
                grow(conn, have, want)
                have = want
                conn.autocommit = True
                conn.execute("VACUUM ANALYZE sturdy.queue")
                conn.execute("VACUUM ANALYZE sturdy.instances")
                conn.autocommit = False
                # 16 passes under way at the front of the big queue
                conn.execute("SELECT count(*) FROM sturdy.take('big', '1 hour', max => 16)")
                conn.commit()
                conn.execute("SELECT sturdy.sample()")  # a previous sample, as every minute
                conn.commit()
                before = seq_scans(conn)
                sample = timed(conn, "SELECT sturdy.sample()")
                after = seq_scans(conn)
                stats = timed(conn, "SELECT * FROM sturdy.queue_stats")
                figures = conn.execute(
                    "SELECT figures FROM sturdy.samples WHERE kind = 'queue' AND name = 'big'"
                    " ORDER BY sampled_at DESC LIMIT 1").fetchone()[0]
                conn.commit()
                scans = {k: after[k] - before[k] for k in after}
                results.append((want, sample, stats, scans, figures))
                print(want, sample, stats, scans, figures, file=sys.stderr)
    finally:
        subprocess.run(["scripts/cluster.sh", "stop", os.path.join(DIR, "cluster")], cwd=ROOT, capture_output=True)
    print("sample() and a read of queue_stats, median (range) of five, ms:\n")
    print("| queue rows | sample() | queue_stats | ratio | seq scans in sample() | big queue's figures |")
    print("|---:|---:|---:|---:|---|---|")
    fmt = lambda m: f"{m[0]:.1f} ({m[1]:.1f}..{m[2]:.1f})"
    for want, sample, stats, scans, f in results:
        print(f"| {want:,} | {fmt(sample)} | {fmt(stats)} | {stats[0] / sample[0]:.0f}x | "
              f"{', '.join(f'{k} {v}' for k, v in sorted(scans.items()))} | "
              f"ready {f['ready']:,}, leased {f['leased']}, sleeping {f['sleeping']:,}, estimated {f['estimated']} |")
    if any(v for _, _, _, scans, _ in results for v in scans.values()):
        sys.exit("sample() scanned a table")


if __name__ == "__main__":
    main()
