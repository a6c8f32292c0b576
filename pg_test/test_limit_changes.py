"""Flow control while its limits change (src/queue/limits.rs): every backend
takes by the limits in force, whatever snapshot its take runs on; passes
already running count against a new limit until they end; and a change
made while takers run never lets more passes run than the limit allows."""
import datetime
import threading
import time

import psycopg
import pytest

from sturdy import Worker, connect, start_and_join, wait_notifies

Q = "lch"
# a sample's transaction may start before the change it sees was noted as
# committed (by the changer's next transaction): by this much at most
SLACK = datetime.timedelta(milliseconds=100)


def fresh(c, rows=10, key=None):
    c.execute("DELETE FROM sturdy.queue WHERE queue = %s", (Q,))
    c.execute("SELECT sturdy.limit_queue(%s)", (Q,))
    c.execute("SELECT sturdy.resume(%s)", (Q,))
    c.execute("SELECT sturdy.schedule('lch-' || i, now() - interval '1 minute', %s, key => %s)"
              " FROM generate_series(1, %s) i", (Q, key, rows))


def hold(c, n):
    """n passes of Q taken and committed (ten-minute leases)."""
    got = [c.execute("SELECT workflow, receipt FROM sturdy.take(%s, '10 minutes')", (Q,)).fetchone()
           for _ in range(n)]
    assert all(got), f"could not take {n} passes to hold: {got}"
    return got


def takes_now(c):
    """What a take hands out now, undone (rolled back)."""
    with c.transaction(force_rollback=True):
        return c.execute("SELECT count(*) FROM sturdy.take(%s, '10 minutes')", (Q,)).fetchone()[0]


def straddling_take(s1, other, change, isolation):
    """A take whose snapshot predates `change`, committed by `other` before
    the take reads the limits: a repeatable-read transaction that began
    before, or a read-committed statement that began before. Rolled back;
    returns what it handed out."""
    if isolation == "repeatable read":
        # (autocommit: the statements go as they are)
        s1.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        s1.execute("SELECT 1")  # the snapshot
        other.execute(change)
        try:
            n = s1.execute("SELECT count(*) FROM sturdy.take(%s, '10 minutes')", (Q,)).fetchone()[0]
        except psycopg.errors.SerializationFailure:
            # the change made the places anew after this snapshot: a place
            # it would lock was deleted since, which repeatable read refuses
            n = None
        s1.execute("ROLLBACK")
        return n
    # read committed: the statement's snapshot is taken before the sleep;
    # the take reads the limits after it (the sleep's subquery is not pulled
    # up, pg_sleep being volatile, so the take depends on its row)
    done = threading.Event()

    def change_during_sleep():
        time.sleep(0.3)
        other.execute(change)
        done.set()

    t = Worker(target=change_during_sleep)
    t.start()
    with s1.transaction(force_rollback=True):
        n = s1.execute("SELECT count(t.*) FROM (SELECT pg_sleep(1) AS z, 1 AS one) s,"
                       " LATERAL (SELECT * FROM sturdy.take(%s, '10 minutes') WHERE s.one = 1) t",
                       (Q,)).fetchone()[0]
    t.join()
    assert done.is_set()
    return n


