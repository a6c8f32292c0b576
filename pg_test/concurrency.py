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


def test_notify_reaches_a_listener_only_after_commit():
    with connect() as listener, connect(autocommit=False) as app:
        listener.execute("LISTEN sturdy")
        app.execute("SELECT sturdy.schedule('n-1', now(), 'mail')")
        assert wait_notifies(listener, 0.5) == [], "notified before commit"
        app.commit()
        assert wait_notifies(listener, 2.0) == [("sturdy", "mail")]


def test_a_rolled_back_schedule_notifies_nobody():
    with connect() as listener, connect(autocommit=False) as app:
        listener.execute("LISTEN sturdy")
        app.execute("SELECT sturdy.schedule('n-2', now(), 'mail')")
        app.rollback()
        assert wait_notifies(listener, 0.5) == []


def test_one_notification_per_queue_per_transaction():
    with connect() as listener, connect(autocommit=False) as app:
        listener.execute("LISTEN sturdy")
        app.execute("SELECT sturdy.schedule('many-' || i, now(), 'bulk') FROM generate_series(1, 100) i")
        app.execute("SELECT sturdy.schedule('other', now(), 'other')")
        app.execute("SELECT sturdy.schedule('later', now() + interval '1 hour', 'sleepy')")
        app.commit()
        got = sorted(wait_notifies(listener, 1.0))
        assert got == [("sturdy", "bulk"), ("sturdy", "other")], got


def test_a_listening_worker_wakes_and_takes():
    """A worker blocked on LISTEN (no polling) is woken by a schedule in
    another session and takes the workflow."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'wake'")
    result = {}

    def worker():
        with connect() as c:
            c.execute("LISTEN sturdy")
            ready.set()
            woken = any(n.payload == "wake" for n in c.notifies(timeout=5.0, stop_after=1))
            # the connection is free again once the notifies() generator is done
            if woken:
                result["row"] = c.execute("SELECT workflow FROM sturdy.take('wake')").fetchone()

    ready = threading.Event()
    t = threading.Thread(target=worker)
    t.start()
    ready.wait()
    with connect() as app:
        app.execute("SELECT sturdy.schedule('woken', now(), 'wake')")
    t.join()
    assert result.get("row") == ("woken",), result


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
