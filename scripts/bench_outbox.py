#!/usr/bin/env python3
"""The outbox benchmark: what one delivery costs through `sturdy.pump`, side
by side in one run with
  - the floor: the same subscriber called directly on the same messages, in
    a PL/pgSQL loop, with as many commits (one per 100 messages) and no
    bookkeeping;
  - the bookkeeping alone: the row lock and the update to `done` any pump on
    these tables must do per delivery, 100 per transaction, calling nobody;
  - the same pump written by hand in PL/pgSQL, as a user without pg_sturdy
    would: the same tables and query, an EXCEPTION block per subscriber call
    (dynamic SQL), the row updated after each call (no per-aggregate order);
  - aflib 0.0.7's PL/Python `Outbox.pump` on tables of its shape, calling a
    subscriber of its shape `(outbox_id bigint, attempt integer)` through
    `aflib.functions.call` (skipped when PL/Python or aflib is missing: see
    scripts/bootstrap.sh).
Two subscribers: one that does nothing, one that inserts a row. Each side
drains a backlog of BENCH_OUTBOX_N deliveries, 100 per call, each call its own
transaction, with synchronous_commit on and off. Not a test: it reports.

Then a long backlog: BENCH_OUTBOX_BACKLOG deliveries emitted at once and
drained by pump(100) in a procedure (a COMMIT per call), reporting the cost
per delivery of the first and the last tenth: what settled deliveries left in
the due index costs the pumps that follow (0 skips it).

  scripts/bench_outbox.py           (part of `make bench`)
  BENCH_OUTBOX_N=10000 BENCH_OUTBOX_REPS=3 BENCH_REGIMES=on,off BENCH_OUTBOX_BACKLOG=200000 (the defaults)
"""
import os
import statistics
import subprocess
import time

import psycopg

