"""Several connections taking and finishing the same queue: no row shared,
no done kept waiting, no take fooled by locks, dead entries or rows
rewritten under it, and racing schedules of one key."""
import random
import threading
import time

import psycopg

from sturdy import Worker, connect, start_and_join


def test_eight_workers_drain_ten_thousand_exactly_once():
    """8 workers take 1 to 10 at a time until the queue is empty: every
    workflow is taken exactly once, every done succeeds, nothing is left."""
    total, workers = 10_000, 8
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'drain'")
        c.execute(
            "SELECT sturdy.schedule('job-' || i, now() - interval '1 minute', 'drain')"
            " FROM generate_series(1, %s) i",
            (total,),
        )
    taken, failures, lock = [], [], threading.Lock()

    def worker(seed):
        rng = random.Random(seed)
        with connect() as c:
            while True:
                rows = c.execute(
                    "SELECT workflow, receipt FROM sturdy.take('drain', '5 minutes', %s)", (rng.randint(1, 10),)
                ).fetchall()
                if not rows:
                    return
                for workflow, receipt in rows:
                    (ok,) = c.execute("SELECT sturdy.done(%s, %s, 'drain')", (workflow, receipt)).fetchone()
                    if not ok:
                        with lock:
                            failures.append(workflow)
                with lock:
                    taken.extend(w for w, _ in rows)

    threads = [Worker(target=worker, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with connect() as c:
        (left,) = c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'drain'").fetchone()
    assert not failures, f"done refused {len(failures)} rows"
    assert len(taken) == total, f"took {len(taken)} rows, expected {total}"
    assert len(set(taken)) == total, f"{len(taken) - len(set(taken))} rows were handed out twice"
    assert left == 0, f"{left} rows left in the queue"


def test_takers_never_share_a_row_while_leases_are_live():
    """Workers that take and hold (no done) never see the same row twice."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'hold'")
        c.execute("SELECT sturdy.schedule('h-' || i, now() - interval '1 s', 'hold') FROM generate_series(1, 2000) i")
    seen, lock = [], threading.Lock()

    def worker():
        with connect() as c:
            while rows := c.execute("SELECT workflow FROM sturdy.take('hold', '10 minutes', 7)").fetchall():
                with lock:
                    seen.extend(r[0] for r in rows)

    threads = [Worker(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 2000 and len(set(seen)) == 2000, f"{len(seen)} taken, {len(set(seen))} distinct"


def test_a_done_never_waits_for_a_taker_that_passed_its_row():
    """Eight workers take one row and done it, over and over, while a ninth
    connection watches pg_locks. A take whose snapshot is older than another
    taker's lease sees that row still ready; locking it just to find it
    leased would keep the lock to the take's commit, and the row's own `done`
    would wait for it (measured before the change: hundreds of waits in this
    test). So no `done` here ever waits on another transaction."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'pass'")
        c.execute(
            "SELECT sturdy.schedule('p-' || i, now() - interval '1 s', 'pass') FROM generate_series(1, 20000) i"
        )
    # until 3,000 cycles ran (about a second here), whatever the machine's pace
    wanted, deadline = 3000, time.monotonic() + 120
    waits, cycles, timeouts, lock = [], [0], [], threading.Lock()

    def going():
        return cycles[0] < wanted and time.monotonic() < deadline

    def worker():
        with connect() as c:
            # any wait for a lock ends the call at once, and is counted: the
            # monitor below samples, this misses none
            c.execute("SET lock_timeout = '1ms'")
            while going():
                try:
                    taken = c.execute("SELECT workflow, receipt FROM sturdy.take('pass')").fetchall()
                except psycopg.errors.LockNotAvailable as e:
                    with lock:
                        timeouts.append(("take", e.diag.context))
                    continue
                for workflow, receipt in taken:
                    try:
                        c.execute("SELECT sturdy.done(%s, %s, 'pass')", (workflow, receipt))
                    except psycopg.errors.LockNotAvailable as e:
                        with lock:
                            timeouts.append(("done", e.diag.context))
                        continue
                    with lock:
                        cycles[0] += 1

    def monitor():
        with connect() as c:
            while going():
                waits.extend(c.execute(
                    "SELECT a.query FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                    " WHERE NOT l.granted AND l.locktype = 'transactionid'"
                    " AND a.datname = current_database()").fetchall())

    start_and_join([Worker(target=worker) for _ in range(8)] + [Worker(target=monitor)])
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'pass'")
    assert cycles[0] >= wanted, f"only {cycles[0]} take + done cycles ran in two minutes"
    assert not waits, f"{len(waits)} waits on a transaction seen, e.g. {waits[0][0]!r}"
    assert not timeouts, f"{len(timeouts)} calls waited for a lock (55P03 at lock_timeout = 1ms), e.g. {timeouts[:3]}"


def test_a_take_of_a_queue_with_nothing_due_locks_nothing_of_the_next_queue():
    """A take walks its queue's index entries in order and stops at the
    first that is not due or not of its queue (the index checks only where to
    start). Queue 'stop-a' holds one row, leased; 'stop-b', right after it in
    the index, a ready one. A take of 'stop-a' left open walks past the
    leased row and must stop there, not lock the next queue's row: a take of
    'stop-b' from another connection gets it."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue IN ('stop-a', 'stop-b')")
        c.execute("SELECT sturdy.schedule('a1', now() - interval '1 minute', 'stop-a')")
        c.execute("SELECT sturdy.schedule('b1', now() - interval '1 minute', 'stop-b')")
        assert c.execute("SELECT workflow FROM sturdy.take('stop-a', '1 hour')").fetchall() == [("a1",)]
    with connect(autocommit=False) as a, connect() as b:
        assert a.execute("SELECT count(*) FROM sturdy.take('stop-a')").fetchone()[0] == 0
        got = b.execute("SELECT workflow FROM sturdy.take('stop-b')").fetchall()
        a.rollback()
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue IN ('stop-a', 'stop-b')")
    assert got == [("b1",)], f"the other queue's take got {got} while the empty take was open"


def test_a_take_skips_more_rows_locked_by_others_than_its_window():
    """A one-row take reads its queue's entries a window at a time (16) and
    goes on after the last when that closes before a row is leased. Another
    transaction holds the first 20 of 25 ready rows (its take left open): a
    take from a fresh connection skips them all and gets the 21st."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'window'")
        c.execute(
            "SELECT sturdy.schedule(format('w-%s', lpad(i::text, 2, '0')),"
            " now() - interval '1 minute' + i * interval '1 millisecond', 'window')"
            " FROM generate_series(1, 25) i"
        )
    with connect(autocommit=False) as a, connect() as b:
        held = a.execute("SELECT workflow FROM sturdy.take('window', max => 20) ORDER BY 1").fetchall()
        got = b.execute("SELECT workflow FROM sturdy.take('window')").fetchall()
        a.rollback()
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'window'")
    assert held == [(f"w-{i:02}",) for i in range(1, 21)], f"the open take holds {held}"
    assert got == [("w-21",)], f"the take past the 20 locked rows got {got}"


