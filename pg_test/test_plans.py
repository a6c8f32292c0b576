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


SEQ_READ = ("SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_xact_user_tables"
            " WHERE relid = 'sturdy.queue'::regclass")
INDEX_READ = ("SELECT coalesce(sum(pg_catalog.pg_stat_get_xact_tuples_returned(indexrelid)), 0)"
              " FROM pg_catalog.pg_index WHERE indrelid = 'sturdy.queue'::regclass")


def counted(c, counter, sql, params=()):
    """Run `sql` in a transaction of its own; what it added to `counter` (a
    backend's counts since it last reported them, so read before and after
    within the transaction), and its result."""
    with c.transaction():
        (before,) = c.execute(counter).fetchone()
        result = c.execute(sql, params).fetchall()
        (after,) = c.execute(counter).fetchone()
    return after - before, result


def read_by_scans(c, sql, params=()):
    """The queue's rows `sql` read by sequential scans, and its result."""
    return counted(c, SEQ_READ, sql, params)


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


def index_entries_read(c, sql, params=()):
    """The entries of the queue's indexes `sql` read (dead ones included),
    and its result."""
    return counted(c, INDEX_READ, sql, params)


@pytest.mark.parametrize("others", ["other queues live", "no row live"])
def test_acknowledgements_planned_after_analyze_saw_only_dead_rows_go_straight_to_their_rows(dsn, others):
    """An old snapshot keeps every row version a queue's jobs left; ANALYZE
    then finds none of them live (and the table empty, or the queue a
    sliver of it), and the plans made after it (a new worker's, or every
    worker's, since ANALYZE invalidates kept plans) must still reach each
    acknowledged row by its tuple id or its key: a plan that read the
    queue's index by queue name walked every dead entry, each call (the
    stall under the harness's idle-in-transaction phase)."""
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'dead'")  # the other case's
        if others == "no row live":
            c.execute("DELETE FROM sturdy.queue")
        else:
            c.execute("SELECT sturdy.schedule_many(array_agg('o' || g), NULL, 'others')"
                      " FROM generate_series(1, 3000) g")
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM sturdy.queue")  # the snapshot, held until the end
        c.execute("SELECT sturdy.schedule_many(array_agg('d' || g), NULL, 'dead') FROM generate_series(1, 6000) g")
        for _ in range(12):
            c.execute("SELECT sturdy.done_many(array_agg(workflow), array_agg(receipt), 'dead')"
                      " FROM sturdy.take('dead', '1 minute', 500)")
        c.execute("ANALYZE sturdy.queue")
        assert c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'dead'").fetchone() == (0,)
        with psycopg.connect(dsn, autocommit=True) as worker, psycopg.connect(dsn, autocommit=True) as other:
            for batch in range(3):
                c.execute("SELECT sturdy.schedule_many(%s::text[], NULL, 'dead')",
                          ([f"{w}{batch}" for w in "abcde"],))
                taken = worker.execute("SELECT workflow, receipt FROM sturdy.take('dead', '1 minute', 2)").fetchall()
                assert len(taken) == 2
                pairs = ([w for w, _ in taken], [r for _, r in taken])
                # the worker's own batch: by the tuple ids its take kept
                read, done = index_entries_read(
                    worker, "SELECT sturdy.done_many(%s::text[], %s::timestamptz[], 'dead')", pairs)
                assert done == [(2,)]
                assert read <= 4, f"done_many of the worker's own 2 rows read {read} index entries"
                # another session's: by key
                taken = worker.execute("SELECT workflow, receipt FROM sturdy.take('dead', '1 minute', 2)").fetchall()
                pairs = ([w for w, _ in taken], [r for _, r in taken])
                read, done = index_entries_read(
                    other, "SELECT sturdy.done_many(%s::text[], %s::timestamptz[], 'dead')", pairs)
                assert done == [(2,)]
                assert read <= 4, f"done_many of 2 rows by key read {read} index entries"
                (w, r), = worker.execute("SELECT workflow, receipt FROM sturdy.take('dead', '1 minute', 1)").fetchall()
                read, done = index_entries_read(other, "SELECT sturdy.done(%s, %s, 'dead')", (w, r))
                assert done == [(True,)]
                assert read <= 4, f"done of 1 row read {read} index entries"