import installed_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.path.join(ROOT, "target", "bench_outbox")
PORT = os.environ.get("BENCH_OUTBOX_PORT", "55436")
N = int(os.environ.get("BENCH_OUTBOX_N", "10000"))
REPS = int(os.environ.get("BENCH_OUTBOX_REPS", "3"))
REGIMES = os.environ.get("BENCH_REGIMES", "on,off").split(",")
AFLIB_DIR = os.environ.get("AFLIB_DIR", "/opt/pg_sturdy/aflib")
PG_CONFIG = os.environ.setdefault("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
DSN = f"host={os.path.join(DIR, 'cluster')} port={PORT} user=postgres dbname=postgres"
BATCH = 100
BACKLOG = int(os.environ.get("BENCH_OUTBOX_BACKLOG", "200000"))

SETUP = """
CREATE EXTENSION pg_sturdy;
CREATE SCHEMA bench;
CREATE TABLE bench.sink (id bigint);
CREATE FUNCTION bench.noop(m sturdy.outbox, attempt int) RETURNS void LANGUAGE plpgsql AS $$BEGIN END$$;
CREATE FUNCTION bench.insert(m sturdy.outbox, attempt int) RETURNS void LANGUAGE plpgsql
  AS $$BEGIN INSERT INTO bench.sink VALUES (m.id); END$$;
-- the floor: the subscriber called directly on messages a..b
CREATE PROCEDURE bench.floor(sub text, a bigint, b bigint) LANGUAGE plpgsql AS $$
DECLARE m sturdy.outbox;
BEGIN
  FOR m IN SELECT * FROM sturdy.outbox WHERE id BETWEEN a AND b ORDER BY id LOOP
    IF sub = 'noop' THEN PERFORM bench.noop(m, 1); ELSE PERFORM bench.insert(m, 1); END IF;
  END LOOP;
END $$;
-- the long backlog: pump(100) until nothing is left, a COMMIT per call;
-- the µs per delivery of each tenth of the backlog
CREATE PROCEDURE bench.drain_tenths(total int, INOUT tenths float8[] DEFAULT NULL) LANGUAGE plpgsql AS $$
DECLARE s int; done_ int := 0; mark int := total / 10; t0 timestamptz := clock_timestamp();
BEGIN
  tenths := '{}';
  LOOP
    SELECT seen INTO s FROM sturdy.pump(100);
    COMMIT;
    EXIT WHEN s = 0;
    done_ := done_ + s;
    IF done_ >= mark THEN
      tenths := tenths || extract(epoch FROM clock_timestamp() - t0) * 1e6 / (total / 10);
      t0 := clock_timestamp();
      mark := mark + total / 10;
    END IF;
  END LOOP;
END $$;
-- the bookkeeping alone: what any pump on these tables must do per delivery
-- (take it with a row lock, mark it done), without calling anybody: 100 per
-- transaction, as pump(100) does, through the same index
CREATE PROCEDURE bench.bookkeeping() LANGUAGE plpgsql AS $$
DECLARE t tid[];
BEGIN
  LOOP
    SELECT array_agg(ctid) INTO t FROM (
      SELECT d.ctid FROM sturdy.deliveries d JOIN sturdy.outbox o ON o.id = d.outbox_id
       WHERE d.state = 'pending' AND d.next_attempt_at <= now()
       ORDER BY d.next_attempt_at, d.id LIMIT 100 FOR UPDATE OF d SKIP LOCKED) x;
    EXIT WHEN t IS NULL;
    UPDATE sturdy.deliveries SET state = 'done', attempts = attempts + 1, delivered_at = now()
     WHERE ctid = ANY (t);
    COMMIT;
  END LOOP;
END $$;
-- a hand-written pump on pg_sturdy's tables
CREATE FUNCTION bench.plpgsql_pump(lim int, subscriber regproc) RETURNS int LANGUAGE plpgsql AS $$
DECLARE d record; n int := 0; msg text; code text;
BEGIN
  FOR d IN SELECT dl.id, dl.attempts + 1 AS attempt, dl.max_attempts, o AS m
             FROM sturdy.deliveries dl JOIN sturdy.outbox o ON o.id = dl.outbox_id
            WHERE dl.state = 'pending' AND dl.next_attempt_at <= now()
            ORDER BY dl.next_attempt_at, dl.id LIMIT lim
              FOR UPDATE OF dl SKIP LOCKED LOOP
    n := n + 1;
    BEGIN
      EXECUTE format('SELECT %s($1, $2)', subscriber) USING d.m, d.attempt;
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT, code = RETURNED_SQLSTATE;
      UPDATE sturdy.deliveries
         SET attempts = d.attempt, last_error = left(msg, 200), last_sqlstate = code,
             state = CASE WHEN d.attempt >= d.max_attempts THEN 'dead' ELSE 'pending' END,
             next_attempt_at = now() + make_interval(secs => 2 ^ d.attempt)
       WHERE id = d.id;
      CONTINUE;
    END;
    UPDATE sturdy.deliveries SET state = 'done', attempts = d.attempt, delivered_at = now() WHERE id = d.id;
  END LOOP;
  RETURN n;
END $$;
"""

# aflib's tables, as its events.py documents them, with the indexes its pump's
# query needs (the same partial index on pending rows pg_sturdy has).
AFLIB_SETUP = """
CREATE EXTENSION plpython3u;
CREATE TABLE bench.aflib_outbox (id bigserial PRIMARY KEY, evento text, payload jsonb, aggregate_id bigint);
CREATE TABLE bench.aflib_delivery (id bigserial PRIMARY KEY, id_outbox bigint, suscriptor text,
  estado text NOT NULL DEFAULT 'pending', attempts int NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT now(), last_error text);
CREATE INDEX ON bench.aflib_delivery (id) WHERE estado = 'pending';
CREATE TABLE bench.aflib_sub (evento text, suscriptor text, activo boolean);
CREATE FUNCTION bench.af_noop(outbox_id bigint, attempt int) RETURNS void LANGUAGE plpgsql AS $$BEGIN END$$;
CREATE FUNCTION bench.af_insert(outbox_id bigint, attempt int) RETURNS void LANGUAGE plpgsql
  AS $$BEGIN INSERT INTO bench.sink VALUES (outbox_id); END$$;
CREATE FUNCTION bench.aflib_pump(lim int) RETURNS int LANGUAGE plpython3u AS $py$
import sys
if %(dir)r not in sys.path:
    sys.path.insert(0, %(dir)r)
from aflib.events import Outbox
from aflib import functions
box = Outbox(plpy, outbox="bench.aflib_outbox", delivery="bench.aflib_delivery",
             subscription="bench.aflib_sub")
def deliver(subscriber, outbox_id, attempt):
    functions.call(plpy, subscriber, [outbox_id, attempt], ["bigint", "integer"])
return box.pump(deliver, lim)["seen"]
$py$;
"""


def cluster(cmd, *extra):
    subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), cmd, os.path.join(DIR, "cluster"), *extra],
                   check=True)


