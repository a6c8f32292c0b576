#!/usr/bin/env python3
"""Multi-connection tests of the queue, from outside the server.

Each test uses several real connections (psycopg, autocommit unless it says
otherwise) against a database where pg_sturdy is installed. Run by
scripts/suites.sh:  pg_test/concurrency.py "host=... port=... dbname=..."
Prints one line per test and a closing 'N passed, N failed'.
"""
import random
import sys
import threading
import time

import psycopg

DSN = sys.argv[1] if len(sys.argv) > 1 else "dbname=postgres"


def connect(autocommit=True):
    return psycopg.connect(DSN, autocommit=autocommit)


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

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
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

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 2000 and len(set(seen)) == 2000, f"{len(seen)} taken, {len(set(seen))} distinct"


def wait_notifies(conn, seconds):
    """Notifications that reach `conn` within `seconds`."""
    got = []
    for n in conn.notifies(timeout=seconds, stop_after=None):
        got.append((n.channel, n.payload))
    return got


def go_idle(conn, *queues):
    """What an idle worker does: LISTEN, then a take that finds nothing, which
    marks the queue as having a waiter."""
    conn.execute("LISTEN sturdy")
    for q in queues:
        assert conn.execute("SELECT count(*) FROM sturdy.take(%s)", (q,)).fetchone() == (0,)


def test_notify_reaches_an_idle_listener_only_after_commit():
    with connect() as listener, connect(autocommit=False) as app:
        go_idle(listener, "mail")
        app.execute("SELECT sturdy.schedule('n-1', now(), 'mail')")
        assert wait_notifies(listener, 0.5) == [], "notified before commit"
        app.commit()
        assert wait_notifies(listener, 2.0) == [("sturdy", "mail")]


def test_a_rolled_back_schedule_notifies_nobody_and_keeps_the_mark():
    with connect() as listener, connect(autocommit=False) as app:
        go_idle(listener, "mail2")
        app.execute("SELECT sturdy.schedule('n-2', now(), 'mail2')")
        app.rollback()
        assert wait_notifies(listener, 0.5) == []
        app.execute("SELECT sturdy.schedule('n-3', now(), 'mail2')")
        app.commit()
        assert wait_notifies(listener, 2.0) == [("sturdy", "mail2")], "the mark survives a rollback"


def test_one_notification_per_idle_period_and_queue():
    with connect() as listener, connect(autocommit=False) as app:
        go_idle(listener, "bulk", "other", "sleepy")
        app.execute("SELECT sturdy.schedule('many-' || i, now(), 'bulk') FROM generate_series(1, 100) i")
        app.execute("SELECT sturdy.schedule('other', now(), 'other')")
        app.execute("SELECT sturdy.schedule('later', now() + interval '1 hour', 'sleepy')")
        app.commit()
        got = sorted(wait_notifies(listener, 1.0))
        assert got == [("sturdy", "bulk"), ("sturdy", "other")], got
        # the mark is spent: more work in a busy queue notifies nobody
        app.execute("SELECT sturdy.schedule('more', now(), 'bulk')")
        app.commit()
        assert wait_notifies(listener, 0.5) == []


def test_no_notification_while_workers_keep_finding_work():
    """Sustained load: 4 workers take and finish while 2 producers schedule,
    and no take ever comes back empty, so nothing notifies (no commit waits
    on the notification lock)."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue_waiters WHERE queue = 'busy'")
        c.execute("SELECT sturdy.schedule('busy-' || i, now() - interval '1 s', 'busy') FROM generate_series(1, 3000) i")
    stop, empty, lock = threading.Event(), [], threading.Lock()

    def worker():
        with connect() as c:
            while not stop.is_set():
                rows = c.execute("SELECT workflow, receipt FROM sturdy.take('busy', '5 minutes', 5)").fetchall()
                if not rows:
                    with lock:
                        empty.append(1)
                for w, r in rows:
                    c.execute("SELECT sturdy.done(%s, %s, 'busy')", (w, r))

    def producer(k):
        with connect() as c:
            for i in range(300):
                c.execute("SELECT sturdy.schedule(%s, now(), 'busy')", (f"new-{k}-{i}",))

    with connect() as listener:
        listener.execute("LISTEN sturdy")
        workers = [threading.Thread(target=worker) for _ in range(4)]
        producers = [threading.Thread(target=producer, args=(k,)) for k in range(2)]
        for t in workers + producers:
            t.start()
        for t in producers:
            t.join()
        stop.set()
        for t in workers:
            t.join()
        assert not empty, "a take came back empty: the load was not sustained"
        got = [n for n in wait_notifies(listener, 0.5) if n[1] == "busy"]
        assert got == [], f"{len(got)} notifications under load"


def test_a_missed_wakeup_is_caught_by_the_poll():
    """A schedule that raced the worker's empty take (simulated: the mark is
    gone) sends nothing; the worker's poll interval still finds the row."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'missed'")
    result = {}

    def worker():
        with connect() as c:
            go_idle(c, "missed")
            ready.set()
            for _ in range(10):  # a worker loop: wait for a notification, at most 0.3 s
                woken = any(True for _ in c.notifies(timeout=0.3, stop_after=1))
                row = c.execute("SELECT workflow FROM sturdy.take('missed')").fetchone()
                if row:
                    result.update(row=row, woken=woken)
                    return

    ready = threading.Event()
    t = threading.Thread(target=worker)
    t.start()
    ready.wait()
    with connect() as app:
        app.execute("DELETE FROM sturdy.queue_waiters WHERE queue = 'missed'")
        app.execute("SELECT sturdy.schedule('late', now(), 'missed')")
    t.join()
    assert result.get("row") == ("late",) and result.get("woken") is False, result


def test_an_idle_listening_worker_wakes_at_once_and_takes():
    """A worker whose take found nothing blocks on LISTEN (no polling) and is
    woken by a schedule in another session within a bound, and takes it."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'wake'")
    result = {}

    def worker():
        with connect() as c:
            go_idle(c, "wake")
            ready.set()
            woken = any(n.payload == "wake" for n in c.notifies(timeout=5.0, stop_after=1))
            result["woken_after"] = time.monotonic() - scheduled_at[0] if scheduled_at else None
            # the connection is free again once the notifies() generator is done
            if woken:
                result["row"] = c.execute("SELECT workflow FROM sturdy.take('wake')").fetchone()

    ready = threading.Event()
    scheduled_at = []
    t = threading.Thread(target=worker)
    t.start()
    ready.wait()
    with connect() as app:
        app.execute("SELECT sturdy.schedule('woken', now(), 'wake')")
        scheduled_at.append(time.monotonic())
    t.join()
    assert result.get("row") == ("woken",), result
    assert result["woken_after"] is not None and result["woken_after"] < 1.0, result


def main():
    tests = [v for k, v in sorted(globals().items()) if k.startswith("test_")]
    passed = failed = 0
    for t in tests:
        try:
            t()
            print(f"ok   {t.__name__}")
            passed += 1
        except Exception as e:  # report every test, then fail the run
            print(f"FAIL {t.__name__}: {e!r}")
            failed += 1
    print(f"concurrency: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