def test_a_take_from_the_start_gets_past_pages_of_dead_entries():
    """A take's window counts the high key of every leaf page its scan reads
    (see the test above), and a page whose entries are all marked dead has
    nothing else: 10,000 rows done (their entries marked dead by an index
    scan that found them gone) are over 50 such pages, so the window closes
    before the scan hands back any entry. A take from the start (a fresh
    connection) must go on past them to the one ready row after."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'dead-head'")
        c.execute(
            "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)"
            " SELECT 'dead-head', 'gone-' || i, now() - interval '1 hour', now() FROM generate_series(1, 10000) i"
        )
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'dead-head'")
    with connect() as c:
        # an index scan that meets the deleted rows marks their entries dead
        c.execute("SET enable_seqscan = off")
        c.execute("SET enable_bitmapscan = off")
        for _ in range(2):
            c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'dead-head' AND visible_at <= now()")
        c.execute("SELECT sturdy.schedule('ready', now() - interval '1 minute', 'dead-head')")
    with connect() as c:
        got = c.execute("SELECT workflow FROM sturdy.take('dead-head')").fetchall()
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'dead-head'")
    assert got == [("ready",)], f"the take from the start got {got}"


def test_a_done_after_its_take_honours_what_others_did_between():
    """A done of the row its connection's last take leased goes straight to
    the version the take wrote (no look through the primary key). What other
    connections commit between the take and the done still decides: a
    reschedule keeps the row (its receipt no longer matches), and after a
    VACUUM FULL moved every row the done removes its own row by key and no
    other."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'between'")
        c.execute(
            "SELECT sturdy.schedule('b-' || i, now() - interval '1 minute' + i * interval '1 millisecond', 'between')"
            " FROM generate_series(1, 30) i"
        )
    with connect() as w, connect() as other:
        workflow, receipt = w.execute("SELECT workflow, receipt FROM sturdy.take('between')").fetchone()
        other.execute("SELECT sturdy.schedule(%s, now(), 'between')", (workflow,))
        (rescheduled,) = w.execute("SELECT sturdy.done(%s, %s, 'between')", (workflow, receipt)).fetchone()
        (kept,) = other.execute(
            "SELECT count(*) FROM sturdy.queue WHERE queue = 'between' AND workflow = %s", (workflow,)
        ).fetchone()
        workflow, receipt = w.execute("SELECT workflow, receipt FROM sturdy.take('between')").fetchone()
        other.execute("DELETE FROM sturdy.queue WHERE queue = 'between' AND workflow IN ('b-1', 'b-3')")
        other.execute("VACUUM FULL sturdy.queue")
        (moved,) = w.execute("SELECT sturdy.done(%s, %s, 'between')", (workflow, receipt)).fetchone()
        left = [r for (r,) in other.execute(
            "SELECT workflow FROM sturdy.queue WHERE queue = 'between' ORDER BY workflow")]
        other.execute("DELETE FROM sturdy.queue WHERE queue = 'between'")
    assert (rescheduled, kept) == (False, 1), f"a done after a reschedule: {rescheduled}, rows kept {kept}"
    assert moved, "the done after VACUUM FULL removed nothing"
    assert workflow not in left and len(left) == 30 - 1 - 2, f"after VACUUM FULL the queue holds {left}"