def connect(regime):
    return psycopg.connect(DSN, autocommit=True, options=f"-c synchronous_commit={regime}")


def fill_sturdy(c, sub, n=N):
    c.execute("TRUNCATE sturdy.subscriptions, sturdy.outbox, bench.sink CASCADE")
    c.execute("SELECT sturdy.subscribe('bench', %s::regprocedure)", (f"bench.{sub}(sturdy.outbox, integer)",))
    c.execute("SELECT count(*) FROM generate_series(1, %s) i, LATERAL sturdy.emit('bench', to_jsonb(i))", (n,))
    c.execute("VACUUM ANALYZE sturdy.outbox, sturdy.deliveries")


def fill_aflib(c, sub):
    c.execute("TRUNCATE bench.aflib_outbox, bench.aflib_delivery, bench.aflib_sub, bench.sink")
    c.execute("INSERT INTO bench.aflib_sub VALUES ('bench', %s, true)", (f"bench.af_{sub}",))
    c.execute("INSERT INTO bench.aflib_outbox (evento, payload, aggregate_id)"
              " SELECT 'bench', to_jsonb(i), i FROM generate_series(1, %s) i", (N,))
    c.execute("INSERT INTO bench.aflib_delivery (id_outbox, suscriptor)"
              " SELECT o.id, s.suscriptor FROM bench.aflib_outbox o, bench.aflib_sub s")
    c.execute("VACUUM ANALYZE bench.aflib_outbox, bench.aflib_delivery")


def drain(c, sql):
    """Call `sql` (returning how many it saw) until it sees nothing; seconds."""
    start = time.perf_counter()
    while c.execute(sql).fetchone()[0]:
        pass
    return time.perf_counter() - start


def run_sturdy(c, sub):
    fill_sturdy(c, sub)
    seconds = drain(c, f"SELECT seen FROM sturdy.pump({BATCH})")
    assert c.execute("SELECT count(*) FROM sturdy.deliveries WHERE state = 'done'").fetchone()[0] == N
    return seconds


def run_floor(c, sub):
    fill_sturdy(c, sub)
    first = c.execute("SELECT min(id) FROM sturdy.outbox").fetchone()[0]
    start = time.perf_counter()
    for a in range(first, first + N, BATCH):
        c.execute("CALL bench.floor(%s, %s, %s)", (sub, a, a + BATCH - 1))
    return time.perf_counter() - start


def run_bookkeeping(c, sub):
    fill_sturdy(c, sub)
    start = time.perf_counter()
    c.execute("CALL bench.bookkeeping()")
    seconds = time.perf_counter() - start
    assert c.execute("SELECT count(*) FROM sturdy.deliveries WHERE state = 'done'").fetchone()[0] == N
    return seconds


def run_plpgsql(c, sub):
    fill_sturdy(c, sub)
    seconds = drain(c, f"SELECT bench.plpgsql_pump({BATCH}, 'bench.{sub}')")
    assert c.execute("SELECT count(*) FROM sturdy.deliveries WHERE state = 'done'").fetchone()[0] == N
    return seconds


def run_aflib(c, sub):
    fill_aflib(c, sub)
    seconds = drain(c, f"SELECT bench.aflib_pump({BATCH})")
    assert c.execute("SELECT count(*) FROM bench.aflib_delivery WHERE estado = 'done'").fetchone()[0] == N
    return seconds