# (setup before, the change, what takes hand out after it, key of the rows)
CHANGES = {
    "pause": ([], "SELECT sturdy.pause('lch')", 0, None),
    "resume": (["SELECT sturdy.pause('lch')"], "SELECT sturdy.resume('lch')", 1, None),
    "running raised": (["SELECT sturdy.limit_queue('lch', running => 1)", "HOLD 1"],
                       "SELECT sturdy.limit_queue('lch', running => 2)", 1, None),
    "running lowered": (["SELECT sturdy.limit_queue('lch', running => 2)", "HOLD 1"],
                        "SELECT sturdy.limit_queue('lch', running => 1)", 0, None),
    "running cleared": (["SELECT sturdy.limit_queue('lch', running => 1)", "HOLD 1"],
                        "SELECT sturdy.limit_queue('lch')", 1, None),
    "per_key raised": (["SELECT sturdy.limit_queue('lch', per_key => 1)", "HOLD 1"],
                       "SELECT sturdy.limit_queue('lch', per_key => 2)", 1, "k"),
    "per_key lowered": (["SELECT sturdy.limit_queue('lch', per_key => 2)", "HOLD 1"],
                        "SELECT sturdy.limit_queue('lch', per_key => 1)", 0, "k"),
    "per_key cleared": (["SELECT sturdy.limit_queue('lch', per_key => 1)", "HOLD 1"],
                        "SELECT sturdy.limit_queue('lch')", 1, "k"),
}


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
@pytest.mark.parametrize("case", list(CHANGES))
def test_a_take_on_an_older_snapshot_leaves_no_stale_limits_behind(case, isolation):
    """A backend whose take read the limits on a snapshot older than a
    change (which its cache had already taken in) kept what that snapshot
    saw until the next change: a paused queue kept handing out to it. Now
    the take that straddles the change obeys it where it can see it (a
    pause, always), and every later take of that backend, and of a new
    one, hands out what the new limits allow."""
    setup, change, after, key = CHANGES[case]
    with connect() as s1, connect() as other:
        fresh(other, key=key)
        for sql in setup:
            if sql.startswith("HOLD"):
                hold(other, int(sql.split()[1]))
            else:
                other.execute(sql)
        takes_now(s1)  # s1 keeps the limits as they were
        n = straddling_take(s1, other, change, isolation)
        if case == "pause":
            assert n == 0, f"{isolation}: a take that began before the pause committed handed out {n}"
        later = [takes_now(s1) for _ in range(3)]
        with connect() as new:
            fresh_backend = takes_now(new)
        assert later == [after] * 3, f"{case}, {isolation}: this backend's later takes {later}, expected {after}"
        assert fresh_backend == after
        other.execute("SELECT sturdy.limit_queue(%s)", (Q,))
        other.execute("SELECT sturdy.resume(%s)", (Q,))


def leased(c):
    return c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = %s AND leased_until > now()",
                     (Q,)).fetchone()[0]


def settling(c):
    return c.execute("SELECT settling FROM sturdy.queue_limits WHERE queue = %s", (Q,)).fetchone()[0]


def test_lowering_then_raising_running_counts_the_passes_in_flight():
    """Five passes running under running = 5; lowered to 2 and raised to 5
    again: new places used to come empty, and three more takes got rows
    (8 leased under a limit of 5)."""
    with connect() as c:
        fresh(c)
        c.execute("SELECT sturdy.limit_queue(%s, running => 5)", (Q,))
        hold(c, 5)
        assert takes_now(c) == 0
        c.execute("SELECT sturdy.limit_queue(%s, running => 2)", (Q,))
        assert takes_now(c) == 0
        c.execute("SELECT sturdy.limit_queue(%s, running => 5)", (Q,))
        for _ in range(3):
            assert c.execute("SELECT count(*) FROM sturdy.take(%s, '10 minutes')", (Q,)).fetchone()[0] == 0
        assert leased(c) == 5
        assert c.execute("SELECT count(*) FROM sturdy.queue_places WHERE queue = %s AND receipt > now()",
                         (Q,)).fetchone()[0] == 5
        c.execute("SELECT sturdy.limit_queue(%s)", (Q,))


def test_a_first_limit_counts_the_rows_already_leased():
    """Four passes running on a queue without limits; running = 2 set: no
    take until fewer than two run, then one at a time."""
    with connect() as c:
        fresh(c)
        passes = hold(c, 4)
        c.execute("SELECT sturdy.limit_queue(%s, running => 2)", (Q,))
        assert settling(c) is True
        assert takes_now(c) == 0
        # every ready row is held back, no more (four places held of two)
        assert c.execute("SELECT ready, held_back FROM sturdy.queue_stats WHERE queue = %s",
                         (Q,)).fetchone() == (6, 6)
        for n, (w, r) in enumerate(passes[:3]):
            assert c.execute("SELECT sturdy.done(%s, %s, %s)", (w, r, Q)).fetchone()[0]
            running = 4 - (n + 1)
            assert takes_now(c) == (1 if running < 2 else 0), f"{running} running"
        # one left: a take gets one; then the limit is reached
        got = c.execute("SELECT workflow, receipt FROM sturdy.take(%s, '10 minutes', max => 5)", (Q,)).fetchall()
        assert len(got) == 1
        assert takes_now(c) == 0
        assert leased(c) == 2
        c.execute("SELECT sturdy.limit_queue(%s)", (Q,))


