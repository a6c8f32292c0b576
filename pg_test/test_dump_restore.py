"""pg_dump and restore: a database with rows in every pg_sturdy table, dumped
and restored into a fresh database, keeps every row, works, and goes on
numbering after the dumped ids.
"""
import os
import subprocess
import tempfile

import psycopg
import pytest

from sturdy import SERVER as CONN, needs

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
SELECT sturdy.limit_queue('dump-q', running => 2, per_second => 50, burst => 5);
SELECT sturdy.pause('paused-q');
SELECT sturdy.schedule('keyed-' || i, now() - interval '1 minute', 'keyed-q', priority => i % 3, key => 'tenant-' || (i % 4))
  FROM generate_series(1, 12) i;
SELECT sturdy.limit_queue('keyed-q', per_key => 1);
SELECT count(*) FROM sturdy.take('keyed-q', max => 2);
-- failing passes: a policy, a row backing off after one failure, a dead one
SELECT sturdy.retry_queue('fail-q', max_attempts => 2, backoff => '1 hour');
SELECT sturdy.schedule('failing', now() - interval '1 minute', 'fail-q');
SELECT sturdy.schedule('dying', now() - interval '2 minutes', 'fail-q');
SELECT sturdy.fail(workflow, receipt, 'first', 'fail-q', code => 'DR002') FROM sturdy.take('fail-q', max => 2);
UPDATE sturdy.queue SET visible_at = now() - interval '1 minute' WHERE workflow = 'dying';
SELECT sturdy.fail(workflow, receipt, 'second', 'fail-q') FROM sturdy.take('fail-q');
SELECT sturdy.sample();
"""

# every table the extension keeps, and the unlogged hints it does not
KEPT = ["claims", "checkpoints", "queue", "subscriptions", "outbox", "deliveries", "instances",
        "idempotency_keys", "batches", "queue_limits", "queue_places", "queue_key_places", "queue_retry", "samples"]


def run(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def dsn(db):
    return f"{CONN} dbname={db}"


def snapshot(db):
    """Every kept table's rows, as text, in a stable order."""
    with psycopg.connect(dsn(db), autocommit=True) as c:
        return {t: c.execute(f"SELECT coalesce(string_agg(r::text, E'\\n' ORDER BY r::text), '') "
                             f"FROM sturdy.{t} r").fetchone()[0] for t in KEPT}


@pytest.fixture(scope="module")
def dumped():
    """The source filled, dumped with pg_dump and restored into the target:
    the tables the source left empty, its largest ids, and every kept
    table's rows in each database."""
    (bindir,) = needs("STURDY_BINDIR")
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
    before = snapshot(SOURCE)
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o777)
        path = os.path.join(tmp, "sturdy.dump")
        conn = dict(kv.split("=", 1) for kv in CONN.split())
        args = ["-h", conn["host"], "-p", conn["port"], "-U", conn["user"]]
        run(os.path.join(bindir, "pg_dump"), *args, "-Fc", "-f", path, SOURCE)
        run(os.path.join(bindir, "pg_restore"), *args, "--exit-on-error", "-d", TARGET, path)
    with psycopg.connect(dsn(TARGET), autocommit=True) as c:
        yield {"empty": empty, "maxima": maxima, "before": before, "after": snapshot(TARGET), "target": c}


def test_every_kept_table_has_rows_before_the_dump(dumped):
    assert not dumped["empty"], f"empty: {dumped['empty']}"


def test_every_row_is_back_as_it_was(dumped):
    differ = [t for t in KEPT if dumped["before"][t] != dumped["after"][t]]
    assert not differ, f"tables that differ: {differ}"


def test_no_duplicate_configuration_rows(dumped):
    dupes = dumped["target"].execute("SELECT count(*) - count(DISTINCT cfg) FROM pg_extension e,"
                                     " unnest(e.extconfig) cfg WHERE e.extname = 'pg_sturdy'").fetchone()[0]
    assert dupes == 0, f"{dupes} duplicates"