def test_a_done_after_a_vacuum_cut_off_its_rows_page_answers_false():
    """The version a take leased on the table's last page, deleted by
    another connection and its page cut off by VACUUM (TRUNCATE) before the done: the
    done looks for it no further than the table's end (reading past it is an
    error) and answers false."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'cut-off'")
        c.execute("VACUUM sturdy.queue")
        # past the free space VACUUM left: the last rows written extend the
        # table, and the last of them is the oldest, the one a take leases
        size = "SELECT pg_relation_size('sturdy.queue') / current_setting('block_size')::bigint"
        (start,) = c.execute(size).fetchone()
        grown, n = start, 0
        while grown < start + 10:
            c.execute(
                "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)"
                " SELECT 'cut-off', 'c-' || i, now() - i * interval '1 millisecond', now()"
                " FROM generate_series(%s, %s + 19999) i",
                (n + 1, n + 1),
            )
            n += 20000
            (grown,) = c.execute(size).fetchone()
    with connect() as w, connect() as other:
        workflow, receipt = w.execute("SELECT workflow, receipt FROM sturdy.take('cut-off')").fetchone()
        (block,) = other.execute(
            "SELECT (ctid::text::point)[0]::bigint FROM sturdy.queue WHERE queue = 'cut-off' AND workflow = %s",
            (workflow,),
        ).fetchone()
        other.execute("DELETE FROM sturdy.queue WHERE queue = 'cut-off'")
        # the table keeps its empty pages unless a vacuum is told otherwise
        other.execute("VACUUM (TRUNCATE) sturdy.queue")
        (pages,) = other.execute(
            "SELECT pg_relation_size('sturdy.queue') / current_setting('block_size')::bigint"
        ).fetchone()
        (removed,) = w.execute("SELECT sturdy.done(%s, %s, 'cut-off')", (workflow, receipt)).fetchone()
    assert workflow == f"c-{n}", f"the take leased {workflow}, not the last row written (c-{n})"
    assert pages <= block, f"VACUUM left {pages} pages: the leased version's page {block} is still there"
    assert removed is False, f"a done of a row deleted and cut off answered {removed}"


def test_a_vacuum_leaves_every_table_its_empty_pages():
    """A vacuum that cuts empty pages off a table's end holds an ACCESS
    EXCLUSIVE lock while it does, and every take and done of the table waits
    behind it (seen here as a done cancelled at lock_timeout = 1ms). Every
    table of the schema is made to keep them: a queue emptied at its end and
    vacuumed keeps its size, and only VACUUM (TRUNCATE) gives the pages back."""
    with connect() as c:
        (unset,) = c.execute(
            "SELECT array_agg(relname ORDER BY relname) FROM pg_class"
            " WHERE relnamespace = 'sturdy'::regnamespace AND relkind IN ('r', 'p')"
            " AND NOT coalesce('vacuum_truncate=false' = ANY (reloptions), false)"
        ).fetchone()
        assert unset is None, f"tables a vacuum may truncate: {unset}"
        size = "SELECT pg_relation_size('sturdy.queue') / current_setting('block_size')::bigint"
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'tail'")
        c.execute("VACUUM sturdy.queue")
        (start,) = c.execute(size).fetchone()
        # past the free space: rows enough to add pages at the table's end
        grown, n = start, 0
        while grown < start + 20:
            c.execute(
                "SELECT sturdy.schedule('t-' || i, now() + interval '1 day', 'tail')"
                " FROM generate_series(%s, %s + 4999) i",
                (n, n),
            )
            n += 5000
            (grown,) = c.execute(size).fetchone()
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'tail'")
        c.execute("VACUUM sturdy.queue")
        (kept,) = c.execute(size).fetchone()
        c.execute("VACUUM (TRUNCATE) sturdy.queue")
        (cut,) = c.execute(size).fetchone()
    assert kept == grown, f"VACUUM cut the queue from {grown} pages to {kept}"
    assert cut < grown, f"VACUUM (TRUNCATE) left the queue at {cut} pages of {grown}"


def test_a_take_never_comes_back_empty_holding_a_ready_row():
    """Two rows rescheduled (past-dated, so always ready) in a tight loop by
    two sessions while a third takes, one row or a batch, with and without
    claim, each take its own transaction: a take that returns nothing never
    holds the lock on a row that is ready. The take that locks a version
    committed after its statement began must still lease it (or another):
    before take_from ran again for such rows, 354 of 5,000 takes came back
    empty holding it."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'rescheduled'")
        c.execute("DROP SCHEMA IF EXISTS take_race CASCADE")
        c.execute("CREATE SCHEMA take_race")
        c.execute("CREATE TABLE take_race.stop ()")
        c.execute("SELECT sturdy.schedule(w, '2000-01-01', 'rescheduled') FROM unnest(array['hot-a', 'hot-b']) w")
        c.execute("""
            CREATE PROCEDURE take_race.churn(w text) LANGUAGE plpgsql AS $$
            BEGIN
              WHILE NOT EXISTS (SELECT FROM take_race.stop) LOOP
                PERFORM sturdy.schedule(w, '2000-01-01', 'rescheduled');
                COMMIT;
              END LOOP;
            END $$""")
        c.execute("""
            CREATE PROCEDURE take_race.takes(max int, claim boolean, n int, INOUT taken int, INOUT bad int)
            LANGUAGE plpgsql AS $$
            DECLARE got int; r record;
            BEGIN
              taken := 0; bad := 0;
              FOR i IN 1..n LOOP
                got := 0;
                -- each pass ended at once: a wakeup keeps a pass's lease, and
                -- the pass's done (false: woken) leaves the row ready again
                FOR r IN SELECT * FROM sturdy.take('rescheduled', '1 minute', max, claim) LOOP
                  got := got + 1;
                  PERFORM sturdy.done(r.workflow, r.receipt, 'rescheduled');
                END LOOP;
                taken := taken + got;
                IF got = 0 AND EXISTS (
                    SELECT FROM sturdy.queue
                     WHERE queue = 'rescheduled' AND visible_at <= now()
                       AND (leased_until IS NULL OR leased_until <= now())
                       AND xmax::text = (pg_current_xact_id_if_assigned()::text::bigint % 4294967296)::text) THEN
                  bad := bad + 1;
                END IF;
                COMMIT;
              END LOOP;
            END $$""")
    errors = []

    def churn(w):
        try:
            with connect() as c:
                c.execute("CALL take_race.churn(%s)", (w,))
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [Worker(target=churn, args=(w,)) for w in ("hot-a", "hot-b")]
    for t in threads:
        t.start()
    results = {}
    try:
        with connect() as c:
            for max_, claim in ((1, False), (1, True), (2, False), (2, True)):
                results[(max_, claim)] = c.execute(
                    "CALL take_race.takes(%s, %s, 2000, 0, 0)", (max_, claim)).fetchone()
    finally:
        with connect() as c:
            c.execute("INSERT INTO take_race.stop DEFAULT VALUES")
        for t in threads:
            t.join()
        with connect() as c:
            c.execute("DROP SCHEMA take_race CASCADE")
            c.execute("DELETE FROM sturdy.queue WHERE queue = 'rescheduled'")
            c.execute("DELETE FROM sturdy.claims WHERE workflow IN ('hot-a', 'hot-b')")
    assert not errors, errors
    # the rows were ready nearly always: most takes got one
    assert all(taken > 0 for taken, _ in results.values()), results
    assert all(bad == 0 for _, bad in results.values()), results


