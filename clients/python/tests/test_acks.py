"""`AsyncAcks` against a real server: each job acknowledged by its own
receipt whatever its flush holds, acknowledgements gathered into few
flushes, a flush the connection lost sent again and counted, a refused one
counted as failed without hanging, and nothing queued lost at close."""
import asyncio
import datetime as dt
import uuid

import psycopg
import pytest

from pg_sturdy import AsyncAcks, Sturdy

LEASE = dt.timedelta(minutes=5)


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def taken(conn, queue, n):
    s = Sturdy(conn)
    s.schedule_many([f"{queue}/{i}" for i in range(n)], [{"i": i} for i in range(n)], queue)
    jobs = s.take(queue, LEASE, n)
    assert len(jobs) == n
    return jobs


def left(conn, queue):
    return conn.execute("SELECT count(*) FROM sturdy.queue WHERE queue = %s", (queue,)).fetchone()[0]


def connector(dsn, name, **options):
    async def connect():
        return await psycopg.AsyncConnection.connect(dsn, autocommit=True, application_name=name, **options)
    return connect


def test_each_job_is_acknowledged_by_its_own_receipt(dsn, conn):
    q = unique("acks")
    jobs = taken(conn, q, 50)
    # five rescheduled while taken: their receipts no longer match, they stay
    s = Sturdy(conn)
    for j in jobs[:5]:
        s.schedule(j.workflow, queue=q)

    async def main():
        async with AsyncAcks(connector(dsn, "acks-own"), q) as acks:
            for j in jobs:
                acks.done(j.workflow, j.receipt)
            await acks.flush()
            assert acks.pending == 0
            return acks.removed

    assert asyncio.run(main()) == 45
    rows = {w for (w,) in conn.execute("SELECT workflow FROM sturdy.queue WHERE queue = %s", (q,))}
    assert rows == {j.workflow for j in jobs[:5]}


def test_acknowledgements_queued_together_go_in_few_flushes(dsn, conn):
    q = unique("acks")
    jobs = taken(conn, q, 200)
    flushes = []

    async def main():
        acks = AsyncAcks(connector(dsn, "acks-few"), q, flushers=2, max_batch=64, on_removed=flushes.append)
        acks.start()
        for j in jobs:
            acks.done(j.workflow, j.receipt)
        await acks.close()
        return acks.removed

    assert asyncio.run(main()) == 200
    assert sorted(flushes) == [8, 64, 64, 64], flushes
    assert left(conn, q) == 0


def test_a_flush_whose_connection_was_lost_is_sent_again_and_counted(dsn, conn):
    q = unique("acks")
    name = unique("acks-lost")
    jobs = taken(conn, q, 11)

    async def main():
        async with AsyncAcks(connector(dsn, name), q, flushers=1, retry=(0.01, 0.05)) as acks:
            acks.done(jobs[0].workflow, jobs[0].receipt)
            await acks.flush()
            killed = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                  " WHERE application_name = %s", (name,)).fetchone()[0]
            assert killed == 1
            for j in jobs[1:]:
                acks.done(j.workflow, j.receipt)
            await acks.flush()
            assert isinstance(acks.last_error, psycopg.OperationalError)
            return acks.removed, acks.failed

    assert asyncio.run(main()) == (11, 0)
    assert left(conn, q) == 0


def test_a_flush_whose_answer_was_lost_after_its_commit_counts_the_rows_it_removed(dsn, conn, monkeypatch):
    """The commit went through and the connection died before the answer:
    sent again, `done_many` removes nothing, and the jobs gone from the
    queue are the lost commit's."""
    import pg_sturdy.acks

    q = unique("acks")
    jobs = taken(conn, q, 7)
    answers = []

    class AnswerLost(pg_sturdy.acks.AsyncSturdy):
        async def run(self, stmt):
            n = await super().run(stmt)
            answers.append(n)
            if len(answers) == 1:
                await self.conn.close()
                raise psycopg.OperationalError("the server closed the connection before its answer")
            return n

    monkeypatch.setattr(pg_sturdy.acks, "AsyncSturdy", AnswerLost)

    async def main():
        async with AsyncAcks(connector(dsn, "acks-answer"), q, flushers=1, retry=(0.01, 0.05)) as acks:
            for j in jobs:
                acks.done(j.workflow, j.receipt)
            await acks.flush()
            return acks.removed

    assert asyncio.run(main()) == 7
    assert answers == [7, 0], "committed once, sent again, removing nothing the second time"
    assert left(conn, q) == 0


def test_a_refused_flush_counts_as_failed_and_its_jobs_stay_for_their_leases(dsn, conn):
    q = unique("acks")
    jobs = taken(conn, q, 3)

    async def main():
        connect = connector(dsn, "acks-refused", options="-c default_transaction_read_only=on")
        async with AsyncAcks(connect, q) as acks:
            for j in jobs:
                acks.done(j.workflow, j.receipt)
            await acks.flush()
            return acks.removed, acks.failed, acks.last_error

    removed, failed, error = asyncio.run(asyncio.wait_for(main(), 30))
    assert (removed, failed) == (0, 3)
    assert isinstance(error, psycopg.errors.ReadOnlySqlTransaction), error
    assert left(conn, q) == 3


def test_close_sends_what_is_queued_and_later_acknowledgements_are_refused(dsn, conn):
    q = unique("acks")
    jobs = taken(conn, q, 20)

    async def main():
        acks = AsyncAcks(connector(dsn, "acks-close"), q)
        with pytest.raises(RuntimeError):
            acks.done(jobs[0].workflow, jobs[0].receipt)
        acks.start()
        for j in jobs:
            acks.done(j.workflow, j.receipt)
        await acks.close()
        with pytest.raises(RuntimeError):
            acks.done(jobs[0].workflow, jobs[0].receipt)
        return acks.removed

    assert asyncio.run(main()) == 20
    assert left(conn, q) == 0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        AsyncAcks(connector("", "x"), flushers=0)
    with pytest.raises(ValueError):
        AsyncAcks(connector("", "x"), max_batch=0)
    with pytest.raises(ValueError):
        AsyncAcks(connector("", "x"), max_batch=10_001)