def test_a_lowered_limit_settles_once_the_older_passes_end():
    """running 4 → 2 with four passes: settling while a place past 2 is
    held; once those passes end (one done, one lapsed), the first take
    settles the queue: the places past the limit go, and the takes go by
    the places again."""
    with connect() as c:
        fresh(c)
        c.execute("SELECT sturdy.limit_queue(%s, running => 4)", (Q,))
        passes = hold(c, 2)
        short = [c.execute("SELECT workflow, receipt FROM sturdy.take(%s, '1 second')", (Q,)).fetchone()
                 for _ in range(2)]
        c.execute("SELECT sturdy.limit_queue(%s, running => 2)", (Q,))
        assert settling(c) is True
        assert c.execute("SELECT max(place) FROM sturdy.queue_places WHERE queue = %s", (Q,)).fetchone()[0] == 4
        assert takes_now(c) == 0
        # one of the short passes ends, the other lapses
        assert c.execute("SELECT sturdy.done(%s, %s, %s)", (*short[0], Q)).fetchone()[0]
        time.sleep(1.2)
        assert takes_now(c) == 0, "two passes still run under running = 2"
        # still settling while the long passes hold places 1..2 only? the
        # places past 2 held none now: the next take settles the queue
        c.execute("SELECT count(*) FROM sturdy.take(%s, '10 minutes')", (Q,))
        assert settling(c) is False
        assert c.execute("SELECT max(place) FROM sturdy.queue_places WHERE queue = %s", (Q,)).fetchone()[0] == 2
        assert c.execute("SELECT sturdy.done(%s, %s, %s)", (*passes[0], Q)).fetchone()[0]
        assert takes_now(c) == 1
        c.execute("SELECT sturdy.limit_queue(%s)", (Q,))


def test_lowering_per_key_counts_each_keys_passes_in_flight():
    """per_key 3 with three passes of key k; lowered to 1: no take of k
    until all three end; rows without a key are not held back."""
    with connect() as c:
        fresh(c, rows=6, key="k")
        c.execute("SELECT sturdy.limit_queue(%s, per_key => 3)", (Q,))
        passes = hold(c, 3)
        c.execute("SELECT sturdy.limit_queue(%s, per_key => 1)", (Q,))
        assert settling(c) is True
        for w, r in passes:
            assert takes_now(c) == 0
            assert c.execute("SELECT sturdy.done(%s, %s, %s)", (w, r, Q)).fetchone()[0]
        assert takes_now(c) == 1
        c.execute("SELECT sturdy.schedule('lch-free', now() - interval '1 minute', %s)", (Q,))
        c.execute("SELECT count(*) FROM sturdy.take(%s, '10 minutes')", (Q,))
        assert takes_now(c) == 1, "the row without a key is not held back by k's limit"
        c.execute("SELECT sturdy.limit_queue(%s)", (Q,))


def test_per_key_lowered_while_a_take_makes_the_keys_places():
    """A take that meets a key without places makes them; limit_queue
    lowering per_key meanwhile used to miss the places that take had not
    committed, and leave the old number. Now it waits for that take and
    makes the key's places anew: two, one held by the take's pass."""
    with connect() as c, connect() as s1, connect() as s2:
        fresh(c, rows=3, key="k")
        c.execute("SELECT sturdy.limit_queue(%s, per_key => 5)", (Q,))
        c.execute("DELETE FROM sturdy.queue_key_places WHERE queue = %s", (Q,))
        s1.autocommit = False
        assert s1.execute("SELECT count(*) FROM sturdy.take(%s, '10 minutes')", (Q,)).fetchone()[0] == 1
        result = []
        t = Worker(target=lambda: result.append(
            s2.execute("SELECT sturdy.limit_queue(%s, per_key => 2)", (Q,)).fetchone()))
        t.start()
        time.sleep(0.5)
        assert t.is_alive(), "limit_queue did not wait for the take making the key's places"
        s1.commit()
        t.join(10)
        assert result
        places = c.execute("SELECT place, receipt > now() FROM sturdy.queue_key_places"
                           " WHERE queue = %s AND key = 'k' ORDER BY place", (Q,)).fetchall()
        assert [p for p, _ in places] == [1, 2], places
        assert sum(1 for _, held in places if held) == 1
        assert takes_now(c) == 1
        c.execute("SELECT sturdy.limit_queue(%s)", (Q,))


