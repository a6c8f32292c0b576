"""Workflow instances and batch jobs from several connections: sweep beside
workers, idempotency keys, ticks racing batches."""
import threading
import time

from sturdy import Worker, connect, start_and_join


def test_batch_all_commits_each_chunk_and_stops_at_its_budget():
    """CALL sturdy.batch_all: chunks committed one by one (another session sees
    the first chunk's rows while the budget stops the loop), then to
    completion."""
    with connect() as c:
        c.execute("DROP TABLE IF EXISTS public.bulk")
        c.execute("CREATE TABLE public.bulk (id int PRIMARY KEY, done boolean NOT NULL DEFAULT false)")
        c.execute("INSERT INTO public.bulk SELECT i FROM generate_series(1, 25000) i")
        c.execute("DELETE FROM sturdy.batches")
        first = c.execute("CALL sturdy.batch_all('public.bulk', 'done = true', 'NOT done', chunk => 1000,"
                          " budget => '1 microsecond')").fetchone()
        assert first == (1000, 24000, 1, False), first
        with connect() as other:
            assert other.execute("SELECT count(*) FROM public.bulk WHERE done").fetchone() == (1000,)
        rest = c.execute("CALL sturdy.batch_all('public.bulk', 'done = true', 'NOT done', chunk => 1000)").fetchone()
        assert rest == (24000, 0, 25, True), rest  # the 25th chunk finds the end of the pass
        assert c.execute("SELECT count(*) FROM public.bulk WHERE NOT done").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM sturdy.batches").fetchone() == (0,)


def test_a_sweep_running_beside_workers_breaks_no_pass_and_leaves_nothing_finished():
    """Four workers run instances' passes (take with a claim, record, finish
    with a status) while a fifth connection sweeps over and over: no pass is
    fenced or fails (a sweep never removes what a live pass holds, and the
    instance of a pass in flight is not finished), and once the workers are
    done a last sweep leaves nothing of the finished instances behind."""
    total = 600
    with connect() as c:
        c.execute("DELETE FROM sturdy.instances WHERE process = 'swept'")
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'swept'")
        c.execute("SELECT sturdy.start('swept', 'swept-' || i, queue => 'swept') FROM generate_series(1, %s) i", (total,))
    finished, swept, stop, lock = [0], [0], threading.Event(), threading.Lock()

    def worker():
        with connect() as c:
            while rows := c.execute("SELECT workflow, receipt, token FROM sturdy.take('swept', '1 minute', 1, true)"
                                    ).fetchall():
                for workflow, receipt, token in rows:
                    if token is None:
                        continue
                    c.execute("SELECT * FROM sturdy.record(%s, 'work', '1', %s)", (workflow, token))
                    (removed,) = c.execute(
                        "SELECT sturdy.finish(%s, %s, %s, 'end', '1', 'succeeded', 'swept')",
                        (workflow, token, receipt)).fetchone()
                    assert removed, f"{workflow}: finish did not remove its queue row"
                    with lock:
                        finished[0] += 1

    def sweeper():
        with connect() as c:
            while not stop.is_set():
                for kind, deleted in c.execute("SELECT kind, deleted FROM sturdy.sweep('1 microsecond', 50)"):
                    if kind == "instances":
                        with lock:
                            swept[0] += deleted

    sweeping = Worker(target=sweeper)
    sweeping.start()
    start_and_join([Worker(target=worker) for _ in range(4)])
    stop.set()
    sweeping.join()
    with connect() as c:
        while c.execute("SELECT deleted FROM sturdy.sweep('1 microsecond', 1000) WHERE kind = 'instances'"
                        ).fetchone()[0]:
            pass
        left = c.execute(
            "SELECT (SELECT count(*) FROM sturdy.instances WHERE process = 'swept'),"
            " (SELECT count(*) FROM sturdy.checkpoints WHERE workflow LIKE 'swept/%'),"
            " (SELECT count(*) FROM sturdy.claims WHERE workflow LIKE 'swept/%'),"
            " (SELECT count(*) FROM sturdy.queue WHERE queue = 'swept')").fetchone()
    assert finished[0] == total, f"{finished[0]} of {total} passes finished"
    assert swept[0] > 0, "the sweeps beside the workers removed nothing: they never met"
    assert left == (0, 0, 0, 0), f"left (instances, checkpoints, claims, queue rows): {left}"


def test_an_idempotency_key_lives_for_the_ttl_set_when_it_was_written():
    """sturdy.idempotency_ttl in real time: a key written under '3s'
    returns its instance until then and is reused after (by the server's
    clock); one written under the default is not affected by a later SET."""
    with connect() as c:
        c.execute("SET sturdy.idempotency_ttl = '3s'")
        first = c.execute("SELECT sturdy.start('ttl', 'a', idempotency_key => 'short')").fetchone()[0]
        assert c.execute("SELECT sturdy.start('ttl', 'a', idempotency_key => 'short')").fetchone()[0] == first
        c.execute("RESET sturdy.idempotency_ttl")
        long_lived = c.execute("SELECT sturdy.start('ttl', 'b', idempotency_key => 'long')").fetchone()[0]
        c.execute("SET sturdy.idempotency_ttl = '3s'")
        deadline = time.monotonic() + 60
        while not c.execute("SELECT clock_timestamp() > expires_at FROM sturdy.idempotency_keys"
                            " WHERE process = 'ttl' AND key = 'short'").fetchone()[0]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        again = c.execute("SELECT sturdy.start('ttl', 'a', idempotency_key => 'short')").fetchone()[0]
        assert again > first, f"the expired key still returned {first}"
        assert c.execute("SELECT sturdy.start('ttl', 'b', idempotency_key => 'long')").fetchone()[0] == long_lived
        (ttl,) = c.execute("SELECT expires_at - created_at FROM sturdy.idempotency_keys"
                           " WHERE process = 'ttl' AND key = 'long'").fetchone()
        assert ttl.total_seconds() == 24 * 3600, ttl


def test_concurrent_ticks_and_batches_never_update_a_row_twice():
    """Two sessions ticking one named job (the second returns at once while
    the first holds it) and two running the same plain batch, all at once,
    over 20,000 rows whose SET adds one to a counter: every row ends at
    exactly one."""
    with connect() as c:
        c.execute("DROP TABLE IF EXISTS public.twice")
        c.execute("CREATE TABLE public.twice (id int PRIMARY KEY, n int NOT NULL DEFAULT 0)")
        c.execute("INSERT INTO public.twice SELECT i FROM generate_series(1, 20000) i")
        c.execute("DELETE FROM sturdy.batches")
        c.execute("SELECT sturdy.batch_start('twice', 'public.twice', 'n = n + 1', 'n = 0', chunk => 500,"
                  " target_seconds => 0.05)")
    errors, busy = [], []

    def ticker():
        try:
            with connect() as c:
                while True:
                    done, complete = c.execute("SELECT done, complete FROM sturdy.batch_tick('twice')").fetchone()
                    if complete:
                        return
                    if done == 0:
                        busy.append(1)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    def plain():
        try:
            with connect() as c:
                while not c.execute("SELECT complete FROM sturdy.batch('public.twice', 'n = n + 1', 'n = 0',"
                                    " chunk => 700)").fetchone()[0]:
                    pass
        except Exception as e:
            errors.append(e)

    threads = [Worker(target=f) for f in (ticker, ticker, plain, plain)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with connect() as c:
        counts = c.execute("SELECT n, count(*) FROM public.twice GROUP BY n ORDER BY n").fetchall()
    assert counts == [(1, 20000)], counts
