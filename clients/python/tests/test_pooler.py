"""The client behind PgBouncer in transaction mode (pg_test/pooler.py
starts one in front of the suites' server): no statement is prepared, so
every call works on whichever server connection the pooler gives; a worker
that polls (listen=False) finishes workflows with their steps, through a
SIGTERM of one of two workers."""
import datetime as dt
import os
import sys
import time
import uuid

import psycopg
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "pg_test"))

from pg_sturdy import Fenced, Pass, Sturdy, Worker  # noqa: E402


@pytest.fixture(scope="module")
def pooled():
    if not os.environ.get("STURDY_SERVER"):
        pytest.skip("STURDY_SERVER not set: run through scripts/suites.sh")
    from pooler import Bouncer
    b = Bouncer()
    if b.binary is None:
        pytest.skip("pgbouncer is not installed (scripts/bootstrap.sh installs it)")
    b.start()
    try:
        yield b.dsn()
    finally:
        b.stop()


def test_every_kind_of_call_through_the_pooler(pooled):
    # (a connection that would prepare after five runs, as psycopg does by default)
    with psycopg.connect(pooled, autocommit=True) as c:
        s = Sturdy(c)
        q = f"pool-{uuid.uuid4().hex[:8]}"
        for i in range(12):
            w = f"{q}-{i}"
            s.schedule(w, queue=q)
            [t] = s.take(q, "1 minute", claim=True)
            s.record(t.workflow, "a", i, t.token)
            with pytest.raises(Fenced):
                s.record(t.workflow, "b", i, t.token + 1)
            assert s.finish(t.workflow, t.token, t.receipt, queue=q) is True
        assert s.take(q) == []


def test_polling_workers_finish_every_workflow_with_its_steps(pooled, conn):
    q = f"poolw-{uuid.uuid4().hex[:8]}"
    s = Sturdy(conn)
    names = [f"{q}-{i}" for i in range(60)]
    for n in names:
        s.schedule(n, queue=q)
    ran = []

    def handle(p: Pass):
        p.step("one", lambda: ran.append((p.workflow, "one")) or 1)
        p.step("two", lambda: ran.append((p.workflow, "two")) or 2)

    workers = [Worker(pooled, q, handle, listen=False, lease=dt.timedelta(seconds=5)) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + 60
        while conn.execute("SELECT count(*) FROM sturdy.queue WHERE queue = %s", (q,)).fetchone()[0]:
            assert time.monotonic() < deadline, "the workers did not finish within a minute"
            time.sleep(0.05)
    finally:
        for w in workers:
            w.stop()
        for w in workers:
            w.join()
    assert sorted(ran) == sorted((n, step) for n in names for step in ("one", "two"))
    assert not any(w.errors for w in workers)
