#!/usr/bin/env python3
"""pg_dump and restore: a database with rows in every pg_sturdy table, dumped
and restored into a fresh database, keeps every row, works, and goes on
numbering after the dumped ids. Run by scripts/suites.sh:

  pg_test/dump_restore.py BINDIR "host=... port=... user=..."

Prints 'ok' or 'FAIL' lines like concurrency.py, and a closing count.
"""
import os
import subprocess
import sys
import tempfile

import psycopg

BINDIR, CONN = sys.argv[1], sys.argv[2]
SOURCE, TARGET = "sturdy_dump_source", "sturdy_dump_target"

FILL = """
CREATE FUNCTION public.on_event(m sturdy.outbox, attempt int) RETURNS void LANGUAGE sql AS 'SELECT';
CREATE FUNCTION public.always_fails(m sturdy.outbox, attempt int) RETURNS void LANGUAGE plpgsql
  AS $$BEGIN RAISE EXCEPTION 'down' USING ERRCODE = 'DR001'; END$$;
CREATE TABLE public.backlog (id int PRIMARY KEY, moved boolean NOT NULL DEFAULT false);
INSERT INTO public.backlog SELECT i FROM generate_series(1, 3000) i;

SELECT sturdy.claim('wf-' || i) FROM generate_series(1, 20) i;
SELECT sturdy.record('wf-' || i, 'step', to_jsonb(i), 1) FROM generate_series(1, 20) i;
SELECT sturdy.supply('wf-1', 'approval', '"yes"');
SELECT sturdy.schedule('job-' || i, now() + interval '1 hour', 'dump-q') FROM generate_series(1, 10) i;
SELECT count(*) FROM sturdy.take('empty-q');
SELECT sturdy.subscribe('order.placed', 'public.on_event(sturdy.outbox, integer)');
SELECT sturdy.subscribe('order.placed', 'public.always_fails(sturdy.outbox, integer)', 1);
SELECT sturdy.emit('order.placed', to_jsonb(i), 'agg-' || (i % 3)) FROM generate_series(1, 12) i;
SELECT * FROM sturdy.pump(100);
SELECT sturdy.emit('order.placed', '"later"');
SELECT sturdy.start('ship', 'order-' || i, '{"n": 1}', idempotency_key => 'key-' || i) FROM generate_series(1, 5) i;
SELECT sturdy.transition(1, 'pending', 'running');
SELECT sturdy.batch_start('move', 'public.backlog', 'moved = true', 'NOT moved', chunk => 1000);
SELECT * FROM sturdy.batch_tick('move');
SELECT * FROM sturdy.batch('public.backlog', 'moved = true', 'NOT moved', chunk => 500);
"""

# every table the extension keeps, and the unlogged hints it does not
KEPT = ["claims", "checkpoints", "queue", "subscriptions", "outbox", "deliveries", "instances",
        "idempotency_keys", "batches"]


def run(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def dsn(db):
    return f"{CONN} dbname={db}"


def snapshot(db):
    """Every kept table's rows, as text, in a stable order."""
    with psycopg.connect(dsn(db), autocommit=True) as c:
        return {t: c.execute(f"SELECT coalesce(string_agg(r::text, E'\\n' ORDER BY r::text), '') "
                             f"FROM sturdy.{t} r").fetchone()[0] for t in KEPT}


def main():
    results = []

    def check(name, ok, why=""):
        results.append(ok)
        print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {why}"), flush=True)

    with psycopg.connect(dsn("postgres"), autocommit=True) as c:
        for db in (SOURCE, TARGET):
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        c.execute(f"CREATE DATABASE {SOURCE}")
        c.execute(f"CREATE DATABASE {TARGET}")
    with psycopg.connect(dsn(SOURCE), autocommit=True) as c:
        c.execute("CREATE EXTENSION pg_sturdy")
        c.execute(FILL)
        empty = [t for t in KEPT if c.execute(f"SELECT count(*) FROM sturdy.{t}").fetchone()[0] == 0]
        maxima = c.execute("SELECT (SELECT max(id) FROM sturdy.outbox), (SELECT max(id) FROM sturdy.deliveries),"
                           " (SELECT max(id) FROM sturdy.instances)").fetchone()
    check("every kept table has rows before the dump", not empty, f"empty: {empty}")
    before = snapshot(SOURCE)

    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o777)
        path = os.path.join(tmp, "sturdy.dump")
        conn = dict(kv.split("=", 1) for kv in CONN.split())
        args = ["-h", conn["host"], "-p", conn["port"], "-U", conn["user"]]
        run(os.path.join(BINDIR, "pg_dump"), *args, "-Fc", "-f", path, SOURCE)
        run(os.path.join(BINDIR, "pg_restore"), *args, "--exit-on-error", "-d", TARGET, path)

    after = snapshot(TARGET)
    differ = [t for t in KEPT if before[t] != after[t]]
    check("every row is back, as it was", not differ, f"tables that differ: {differ}")
    with psycopg.connect(dsn(TARGET), autocommit=True) as c:
        dupes = c.execute("SELECT count(*) - count(DISTINCT cfg) FROM pg_extension e, unnest(e.extconfig) cfg"
                          " WHERE e.extname = 'pg_sturdy'").fetchone()[0]
        check("no duplicate configuration rows", dupes == 0, f"{dupes} duplicates")
        outbox = c.execute("SELECT outbox FROM sturdy.emit('order.placed', '\"after\"')").fetchone()[0]
        instance = c.execute("SELECT sturdy.start('ship', 'after')").fetchone()[0]
        delivery = c.execute("SELECT max(id) FROM sturdy.deliveries").fetchone()[0]
        check("ids go on after the dumped ones",
              outbox > maxima[0] and delivery > maxima[1] and instance > maxima[2],
              f"new outbox {outbox}, delivery {delivery}, instance {instance} vs dumped {maxima}")
        same = c.execute("SELECT sturdy.start('ship', 'order-1', idempotency_key => 'key-1')").fetchone()[0]
        check("idempotency keys are kept", same == 1, f"got {same}")
        (token,) = c.execute("SELECT sturdy.claim('wf-new')").fetchone()
        seen, delivered, _, _ = c.execute("SELECT * FROM sturdy.pump(100)").fetchone()
        ticked = c.execute("SELECT done FROM sturdy.batch_tick('move')").fetchone()[0]
        check("the extension works: claim, pump, tick", token == 1 and delivered >= 2 and ticked > 0,
              f"token {token}, pump {seen}/{delivered}, tick {ticked}")
        stale = c.execute("SELECT count(*) FROM sturdy.queue_waiters").fetchone()[0]
        check("unlogged wakeup hints are not restored", stale == 0, f"{stale} rows")
    print(f"dump_restore: {sum(results)} passed, {len(results) - sum(results)} failed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