def test_racing_schedules_of_one_new_key_make_one_row_and_never_fail():
    """Three sessions schedule the same six keys in a loop while a fourth
    deletes them, each call its own transaction, so that most schedules find
    no row and insert one, often two at once: schedule's upsert (without a
    statement, access/insert.rs) takes the speculative insert of the loser back and
    updates the winner's row, as ON CONFLICT does. No schedule fails (no
    duplicate key, no serialization error read committed), and the queue
    never holds a key twice."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'upsert_race'")
        c.execute("DROP SCHEMA IF EXISTS upsert_race CASCADE")
        c.execute("CREATE SCHEMA upsert_race")
        c.execute("CREATE TABLE upsert_race.stop ()")
        c.execute("""
            CREATE PROCEDURE upsert_race.schedules(n int) LANGUAGE plpgsql AS $$
            BEGIN
              FOR i IN 1..n LOOP
                PERFORM sturdy.schedule('k' || (i % 6), now(), 'upsert_race');
                COMMIT;
              END LOOP;
            END $$""")
        c.execute("""
            CREATE PROCEDURE upsert_race.clear() LANGUAGE plpgsql AS $$
            BEGIN
              WHILE NOT EXISTS (SELECT FROM upsert_race.stop) LOOP
                DELETE FROM sturdy.queue WHERE queue = 'upsert_race';
                COMMIT;
              END LOOP;
            END $$""")
        first = c.execute("SELECT last_value FROM sturdy.queue_seq").fetchone()[0]
    errors = []

    def run(sql):
        try:
            with connect() as c:
                c.execute(sql)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    clearer = Worker(target=run, args=("CALL upsert_race.clear()",))
    clearer.start()
    start_and_join([Worker(target=run, args=("CALL upsert_race.schedules(3000)",))
                    for _ in range(3)])
    with connect() as c:
        c.execute("INSERT INTO upsert_race.stop DEFAULT VALUES")
    clearer.join()
    with connect() as c:
        inserted = c.execute("SELECT last_value FROM sturdy.queue_seq").fetchone()[0] - first
        keys = c.execute("SELECT count(*), count(DISTINCT workflow) FROM sturdy.queue"
                         " WHERE queue = 'upsert_race'").fetchone()
        c.execute("DROP SCHEMA upsert_race CASCADE")
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'upsert_race'")
    assert not errors, errors
    assert keys[0] == keys[1] <= 6, keys
    # the deletes kept the keys new: many schedules inserted (a sequence
    # value each, taken back or not)
    assert inserted > 500, inserted


def test_a_schedule_inserting_first_waits_for_the_key_another_is_inserting():
    """Among new keys a backend's schedule inserts before it looks (at most
    four of its last 32 upserts found a row: access/insert.rs, FOUND_AT_MOST; a new
    connection starts looking first, so 30 new keys come first). Where another
    transaction is inserting the same key, the primary key's check reports
    the conflict without waiting; the schedule then takes its row back and
    looks, which waits for the other to end, as ON CONFLICT does: it updates
    the committed row, or, the other rolled back, inserts its own. Never a
    second row, never an error."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'blind'")
    for outcome in ("COMMIT", "ROLLBACK"):
        with connect() as a, connect(autocommit=False) as b:
            pid = a.execute("SELECT pg_backend_pid()").fetchone()[0]
            for i in range(30):
                a.execute("SELECT sturdy.schedule(%s, now(), 'blind')", (f"run-{outcome}-{i}",))
            key = f"raced-{outcome}"
            b.execute("SELECT sturdy.schedule(%s, now() + interval '1 hour', 'blind')", (key,))
            errors = []

            def schedule():
                try:
                    a.execute("SELECT sturdy.schedule(%s, now() + interval '2 hours', 'blind')", (key,))
                except Exception as e:  # reported by the main thread
                    errors.append(e)

            t = Worker(target=schedule)
            t.start()
            waited = False
            with connect() as watch:
                for _ in range(100):
                    waited = watch.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                                           (pid,)).fetchone()[0]
                    if waited:
                        break
                    time.sleep(0.02)
            b.execute(outcome)
            t.join()
            assert not errors, errors
            assert waited, f"{outcome}: the schedule did not wait for the other's insert"
            with connect() as c:
                rows = c.execute("SELECT count(*), min(visible_at - now()) > interval '90 minutes'"
                                 " FROM sturdy.queue WHERE queue = 'blind' AND workflow = %s", (key,)).fetchone()
            assert rows == (1, True), f"{outcome}: {rows} (one row, at two hours)"
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'blind'")