def main():
    installed_build.require_release(PG_CONFIG)
    cluster("start", PORT, "shared_buffers = 512MB", "max_wal_size = 4GB")
    try:
        with psycopg.connect(DSN, autocommit=True) as c:
            c.execute(SETUP)
            have_aflib = False
            if not os.path.isfile(os.path.join(AFLIB_DIR, "aflib", "events.py")):
                print(f"aflib not found in {AFLIB_DIR}: its column is skipped", flush=True)
            elif not c.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'plpython3u'").fetchone()[0]:
                print("plpython3u is not installed: aflib's column is skipped", flush=True)
            else:
                c.execute(AFLIB_SETUP % {"dir": AFLIB_DIR})
                have_aflib = True
        sides = [("pg_sturdy pump", run_sturdy), ("floor", run_floor), ("bookkeeping", run_bookkeeping),
                 ("PL/pgSQL pump", run_plpgsql)]
        if have_aflib:
            sides.append(("aflib pump", run_aflib))
        results = {}
        for rep in range(REPS):
            for regime in REGIMES:
                with connect(regime) as c:
                    for sub in ("noop", "insert"):
                        order = sides if rep % 2 == 0 else list(reversed(sides))
                        for name, run in order:
                            us = run(c, sub) / N * 1e6
                            results.setdefault((regime, sub, name), []).append(us)
                            print(f"rep {rep + 1} sync {regime:3} {sub:6} {name:15} {us:8.1f} µs/delivery",
                                  flush=True)
        backlog = {}
        if BACKLOG:
            for regime in REGIMES:
                with connect(regime) as c:
                    fill_sturdy(c, "noop", BACKLOG)
                    (tenths,) = c.execute("CALL bench.drain_tenths(%s)", (BACKLOG,)).fetchone()
                    backlog[regime] = tenths
                    print(f"backlog sync {regime:3} µs/delivery by tenth: "
                          + " ".join(f"{t:.1f}" for t in tenths), flush=True)
        report(results, have_aflib, backlog)
    finally:
        cluster("stop")


def report(results, have_aflib, backlog):
    med = {k: statistics.median(v) for k, v in results.items()}
    lines = [
        f"Outbox: µs per delivery, draining {N:,} deliveries {BATCH} per call (one transaction each), "
        f"median of {REPS}, " + subprocess.run([PG_CONFIG, "--version"], capture_output=True, text=True).stdout.strip(),
        "",
        "| synchronous_commit | subscriber | pg_sturdy pump | floor (direct calls) | pump / floor "
        "| bookkeeping alone | pump / (floor + bookkeeping) "
        "| PL/pgSQL pump | PL/pgSQL / pump | aflib pump | aflib / pump |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for regime in REGIMES:
        for sub in ("noop", "insert"):
            p, f = med[(regime, sub, "pg_sturdy pump")], med[(regime, sub, "floor")]
            b = med[(regime, sub, "bookkeeping")]
            h, a = med[(regime, sub, "PL/pgSQL pump")], med.get((regime, sub, "aflib pump"))
            af = f"{a:.1f} | {a / p:.1f}x" if have_aflib else "skipped | "
            lines.append(f"| {regime} | {sub} | {p:.1f} | {f:.1f} | {p / f:.2f}x | {b:.1f} | {p / (f + b):.2f}x "
                         f"| {h:.1f} | {h / p:.2f}x | {af} |")
    if backlog:
        lines += [
            "",
            f"A backlog of {BACKLOG:,} deliveries emitted at once, drained by pump(100) in a procedure "
            "(COMMIT per call), noop subscriber, µs per delivery:",
            "",
            "| synchronous_commit | first tenth | last tenth | last / first |",
            "|---|---:|---:|---:|",
        ]
        for regime, tenths in backlog.items():
            lines.append(f"| {regime} | {tenths[0]:.1f} | {tenths[-1]:.1f} | {tenths[-1] / tenths[0]:.2f}x |")
    text = "\n".join(lines)
    os.makedirs(DIR, exist_ok=True)
    with open(os.path.join(DIR, "results.md"), "w") as out:
        out.write(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
