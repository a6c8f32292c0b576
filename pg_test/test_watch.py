"""watch(id): the end of a watched instance is announced on
`sturdy_instance` by each way an instance ends (finish, transition, a queue
row dying at max_attempts), at commit and only then; an unwatched one
announces nothing; and a watch racing an end never misses it."""
import threading
import uuid

from sturdy import connect, wait_notifies


def started(c, queue):
    return c.execute("SELECT sturdy.start('watched', %s, '{}', queue => %s)",
                     (uuid.uuid4().hex, queue)).fetchone()[0]


def heard(listener, seconds=1.0):
    return [payload for channel, payload in wait_notifies(listener, seconds) if channel == "sturdy_instance"]


def test_each_way_an_instance_ends_announces_a_watched_one_at_commit():
    q = "watch-" + uuid.uuid4().hex[:8]
    with connect() as listener, connect() as app, connect(autocommit=False) as tx:
        listener.execute("LISTEN sturdy_instance")
        app.execute("SELECT sturdy.retry_queue(%s, max_attempts => 1)", (q,))
        by_finish, by_transition, by_death, unwatched = (started(app, q) for _ in range(4))
        for i in (by_finish, by_transition, by_death):
            assert app.execute("SELECT status FROM sturdy.watch(%s)", (i,)).fetchone() == ("pending",)
        taken = {w: (r, t) for w, r, t in app.execute(
            "SELECT workflow, receipt, token FROM sturdy.take(%s, '1 minute', 10, claim => true)", (q,))}
        r, t = taken[f"watched/{by_finish}"]
        tx.execute("SELECT sturdy.finish(%s, %s, %s, status => 'succeeded', queue => %s)",
                   (f"watched/{by_finish}", t, r, q))
        assert heard(listener, 0.3) == [], "not before the commit"
        tx.commit()
        assert heard(listener) == [str(by_finish)]
        app.execute("SELECT sturdy.transition(%s, 'pending', 'cancelled')", (by_transition,))
        assert heard(listener) == [str(by_transition)]
        r, t = taken[f"watched/{by_death}"]
        app.execute("SELECT sturdy.fail(%s, %s, 'boom', %s)", (f"watched/{by_death}", r, q))
        assert heard(listener) == [str(by_death)]
        r, t = taken[f"watched/{unwatched}"]
        app.execute("SELECT sturdy.finish(%s, %s, %s, status => 'succeeded', queue => %s)",
                    (f"watched/{unwatched}", t, r, q))
        assert heard(listener, 0.5) == [], "an unwatched instance ends without a notification"


def test_a_watch_racing_an_end_either_sees_it_or_hears_it():
    """Many rounds of a watch and a transition to succeeded at once: the
    watch answers succeeded, or it answered running and the notification
    comes."""
    q = "watchrace-" + uuid.uuid4().hex[:8]
    with connect() as app, connect() as waiter, connect() as mover:
        waiter.execute("LISTEN sturdy_instance")
        for _ in range(100):
            i = started(app, q)
            app.execute("SELECT sturdy.transition(%s, 'pending', 'running')", (i,))
            go = threading.Barrier(2)
            answer = []

            def watch():
                go.wait()
                answer.append(waiter.execute("SELECT status FROM sturdy.watch(%s)", (i,)).fetchone()[0])

            t = threading.Thread(target=watch)
            t.start()
            go.wait()
            mover.execute("SELECT sturdy.transition(%s, 'running', 'succeeded')", (i,))
            t.join()
            if answer == ["running"]:
                got = [n.payload for n in waiter.notifies(timeout=5.0, stop_after=1)]
                assert got == [str(i)], "it answered running: the end must be announced"
            else:
                assert answer == ["succeeded"]
                heard(waiter, 0.05)