def test_a_batch_take_locks_no_more_places_than_rows_ready():
    """running = 10 and three ready rows: a take(max => 10) locked ten
    places and held them to its commit, so every other taker got nothing
    meanwhile. Now it locks three."""
    with connect() as c, connect() as s1:
        fresh(c, rows=3)
        c.execute("SELECT sturdy.limit_queue(%s, running => 10)", (Q,))
        s1.autocommit = False
        assert s1.execute("SELECT count(*) FROM sturdy.take(%s, '10 minutes', max => 10)",
                          (Q,)).fetchone()[0] == 3
        c.execute("SELECT sturdy.schedule('lch-late', now() - interval '1 minute', %s)", (Q,))
        assert takes_now(c) == 1, "the other taker found every place locked"
        s1.rollback()
        c.execute("SELECT sturdy.limit_queue(%s)", (Q,))


def test_limits_changing_while_sixteen_takers_run_are_never_exceeded():
    """Sixteen workers take one row at a time and hold it 20 ms; a changer
    moves running through 6, 2, 4, 1, 3, 5 every 150 ms; a sampler reads,
    in one statement, the limit in force and the leased rows. A sample
    never holds more passes than the limit, except passes taken before the
    last change, which count only until they end: at most max(limit,
    passes that started before the change)."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'lch-live'")
        c.execute("SELECT sturdy.schedule('lv-' || i, now() - interval '1 minute', 'lch-live')"
                  " FROM generate_series(1, 20000) i")
        c.execute("SELECT sturdy.limit_queue('lch-live', running => 6)")
    stop, samples, changes = threading.Event(), [], []  # changes: (limit, committed by)

    def sampler():
        with connect() as c:
            while not stop.is_set():
                samples.append(c.execute(
                    "SELECT now(), (SELECT running FROM sturdy.queue_limits WHERE queue = 'lch-live'),"
                    " array_agg(taken_at) FROM sturdy.queue"
                    " WHERE queue = 'lch-live' AND leased_until > now()").fetchone())
                time.sleep(0.002)

    def changer():
        try:
            with connect() as c:
                for _ in range(3):
                    for n in (2, 4, 1, 3, 5, 6):
                        time.sleep(0.15)
                        c.execute("SELECT sturdy.limit_queue('lch-live', running => %s)", (n,))
                        changes.append((n, c.execute("SELECT now()").fetchone()[0]))
        finally:
            stop.set()

    def worker():
        with connect() as c:
            while not stop.is_set():
                row = c.execute("SELECT workflow, receipt FROM sturdy.take('lch-live', '1 minute')").fetchone()
                if row is None:
                    time.sleep(0.002)
                    continue
                time.sleep(0.02)
                c.execute("SELECT sturdy.done(%s, %s, 'lch-live')", row)

    threads = [Worker(target=sampler), Worker(target=changer)] + [Worker(target=worker) for _ in range(16)]
    start_and_join(threads)
    over, reached = [], 0
    for at, limit, taken in samples:
        taken = taken or []
        # the change the sample saw (each differs from the one before it):
        # passes taken by the time it had committed started under an older
        # limit
        last = next((t for n, t in reversed(changes) if n == limit and t - at < SLACK), None)
        older = sum(1 for t in taken if last is not None and t <= last)
        if len(taken) > max(limit, older):
            over.append((at, limit, len(taken), older))
        reached += len(taken) == limit
    with connect() as c:
        c.execute("SELECT sturdy.limit_queue('lch-live')")
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'lch-live'")
    print(f"     {len(samples)} samples, {len(changes)} changes, at the limit in {reached}")
    assert not over, f"{len(over)} samples over the limit in force, e.g. {over[:3]}"
    assert reached > 0, "the limit was never reached: the test did not load it"


@pytest.mark.parametrize("sql", [
    "SELECT sturdy.limit_queue('lch', running => 2147483647)",
    "SELECT sturdy.limit_queue('lch', running => 10001)",
    "SELECT sturdy.limit_queue('lch', per_key => 1001)",
    "SELECT sturdy.limit_queue('lch', per_second => 1e308)",
    "SELECT sturdy.limit_queue('lch', per_second => 1000000.5)",
    "SELECT sturdy.limit_queue('lch', per_second => 10, burst => 2147483647)",
])
def test_a_limit_past_its_maximum_is_refused_and_writes_nothing(sql):
    with connect() as c:
        c.execute("SELECT sturdy.limit_queue('lch')")
        with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
            c.execute(sql)
        assert "at most" in str(e.value)
        assert c.execute("SELECT count(*) FROM sturdy.queue_limits WHERE queue = 'lch'").fetchone()[0] == 0
        assert c.execute("SELECT count(*) FROM sturdy.queue_places WHERE queue = 'lch'").fetchone()[0] == 0


def test_the_largest_limits_are_taken():
    with connect() as c:
        c.execute("SELECT sturdy.limit_queue('lch', running => 10000, per_key => 1000,"
                  " per_second => 1000000, burst => 1000000)")
        assert c.execute("SELECT count(*) FROM sturdy.queue_places WHERE queue = 'lch'").fetchone()[0] == 10000
        c.execute("SELECT sturdy.limit_queue('lch')")


def test_a_clock_stepped_back_refills_the_bucket_from_then_on():
    """The bucket's refill time a day ahead of the clock (a failover to a
    standby whose clock is behind): the next take moves it back to now()
    and takes go on at the rate, instead of none until the clock passes it."""
    with connect() as c:
        fresh(c, rows=20)
        c.execute("SELECT sturdy.limit_queue(%s, per_second => 50, burst => 1)", (Q,))
        c.execute("UPDATE sturdy.queue_limits SET tokens = 0, refilled_at = now() + interval '1 day'"
                  " WHERE queue = %s", (Q,))
        c.execute("SELECT count(*) FROM sturdy.take(%s)", (Q,))
        assert c.execute("SELECT refilled_at <= now() FROM sturdy.queue_limits WHERE queue = %s",
                         (Q,)).fetchone()[0]
        time.sleep(0.2)
        assert takes_now(c) == 1
        c.execute("SELECT sturdy.limit_queue(%s)", (Q,))


@pytest.mark.parametrize("limit", ["running", "per_key"])
def test_a_take_held_back_by_a_full_limit_is_woken_when_a_place_frees(limit):
    """A worker whose take found no free place sleeps on LISTEN; it used to
    be woken by nothing but its poll interval (a held-back take left no
    mark). Now the take leaves the mark, and the pass's done that frees a
    place notifies it at commit, once."""
    with connect() as c, connect() as listener:
        fresh(c, rows=3, key="k")
        c.execute(f"SELECT sturdy.limit_queue(%s, {limit} => 1)", (Q,))
        (w, r), = hold(c, 1)
        listener.execute("LISTEN sturdy")
        assert takes_now(listener) == 0
        assert listener.execute("SELECT count(*) FROM sturdy.take(%s)", (Q,)).fetchone()[0] == 0
        assert wait_notifies(listener, 0.3) == []
        assert c.execute("SELECT sturdy.done(%s, %s, %s)", (w, r, Q)).fetchone()[0]
        assert wait_notifies(listener, 2.0) == [("sturdy", Q)]
        assert listener.execute("SELECT count(*) FROM sturdy.take(%s)", (Q,)).fetchone()[0] == 1
        c.execute("SELECT sturdy.limit_queue(%s)", (Q,))
