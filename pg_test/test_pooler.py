"""pg_sturdy behind PgBouncer in transaction mode (pooler.py): every function
of the catalog, the multi-connection guarantees with many clients sharing
few server connections, and what each backend keeps for itself met by the
next client on the same backend (docs/operations.md, "Poolers and
drivers")."""
import itertools
import threading
import time

import psycopg
import pytest

from pooler import ONE_BACKEND
from psycopg.types.json import Jsonb

from sturdy import Worker, connect, start_and_join, wait_notifies


def fresh_role(c, role):
    """`role`, created again without the privileges an earlier run gave it."""
    if c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
        c.execute(f"DROP OWNED BY {role}")
        c.execute(f"DROP ROLE {role}")
    c.execute(f"CREATE ROLE {role}")


def backend_of(c):
    return c.execute("SELECT pg_backend_pid()").fetchone()[0]


def test_every_function_of_the_catalog_through_transaction_pooling(bouncer):
    """Each function and procedure in schema sturdy, called through the
    pooler from three clients in turn (each call its own transaction, on
    whichever server connection is free), gives the answer it gives a
    direct connection. The list must name every one the catalog has."""
    with connect() as c:
        c.execute("DROP SCHEMA IF EXISTS pooled_app CASCADE")
        c.execute("CREATE SCHEMA pooled_app")
        c.execute("CREATE TABLE pooled_app.got (m bigint, attempt int)")
        c.execute("CREATE FUNCTION pooled_app.sub(m sturdy.outbox, attempt int) RETURNS void LANGUAGE sql"
                  " AS 'INSERT INTO pooled_app.got VALUES (m.id, attempt)'")
        c.execute("CREATE FUNCTION pooled_app.fails(m sturdy.outbox, attempt int) RETURNS void LANGUAGE plpgsql"
                  " AS $$BEGIN RAISE EXCEPTION 'no' USING ERRCODE = 'P0001'; END$$")
        c.execute("CREATE FUNCTION pooled_app.effect(a jsonb) RETURNS jsonb LANGUAGE sql"
                  " AS $$SELECT jsonb_build_object('doubled', (a->>'n')::int * 2)$$")
        c.execute("CREATE TABLE pooled_app.rows (id int PRIMARY KEY, state text NOT NULL)")
        c.execute("INSERT INTO pooled_app.rows SELECT i, 'new' FROM generate_series(1, 50) i")
        c.execute("DELETE FROM sturdy.batches")
        c.execute("DELETE FROM sturdy.subscriptions WHERE event LIKE 'pooled.%'")
        for table, column in (("checkpoints", "workflow"), ("claims", "workflow"), ("queue", "queue"),
                              ("instances", "process"), ("idempotency_keys", "process")):
            c.execute(f"DELETE FROM sturdy.{table} WHERE {column} LIKE 'pooled%%'")
        fresh_role(c, "sturdy_pooled_user")
        functions = {r[0] for r in c.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'sturdy'::regnamespace")}
    clients = [bouncer.connect() for _ in range(3)]
    turn = itertools.cycle(clients)
    one = lambda sql, *args: next(turn).execute(sql, args or None).fetchone()
    calls = []

    def call(name, sql, *args):
        calls.append(name)
        return one(sql, *args)

    token = call("claim", "SELECT sturdy.claim('pooled-w', '1 minute', 'me')")[0]
    assert token is not None
    assert call("renew", "SELECT sturdy.renew('pooled-w', %s, '2 minutes') > now()", token) == (True,)
    assert call("fence", "SELECT sturdy.fence('pooled-w', %s)::text", token) == ("",)
    assert call("record", "SELECT recorded, first FROM sturdy.record('pooled-w', 's1', %s, %s)",
                Jsonb({"a": 1}), token) == ({"a": 1}, True)
    assert call("supply", "SELECT sturdy.supply('pooled-w', 's1', '{\"a\": 2}')") == ({"a": 1},)
    assert call("load", "SELECT count(*) FROM sturdy.load('pooled-w')") == (1,)
    assert call("transact", "SELECT sturdy.transact('pooled-w', %s, 's2', 'pooled_app.effect(jsonb)', '{\"n\": 21}')",
                token) == ({"doubled": 42},)
    assert call("release", "SELECT sturdy.release('pooled-w', %s)", token) == (True,)
    call("schedule", "SELECT sturdy.schedule('pooled-q1', now(), 'pooled')")
    call("schedule", "SELECT sturdy.schedule('pooled-q2', now(), 'pooled')")
    w, receipt, tok = call("take", "SELECT workflow, receipt, token FROM sturdy.take('pooled', '1 minute', 1, true)")
    assert (w, tok is not None) == ("pooled-q1", True)
    assert call("wake_at", "SELECT sturdy.wake_at(%s, %s, now() + interval '1 hour', 'pooled')", w, receipt) == (True,)
    w2, receipt2, _ = call("take", "SELECT workflow, receipt, token FROM sturdy.take('pooled')")
    assert w2 == "pooled-q2"
    (receipt2,) = call("extend", "SELECT sturdy.extend(%s, %s, '5 minutes', 'pooled')", w2, receipt2)
    assert receipt2 is not None
    assert call("done", "SELECT sturdy.done(%s, %s, 'pooled')", w2, receipt2) == (True,)
    call("schedule", "SELECT sturdy.schedule('pooled-q3', now(), 'pooled')")
    rows = next(turn).execute("SELECT workflow, receipt FROM sturdy.take('pooled', max => 5)").fetchall()
    assert [r[0] for r in rows] == ["pooled-q3"]
    assert call("done_many", "SELECT sturdy.done_many(%s, %s, 'pooled')",
                [r[0] for r in rows], [r[1] for r in rows]) == (1,)
    call("retry_queue", "SELECT sturdy.retry_queue('pooled', max_attempts => 1)")
    call("schedule", "SELECT sturdy.schedule('pooled-f', now(), 'pooled')")
    wf, receiptf, attempt = call("take", "SELECT workflow, receipt, attempt FROM sturdy.take('pooled')")
    assert (wf, attempt) == ("pooled-f", 1)
    assert call("fail", "SELECT sturdy.fail(%s, %s, 'no', 'pooled', code => 'P0001')", wf, receiptf) == (True,)
    assert one("SELECT visible_at = 'infinity', last_sqlstate FROM sturdy.queue WHERE workflow = 'pooled-f'") \
        == (True, "P0001"), "dead at its one attempt"
    # untyped parameters, as a driver sends them: two arguments are the queue's redrive
    assert call("redrive", "SELECT sturdy.redrive(%s, %s)", wf, "pooled") == (True,)
    assert call("cancel", "SELECT sturdy.cancel(%s, %s)", wf, "pooled") == (True,)
    call("retry_queue", "SELECT sturdy.retry_queue('pooled')")
    assert call("arrive", "SELECT sturdy.arrive('pooled-a', 'ok', '{\"v\": 1}', 'pooled')") == ({"v": 1},)
    w3, receipt3, token3 = call("take", "SELECT workflow, receipt, token FROM sturdy.take('pooled', claim => true)")
    assert w3 == "pooled-a"
    assert call("finish", "SELECT sturdy.finish(%s, %s, %s, 'end', '{\"e\": 1}', queue => 'pooled')",
                w3, token3, receipt3) == (True,)
    call("subscribe", "SELECT sturdy.subscribe('pooled.e', 'pooled_app.sub(sturdy.outbox, integer)')")
    call("subscribe", "SELECT sturdy.subscribe('pooled.e', 'pooled_app.fails(sturdy.outbox, integer)', 1)")
    assert call("emit", "SELECT outbox IS NOT NULL, deliveries FROM sturdy.emit('pooled.e', '{}', 'agg')") == (True, 2)
    delivered = 0
    for _ in range(20):
        delivered += call("pump", "SELECT delivered FROM sturdy.pump(100)")[0]
        if delivered >= 1:
            break
    assert one("SELECT count(*) FROM pooled_app.got") == (1,)
    dead = one("SELECT id FROM sturdy.deliveries WHERE state = 'dead' AND subscriber LIKE 'pooled_app.fails%'")[0]
    assert call("redrive", "SELECT sturdy.redrive(%s)", dead) == (True,)
    assert call("unsubscribe", "SELECT sturdy.unsubscribe('pooled.e', 'pooled_app.fails(sturdy.outbox, integer)')") \
        == (True,)
    iid = call("start", "SELECT sturdy.start('pooled-p', 'bk-1', '{}', 'key-1', 'pooled-wf')")[0]
    assert call("start", "SELECT sturdy.start('pooled-p', 'bk-1', '{}', 'key-1', 'pooled-wf')") == (iid,)
    assert call("status", "SELECT id, status FROM sturdy.status('bk-1')") == (iid, "pending")
    assert call("transition", "SELECT sturdy.transition(%s, 'pending', 'running')", iid) == (True,)
    assert call("watch", "SELECT status FROM sturdy.watch(%s)", iid) == ("running",)
    assert call("schedule_many", "SELECT sturdy.schedule_many(ARRAY['pooled-j1', 'pooled-j2'],"
                " ARRAY['{\"n\": 1}', NULL]::jsonb[], 'pooled-jobs')") == (2,)
    assert call("stuck", "SELECT count(*) FROM sturdy.stuck('1 hour')") == (0,)
    assert call("sample", "SELECT sturdy.sample() > 0") == (True,)
    assert call("sweep", "SELECT string_agg(kind, ',' ORDER BY kind) FROM sturdy.sweep('7 days', 10)") == \
        ("checkpoints,claims,dead,idempotency_keys,instances,key_places,lapsed,outbox,queue,samples",)
    assert call("batch", "SELECT done FROM sturdy.batch('pooled_app.rows', 'state = $1', 'state = $2',"
                " ARRAY['half', 'new'], 25)") == (25,)
    call("batch_start", "SELECT sturdy.batch_start('pooled-job', 'pooled_app.rows', 'state = $1', 'state = $2',"
         " ARRAY['ticked', 'half'], 10)")
    while not call("batch_tick", "SELECT complete FROM sturdy.batch_tick('pooled-job')")[0]:
        pass
    c = next(turn)
    c.execute("CALL sturdy.batch_all('pooled_app.rows', 'state = $1', 'state = $2', ARRAY['all', 'new'], 10)")
    calls.append("batch_all")
    assert one("SELECT string_agg(DISTINCT state, ',' ORDER BY state) FROM pooled_app.rows") == ("all,ticked",)
    call("limit_queue", "SELECT sturdy.limit_queue('pooled-lim', running => 1)")
    call("schedule", "SELECT sturdy.schedule('pl-' || i, now(), 'pooled-lim') FROM generate_series(1, 3) i")
    assert one("SELECT count(*) FROM sturdy.take('pooled-lim', max => 3)") == (1,)
    assert call("pause", "SELECT sturdy.pause('pooled-lim')") == (True,)
    assert call("resume", "SELECT sturdy.resume('pooled-lim')") == (True,)
    call("queue_changed", "SELECT sturdy.queue_changed('pooled-lim')")
    call("queue_backdated", "SELECT sturdy.queue_backdated('pooled-lim')")
    assert call("workflow_place", "SELECT sturdy.workflow_place('pooled-lim/7')") == ("pooled-lim",)
    # one server: no node to go to
    assert one("SELECT count(*) FROM sturdy.queue_node('pooled-lim')") == (0,)
    calls.append("queue_node")
    call("limit_queue", "SELECT sturdy.limit_queue('pooled-lim')")
    call("grant_usage", "SELECT sturdy.grant_usage('sturdy_pooled_user')")
    # without Citus: refused with its SQLSTATE, the connection fine after it
    calls.append("distribute")
    c = next(turn)
    with pytest.raises(psycopg.errors.FeatureNotSupported):
        c.execute("SELECT sturdy.distribute()")
    assert c.execute("SELECT 1").fetchone() == (1,)
    for view in ("queue_stats", "outbox_stats", "batch_jobs", "health"):
        one(f"SELECT count(*) FROM sturdy.{view}")
    for c in clients:
        c.close()
    assert functions - set(calls) == set(), "functions of the catalog this test does not call"


def test_concurrent_takers_through_the_pooler_never_share_a_row(bouncer):
    """Twelve clients on three server connections, take and done until the
    queue is empty: 600 rows, each taken once, every done true."""
    with connect() as c:
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'pooled-many'")
        c.execute("SELECT sturdy.schedule('pm-' || i, now(), 'pooled-many') FROM generate_series(1, 600) i")
    taken, refused = [], []

    def worker():
        with bouncer.connect() as c:
            idle = 0
            while idle < 3:
                row = c.execute("SELECT workflow, receipt FROM sturdy.take('pooled-many')").fetchone()
                if row is None:
                    idle += 1
                    time.sleep(0.02)
                    continue
                taken.append(row[0])
                if not c.execute("SELECT sturdy.done(%s, %s, 'pooled-many')", row).fetchone()[0]:
                    refused.append(row[0])

    start_and_join([Worker(target=worker) for _ in range(12)])
    assert len(taken) == 600 and len(set(taken)) == 600, (len(taken), len(set(taken)))
    assert refused == []
    with connect() as c:
        assert c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'pooled-many'").fetchone()[0] == 0


def test_a_wakeup_during_a_pass_survives_through_the_pooler(bouncer):
    """take, then arrive from another client, then done with the old
    receipt: false, and the row is there for the next take."""
    a, b = bouncer.connect(), bouncer.connect()
    a.execute("DELETE FROM sturdy.queue WHERE queue = 'pooled-wake'")
    a.execute("SELECT sturdy.schedule('pw', now(), 'pooled-wake')")
    w, receipt, _ = a.execute("SELECT workflow, receipt, token FROM sturdy.take('pooled-wake')").fetchone()
    b.execute("SELECT sturdy.arrive('pw', 'mail', '{}', 'pooled-wake')")
    assert a.execute("SELECT sturdy.done(%s, %s, 'pooled-wake')", (w, receipt)).fetchone() == (False,)
    assert b.execute("SELECT workflow FROM sturdy.take('pooled-wake')").fetchone() == ("pw",)
    a.close()
    b.close()


def test_concurrent_pumps_through_the_pooler_deliver_each_once_in_order(bouncer):
    """Four pumping clients on three server connections: 300 deliveries over
    ten aggregates, each delivered once, in emit order per aggregate."""
    with connect() as c:
        c.execute("DROP TABLE IF EXISTS public.pooled_seen")
        c.execute("CREATE TABLE public.pooled_seen (id bigserial, m bigint, agg text)")
        c.execute("CREATE OR REPLACE FUNCTION public.pooled_seen(m sturdy.outbox, attempt int) RETURNS void"
                  " LANGUAGE sql AS 'INSERT INTO public.pooled_seen (m, agg) VALUES (m.id, m.aggregate_id)'")
        c.execute("SELECT sturdy.subscribe('pooled.order', 'public.pooled_seen(sturdy.outbox, integer)')")
        c.execute("SELECT sturdy.emit('pooled.order', jsonb_build_object('i', i), 'agg-' || (i % 10))"
                  " FROM generate_series(1, 300) i")

    def pump():
        with bouncer.connect() as c:
            quiet = 0
            while quiet < 3:
                if c.execute("SELECT seen FROM sturdy.pump(7)").fetchone()[0] == 0:
                    quiet += 1
                    time.sleep(0.02)
                else:
                    quiet = 0

    start_and_join([Worker(target=pump) for _ in range(4)])
    with connect() as c:
        rows = c.execute("SELECT m, agg FROM public.pooled_seen ORDER BY id").fetchall()
        c.execute("SELECT sturdy.unsubscribe('pooled.order', 'public.pooled_seen(sturdy.outbox, integer)')")
    assert len(rows) == 300 and len({m for m, _ in rows}) == 300
    for agg in {a for _, a in rows}:
        ids = [m for m, a in rows if a == agg]
        assert ids == sorted(ids), f"{agg} out of emit order"


def test_starts_racing_on_one_key_through_the_pooler_make_one_instance(bouncer):
    ids, barrier = [], threading.Barrier(8)

    def start():
        with bouncer.connect() as c:
            barrier.wait(10)
            ids.append(c.execute("SELECT sturdy.start('pooled-race', 'bk', '{}', 'the-key')").fetchone()[0])

    start_and_join([Worker(target=start) for _ in range(8)])
    assert len(ids) == 8 and len(set(ids)) == 1, ids
    with connect() as c:
        assert c.execute("SELECT count(*) FROM sturdy.instances WHERE process = 'pooled-race'").fetchone()[0] == 1


def test_a_batch_job_ticked_from_several_clients_updates_each_row_once(bouncer):
    with connect() as c:
        c.execute("DROP TABLE IF EXISTS public.pooled_ticks")
        c.execute("CREATE TABLE public.pooled_ticks (id int PRIMARY KEY, n int NOT NULL DEFAULT 0)")
        c.execute("INSERT INTO public.pooled_ticks SELECT i FROM generate_series(1, 5000) i")
        c.execute("DELETE FROM sturdy.batches WHERE name = 'pooled-ticks'")
        c.execute("SELECT sturdy.batch_start('pooled-ticks', 'public.pooled_ticks', 'n = n + 1', 'n = 0',"
                  " chunk => 200, target_seconds => 0.05)")

    def tick():
        with bouncer.connect() as c:
            while not c.execute("SELECT complete FROM sturdy.batch_tick('pooled-ticks')").fetchone()[0]:
                pass

    start_and_join([Worker(target=tick) for _ in range(5)])
    with connect() as c:
        assert c.execute("SELECT min(n), max(n) FROM public.pooled_ticks").fetchone() == (1, 1)


# What a backend keeps for itself, met by the next client on that backend:
# each is a cache, and the next client's answer is the one it would get alone.

def test_a_floor_left_by_another_clients_take_hides_no_row(bouncer):
    """Client A's takes leave this backend's floor past the rows it took;
    client B schedules a row dated before all of them; client C's take on
    the same backend finds it."""
    a, b, c = (bouncer.connect(ONE_BACKEND) for _ in range(3))
    pid = backend_of(a)
    a.execute("DELETE FROM sturdy.queue WHERE queue = 'pooled-floor'")
    a.execute("SELECT sturdy.schedule('pf-' || i, now() - interval '1 minute', 'pooled-floor')"
              " FROM generate_series(1, 20) i")
    for _ in range(20):
        w, receipt, _ = a.execute("SELECT workflow, receipt, token FROM sturdy.take('pooled-floor')").fetchone()
        a.execute("SELECT sturdy.done(%s, %s, 'pooled-floor')", (w, receipt))
    b.execute("SELECT sturdy.schedule('pf-early', now() - interval '1 hour', 'pooled-floor')")
    assert backend_of(c) == pid
    assert c.execute("SELECT workflow FROM sturdy.take('pooled-floor')").fetchone() == ("pf-early",)
    for x in (a, b, c):
        x.close()


def test_the_idle_mark_is_read_again_for_the_next_client(bouncer):
    """Client C's schedule finds the queue unmarked (and this backend
    remembers it); a worker's empty take then marks it; C's next schedule,
    on the same backend, must still wake the listening worker."""
    listener = connect()
    listener.execute("LISTEN sturdy")
    a, c = bouncer.connect(ONE_BACKEND), bouncer.connect(ONE_BACKEND)
    a.execute("DELETE FROM sturdy.queue WHERE queue = 'pooled-mark'")
    c.execute("SELECT sturdy.schedule('pm-1', now(), 'pooled-mark')")
    w, receipt, _ = a.execute("SELECT workflow, receipt, token FROM sturdy.take('pooled-mark')").fetchone()
    a.execute("SELECT sturdy.done(%s, %s, 'pooled-mark')", (w, receipt))
    wait_notifies(listener, 0.2)
    assert a.execute("SELECT count(*) FROM sturdy.take('pooled-mark')").fetchone() == (0,)  # marks
    c.execute("SELECT sturdy.schedule('pm-2', now(), 'pooled-mark')")
    got = wait_notifies(listener, 10)
    listener.close()
    assert ("sturdy", "pooled-mark") in got, got


def test_a_queue_found_without_priorities_is_looked_at_again_for_the_next_client(bouncer):
    """Client A's takes find the queue without prioritized rows (and this
    backend remembers it); another connection schedules one at priority 3;
    client C's take on the same backend hands it out before the older
    default rows."""
    a, c = bouncer.connect(ONE_BACKEND), bouncer.connect(ONE_BACKEND)
    pid = backend_of(a)
    a.execute("DELETE FROM sturdy.queue WHERE queue = 'pooled-prio'")
    a.execute("SELECT sturdy.schedule('pp-' || i, now() - interval '1 minute', 'pooled-prio')"
              " FROM generate_series(1, 5) i")
    w, receipt, _ = a.execute("SELECT workflow, receipt, token FROM sturdy.take('pooled-prio')").fetchone()
    a.execute("SELECT sturdy.done(%s, %s, 'pooled-prio')", (w, receipt))
    with connect() as other:
        other.execute("SELECT sturdy.schedule('pp-urgent', now(), 'pooled-prio', priority => 3)")
    assert backend_of(c) == pid
    assert c.execute("SELECT workflow FROM sturdy.take('pooled-prio')").fetchone() == ("pp-urgent",)
    for x in (a, c):
        x.close()


def test_the_last_takes_row_is_only_a_shortcut_for_the_next_client(bouncer):
    """Client A takes a row (the backend keeps where its leased version
    lives); client B reschedules it; client C's done with A's receipt on
    the same backend is false and the row stays; B's own take and done go
    through."""
    a, b, c = (bouncer.connect(ONE_BACKEND) for _ in range(3))
    a.execute("DELETE FROM sturdy.queue WHERE queue = 'pooled-tid'")
    a.execute("SELECT sturdy.schedule('pt', now(), 'pooled-tid')")
    w, receipt, _ = a.execute("SELECT workflow, receipt, token FROM sturdy.take('pooled-tid')").fetchone()
    b.execute("SELECT sturdy.schedule('pt', now(), 'pooled-tid')")
    assert c.execute("SELECT sturdy.done(%s, %s, 'pooled-tid')", (w, receipt)).fetchone() == (False,)
    w2, receipt2, _ = b.execute("SELECT workflow, receipt, token FROM sturdy.take('pooled-tid')").fetchone()
    assert c.execute("SELECT sturdy.done(%s, %s, 'pooled-tid')", (w2, receipt2)).fetchone() == (True,)
    for x in (a, b, c):
        x.close()


def test_privileges_are_asked_again_for_another_role_on_the_same_backend(bouncer):
    """One backend, calls as two roles in turn: one granted pg_sturdy's
    usage, one allowed to call schedule but not to write the queue. The
    second is refused (42501) whichever came first, and the first's calls
    go through before and after (the privilege answers are kept per role)."""
    with connect() as c:
        for role in ("sturdy_pooled_granted", "sturdy_pooled_nobody"):
            fresh_role(c, role)
        c.execute("SELECT sturdy.grant_usage('sturdy_pooled_granted')")
        c.execute("GRANT USAGE ON SCHEMA sturdy TO sturdy_pooled_nobody")
        c.execute("GRANT EXECUTE ON FUNCTION sturdy.schedule(text, timestamptz, text, integer, text)"
                  " TO sturdy_pooled_nobody")
        c.execute("DELETE FROM sturdy.queue WHERE queue = 'pooled-roles'")
    a = bouncer.connect(ONE_BACKEND)

    def schedule_as(role, workflow):
        with a.transaction():
            a.execute(f"SET LOCAL ROLE {role}")
            a.execute("SELECT sturdy.schedule(%s, now(), 'pooled-roles')", (workflow,))

    for first, second in (("granted", "nobody"), ("nobody", "granted"), ("granted", "nobody")):
        for role in (first, second):
            if role == "granted":
                schedule_as("sturdy_pooled_granted", "pr")
            else:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    schedule_as("sturdy_pooled_nobody", "pr-nobody")
    with connect() as c:
        assert c.execute("SELECT workflow FROM sturdy.queue WHERE queue = 'pooled-roles'").fetchall() == [("pr",)]
    a.close()


def test_a_search_path_one_client_leaves_on_a_backend_changes_no_answer(bouncer):
    """Client A sets a session search_path (which transaction pooling leaks
    to whoever gets the backend next) with a schema whose text '=' is always
    true; client B's calls on that backend answer as before."""
    with connect() as c:
        c.execute("DROP SCHEMA IF EXISTS pooled_evil CASCADE")
        c.execute("CREATE SCHEMA pooled_evil")
        c.execute("CREATE FUNCTION pooled_evil.eq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true'")
        c.execute("CREATE OPERATOR pooled_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = pooled_evil.eq)")
    a, b = bouncer.connect(ONE_BACKEND), bouncer.connect(ONE_BACKEND)
    b.execute("DELETE FROM sturdy.queue WHERE queue IN ('pooled-sp', 'pooled-sp2')")
    b.execute("SELECT sturdy.schedule('sp-other', now(), 'pooled-sp2')")
    a.execute("SET search_path = pooled_evil, pg_catalog, public")
    # the leak is real: on b's backend an unqualified '=' is the evil one
    assert b.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'pooled-sp'").fetchone()[0] > 0
    assert b.execute("SELECT count(*) FROM sturdy.take('pooled-sp')").fetchone() == (0,)
    b.execute("SELECT sturdy.schedule('sp', now(), 'pooled-sp')")
    w, receipt, _ = b.execute("SELECT workflow, receipt, token FROM sturdy.take('pooled-sp')").fetchone()
    assert w == "sp"
    # with the leaked '=' comparing queues, this done would remove sp
    assert b.execute("SELECT sturdy.done('sp', %s, 'pooled-sp2')", (receipt,)).fetchone() == (False,)
    a.execute("RESET search_path")
    a.close()
    b.close()
    with connect() as c:
        c.execute("DROP SCHEMA pooled_evil CASCADE")


def test_a_poller_that_cannot_listen_asks_for_no_notify(bouncer):
    """A worker behind the pooler polls: its empty takes with wake => false
    leave no mark, so the schedules after them send no NOTIFY (a commit
    serialised with every other notifying commit) for a worker that cannot
    hear it. The same loop with the default wake does notify."""
    listener = connect()
    listener.execute("LISTEN sturdy")
    poller, producer = bouncer.connect(), bouncer.connect()
    poller.execute("DELETE FROM sturdy.queue WHERE queue = 'pooled-poll'")
    poller.execute("DELETE FROM sturdy.queue_waiters WHERE queue = 'pooled-poll'")
    notified = {}
    for wake in (False, True):
        for i in range(20):
            assert poller.execute("SELECT count(*) FROM sturdy.take('pooled-poll', wake => %s)",
                                  (wake,)).fetchone() == (0,)
            producer.execute("SELECT sturdy.schedule(%s, now(), 'pooled-poll')", (f"pp-{wake}-{i}",))
            w, receipt, _ = poller.execute("SELECT workflow, receipt, token FROM sturdy.take('pooled-poll', wake => %s)", (wake,)).fetchone()
            poller.execute("SELECT sturdy.done(%s, %s, 'pooled-poll')", (w, receipt))
            time.sleep(0.02)
        notified[wake] = len([n for n in wait_notifies(listener, 1) if n == ("sturdy", "pooled-poll")])
    listener.close()
    assert notified[False] == 0, notified
    assert notified[True] > 0, notified
