"""Flow control under real concurrency (src/queue/limits.rs): the running
limit never exceeded by sixteen workers, the rate limit's bucket holding a
burst and a rate by the server's clock, and a place freed by a lease that
lapses."""
import threading
import time

from sturdy import Worker, connect, start_and_join


def test_sixteen_workers_never_hold_more_passes_than_running():
    """running = 3, 600 rows, sixteen workers each taking up to two rows a
    call and holding them 20 ms before done; a sampler reads the queue's
    leased rows every few milliseconds from its own connection. Never above
    3, the limit reached, and the queue drains."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'lim-run'")
        c.execute("SELECT sturdy.schedule('lr-' || i, now() - interval '1 minute', 'lim-run')"
                  " FROM generate_series(1, 600) i")
        c.execute("SELECT sturdy.limit_queue('lim-run', running => 3)")
    stop, seen = threading.Event(), []

    def sampler():
        with connect() as c:
            while not stop.is_set():
                seen.append(c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'lim-run'"
                                      " AND leased_until > now()").fetchone()[0])
                time.sleep(0.002)

    def worker():
        with connect() as c:
            while True:
                rows = c.execute("SELECT workflow, receipt FROM sturdy.take('lim-run', max => 2)").fetchall()
                if not rows:
                    if c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'lim-run'").fetchone()[0] == 0:
                        return
                    time.sleep(0.005)
                    continue
                time.sleep(0.02)
                for w, r in rows:
                    c.execute("SELECT sturdy.done(%s, %s, 'lim-run')", (w, r))

    s = Worker(target=sampler)
    s.start()
    start_and_join([Worker(target=worker) for _ in range(16)])
    stop.set()
    s.join()
    with connect() as c:
        c.execute("SELECT sturdy.limit_queue('lim-run')")
    print(f"     {len(seen)} samples, at most {max(seen)} leased")
    assert max(seen) <= 3, f"{max(seen)} passes at once under running = 3"
    assert max(seen) == 3, "the limit was never reached: the test did not load it"


def test_the_rate_limit_hands_out_burst_and_rate_by_the_server_clock():
    """per_second = 200, burst = 20; eight workers take and done as fast as
    they can for five seconds over a backlog that never runs out. The takes
    come to at most burst + 200 a second of the server time between the
    first and the last (each take's now() is its receipt less its lease),
    and to at least 90% of what five seconds allow."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'lim-rate'")
        c.execute("SELECT sturdy.schedule('rt-' || i, now() - interval '1 minute', 'lim-rate')"
                  " FROM generate_series(1, 3000) i")
        c.execute("SELECT sturdy.limit_queue('lim-rate', per_second => 200, burst => 20)")
    taken, deadline = [], time.monotonic() + 5

    def worker():
        with connect() as c:
            while time.monotonic() < deadline:
                row = c.execute("SELECT workflow, receipt, extract(epoch FROM receipt - interval '1 minute')"
                                " FROM sturdy.take('lim-rate', '1 minute')").fetchone()
                if row is None:
                    time.sleep(0.001)
                    continue
                taken.append(float(row[2]))
                c.execute("SELECT sturdy.done(%s, %s, 'lim-rate')", row[:2])

    start_and_join([Worker(target=worker) for _ in range(8)])
    with connect() as c:
        c.execute("SELECT sturdy.limit_queue('lim-rate')")
    span = max(taken) - min(taken)
    bound = 20 + 200 * span
    print(f"     {len(taken)} takes over {span:.2f} s of server time (at most {bound:.0f})")
    assert len(taken) <= bound + 1, f"{len(taken)} takes in {span:.2f} s: above the bucket's {bound:.0f}"
    assert len(taken) >= 0.9 * (20 + 200 * 5), f"only {len(taken)} takes in five seconds of work"


