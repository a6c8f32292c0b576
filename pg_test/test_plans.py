"""The plans a backend keeps for its whole life are made for the table as it
is when they are first run: a worker that took from a queue while it was
small keeps taking from it once it has grown. The statements a batch take
and its `done_many` run reach their rows by key or tuple id, never by
reading the whole queue, however small the queue was when their plans were
made. Counted with the transaction's own table statistics
(`pg_stat_xact_user_tables`), in a database of its own so the queue starts
empty."""
import uuid

import psycopg
import pytest

from sturdy import SERVER

DB = f"sturdy_plans_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def dsn():
    if not SERVER:
        pytest.skip("STURDY_SERVER not set: run through scripts/suites.sh")
    with psycopg.connect(f"{SERVER} dbname=postgres", autocommit=True) as c:
        c.execute(f"CREATE DATABASE {DB}")
    try:
        with psycopg.connect(f"{SERVER} dbname={DB}", autocommit=True) as c:
            c.execute("CREATE EXTENSION pg_sturdy")
        yield f"{SERVER} dbname={DB}"
    finally:
        with psycopg.connect(f"{SERVER} dbname=postgres", autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


def read_by_scans(c, sql, params=()):
    """Run `sql` in a transaction of its own; the queue's rows it read by
    sequential scans, and its result."""
    with c.transaction():
        result = c.execute(sql, params).fetchall()
        (seq,) = c.execute("SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_xact_user_tables"
                           " WHERE relid = 'sturdy.queue'::regclass").fetchone()
    return seq, result


def test_a_worker_that_first_took_from_a_small_queue_takes_without_reading_it_whole(dsn):
    with psycopg.connect(dsn, autocommit=True) as worker, psycopg.connect(dsn, autocommit=True) as producer:
        producer.execute("SELECT sturdy.schedule_many(ARRAY['a', 'b', 'c'], NULL, 'jobs')")
        # the worker's first batch: its kept plans are made on a queue of three rows
        seq, taken = read_by_scans(worker, "SELECT workflow, receipt FROM sturdy.take('jobs', '1 minute', 2)")
        assert len(taken) == 2
        for part in range(4):
            producer.execute("SELECT sturdy.schedule_many(array_agg('w' || g), NULL, 'jobs')"
                             " FROM generate_series(%s::int, %s::int) g", (part * 5000, part * 5000 + 4999))
        seq, taken = read_by_scans(worker, "SELECT workflow, receipt FROM sturdy.take('jobs', '1 minute', 16)")
        assert len(taken) == 16
        assert seq == 0, f"a take of 16 read {seq} rows of the queue by sequential scans"
        seq, done = read_by_scans(worker, "SELECT sturdy.done_many(%s::text[], %s::timestamptz[], 'jobs')",
                                  ([w for w, _ in taken], [r for _, r in taken]))
        assert done == [(16,)]
        assert seq == 0, f"done_many of 16 read {seq} rows of the queue by sequential scans"


def test_the_callers_own_planner_settings_are_left_as_they_were(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT sturdy.schedule_many(ARRAY['x', 'y'], NULL, 'settings')")
        for setting in ("on", "off"):
            c.execute(f"SET enable_seqscan = {setting}")
            c.execute("SELECT * FROM sturdy.take('settings', '1 minute', 2)")
            assert c.execute("SHOW enable_seqscan").fetchone()[0] == setting
