"""Failing passes from outside: a poison workflow that kills every worker
process that takes it, among healthy work under a running limit; and two
takers racing for one lapsed lease.
"""
import os
import signal
import subprocess
import sys
import time

from sturdy import DSN, Worker, connect, start_and_join

# A worker process: takes one row at a time from queue px (lease 1 s), logs
# each take of `poison` (its attempt and the server's times) and dies by
# SIGKILL at once, as a worker crashing on a bad payload does; does the
# rest. Exits when the queue holds nothing but dead rows.
WORKER = r"""
import os, signal, sys, time
import psycopg
c = psycopg.connect(sys.argv[1], autocommit=True)
while True:
    row = c.execute("SELECT workflow, receipt, attempt FROM sturdy.take('px', '1 second')").fetchone()
    if row is None:
        if c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'px' AND visible_at < 'infinity'").fetchone()[0] == 0:
            break
        time.sleep(0.05)
        continue
    workflow, receipt, attempt = row
    if workflow == 'poison':
        c.execute("INSERT INTO public.poison_takes VALUES (%s, %s, now())", (attempt, receipt))
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.01)
    assert c.execute("SELECT sturdy.done(%s, %s, 'px')", (workflow, receipt)).fetchone()[0]
"""

MAX_ATTEMPTS = 4
BACKOFF = 0.3  # seconds, doubled each failure, at most MAX_BACKOFF
MAX_BACKOFF = 1.0


def test_a_poison_workflow_is_tried_max_attempts_times_then_dead_and_the_rest_all_finish():
    """Nine worker processes, each killed (SIGKILL) whenever it takes
    `poison`, and started again; 60 healthy rows; `running = 4`. `poison`
    is handed out exactly max_attempts times, each retake no earlier than
    the lease's end plus the backoff by the server's clock, then is dead
    (visible_at 'infinity', holding no place); every healthy row is done."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'px'")
        c.execute("DROP TABLE IF EXISTS public.poison_takes")
        c.execute("CREATE TABLE public.poison_takes (attempt int, receipt timestamptz, at timestamptz)")
        c.execute("SELECT sturdy.limit_queue('px', running => 4)")
        c.execute("SELECT sturdy.retry_queue('px', max_attempts => %s, backoff => make_interval(secs => %s),"
                  " max_backoff => make_interval(secs => %s), jitter => 0)", (MAX_ATTEMPTS, BACKOFF, MAX_BACKOFF))
        c.execute("SELECT sturdy.schedule('poison', now() - interval '1 minute', 'px')")
        c.execute("SELECT sturdy.schedule('job-' || i, now(), 'px') FROM generate_series(1, 60) i")

    def supervise(n):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            p = subprocess.run([sys.executable, "-c", WORKER, DSN], capture_output=True, text=True)
            if p.returncode == -signal.SIGKILL:
                continue  # took poison: start it again
            assert p.returncode == 0, f"worker {n}: {p.stderr[-2000:]}"
            return
        raise AssertionError(f"worker {n} still restarting after 60 s")

    start_and_join([Worker(target=supervise, args=(n,)) for n in range(9)])

    with connect() as c:
        takes = c.execute("SELECT attempt, receipt, at FROM public.poison_takes ORDER BY at").fetchall()
        assert [a for a, _, _ in takes] == list(range(1, MAX_ATTEMPTS + 1)), f"poison's takes: {takes}"
        for (n, receipt, _), (_, _, retaken) in zip(takes, takes[1:]):
            wait = min(MAX_BACKOFF, BACKOFF * 2 ** (n - 1))
            gap = (retaken - receipt).total_seconds()
            assert gap >= wait, f"attempt {n + 1} taken {gap:.3f} s after the lease's end, before its backoff {wait}"
        left = c.execute("SELECT workflow, visible_at = 'infinity', attempts, last_error FROM sturdy.queue"
                         " WHERE queue = 'px'").fetchall()
        assert left == [("poison", True, MAX_ATTEMPTS, "the lease ran out")], f"left in the queue: {left}"
        held = c.execute("SELECT count(*) FROM sturdy.queue_places WHERE queue = 'px' AND workflow = 'poison'"
                         " AND receipt > now()").fetchone()[0]
        assert held == 0, "the dead row holds a place"
        stats = c.execute("SELECT ready, leased, sleeping, dead FROM sturdy.queue_stats WHERE queue = 'px'").fetchone()
        assert stats == (0, 0, 0, 1), stats
        c.execute("SELECT sturdy.limit_queue('px')")
        c.execute("SELECT sturdy.retry_queue('px')")
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'px'")
        c.execute("DROP TABLE public.poison_takes")


def test_two_takers_racing_for_a_lapsed_lease_count_one_attempt():
    """A row whose lease ran out, two takes at once (one held in its
    transaction after taking it): the failure is counted once, and the
    other take gets nothing."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'race'")
        c.execute("SELECT sturdy.retry_queue('race', backoff => '0 seconds')")
        c.execute("SELECT sturdy.schedule('r', now() - interval '1 minute', 'race')")
        c.execute("SELECT count(*) FROM sturdy.take('race', '10 milliseconds')")
        time.sleep(0.05)
    a, b = connect(autocommit=False), connect(autocommit=False)
    try:
        got_a = a.execute("SELECT workflow, attempt FROM sturdy.take('race', '1 minute')").fetchall()
        got_b = b.execute("SELECT workflow, attempt FROM sturdy.take('race', '1 minute')").fetchall()
        a.commit()
        b.commit()
        assert got_a == [("r", 2)] and got_b == [], (got_a, got_b)
        with connect() as c:
            assert c.execute("SELECT attempts FROM sturdy.queue WHERE queue = 'race'").fetchone()[0] == 1
            c.execute("SELECT sturdy.retry_queue('race')")
            c.execute("DELETE FROM sturdy.queue WHERE queue = 'race'")
    finally:
        a.close()
        b.close()