def test_a_lease_that_lapses_frees_its_place():
    """running = 1: a worker takes with a one-second lease and dies without
    done; the next take gets nothing until the lease has passed by the
    server's clock, then gets the row."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'lim-lapse'")
        c.execute("SELECT sturdy.schedule('ll-' || i, now() - interval '1 minute', 'lim-lapse')"
                  " FROM generate_series(1, 2) i")
        c.execute("SELECT sturdy.limit_queue('lim-lapse', running => 1)")
    with connect() as dead:
        receipt = dead.execute("SELECT receipt FROM sturdy.take('lim-lapse', '1 second')").fetchone()[0]
    with connect() as c:
        assert c.execute("SELECT count(*) FROM sturdy.take('lim-lapse')").fetchone()[0] == 0
        while c.execute("SELECT now() <= %s", (receipt,)).fetchone()[0]:
            time.sleep(0.05)
        got = c.execute("SELECT workflow FROM sturdy.take('lim-lapse')").fetchone()
        c.execute("SELECT sturdy.limit_queue('lim-lapse')")
    assert got is not None, "the lapsed lease did not free its place"


def test_per_key_one_over_fifty_keys_never_leases_two_rows_of_a_key():
    """per_key = 1 over 50 keys, 1,000 rows (20 a key), sixteen workers each
    taking up to four rows a call and holding them 10 ms before done; one
    more takes a row with a one-second lease and dies without done. A
    sampler reads the leased rows per key every few milliseconds from its
    own connection: never two of one key, many keys at once, and the queue
    drains (the dead worker's place freed when its lease lapsed)."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'lim-key'")
        c.execute("SELECT sturdy.limit_queue('lim-key', per_key => 1)")
        c.execute("SELECT sturdy.schedule('lk-' || i, now() - interval '1 minute', 'lim-key',"
                  " key => 'tenant-' || (i % 50)) FROM generate_series(1, 1000) i")
    with connect() as dead:
        assert dead.execute("SELECT count(*) FROM sturdy.take('lim-key', '1 second')").fetchone()[0] == 1
    stop, seen = threading.Event(), []

    def sampler():
        with connect() as c:
            while not stop.is_set():
                seen.append(c.execute("SELECT coalesce(max(n), 0), count(*) FROM (SELECT count(*) AS n"
                                      " FROM sturdy.queue WHERE queue = 'lim-key' AND leased_until > now()"
                                      " GROUP BY key) k").fetchone())
                time.sleep(0.002)

    def worker():
        with connect() as c:
            while True:
                rows = c.execute("SELECT workflow, receipt FROM sturdy.take('lim-key', max => 4)").fetchall()
                if not rows:
                    if c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'lim-key'").fetchone()[0] == 0:
                        return
                    time.sleep(0.005)
                    continue
                time.sleep(0.01)
                c.execute("SELECT sturdy.done_many(%s, %s, 'lim-key')",
                          ([w for w, _ in rows], [r for _, r in rows]))

    s = Worker(target=sampler)
    s.start()
    start_and_join([Worker(target=worker) for _ in range(16)])
    stop.set()
    s.join()
    with connect() as c:
        c.execute("SELECT sturdy.limit_queue('lim-key')")
        left = c.execute("SELECT count(*) FROM sturdy.queue_key_places").fetchone()[0]
    most, keys = max(n for n, _ in seen), max(k for _, k in seen)
    print(f"     {len(seen)} samples, at most {most} leased of a key, {keys} keys at once")
    assert most <= 1, f"{most} passes of one key at once under per_key = 1"
    assert keys >= 10, f"at most {keys} keys leased at once: the test did not load the limit"
    assert left == 0


def test_a_prioritized_row_behind_ten_thousand_ready_ones_is_taken_next():
    """10,000 ready rows; a worker's take has found the queue without
    prioritized rows (and remembers it); another connection schedules one
    row at priority 5 and commits: the worker's very next take hands it
    out. Then four workers take and done while a producer schedules a
    prioritized row every 20 ms: by the server's clock, no more than a few
    default rows are handed out by takes that began after its schedule
    committed and before the take that hands it out."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'lim-prio'")
        c.execute("SELECT sturdy.schedule('lp-' || i, now() - interval '1 hour' + i * interval '1 ms', 'lim-prio')"
                  " FROM generate_series(1, 10000) i")
    with connect() as worker, connect() as producer:
        for _ in range(3):
            w, r = worker.execute("SELECT workflow, receipt FROM sturdy.take('lim-prio')").fetchone()
            assert w.startswith("lp-")
            worker.execute("SELECT sturdy.done(%s, %s, 'lim-prio')", (w, r))
        producer.execute("SELECT sturdy.schedule('urgent', queue => 'lim-prio', priority => 5)")
        assert worker.execute("SELECT workflow FROM sturdy.take('lim-prio')").fetchone()[0] == "urgent"

    # Ordered by the server's clock, not by when a client thread got to
    # write a row down: a thread the GIL holds back while the others run
    # would otherwise look as if its row had waited. A take's receipt is its
    # statement's now() plus the lease (one minute): when it began.
    stop, order, scheduled = threading.Event(), [], []
    lock = threading.Lock()

    def take_loop():
        with connect() as c:
            while not stop.is_set():
                row = c.execute("SELECT workflow, receipt FROM sturdy.take('lim-prio')").fetchone()
                if row is None:
                    continue
                with lock:
                    order.append(row)
                c.execute("SELECT sturdy.done(%s, %s, 'lim-prio')", row)

    def produce():
        try:
            with connect() as c:
                for i in range(50):
                    c.execute("SELECT sturdy.schedule(%s, queue => 'lim-prio', priority => %s)",
                              (f"hot-{i}", 1 + i % 3))
                    # after the commit: a take that begins later can see it
                    (committed,) = c.execute("SELECT clock_timestamp() + interval '1 minute'").fetchone()
                    with lock:
                        scheduled.append((f"hot-{i}", committed))
                    time.sleep(0.02)
                time.sleep(0.2)
        finally:
            stop.set()

    start_and_join([Worker(target=take_loop) for _ in range(4)] + [Worker(target=produce)])
    began = dict(order)
    late = []
    for name, committed in scheduled:
        assert name in began, f"{name} was never taken"
        # default rows whose take began after its schedule committed, and
        # before its own take began
        behind = [w for w, at in order if w.startswith("lp-") and committed < at < began[name]]
        late.append(len(behind))
    print(f"     {len(order)} takes; default rows handed out ahead of a prioritized one: at most {max(late)}")
    assert max(late) <= 8, f"a prioritized row waited behind {max(late)} default rows"
