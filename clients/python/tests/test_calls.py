"""The calls: one method per SQL function, the contract's errors as
exceptions, receipts kept exactly, sync and async alike."""
import asyncio
import datetime as dt
import inspect
import time
import uuid

import psycopg
import pytest

from pg_sturdy import AsyncSturdy, Conflict, Fenced, InvalidArgument, Sturdy, Taken
from pg_sturdy.client import wrapped


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_every_function_of_the_catalog_is_wrapped_with_its_arguments(conn):
    """Each function and procedure of the extension has a method, sync and
    async, whose parameters are the function's input arguments by name and
    in order; the test fails when the catalog has one the client lacks."""
    catalog = conn.execute("""
        SELECT p.proname, COALESCE((SELECT array_agg(n ORDER BY i) FROM unnest(p.proargnames, p.proargmodes)
                                        WITH ORDINALITY AS a(n, m, i) WHERE m IN ('i', 'b')),
                                   p.proargnames, '{}')
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
         WHERE n.nspname = 'sturdy' AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_sturdy')
           AND p.prorettype <> 'trigger'::regtype""").fetchall()
    assert len(catalog) > 30
    for cls in (Sturdy, AsyncSturdy):
        methods = wrapped(cls)
        shapes = {(b.__name__ if b.__name__ != "redrive_workflow" else "redrive",
                   tuple(inspect.signature(b).parameters)) for b in methods.values()}
        missing = []
        for name, args in catalog:
            # batch_all's INOUT arguments are its results
            args = tuple(args[:8]) if name == "batch_all" else tuple(args)
            if (name, args) not in shapes:
                missing.append(f"{name}({', '.join(args)})")
        assert not missing, f"{cls.__name__} does not wrap: {missing}"


def test_a_pass_through_the_calls_and_the_receipt_kept_exactly(conn):
    s = Sturdy(conn)
    q, w = unique("cq"), unique("w")
    s.schedule(w, queue=q)
    [t] = s.take(q, dt.timedelta(minutes=1), claim=True)
    assert isinstance(t, Taken) and (t.workflow, t.attempt) == (w, 1) and t.token >= 1
    assert isinstance(t.receipt, str)
    # a receipt that lost its microseconds no longer matches: done says false
    exact = conn.execute("SELECT %s::timestamptz", (t.receipt,)).fetchone()[0]
    if exact.microsecond:
        assert s.done(w, exact.replace(microsecond=0), q) is False
    rec = s.record(w, "step", {"n": 1}, t.token)
    assert (rec.value, rec.first) == ({"n": 1}, True)
    assert [c.step for c in s.load(w)] == ["step"]
    assert s.finish(w, t.token, t.receipt, "end", [1, 2], queue=q) is True
    assert s.take(q) == []


def test_jobs_with_their_input_enqueued_in_bulk_and_handed_out_by_take(conn, dsn):
    s = Sturdy(conn)
    q = unique("jobs")
    assert s.schedule_many([f"{q}/1", f"{q}/2", f"{q}/3"], [{"to": "a"}, None, [1, 2]], q) == 3
    taken = s.take(q, dt.timedelta(minutes=1), max=10)
    assert [(t.workflow, t.input) for t in taken] == [(f"{q}/1", {"to": "a"}), (f"{q}/2", None), (f"{q}/3", [1, 2])]
    assert s.done_many([t.workflow for t in taken], [t.receipt for t in taken], q) == 3
    # a worker's pass carries its job's input
    seen = []
    s.schedule_many([f"{q}/4"], [{"n": 4}], q)
    from pg_sturdy import Worker
    w = Worker(dsn, q, lambda p: seen.append(p.input))
    w.start()
    try:
        deadline = time.monotonic() + 30
        while not seen:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        w.stop()
        w.join(0)
    assert seen == [{"n": 4}]
    with pytest.raises(InvalidArgument):
        s.schedule_many(["a", "b"], [1], q)