def test_ids_go_on_after_the_dumped_ones(dumped):
    c, maxima = dumped["target"], dumped["maxima"]
    outbox = c.execute("SELECT outbox FROM sturdy.emit('order.placed', '\"after\"')").fetchone()[0]
    instance = c.execute("SELECT sturdy.start('ship', 'after')").fetchone()[0]
    delivery = c.execute("SELECT max(id) FROM sturdy.deliveries").fetchone()[0]
    assert outbox > maxima[0] and delivery > maxima[1] and instance > maxima[2], \
        f"new outbox {outbox}, delivery {delivery}, instance {instance} vs dumped {maxima}"


def test_idempotency_keys_are_kept(dumped):
    same = dumped["target"].execute("SELECT sturdy.start('ship', 'order-1', idempotency_key => 'key-1')").fetchone()[0]
    assert same == 1, f"got {same}"


def test_the_extension_works_claim_pump_tick(dumped):
    c = dumped["target"]
    (token,) = c.execute("SELECT sturdy.claim('wf-new')").fetchone()
    seen, delivered, _, _ = c.execute("SELECT * FROM sturdy.pump(100)").fetchone()
    ticked = c.execute("SELECT done FROM sturdy.batch_tick('move')").fetchone()[0]
    assert token == 1 and delivered >= 2 and ticked > 0, f"token {token}, pump {seen}/{delivered}, tick {ticked}"


def test_the_limits_hold_after_the_restore(dumped):
    c = dumped["target"]
    c.execute("SELECT sturdy.schedule('job-' || i, now() - interval '1 minute', 'dump-q') FROM generate_series(1, 10) i")
    c.execute("SELECT sturdy.schedule('p-1', now() - interval '1 minute', 'paused-q')")
    got = c.execute("SELECT count(*) FROM sturdy.take('dump-q', max => 10)").fetchone()[0]
    paused = c.execute("SELECT count(*) FROM sturdy.take('paused-q')").fetchone()[0]
    assert (got, paused) == (2, 0), f"running 2 handed out {got}; the paused queue {paused}"
    # per_key 1 over four keys, two held across the dump: the other two
    # keys' highest-priority rows now, nothing more of the held ones
    keyed = c.execute("SELECT string_agg(q.key || ':' || q.priority, ',' ORDER BY q.key)"
                      " FROM sturdy.take('keyed-q', max => 12) t"
                      " JOIN sturdy.queue q ON q.queue = 'keyed-q' AND q.workflow = t.workflow").fetchone()[0]
    assert keyed == "tenant-0:2,tenant-3:2", f"per_key 1 after the restore handed out {keyed}"


def test_unlogged_wakeup_hints_are_not_restored(dumped):
    stale = dumped["target"].execute("SELECT count(*) FROM sturdy.queue_waiters").fetchone()[0]
    assert stale == 0, f"{stale} rows"


def test_failing_passes_after_the_restore(dumped):
    """The policy, the count and the dead row come back: the failing row
    backs off for its hour, the dead one is never handed out, and the
    failing one dies at the policy's second failure."""
    c = dumped["target"]
    assert c.execute("SELECT failing, dead FROM sturdy.queue_stats WHERE queue = 'fail-q'").fetchone() == (1, 1)
    assert c.execute("SELECT count(*) FROM sturdy.take('fail-q')").fetchone() == (0,)
    c.execute("UPDATE sturdy.queue SET visible_at = now() - interval '1 second' WHERE workflow = 'failing'")
    w, r, attempt = c.execute("SELECT workflow, receipt, attempt FROM sturdy.take('fail-q')").fetchone()
    assert (w, attempt) == ("failing", 2)
    c.execute("SELECT sturdy.fail(%s, %s, 'again', 'fail-q')", (w, r))
    assert c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'fail-q' AND visible_at = 'infinity'"
                     ).fetchone() == (2,)
