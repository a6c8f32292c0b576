"""sturdy.health from outside: what it shows of other sessions, and the
rows that turn not ok."""
import datetime
import time

import psycopg
import pytest

from sturdy import SERVER, connect


def test_health_shows_the_snapshot_a_forgotten_transaction_pins():
    """A session left in REPEATABLE READ holds a snapshot: sturdy.health's
    'oldest snapshot' shows its age, and nothing once it ends."""
    def age(c):
        """The time part of the signal's value ('-' when nobody holds one)."""
        return c.execute("SELECT value FROM sturdy.health WHERE signal = 'oldest snapshot'").fetchone()[0].split()[0]

    with connect() as c:
        with connect(autocommit=False) as pinned:
            pinned.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            pinned.execute("SELECT count(*) FROM sturdy.queue").fetchone()
            time.sleep(1.1)
            assert "00:00:01" <= age(c) < "00:01:00", age(c)
            pinned.rollback()
        assert age(c) in ("-", "00:00:00"), age(c)


def test_health_flags_dead_tuples_until_a_vacuum_takes_them():
    """sturdy.health's dead-tuples row for a busy table turns not ok when
    most of its row versions are dead, and ok again once a vacuum has
    removed them (its threshold: a fifth of the table, at least 200)."""

    def dead_ok(c):
        # forced, the counts are flushed as the backend goes idle, before it answers
        c.execute("SELECT pg_stat_force_next_flush()")
        with connect() as fresh:  # a new transaction, a new statistics snapshot
            return fresh.execute("SELECT ok FROM sturdy.health WHERE signal = 'dead tuples claims'").fetchone()[0]

    with connect() as c:
        c.execute("VACUUM sturdy.claims")
        assert dead_ok(c), "dead tuples in sturdy.claims before the test"
        c.execute("INSERT INTO sturdy.claims (workflow, token, held_until, claimed_at)"
                  " SELECT 'dead-' || i, 1, now(), now() FROM generate_series(1, 20000) i")
        c.execute("DELETE FROM sturdy.claims WHERE workflow LIKE 'dead-%'")
        flagged = dead_ok(c)
        c.execute("VACUUM sturdy.claims")
        cleared = dead_ok(c)
    assert (flagged, cleared) == (False, True), f"(ok with 20,000 dead, ok after VACUUM) = {(flagged, cleared)}"


def pin_a_snapshot():
    """Begun when the pytest session starts (conftest.py): a database of its
    own, where one session holds a REPEATABLE READ snapshot, so the tests in
    between pass the five minutes the threshold needs. Returns that
    session."""
    with psycopg.connect(f"{SERVER} dbname=postgres", autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS sturdy_health_pin WITH (FORCE)")
        c.execute("CREATE DATABASE sturdy_health_pin")
    with psycopg.connect(f"{SERVER} dbname=sturdy_health_pin", autocommit=True) as c:
        c.execute("CREATE EXTENSION pg_sturdy")
    pinned = psycopg.connect(f"{SERVER} dbname=sturdy_health_pin")
    pinned.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    pinned.execute("SELECT count(*) FROM sturdy.queue").fetchone()
    return pinned


@pytest.mark.last
@pytest.mark.begun_early.with_args(pin_a_snapshot)
def test_health_flags_a_snapshot_held_for_five_minutes(begun_early):
    """'oldest snapshot' is ok while the oldest snapshot is younger than five
    minutes, turns not ok once it is older (by the server's clock), and is
    ok again when it ends. Runs last, in a database of its own: the
    snapshot, begun when the session started, holds back nothing of the
    other tests' databases."""
    pinned = begun_early
    pid = pinned.info.backend_pid
    seen = []
    with psycopg.connect(f"{SERVER} dbname=sturdy_health_pin", autocommit=True) as c:
        def look():
            (age,) = c.execute("SELECT now() - xact_start FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            (ok, value) = c.execute("SELECT ok, value FROM sturdy.health WHERE signal = 'oldest snapshot'").fetchone()
            seen.append((age.total_seconds(), ok, value))
            return age, ok

        age, ok = look()
        # A session whose other tests took five minutes reaches here with the
        # snapshot already older: the young half is then seen below, with a
        # snapshot begun afresh.
        young_first = age < datetime.timedelta(minutes=5)
        if young_first:
            assert ok, f"not ok at {seen[-1]}: the threshold is under five minutes"
        deadline = time.monotonic() + 420
        while age <= datetime.timedelta(minutes=5, seconds=1):
            assert time.monotonic() < deadline, f"the snapshot never got five minutes old: {seen[-1]}"
            time.sleep(min(5.0, max(0.2, (datetime.timedelta(minutes=5, seconds=1) - age).total_seconds())))
            age, ok = look()
        assert not ok, f"still ok with a snapshot {age} old: {seen[-1]}"
        pinned.rollback()
        pinned.close()
        (ok, value) = c.execute("SELECT ok, value FROM sturdy.health WHERE signal = 'oldest snapshot'").fetchone()
        assert ok, f"not ok once the snapshot ended: {value}"
        if not young_first:
            with psycopg.connect(f"{SERVER} dbname=sturdy_health_pin") as fresh:
                fresh.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                fresh.execute("SELECT count(*) FROM sturdy.queue").fetchone()
                pid = fresh.info.backend_pid
                time.sleep(1)
                age, ok = look()
                assert ok and age >= datetime.timedelta(seconds=1), f"a young snapshot not ok: {seen[-1]}"
    print(f"     seen (age s, ok, value): {seen[0]}, {seen[-1]}, then ok with none")


def test_two_samplers_at_once_count_each_ended_row_once():
    """pg_cron and a dashboard calling sturdy.sample() at the same moment
    each read the history before either committed, and both counted the
    rows that ended since the last sample: twice. Now a sampler waits for
    the one under way and counts from its sample."""
    from sturdy import Worker
    with connect() as c, connect() as s1, connect() as s2:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'twice'")
        c.execute("SELECT sturdy.schedule('tw-' || i, now() - interval '1 minute', 'twice')"
                  " FROM generate_series(1, 5) i")
        c.execute("SELECT sturdy.sample()")
        start = c.execute("SELECT max(sampled_at) FROM sturdy.samples WHERE kind = 'queue' AND name = 'twice'"
                          ).fetchone()[0]
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'twice' AND workflow IN ('tw-1', 'tw-2')")
        s1.autocommit = False
        s1.execute("SELECT sturdy.sample()")
        done = []
        t = Worker(target=lambda: done.append(s2.execute("SELECT sturdy.sample()").fetchone()))
        t.start()
        time.sleep(0.5)
        assert t.is_alive(), "the second sampler did not wait for the first"
        s1.commit()
        t.join(30)
        assert done
        ended = c.execute("SELECT array_agg((figures->>'ended')::int ORDER BY sampled_at) FROM sturdy.samples"
                          " WHERE kind = 'queue' AND name = 'twice' AND sampled_at > %s", (start,)).fetchone()[0]
        assert ended == [2, 0], f"ended per sample after the two rows went: {ended}"
