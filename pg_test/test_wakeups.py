"""Wakeups: NOTIFY to idle listening workers only after commit, once per
idle period, never on busy workers' account; the poll that catches a
missed one."""
import threading
import time

from sturdy import Worker, connect, wait_notifies


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
        workers = [Worker(target=worker) for _ in range(4)]
        producers = [Worker(target=producer, args=(k,)) for k in range(2)]
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
    t = Worker(target=worker)
    t.start()
    ready.wait()
    with connect() as app:
        app.execute("DELETE FROM sturdy.queue_waiters WHERE queue = 'missed'")
        app.execute("SELECT sturdy.schedule('late', now(), 'missed')")
    t.join()
    assert result.get("row") == ("late",) and result.get("woken") is False, result


def test_a_busy_queue_schedules_without_looking_for_marks():
    """Once a producer's backend has found a queue unmarked at an idle epoch
    that stood for a second, its schedules there do not look at
    sturdy.queue_waiters at all; a worker going idle moves the epoch, and the
    same backend's next schedule finds the mark and notifies."""

    def looks(c):
        # forced, this backend's counts are flushed as it goes idle, before
        # it answers (a producer's own call sees its own schedules' looks)
        c.execute("SELECT pg_stat_force_next_flush()")
        return c.execute("SELECT coalesce(idx_scan, 0) + coalesce(seq_scan, 0) FROM pg_stat_user_tables "
                         "WHERE relid = 'sturdy.queue_waiters'::regclass").fetchone()[0]

    with connect() as producer, connect() as watcher, connect() as listener:
        watcher.execute("DELETE FROM sturdy.queue_waiters WHERE queue = 'settle'")
        base = looks(watcher)
        producer.execute("SELECT sturdy.schedule('settle-0', now(), 'settle')")
        # the counter moves when a schedule looks: one not yet settled does
        assert looks(producer) > base, "a schedule before the epoch stood for a second did not look"
        time.sleep(1.1)
        producer.execute("SELECT sturdy.schedule('settle-1', now(), 'settle')")
        before = looks(producer)
        for i in range(200):
            producer.execute("SELECT sturdy.schedule(%s, now(), 'settle')", (f"settle-b{i}",))
        assert looks(producer) == before, "a settled schedule looked for a mark"
        watcher.execute("DELETE FROM sturdy.queue WHERE queue = 'settle'")
        go_idle(listener, "settle")
        # past the quarter second a backend's read of the epoch serves its
        # schedules (the promise is a second)
        time.sleep(0.3)
        producer.execute("SELECT sturdy.schedule('settle-after', now(), 'settle')")
        got = [(n.channel, n.payload) for n in listener.notifies(timeout=10, stop_after=1)]
        assert got == [("sturdy", "settle")], "the epoch moved: the mark is found"


def test_a_worker_going_idle_under_a_steady_producer_is_woken_within_the_second():
    """A producer schedules into a queue every few milliseconds, each call
    its own transaction, so its backend's read of the idle epoch stays fresh
    and its schedules stop looking for marks; a worker that then goes idle is
    still notified within the promise: by a schedule starting at most a
    second after its empty take committed."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'steady'")
        c.execute("DELETE FROM sturdy.queue_waiters WHERE queue = 'steady'")
    stop = threading.Event()

    def produce():
        with connect() as c:
            i = 0
            while not stop.is_set():
                c.execute("SELECT sturdy.schedule(%s, now(), 'steady')", (f"steady-{i % 50}",))
                i += 1
                time.sleep(0.005)

    producer = Worker(target=produce)
    producer.start()
    try:
        time.sleep(1.5)  # the producer's backend has settled: no more looks
        with connect() as listener, connect() as cleaner:
            cleaner.execute("DELETE FROM sturdy.queue WHERE queue = 'steady'")
            listener.execute("LISTEN sturdy")
            while listener.execute("SELECT count(*) FROM sturdy.take('steady')").fetchone() != (0,):
                cleaner.execute("DELETE FROM sturdy.queue WHERE queue = 'steady'")
            idle = time.monotonic()
            # the promise is a second; woken at all is what the settled
            # producer's schedules would never do without the epoch, so the
            # wait is generous and the time printed
            got = [(n.channel, n.payload) for n in listener.notifies(timeout=10, stop_after=1)]
            woke = time.monotonic() - idle
    finally:
        stop.set()
        producer.join()
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'steady'")
    assert ("sturdy", "steady") in got, got
    print(f"     woken {woke:.2f} s after going idle")


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
            woken = any(n.payload == "wake" for n in c.notifies(timeout=10, stop_after=1))
            result["woken_after"] = time.monotonic() - scheduled_at[0] if scheduled_at else None
            # the connection is free again once the notifies() generator is done
            if woken:
                result["row"] = c.execute("SELECT workflow FROM sturdy.take('wake')").fetchone()

    ready = threading.Event()
    scheduled_at = []
    t = Worker(target=worker)
    t.start()
    ready.wait()
    with connect() as app:
        # noted before the schedule: the worker may wake before it returns
        scheduled_at.append(time.monotonic())
        app.execute("SELECT sturdy.schedule('woken', now(), 'wake')")
    t.join()
    assert result.get("row") == ("woken",), result
    print(f"     woken {result['woken_after'] * 1000:.0f} ms after the schedule was sent")