def test_errors_come_as_the_contract_says(conn):
    s = Sturdy(conn)
    w = unique("w")
    token = s.claim(w, "1 minute")
    s.claim(w + "-other", "1 minute")
    with pytest.raises(Fenced) as fenced:
        s.record(w, "x", 1, token + 1)
    assert fenced.value.sqlstate == "SD001"
    with pytest.raises(InvalidArgument) as bad:
        s.schedule("", queue="q")
    assert bad.value.sqlstate == "22023" and isinstance(bad.value, ValueError)
    with pytest.raises(InvalidArgument) as null:
        s.done(w, None)
    assert null.value.sqlstate == "22004"
    i = s.start("proc", unique("bk"))
    assert s.transition(i, "pending", "succeeded") is True
    [(workflow,)] = conn.execute("SELECT workflow FROM sturdy.instances WHERE id = %s", (i,)).fetchall()
    token = s.claim(workflow)
    with pytest.raises(Conflict) as conflict:
        s.finish(workflow, token, dt.datetime.now(dt.timezone.utc), status="failed")
    assert conflict.value.sqlstate == "SD002"
    # anything else comes through as psycopg raised it
    with pytest.raises(psycopg.errors.UndefinedTable):
        conn.execute("SELECT * FROM no_such_table")


def test_the_operator_calls_read_back(conn):
    s = Sturdy(conn)
    q = unique("oq")
    s.retry_queue(q, max_attempts=2, backoff="0 seconds")
    s.limit_queue(q, running=3)
    s.schedule(unique("w"), queue=q)
    [stats] = [x for x in s.queue_stats() if x.queue == q]
    assert (stats.ready, stats.running, stats.dead) == (1, 3, 0)
    assert {x.signal for x in s.health()} >= {"dead workflows"}
    assert set(s.sweep("7 days", 10)) >= {"instances", "lapsed", "dead"}
    assert s.pause(q) is True and s.resume(q) is True


def test_failing_and_redriving_through_the_calls(conn):
    s = Sturdy(conn)
    q, w = unique("fq"), unique("w")
    s.retry_queue(q, max_attempts=1)
    s.schedule(w, queue=q)
    [t] = s.take(q)
    assert s.fail(w, t.receipt, "boom", q, code="XX001") is True
    assert conn.execute("SELECT attempts, last_error, last_sqlstate FROM sturdy.queue WHERE workflow = %s",
                        (w,)).fetchone() == (1, "boom", "XX001")
    assert s.redrive_workflow(w, q) is True
    [t] = s.take(q)
    assert t.attempt == 1
    longer = s.extend(w, t.receipt, "10 minutes", q)
    assert longer is not None and s.done(w, t.receipt, q) is False and s.done(w, longer, q) is True
    assert s.cancel(w, q) is False


def test_async_calls_alike(dsn):
    async def main():
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            s = AsyncSturdy(c)
            q, w = unique("aq"), unique("w")
            await s.schedule(w, queue=q)
            [t] = await s.take(q, "1 minute", claim=True)
            await s.record(w, "a", {"x": 1}, t.token)
            with pytest.raises(Fenced):
                await s.record(w, "b", 1, t.token + 1)
            assert await s.finish(w, t.token, t.receipt, queue=q) is True
            return [c.step for c in await s.load(w)]

    assert asyncio.run(main()) == ["a"]


def test_no_statement_is_prepared_unless_asked(conn):
    s = Sturdy(conn)
    for _ in range(8):
        s.take(unique("pq"))
    assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 0
    Sturdy(conn, prepare=True).take("pq")
    assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 1


def test_a_connection_that_makes_dicts_still_reads_tuples(dsn):
    from psycopg.rows import dict_row
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
        s = Sturdy(c)
        q, w = unique("dq"), unique("w")
        s.schedule(w, queue=q)
        [t] = s.take(q)
        assert t.workflow == w and s.done(w, t.receipt, q) is True
