"""pg_sturdy distributed by Citus (docs/scale-out.md): the API's guarantees
called through the coordinator of a local cluster (a coordinator and two
workers, scripts/citus.sh) and on its worker nodes (the node that holds a
queue, and the other), with several clients at once.

The cluster comes from the environment (scripts/suites.sh starts it):
  STURDY_SERVER       the coordinator's libpq settings, STURDY_DB its database
  STURDY_CITUS_NODES  each worker's libpq settings, separated by ';'
"""
import datetime as dt
import os
import sys
import threading
import time

import psycopg
import pytest
from sturdy import DB, DSN, SERVER, Worker, connect, start_and_join, wait_notifies

NODES = [n for n in os.environ.get("STURDY_CITUS_NODES", "").split(";") if n]
# how the suite's database was distributed (scripts/suites.sh runs the
# suite once each way): claims and checkpoints with the queues (the
# default), or by workflow
WITH_QUEUES = os.environ.get("STURDY_CITUS_PLACEMENT", "with_queues") == "with_queues"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def node(settings):
    return psycopg.connect(f"{settings} dbname={DB}", autocommit=True)


def sqlstate_of(c, sql, params=()):
    try:
        c.execute(sql, params)
    except psycopg.Error as e:
        return e.sqlstate
    return None


def nodes_holding(c, table, values):
    """The ports of the nodes whose shards hold these values of the table's
    distribution column."""
    return {
        c.execute(
            "SELECT p.nodeport FROM pg_dist_shard s JOIN pg_dist_shard_placement p USING (shardid)"
            " WHERE s.shardid = get_shard_id_for_distribution_column(%s::regclass, %s::text)",
            (table, v),
        ).fetchone()[0]
        for v in values
    }


def test_distribute_places_every_table_and_runs_again_harmlessly():
    with connect() as c:
        # the suite ran it once already, with its placement
        c.execute("SELECT sturdy.distribute(%s)", (WITH_QUEUES,))
        placed = dict(
            c.execute(
                "SELECT logicalrelid::text, column_to_column_name(logicalrelid, partkey) || ' ' || colocationid"
                " FROM pg_dist_partition WHERE logicalrelid::text LIKE 'sturdy.%'"
            ).fetchall()
        )
        by = {t: p.split()[0] for t, p in placed.items()}
        group = {t: p.split()[1] for t, p in placed.items()}
        workflows_by = "place" if WITH_QUEUES else "workflow"
        assert by == {
            "sturdy.claims": workflows_by, "sturdy.checkpoints": workflows_by,
            "sturdy.queue": "queue", "sturdy.queue_limits": "queue", "sturdy.queue_places": "queue",
            "sturdy.queue_key_places": "queue", "sturdy.queue_waiters": "queue", "sturdy.queue_retry": "queue",
        }, placed
        assert group["sturdy.claims"] == group["sturdy.checkpoints"]
        assert len({group[t] for t in by if by[t] == "queue"}) == 1
        if WITH_QUEUES:
            # a workflow's claim and checkpoints sit with the queue its name
            # starts with
            assert group["sturdy.claims"] == group["sturdy.queue"]
            assert c.execute(
                "SELECT (SELECT array_agg(a.attname::text ORDER BY k.n) FROM pg_index i"
                "          CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)"
                "          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
                "         WHERE i.indrelid = t::regclass AND i.indisprimary)"
                "  FROM unnest(ARRAY['sturdy.claims', 'sturdy.checkpoints']) t"
            ).fetchall() == [(["place", "workflow"],), (["place", "workflow", "step"],)]
        delegated = c.execute(
            "SELECT coalesce(array_agg(objid::regproc::text ORDER BY 1), '{}') FROM pg_dist_object"
            " WHERE classid = 'pg_proc'::regclass AND distribution_argument_index = 0"
            "   AND colocationid = %s AND NOT coalesce(force_delegation, false)",
            (int(group["sturdy.claims"]),),
        ).fetchone()[0]
        # by place, Citus would send a call by the hash of its workflow
        # argument, which is not where its claim is: none is delegated
        assert delegated == ([] if WITH_QUEUES else sorted(
            ["sturdy.claim", "sturdy.renew", "sturdy.release", "sturdy.fence", "sturdy.record", "sturdy.load"]
        ))
        # delegated inside any transaction to the queue's node
        for fn in ("sturdy.queue_changed(text)", "sturdy.queue_backdated(text)"):
            assert c.execute(
                "SELECT force_delegation, colocationid, distribution_argument_index FROM pg_dist_object"
                " WHERE classid = 'pg_proc'::regclass AND objid = %s::regprocedure",
                (fn,),
            ).fetchone() == (True, int(group["sturdy.queue"]), 0)
        # the shards keep their empty pages at vacuum, as the tables do
        # (a truncation's lock would stop every take of the shard)
        for settings in NODES:
            with node(settings) as n:
                n.execute("SET citus.override_table_visibility = off")
                shards, truncated = n.execute(
                    "SELECT count(*) FILTER (WHERE relname ~ '_[0-9]+$'),"
                    "       array_agg(relname::text) FILTER"
                    "         (WHERE NOT coalesce('vacuum_truncate=false' = ANY (reloptions), false))"
                    "  FROM pg_class WHERE relnamespace = 'sturdy'::regnamespace AND relkind = 'r'"
                ).fetchone()
                assert shards > 0 and truncated is None, f"{settings}: {shards} shards, truncated: {truncated}"
        # both workers hold shards of each kind
        assert len(nodes_holding(c, "sturdy.queue", [f"q-{i}" for i in range(16)])) == 2
        assert len(nodes_holding(c, "sturdy.claims", [f"w-{i}" for i in range(16)])) == 2
        # the other placement, or none, is refused and changes nothing
        assert sqlstate_of(c, "SELECT sturdy.distribute(%s)", (not WITH_QUEUES,)) == "55000"
        assert sqlstate_of(c, "SELECT sturdy.distribute(NULL)") == "22004"
        assert c.execute(
            "SELECT column_to_column_name(logicalrelid, partkey) FROM pg_dist_partition"
            " WHERE logicalrelid = 'sturdy.claims'::regclass"
        ).fetchone() == (workflows_by,)


def test_a_stale_token_is_refused_delegated_and_inside_a_transaction():
    """record with a token no longer current raises SD001, whether the call
    is delegated to the worker (autocommit) or runs on the coordinator
    (inside a transaction, where Citus does not delegate it)."""
    with connect() as a, connect() as b:
        assert a.execute("SELECT sturdy.claim('fence-1', '100 milliseconds')").fetchone() == (1,)
        time.sleep(0.3)
        assert b.execute("SELECT sturdy.claim('fence-1', '1 minute')").fetchone() == (2,)
        assert sqlstate_of(a, "SELECT sturdy.record('fence-1', 'step', '1', 1)") == "SD001"
        with a.transaction():
            assert sqlstate_of(a, "SELECT sturdy.record('fence-1', 'step', '1', 1)") == "SD001"
            raise psycopg.Rollback()
        with b.transaction():
            b.execute("SELECT sturdy.fence('fence-1', 2)")
            b.execute("SELECT sturdy.record('fence-1', 'step', '2', 2)")
        assert a.execute("SELECT value FROM sturdy.load('fence-1')").fetchall() == [(2,)]
        assert a.execute("SELECT first FROM sturdy.record('fence-1', 'step', '3', 2)").fetchone() == (False,)
    # the claim is on a worker: the coordinator's table is an empty shell
    with connect() as c:
        (port,) = nodes_holding(c, "sturdy.claims", ["fence-1"])
    with node(next(n for n in NODES if f"port={port}" in n)) as w:
        shard = w.execute(
            "SELECT shard_name('sturdy.claims'::regclass, get_shard_id_for_distribution_column('sturdy.claims', 'fence-1'))"
        ).fetchone()[0]
        assert w.execute(f"SELECT token FROM {shard} WHERE workflow = 'fence-1'").fetchone() == (2,)


def test_concurrent_takers_hand_each_row_out_once_across_nodes():
    """6 clients, two on the coordinator and two on each worker node, take
    and finish 1,200 rows in 8 queues whose shards are on both workers:
    every row is handed out and done exactly once, whichever node a call
    reached."""
    queues = [f"spread-{i}" for i in range(8)]
    with connect() as c:
        assert len(nodes_holding(c, "sturdy.queue", queues)) == 2
        for q in queues:
            c.execute("SELECT sturdy.schedule(%s || '/' || i, now(), %s) FROM generate_series(1, 150) i", (q, q))
    taken, lock = [], threading.Lock()

    def work(k):
        with (connect() if k < 2 else node(NODES[k % 2])) as c:
            empty, turn = 0, k
            while empty < len(queues):  # every queue found empty in a row
                turn += 1
                q = queues[turn % len(queues)]
                rows = c.execute(
                    "SELECT t.workflow, sturdy.done(t.workflow, t.receipt, %s) FROM sturdy.take(%s, max => 5) t",
                    (q, q),
                ).fetchall()
                empty = empty + 1 if not rows else 0
                with lock:
                    taken.extend(rows)

    start_and_join([Worker(target=work, args=(k,)) for k in range(6)])
    workflows = [w for w, _ in taken]
    assert all(done for _, done in taken), "a done found its row gone"
    assert len(workflows) == 1200 and len(set(workflows)) == 1200
    with connect() as c:
        assert c.execute("SELECT count(*) FROM sturdy.queue WHERE queue LIKE 'spread-%'").fetchone() == (0,)


def test_one_queue_hands_out_in_order_and_skips_rows_another_holds():
    with connect() as c, connect(autocommit=False) as holder:
        c.execute("SELECT sturdy.schedule('fifo-' || i, now() - (10 - i) * interval '1 second', 'fifo')"
                  " FROM generate_series(1, 6) i")
        held = holder.execute("SELECT workflow FROM sturdy.take('fifo')").fetchall()
        assert held == [("fifo-1",)]
        # another client, while the first's transaction is open: skips its row
        got = c.execute("SELECT workflow FROM sturdy.take('fifo', max => 3)").fetchall()
        assert got == [("fifo-2",), ("fifo-3",), ("fifo-4",)]
        holder.rollback()
        got = c.execute("SELECT workflow FROM sturdy.take('fifo', max => 3)").fetchall()
        assert got == [("fifo-1",), ("fifo-5",), ("fifo-6",)]


def test_a_wakeup_during_a_pass_outlives_its_done_and_a_stale_receipt_does_nothing():
    with connect() as c:
        c.execute("SELECT sturdy.schedule('wake-1', now(), 'wakes')")
        (w, receipt) = c.execute("SELECT workflow, receipt FROM sturdy.take('wakes')").fetchone()
        c.execute("SELECT sturdy.schedule('wake-1', now(), 'wakes')")  # lands during the pass
        assert c.execute("SELECT sturdy.done('wake-1', %s, 'wakes')", (receipt,)).fetchone() == (False,)
        (again,) = c.execute("SELECT receipt FROM sturdy.take('wakes')").fetchone()
        assert again != receipt
        assert c.execute("SELECT sturdy.done('wake-1', %s, 'wakes')", (receipt,)).fetchone() == (False,)
        assert c.execute("SELECT sturdy.wake_at('wake-1', %s, now() + interval '1 hour', 'wakes')",
                         (again,)).fetchone() == (True,)
        assert c.execute("SELECT count(*) FROM sturdy.take('wakes')").fetchone() == (0,)


def test_take_with_claim_issues_a_token_that_fences_and_finish_ends_the_pass():
    with connect() as c:
        c.execute("SELECT sturdy.schedule('tc-1', now(), 'claimed')")
        (w, receipt, token) = c.execute("SELECT workflow, receipt, token FROM sturdy.take('claimed', claim => true)").fetchone()
        assert token is not None
        assert sqlstate_of(c, "SELECT sturdy.record('tc-1', 's', '1', %s)", (token - 1,)) == "SD001"
        assert c.execute(
            "SELECT sturdy.finish('tc-1', %s, %s, 's', '\"v\"', queue => 'claimed')", (token, receipt)
        ).fetchone() == (True,)
        assert c.execute("SELECT value FROM sturdy.load('tc-1')").fetchall() == [("v",)]
        assert c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'claimed'").fetchone() == (0,)


def test_a_transaction_across_nodes_commits_or_rolls_back_whole():
    """A claim and checkpoint (a worker), a queue row (maybe the other), an
    instance and an outbox message (the coordinator): all or nothing."""
    def everything(c, n):
        c.execute(f"SELECT sturdy.claim('tx-{n}')")
        c.execute(f"SELECT sturdy.record('tx-{n}', 's', '1', 1)")
        c.execute(f"SELECT sturdy.schedule('tx-{n}', now(), 'txq')")
        c.execute(f"SELECT sturdy.start('txp', 'tx-bk-{n}')")
        c.execute(f"SELECT sturdy.emit('tx-ev', '{n}')")

    def seen(c, n):
        return c.execute(
            f"SELECT (SELECT count(*) FROM sturdy.claims WHERE workflow = 'tx-{n}'),"
            f" (SELECT count(*) FROM sturdy.checkpoints WHERE workflow = 'tx-{n}'),"
            f" (SELECT count(*) FROM sturdy.queue WHERE queue = 'txq' AND workflow = 'tx-{n}'),"
            f" (SELECT count(*) FROM sturdy.instances WHERE business_key = 'tx-bk-{n}'),"
            f" (SELECT count(*) FROM sturdy.outbox WHERE event = 'tx-ev' AND payload = '{n}')"
        ).fetchone()

    with connect(autocommit=False) as c:
        everything(c, 1)
        c.rollback()
        everything(c, 2)
        c.commit()
        assert seen(c, 1) == (0, 0, 0, 0, 0)
        assert seen(c, 2) == (1, 1, 1, 1, 1)


OUTBOX_LOG = """
    CREATE TABLE IF NOT EXISTS public.citus_outbox_log (n bigserial, outbox bigint, aggregate text, pump text);
    CREATE OR REPLACE FUNCTION public.citus_outbox_log(m sturdy.outbox, attempt int) RETURNS void LANGUAGE sql
      AS $$ INSERT INTO public.citus_outbox_log (outbox, aggregate, pump)
            VALUES (m.id, m.aggregate_id, current_setting('application_name')) $$;
"""


def test_outbox_delivers_exactly_once_in_order_per_aggregate_beside_queue_writes():
    """1,000 emits, each in a transaction that also schedules a row (on a
    worker); three pumps at once on the coordinator: one delivery each, in
    emit order per aggregate, and every emit's row scheduled."""
    total = 1000
    with connect() as c:
        c.execute(OUTBOX_LOG)
        c.execute("SELECT sturdy.subscribe('citus-ev', 'public.citus_outbox_log(sturdy.outbox, integer)')")
    with connect(autocommit=False) as c:
        for i in range(total):
            c.execute("SELECT sturdy.emit('citus-ev', %s, %s)", (str(i), f"agg-{i % 20}"))
            c.execute("SELECT sturdy.schedule(%s, now(), 'emitted')", (f"em-{i}",))
            c.commit()

    def pump(k):
        with psycopg.connect(DSN, autocommit=True, application_name=f"pump-{k}") as c:
            while True:
                (seen,) = c.execute("SELECT seen FROM sturdy.pump(25)").fetchone()
                if seen == 0 and c.execute(
                    "SELECT count(*) FROM sturdy.deliveries d JOIN sturdy.outbox o ON o.id = d.outbox_id"
                    " WHERE o.event = 'citus-ev' AND d.state = 'pending'"
                ).fetchone() == (0,):
                    return

    start_and_join([Worker(target=pump, args=(k,)) for k in range(3)])
    with connect() as c:
        rows, distinct = c.execute("SELECT count(*), count(DISTINCT outbox) FROM public.citus_outbox_log").fetchone()
        out_of_order = c.execute(
            "SELECT aggregate FROM public.citus_outbox_log GROUP BY aggregate"
            " HAVING array_agg(outbox ORDER BY n) <> array_agg(outbox ORDER BY outbox)"
        ).fetchall()
        scheduled = c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'emitted'").fetchone()[0]
    assert (rows, distinct) == (total, total)
    assert out_of_order == []
    assert scheduled == total


def test_concurrent_starts_with_one_idempotency_key_make_one_instance():
    ids, barrier = [], threading.Barrier(6)

    def start():
        with connect() as c:
            barrier.wait()
            ids.append(c.execute(
                "SELECT sturdy.start('idem', 'order-9', '{}', 'key-9', 'idemq')").fetchone()[0])

    start_and_join([Worker(target=start) for _ in range(6)])
    assert len(ids) == 6 and len(set(ids)) == 1
    with connect() as c:
        (workflow,) = c.execute("SELECT workflow FROM sturdy.instances WHERE id = %s", (ids[0],)).fetchone()
        assert c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'idemq'").fetchone() == (1,)
        assert c.execute("SELECT workflow FROM sturdy.queue WHERE queue = 'idemq'").fetchone() == (workflow,)


def test_sweep_is_bounded_and_removes_what_belongs_to_each_instance():
    with connect() as c:
        ids = [c.execute("SELECT sturdy.start('swp', %s, '{}', NULL, 'sweepq')", (f"sw-{n}",)).fetchone()[0]
               for n in range(5)]
        for i in ids:
            c.execute("SELECT sturdy.supply(%s, 'step', '1')", (f"swp/{i}",))
            c.execute("SELECT sturdy.transition(%s, 'pending', 'succeeded')", (i,))
        c.execute("UPDATE sturdy.instances SET finished_at = now() - interval '8 days' WHERE process = 'swp'")
        c.execute("SELECT sturdy.claim(%s, '1 hour')", (f"swp/{ids[0]}",))  # a live pass: left alone

        def swept():
            return dict(c.execute("SELECT kind, deleted FROM sturdy.sweep(max => 2)").fetchall())

        first = swept()
        assert first["instances"] <= 2 and first["checkpoints"] == first["instances"]
        total = first["instances"]
        while (n := swept()["instances"]) > 0:
            total += n
        assert total == 4
        left = c.execute("SELECT id FROM sturdy.instances WHERE process = 'swp'").fetchall()
        assert left == [(ids[0],)]
        assert c.execute("SELECT count(*) FROM sturdy.checkpoints WHERE workflow LIKE 'swp/%'").fetchone() == (1,)
        assert c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'sweepq'").fetchone() == (1,)


def test_sweep_counts_leases_run_out_and_removes_long_dead_rows_on_every_shard():
    """sweep's failing passes through the coordinator: a lease that ran out
    with no take to meet it is counted (from its end) on each queue's shard,
    and a row dead past the retention is removed."""
    queues = [f"swl-{n}" for n in range(6)]
    with connect() as c:
        assert len(nodes_holding(c, "sturdy.queue", queues)) > 1, "the queues span the workers"
        for q in queues:
            c.execute("SELECT sturdy.retry_queue(%s, max_attempts => 5, backoff => '1 hour', jitter => 0)", (q,))
            c.execute("SELECT sturdy.schedule('w', now() - interval '1 minute', %s)", (q,))
            c.execute("SELECT sturdy.schedule('d', now() + interval '1 hour', %s)", (q,))
            assert c.execute("SELECT workflow FROM sturdy.take(%s, '10 minutes')", (q,)).fetchall() == [("w",)]
        ended, died = c.execute("SELECT now() - interval '1 minute', now() - interval '8 days'").fetchone()
        for q in queues:
            # the worker went away a minute ago; 'd' died 8 days ago
            c.execute("UPDATE sturdy.queue SET leased_until = %s WHERE queue = %s AND workflow = 'w'", (ended, q))
            c.execute("UPDATE sturdy.queue SET visible_at = 'infinity', attempts = 5, failed_at = %s"
                      " WHERE queue = %s AND workflow = 'd'", (died, q))
        swept = dict(c.execute("SELECT kind, deleted FROM sturdy.sweep()").fetchall())
        assert swept["lapsed"] >= len(queues) and swept["dead"] >= len(queues), swept
        rows = c.execute(
            "SELECT queue, workflow, attempts, last_error, leased_until IS NULL, visible_at = %s + interval '1 hour'"
            " FROM sturdy.queue WHERE queue LIKE 'swl-%%' ORDER BY queue", (ended,)).fetchall()
        assert rows == [(q, "w", 1, "the lease ran out", True, True) for q in queues]
        again = dict(c.execute("SELECT kind, deleted FROM sturdy.sweep()").fetchall())
        assert c.execute("SELECT count(*) FROM sturdy.queue WHERE queue LIKE 'swl-%%' AND attempts > 1").fetchone() == (0,), again


def test_a_running_limit_holds_across_concurrent_takers():
    """running = 2 on a queue 4 clients take from: never more than 2 passes
    leased at once, and every row done once."""
    with connect() as c:
        c.execute("SELECT sturdy.limit_queue('capped', running => 2)")
        c.execute("SELECT sturdy.schedule('cap-' || i, now(), 'capped') FROM generate_series(1, 40) i")
    most, done, lock, stop = [0], [], threading.Lock(), threading.Event()

    def watch():
        with connect() as c:
            while not stop.is_set():
                (n,) = c.execute(
                    "SELECT count(*) FROM sturdy.queue_places WHERE queue = 'capped' AND receipt > now()"
                ).fetchone()
                most[0] = max(most[0], n)

    def work():
        with connect() as c:
            while True:
                row = c.execute("SELECT workflow, receipt FROM sturdy.take('capped')").fetchone()
                if row is None:
                    if c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'capped'").fetchone() == (0,):
                        return
                    time.sleep(0.01)
                    continue
                time.sleep(0.005)
                assert c.execute("SELECT sturdy.done(%s, %s, 'capped')", row).fetchone() == (True,)
                with lock:
                    done.append(row[0])

    watcher = Worker(target=watch)
    watcher.start()
    start_and_join([Worker(target=work) for _ in range(4)])
    stop.set()
    watcher.join()
    assert sorted(done) == sorted(f"cap-{i}" for i in range(1, 41))
    assert 1 <= most[0] <= 2, f"{most[0]} passes held places at once"


def test_an_idle_listener_on_the_coordinator_is_woken_after_commit():
    with connect() as listener, connect(autocommit=False) as app:
        listener.execute("LISTEN sturdy")
        assert listener.execute("SELECT count(*) FROM sturdy.take('citus-mail')").fetchone() == (0,)
        app.execute("SELECT sturdy.schedule('cm-1', now(), 'citus-mail')")
        assert wait_notifies(listener, 0.5) == [], "notified before commit"
        app.commit()
        assert wait_notifies(listener, 5.0) == [("sturdy", "citus-mail")]


def test_many_runs_in_one_session_keep_planning_custom():
    """The plan cache turns a statement generic after five runs, and Citus
    cannot route a generic plan: thirty rounds of each call in one session."""
    with connect() as c:
        for i in range(30):
            c.execute("SELECT sturdy.schedule(%s, now(), 'rounds', priority => %s, key => %s)",
                      (f"r-{i}", i % 3, f"k-{i % 4}"))
            c.execute("SELECT sturdy.claim(%s)", (f"r-{i}",))
            c.execute("SELECT sturdy.record(%s, 's', '1', 1)", (f"r-{i}",))
        for _ in range(30):
            rows = c.execute("SELECT workflow, receipt FROM sturdy.take('rounds')").fetchall()
            assert len(rows) == 1
            assert c.execute("SELECT sturdy.done(%s, %s, 'rounds')", rows[0]).fetchone() == (True,)
        c.execute("SELECT sturdy.schedule('r-' || i, now(), 'rounds') FROM generate_series(1, 20) i")
        for _ in range(8):
            assert len(c.execute("SELECT * FROM sturdy.take('rounds', max => 3)").fetchall()) <= 3


def test_the_operator_views_and_history_read_both_kinds_of_table():
    with connect() as c:
        (i,) = c.execute("SELECT sturdy.start('ops', 'ops-1')").fetchone()
        c.execute("SELECT sturdy.supply(%s, 'asked', '1')", (f"ops/{i}",))
        assert c.execute("SELECT step FROM sturdy.status('ops-1')").fetchone() == ("asked",)
        c.execute("UPDATE sturdy.instances SET updated_at = now() - interval '2 hours' WHERE id = %s", (i,))
        assert c.execute("SELECT count(*) FROM sturdy.stuck('1 second') WHERE id = %s", (i,)).fetchone() == (0,)
        c.execute("SELECT sturdy.start('ops', 'ops-2')")
        c.execute("UPDATE sturdy.instances SET updated_at = now() - interval '2 hours' WHERE business_key = 'ops-2'")
        assert c.execute("SELECT count(*) FROM sturdy.stuck('1 hour') WHERE business_key = 'ops-2'").fetchone() == (1,)
        signals = dict(c.execute("SELECT signal, ok FROM sturdy.health").fetchall())
        assert signals["stuck instances"] is False
        assert c.execute("SELECT sturdy.sample()").fetchone()[0] > 0
        assert c.execute("SELECT count(*) FROM sturdy.samples WHERE kind = 'queue'").fetchone()[0] > 0


def test_an_update_on_the_coordinator_then_distribute_and_the_calls_work():
    """The documented order on a cluster of an older version: ALTER
    EXTENSION UPDATE on the coordinator (Citus runs it on every worker),
    then sturdy.distribute(); an update asked for again afterwards has
    nothing to do."""
    every = [SERVER] + NODES
    for settings in every:
        with psycopg.connect(f"{settings} dbname=postgres", autocommit=True) as c:
            c.execute("DROP DATABASE IF EXISTS sturdy_update")
            c.execute("CREATE DATABASE sturdy_update")
        with psycopg.connect(f"{settings} dbname=sturdy_update", autocommit=True) as c:
            c.execute("CREATE EXTENSION citus")
            c.execute("CREATE EXTENSION pg_sturdy VERSION '0.1.0'")
    coordinator = psycopg.connect(f"{SERVER} dbname=sturdy_update", autocommit=True)
    with coordinator as c:
        host = dict(p.split("=", 1) for p in SERVER.split())
        c.execute("SELECT citus_set_coordinator_host(%s, %s)", (host["host"], int(host["port"])))
        for settings in NODES:
            w = dict(p.split("=", 1) for p in settings.split())
            c.execute("SELECT citus_add_node(%s, %s)", (w["host"], int(w["port"])))
        assert sqlstate_of(c, "SELECT sturdy.distribute()") == "42883"  # not in 0.1.0
        # on the coordinator, which Citus carries to every worker (a worker
        # refuses it: the extension is the cluster's once the nodes joined)
        for settings in NODES:
            with psycopg.connect(f"{settings} dbname=sturdy_update", autocommit=True) as n:
                assert sqlstate_of(n, "ALTER EXTENSION pg_sturdy UPDATE") is not None
        c.execute("ALTER EXTENSION pg_sturdy UPDATE")
        c.execute("SELECT sturdy.distribute()")
        c.execute("ALTER EXTENSION pg_sturdy UPDATE")
        versions = {c.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_sturdy'").fetchone()[0]}
        for settings in NODES:
            with psycopg.connect(f"{settings} dbname=sturdy_update", autocommit=True) as n:
                versions.add(n.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_sturdy'").fetchone()[0])
        assert versions == {"0.2.0"}
        assert c.execute("SELECT sturdy.claim('up-1')").fetchone() == (1,)
        c.execute("SELECT sturdy.record('up-1', 's', '1', 1)")
        assert c.execute("SELECT sturdy.release('up-1', 1)").fetchone() == (True,)
        c.execute("SELECT sturdy.schedule('up-1', now(), 'upq')")
        (w, receipt, token) = c.execute("SELECT workflow, receipt, token FROM sturdy.take('upq', claim => true)").fetchone()
        assert (w, token) == ("up-1", 2)
        assert c.execute("SELECT sturdy.finish('up-1', 2, %s, queue => 'upq')", (receipt,)).fetchone() == (True,)
        assert c.execute("SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'sturdy.%'"
                         ).fetchone() == (8,)


@pytest.mark.parametrize("where", ["coordinator", "holding", "other"])
def test_a_limit_and_a_priority_set_elsewhere_reach_a_session_that_took_before(where):
    """A session keeps what it read of a queue's limits and whether it has
    prioritized rows; a limit or a prioritized row from another session on
    the coordinator reaches its next take: through the coordinator's
    invalidations there, and on a worker node (the one holding the queue or
    the other) because nothing is kept there."""
    q = f"late-{where}"
    with connect() as admin:
        [holding] = nodes_holding(admin, "sturdy.queue", [q])
    at = {"coordinator": None, "holding": next(n for n in NODES if f"port={holding}" in n),
          "other": next(n for n in NODES if f"port={holding}" not in n)}[where]
    with (connect() if at is None else node(at)) as taker, connect() as admin:
        taker.execute = _in_queue(taker.execute, q)
        admin.execute = _in_queue(admin.execute, q)
        admin.execute("SELECT sturdy.schedule('late-' || i, now() - interval '1 minute', 'late') FROM generate_series(1, 6) i")
        assert taker.execute("SELECT count(*) FROM sturdy.take('late')").fetchone() == (1,)
        admin.execute("SELECT sturdy.schedule('urgent', now(), 'late', priority => 5)")
        assert taker.execute("SELECT workflow FROM sturdy.take('late')").fetchone() == ("urgent",)
        admin.execute("SELECT sturdy.limit_queue('late', running => 2)")
        # the two passes taken before the limit count against it: none more
        # (a session that kept "no limit" would hand out three)
        assert taker.execute("SELECT count(*) FROM sturdy.take('late', max => 3)").fetchone() == (0,)
        admin.execute("SELECT sturdy.limit_queue('late', running => 3)")
        assert taker.execute("SELECT count(*) FROM sturdy.take('late', max => 3)").fetchone() == (1,)
        assert taker.execute("SELECT count(*) FROM sturdy.take('late', max => 3)").fetchone() == (0,)


def _local_reads(c, sql):
    """The statements Citus ran locally for `sql` on the connection's node
    that read a queue's limits or looked for its prioritized rows."""
    seen = []
    handler = (lambda d: seen.append(d.message_primary)
               if "executing the command locally" in (d.message_primary or "")
               and ("queue_limits" in d.message_primary or "priority OPERATOR(pg_catalog.>) 0" in d.message_primary)
               else None)
    c.add_notice_handler(handler)
    c.execute("SET citus.log_local_commands = on")
    try:
        rows = c.execute(sql).fetchall()
    finally:
        c.execute("RESET citus.log_local_commands")
        c.remove_notice_handler(handler)
    return rows, seen


def test_a_take_on_the_queue_s_node_keeps_its_settings_and_a_change_reaches_it():
    """On the worker node that holds a queue, a take keeps what it read of
    the queue's limits and prioritized rows between calls (no read of them
    on its next take), and a limit, a pause or a prioritized row set on the
    coordinator reaches it at its next take (queue_changed, delegated
    there); on the other worker nothing is kept."""
    q = "kept-here"
    with connect() as admin:
        [holding] = nodes_holding(admin, "sturdy.queue", [q])
        admin.execute("SELECT sturdy.schedule(%s || '-' || i, now(), %s) FROM generate_series(1, 8) i", (q, q))
    here = next(n for n in NODES if f"port={holding}" in n)
    other = next(n for n in NODES if f"port={holding}" not in n)
    with node(here) as taker, node(other) as elsewhere, connect() as admin:
        take = f"SELECT workflow FROM sturdy.take('{q}')"
        _, first = _local_reads(taker, take)
        assert first, "the first take read nothing"
        rows, again = _local_reads(taker, take)
        assert len(rows) == 1 and again == [], again
        elsewhere.execute(take)
        _, there = _local_reads(elsewhere, take)
        assert there == [], "the other node's reads run on the queue's node, not locally"
        admin.execute("SELECT sturdy.pause(%s)", (q,))
        assert taker.execute(take).fetchall() == []
        admin.execute("SELECT sturdy.resume(%s)", (q,))
        admin.execute("SELECT sturdy.schedule('first-of-all', now(), %s, priority => 3)", (q,))
        assert taker.execute(take).fetchall() == [("first-of-all",)]
        admin.execute("SELECT sturdy.limit_queue(%s, running => 6)", (q,))
        # five taken so far (their leases run): the sixth place left, then none
        assert len(taker.execute(f"SELECT * FROM sturdy.take('{q}', max => 5)").fetchall()) == 1
        assert taker.execute(take).fetchall() == []
        admin.execute("SELECT sturdy.limit_queue(%s)", (q,))
        assert len(taker.execute(take).fetchall()) == 1


@pytest.mark.parametrize("where", ["queue's node", "coordinator", "other worker", "transaction across nodes"])
def test_a_row_made_ready_before_now_elsewhere_is_taken_first_on_the_queue_s_node(where):
    """On the node that holds a queue, takes scan from where they stood (a
    floor), as on one server; a row made ready before now on any node
    reaches them (queue_backdated, delegated to the queue's node): the next
    take hands it out first, not the rows above the floor."""
    q = f"backdated {where}"
    with connect() as admin:
        [holding] = nodes_holding(admin, "sturdy.queue", [q])
        admin.execute("SELECT sturdy.schedule(%s || '-' || i, now(), %s) FROM generate_series(1, 6) i", (q, q))
        # a queue on the other worker, for the transaction across nodes
        other_q = next(f"elsewhere-{i}" for i in range(64)
                       if nodes_holding(admin, "sturdy.queue", [f"elsewhere-{i}"]) != {holding})
    here = next(n for n in NODES if f"port={holding}" in n)
    other = next(n for n in NODES if f"port={holding}" not in n)
    with node(here) as taker, node(other) as elsewhere, connect() as admin:
        def take():
            return taker.execute("SELECT workflow FROM sturdy.take(%s)", (q,)).fetchall()
        # from the start, then from the floor it left (within the second
        # before the next scan from the start is due)
        assert take() == [(f"{q}-1",)]
        assert take() == [(f"{q}-2",)]
        late = "SELECT sturdy.schedule('late', now() - interval '1 hour', %s)"
        if where == "queue's node":
            taker.execute(late, (q,))
        elif where == "coordinator":
            admin.execute(late, (q,))
        elif where == "other worker":
            elsewhere.execute(late, (q,))
        else:
            with admin.transaction():
                admin.execute(late, (q,))
                admin.execute("SELECT sturdy.schedule('late', now() - interval '1 hour', %s)", (other_q,))
                admin.execute("SELECT sturdy.claim('backdated-claim', '1 minute', 'me')")
        assert take() == [("late",)]
        assert take() == [(f"{q}-3",)]
        if where == "transaction across nodes":
            assert admin.execute("SELECT workflow FROM sturdy.take(%s)", (other_q,)).fetchall() == [("late",)]


def _remote_and_local(c, sql, params=()):
    """What Citus logged for `sql`: the commands sent to other nodes and
    the statements it ran locally on a shard."""
    remote, local = [], []

    def handler(d):
        m = d.message_primary or ""
        if m.startswith("issuing"):
            remote.append(m)
        elif "executing the command locally" in m:
            local.append(m)
    c.add_notice_handler(handler)
    c.execute("SET citus.log_remote_commands = on")
    c.execute("SET citus.log_local_commands = on")
    try:
        rows = c.execute(sql, params).fetchall()
    finally:
        c.execute("RESET citus.log_remote_commands")
        c.execute("RESET citus.log_local_commands")
        c.remove_notice_handler(handler)
    return rows, remote, local


def _on_node_holding(table, value):
    with connect() as c:
        [port] = nodes_holding(c, table, [value])
    return next(n for n in NODES if f"port={port}" in n)


def test_a_cycle_on_the_queue_s_node_runs_no_statement_through_citus():
    """On the node that holds the queue (sturdy.queue_node names it), a
    take and its done do their row work on the shard itself: Citus runs no
    statement for them, locally or on another node, once the session knows
    the queue; nor when the take looks again for prioritized rows, every
    second (a probe of the shard's index)."""
    q = "on-its-node"
    with connect() as c:
        # where the worker goes: the node queue_node names
        host, port = c.execute("SELECT host, port FROM sturdy.queue_node(%s)", (q,)).fetchone()
    assert f"port={port}" in _on_node_holding("sturdy.queue", q)
    with psycopg.connect(host=host, port=port, user="postgres", dbname=DB, autocommit=True) as c:
        for i in range(3):
            c.execute("SELECT sturdy.schedule(%s, now(), %s)", (f"{q}-{i}", q))
        c.execute("SELECT sturdy.done(t.workflow, t.receipt, %s) FROM sturdy.take(%s) t", (q, q))
        rows, remote, local = _remote_and_local(
            c, "SELECT sturdy.done(t.workflow, t.receipt, %s) FROM sturdy.take(%s) t", (q, q))
        assert rows == [(True,)]
        assert (remote, local) == ([], []), (remote, local)
        # a second on, the take looks again for prioritized rows: a probe
        # of the shard's index, not its statement through Citus
        time.sleep(1.1)
        rows, remote, local = _remote_and_local(
            c, "SELECT sturdy.done(t.workflow, t.receipt, %s) FROM sturdy.take(%s) t", (q, q))
        assert rows == [(True,)]
        assert (remote, local) == ([], []), (remote, local)
        # drained: the take that finds nothing marks the queue as waited
        # on, on the shard too
        rows, remote, local = _remote_and_local(c, "SELECT * FROM sturdy.take(%s)", (q,))
        assert rows == []
        assert (remote, local) == ([], []), (remote, local)
    with connect() as c:
        assert c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = %s", (q,)).fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM sturdy.queue_waiters WHERE queue = %s", (q,)).fetchone() == (1,)


def test_a_pass_that_claims_on_the_queue_s_node_stays_there_for_workflows_named_for_the_queue():
    """Distributed with queues, workflow 'q/<id>' has its claim and
    checkpoints on queue q's node: there take(claim => true), record and
    finish each do their row work on the shards, and Citus runs no
    statement for them, locally or on another node (two commands for the
    pass: its take and its finish). The token still fences: a stale one is
    refused on every node. Distributed by workflow, the same pass claims on
    the workflow's own node and commits on two by two-phase commit."""
    q = "pass-here"
    here = _on_node_holding("sturdy.queue", q)
    with connect() as c:
        place = c.execute("SELECT sturdy.workflow_place(%s)", (f"{q}/0",)).fetchone()[0]
        assert place == q
        if WITH_QUEUES:
            names = [f"{q}/{i}" for i in range(3)]
        else:
            names = [w for w in (f"{q}/{i}" for i in range(200))
                     if f"port={next(iter(nodes_holding(c, 'sturdy.claims', [w])))}" not in here][:3]
        assert len(names) == 3
        claims_at = {nodes_holding(c, "sturdy.claims", [place if WITH_QUEUES else w]).pop() for w in names}
        assert (claims_at == {int(here.split("port=")[1].split()[0])}) == WITH_QUEUES
        for w in names:
            c.execute("SELECT sturdy.schedule(%s, now(), %s)", (w, q))
    take = "SELECT workflow, receipt, token FROM sturdy.take(%s, claim => true)"
    finish = "SELECT sturdy.finish(%s, %s, %s, 'shipped', '1', queue => %s)"
    with node(here) as c:
        # (the first pass: the session learns the queue)
        w, receipt, token = c.execute(take, (q,)).fetchone()
        assert c.execute(finish, (w, token, receipt, q)).fetchone() == (True,)
        rows, take_remote, take_local = _remote_and_local(c, take, (q,))
        [(w, receipt, token)] = rows
        rows, record_remote, record_local = _remote_and_local(
            c, "SELECT recorded, first FROM sturdy.record(%s, 'packed', '2', %s)", (w, token))
        assert rows == [(2, True)]
        rows, finish_remote, finish_local = _remote_and_local(c, finish, (w, token, receipt, q))
        assert rows == [(True,)]
        if WITH_QUEUES:
            assert (take_remote, take_local, record_remote, record_local, finish_remote, finish_local) == (
                [], [], [], [], [], []), (take_remote, take_local, finish_remote, finish_local)
        else:
            assert any("PREPARE TRANSACTION" in m for m in take_remote), take_remote
            assert any("PREPARE TRANSACTION" in m for m in finish_remote), finish_remote
        # the next pass fences out a stale token on every node
        w2, receipt2, token2 = c.execute(take, (q,)).fetchone()
        c.execute("UPDATE sturdy.claims SET held_until = now() WHERE place = %s AND workflow = %s"
                  if WITH_QUEUES else "UPDATE sturdy.claims SET held_until = now() WHERE workflow = %s",
                  (q, w2) if WITH_QUEUES else (w2,))
        assert c.execute("SELECT sturdy.claim(%s)", (w2,)).fetchone() == (token2 + 1,)
        for settings in [*NODES, None]:
            with (node(settings) if settings else connect()) as o:
                assert sqlstate_of(o, "SELECT sturdy.record(%s, 'late', '3', %s)", (w2, token2)) == "SD001"
                assert sqlstate_of(o, finish, (w2, token2, receipt2, q)) == "SD001"
    with connect() as c:
        # the step recorded in the pass, then finish's
        assert c.execute(
            "SELECT step, value::text FROM sturdy.load(%s)", (w,)).fetchall() == [("packed", "2"), ("shipped", "1")]
        assert c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = %s AND workflow = %s", (q, w)).fetchone() == (0,)
        assert c.execute("SELECT held_until <= now() FROM sturdy.claims WHERE workflow = %s", (w,)).fetchone() == (True,)
        assert c.execute("SELECT count(*) FROM sturdy.checkpoints WHERE workflow = %s AND place IS NOT DISTINCT FROM %s",
                         (w, q if WITH_QUEUES else None)).fetchone() == (2,)


def test_a_statement_that_writes_the_shard_here_and_another_node_commits_by_two_phase_commit():
    """A take and done done on the queue's shard here, and in the same
    statement a claim of a workflow another node holds: Citus prepares the
    other node's part (two-phase commit), as it does where it made both
    writes itself; both are there after the commit."""
    q = "two-nodes"
    here = _on_node_holding("sturdy.queue", q)
    with connect() as c:
        w = next(f"elsewhere-{i}" for i in range(64)
                 if f"port={next(iter(nodes_holding(c, 'sturdy.claims', [f'elsewhere-{i}'])))}" not in here)
        c.execute("SELECT sturdy.schedule('tn-' || i, now(), %s) FROM generate_series(1, 2) i", (q,))
    with node(here) as c:
        # (the session knows the queue: the take and done run no statement)
        c.execute("SELECT sturdy.done(t.workflow, t.receipt, %s) FROM sturdy.take(%s) t", (q, q))
        rows, remote, _ = _remote_and_local(
            c, "SELECT sturdy.done(t.workflow, t.receipt, %s), sturdy.claim(%s) FROM sturdy.take(%s) t", (q, w, q))
        assert rows and rows[0][0] is True and rows[0][1] >= 1
        assert any("PREPARE TRANSACTION" in m for m in remote), remote
    with connect() as c:
        assert c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = %s", (q,)).fetchone() == (0,)
        assert c.execute("SELECT token FROM sturdy.claims WHERE workflow = %s", (w,)).fetchone() == (rows[0][1],)


def test_a_call_on_the_queue_s_node_holds_citus_s_own_shard_metadata_lock():
    """What a take on the shard here holds while it runs is the lock Citus's
    executor takes before it writes the shard, the one a shard move waits
    for: the same advisory lock, in share mode."""
    q = "locked-like-citus"
    here = _on_node_holding("sturdy.queue", q)
    advisory = ("SELECT classid, objid, objsubid, mode FROM pg_locks"
                " WHERE pid = %s AND locktype = 'advisory' AND objsubid = 8")
    with node(here) as c:
        c.execute("SELECT sturdy.schedule('lk-1', now(), %s)", (q,))
        c.execute("BEGIN")
        c.execute("UPDATE sturdy.queue SET takes = takes WHERE queue = %s AND workflow = ''", (q,))
        citus = c.execute(advisory, (c.info.backend_pid,)).fetchall()
        c.execute("ROLLBACK")
        assert citus, "Citus took no metadata lock"
    with node(here) as taker, node(here) as watcher:
        pid = taker.info.backend_pid
        t = Worker(target=lambda: taker.execute(
            "SELECT pg_sleep(1.5) FROM sturdy.take(%s)", (q,)))
        t.start()
        held = []
        for _ in range(300):
            held = watcher.execute(advisory, (pid,)).fetchall()
            if held:
                break
            time.sleep(0.01)
        t.join()
    assert held == citus


def test_python_workers_on_their_queue_s_node_finish_every_workflow_once():
    """The Python client's Worker with on_queue_node=True: its takes and
    ends go to the node that holds its queue (sturdy.queue_node), its LISTEN
    and its fails to the coordinator. Two queues on the two workers, 60
    workflows each with a step; one in ten fails its first pass (retried a
    second later): every workflow finished once, its step recorded once."""
    sys.path.insert(0, os.path.join(ROOT, "clients", "python", "src"))
    from pg_sturdy import Worker as PassWorker
    with connect() as c:
        queues = []
        for i in range(64):
            q = f"py-node-{i}"
            if not queues or nodes_holding(c, "sturdy.queue", [q]) != nodes_holding(c, "sturdy.queue", queues[:1]):
                queues.append(q)
            if len(queues) == 2:
                break
        for q in queues:
            c.execute("SELECT sturdy.schedule(%s || '-' || i, now(), %s) FROM generate_series(1, 60) i", (q, q))
    steps, lock = [], threading.Lock()

    def handle(p):
        def step():
            with lock:
                steps.append(p.workflow)
            return {"by": p.workflow}
        p.step("only", step)
        if p.workflow.endswith("7") and p.attempt == 1:
            raise RuntimeError("the first pass fails")

    workers = [PassWorker(DSN, q, handle, lease=dt.timedelta(seconds=10), on_queue_node=True, poll=(0.02, 0.2))
               for q in queues]
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + 60
        with connect() as c:
            while time.monotonic() < deadline:
                (left,) = c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = ANY(%s)", (queues,)).fetchone()
                if left == 0:
                    break
                time.sleep(0.1)
    finally:
        for w in workers:
            w.stop()
        for w in workers:
            w.join()
    assert all(not w.errors for w in workers), [w.errors for w in workers]
    with connect() as c:
        assert left == 0
        for q, w in zip(queues, workers):
            assert w.node == c.execute("SELECT host, port FROM sturdy.queue_node(%s)", (q,)).fetchone()
        (recorded,) = c.execute("SELECT count(*) FROM sturdy.checkpoints WHERE workflow LIKE 'py-node-%%'").fetchone()
    assert recorded == 120 and len(steps) == 120 == len(set(steps))


def test_a_change_of_a_queue_s_settings_on_a_worker_node_is_refused():
    """limit_queue, pause, resume and a prioritized schedule change what the
    coordinator's sessions keep: made on a worker node they raise 0A000 and
    write nothing."""
    for settings in NODES:
        with node(settings) as c:
            assert sqlstate_of(c, "SELECT sturdy.limit_queue('refused-q', running => 1)") == "0A000"
            assert sqlstate_of(c, "SELECT sturdy.pause('refused-q')") == "0A000"
            assert sqlstate_of(c, "SELECT sturdy.schedule('refused-w', now(), 'refused-q', priority => 1)") == "0A000"
            # a schedule without a priority is a row, nothing more
            c.execute("SELECT sturdy.schedule('plain-w', now(), 'refused-q')")
    with connect() as c:
        assert c.execute("SELECT count(*) FROM sturdy.queue_limits WHERE queue = 'refused-q'").fetchone() == (0,)
        assert c.execute("SELECT array_agg(workflow) FROM sturdy.queue WHERE queue = 'refused-q'").fetchone() == (["plain-w"],)


def test_a_shard_move_under_load_loses_nothing_and_hands_no_row_out_twice():
    """Takers on the coordinator and on both worker nodes take and finish a
    queue's rows while a producer schedules more and the queue's shards
    move from one worker to the other (citus_move_shard_placement,
    block_writes): every row scheduled is done once, none is left, and a
    session that kept the queue's settings on the old node keeps nothing
    after the move (a limit set then holds there)."""
    q = "moving"
    with connect() as c:
        [source] = nodes_holding(c, "sturdy.queue", [q])
        target = next(int(n.split("port=")[1].split()[0]) for n in NODES if f"port={source}" not in n)
        host = {int(n.split("port=")[1].split()[0]): n.split("host=")[1].split()[0] for n in NODES}
        (shard,) = c.execute("SELECT get_shard_id_for_distribution_column('sturdy.queue', %s::text)", (q,)).fetchone()
        c.execute("SELECT sturdy.schedule(%s || '/' || i, now(), %s) FROM generate_series(1, 300) i", (q, q))
    on_source = next(n for n in NODES if f"port={source}" in n)
    kept = node(on_source)
    assert len(kept.execute(f"SELECT * FROM sturdy.take('{q}')").fetchall()) == 1
    scheduled, done, lock = 300, [], threading.Lock()
    producing = threading.Event()
    producing.set()

    def produce():
        nonlocal scheduled
        with connect() as c:
            i = 1000
            while producing.is_set():
                c.execute("SELECT sturdy.schedule(%s, now(), %s)", (f"{q}/{i}", q))
                i += 1
                with lock:
                    scheduled += 1
                time.sleep(0.002)

    def take(k):
        with (connect() if k < 2 else node(NODES[k % 2])) as c:
            quiet = 0
            while quiet < 50:
                rows = c.execute(f"SELECT t.workflow, sturdy.done(t.workflow, t.receipt, '{q}')"
                                 f" FROM sturdy.take('{q}', max => 3) t").fetchall()
                with lock:
                    done.extend(rows)
                if rows or producing.is_set():
                    quiet = 0
                else:
                    quiet += 1
                    time.sleep(0.02)

    threads = [Worker(target=produce)] + [Worker(target=take, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        with connect() as c:
            c.execute("SELECT citus_move_shard_placement(%s, %s, %s, %s, %s, shard_transfer_mode => 'block_writes')",
                      (shard, host[source], source, host[target], target))
            assert nodes_holding(c, "sturdy.queue", [q]) == {target}
        time.sleep(0.5)
    finally:
        producing.clear()
        for t in threads:
            t.join()
    workflows = [w for w, _ in done]
    assert all(ok for _, ok in done), "a done found its row gone"
    assert len(workflows) == len(set(workflows)), "a row handed out twice"
    with connect() as c:
        left = c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = %s", (q,)).fetchone()[0]
        assert left == 1, "the row taken before the load is left, leased"
        assert len(workflows) + 1 == scheduled
        c.execute("SELECT sturdy.limit_queue(%s, running => 1)", (q,))
        c.execute("SELECT sturdy.schedule('after-move-' || i, now(), %s) FROM generate_series(1, 3) i", (q,))
    # the old node's session: the limit (one place, held by its lease) holds
    assert kept.execute(f"SELECT * FROM sturdy.take('{q}', max => 3)").fetchall() == []
    kept.close()
    with connect() as c:
        c.execute("SELECT citus_move_shard_placement(%s, %s, %s, %s, %s, shard_transfer_mode => 'block_writes')",
                  (shard, host[target], target, host[source], source))
        c.execute("SELECT sturdy.limit_queue(%s)", (q,))


def _in_queue(execute, q):
    """`execute` with the queue 'late' renamed `q` in each statement."""
    return lambda sql, *a: execute(sql.replace("'late'", f"'{q}'"), *a)


def test_a_stale_token_is_refused_on_every_node():
    """A token made stale by a newer claim is refused (record: SD001, renew:
    NULL) on the coordinator and on both worker nodes; the current one is
    taken on each."""
    w = "stale-everywhere"
    with connect() as c:
        old = c.execute("SELECT sturdy.claim(%s, '1 minute', 'a')", (w,)).fetchone()[0]
        c.execute("SELECT sturdy.release(%s, %s)", (w, old))
        new = c.execute("SELECT sturdy.claim(%s, '1 minute', 'b')", (w,)).fetchone()[0]
        assert new > old
    for settings in [None, *NODES]:
        with (connect() if settings is None else node(settings)) as c:
            assert sqlstate_of(c, "SELECT sturdy.record(%s, 's', '1', %s)", (w, old)) == "SD001", settings
            assert c.execute("SELECT sturdy.renew(%s, %s, '1 minute')", (w, old)).fetchone() == (None,), settings
            assert c.execute("SELECT first FROM sturdy.record(%s, %s, '1', %s)",
                             (w, f"s-{settings}", new)).fetchone() == (True,)
    with connect() as c:
        assert c.execute("SELECT count(*) FROM sturdy.checkpoints WHERE workflow = %s", (w,)).fetchone() == (3,)


def test_a_call_that_needs_a_coordinator_table_is_refused_on_a_worker_and_writes_nothing():
    """Instances, the outbox and idempotency keys are on the coordinator: on
    a worker node a call about them raises 0A000 (its own copy there is
    empty), and nothing is written anywhere."""
    with connect() as c:
        rows = c.execute("SELECT count(*) FROM sturdy.queue").fetchone()
    for settings in NODES:
        with node(settings) as c:
            assert sqlstate_of(c, "SELECT sturdy.start('order', 'refused-on-worker')") == "0A000"
            assert sqlstate_of(c, "SELECT sturdy.emit('x.y', '{}', 'refused-on-worker')") == "0A000"
            assert sqlstate_of(c, "SELECT * FROM sturdy.status('refused-on-worker')") == "0A000"
    with connect() as c:
        assert c.execute("SELECT count(*) FROM sturdy.instances WHERE business_key = 'refused-on-worker'").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM sturdy.outbox WHERE aggregate_id = 'refused-on-worker'").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM sturdy.queue").fetchone() == rows


def test_batch_runs_on_a_coordinator_table_and_refuses_a_distributed_one():
    with connect() as c:
        c.execute("CREATE TABLE public.local_rows (id int PRIMARY KEY, v int)")
        c.execute("INSERT INTO public.local_rows SELECT i, 0 FROM generate_series(1, 500) i")
        c.execute("CALL sturdy.batch_all('public.local_rows', 'v = 1', 'v = 0', chunk => 100)")
        assert c.execute("SELECT count(*) FROM public.local_rows WHERE v = 1").fetchone() == (500,)
        c.execute("CREATE TABLE public.spread_rows (id int PRIMARY KEY, v int)")
        c.execute("SELECT create_distributed_table('public.spread_rows', 'id')")
        c.execute("INSERT INTO public.spread_rows SELECT i, 0 FROM generate_series(1, 500) i")
        assert sqlstate_of(c, "SELECT * FROM sturdy.batch('public.spread_rows', 'v = 1', 'v = 0')") == "0A000"
        assert sqlstate_of(c, "SELECT sturdy.batch_start('spread', 'public.spread_rows', 'v = 1', 'v = 0')") == "0A000"
        assert c.execute("SELECT count(*) FROM sturdy.batches WHERE name = 'spread'").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM public.spread_rows WHERE v = 1").fetchone() == (0,)


def test_every_function_of_the_catalog_answers_through_the_coordinator():
    """Each function of the API once through the coordinator, as an
    application calls it; the test fails when the catalog has one it does
    not call."""
    with connect() as c:
        functions = {r[0] for r in c.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'sturdy'::regnamespace")}
        calls = []

        def call(name, sql, *args):
            calls.append(name)
            return c.execute(sql, args or None).fetchone()

        c.execute("CREATE SCHEMA IF NOT EXISTS every_app")
        c.execute("CREATE OR REPLACE FUNCTION every_app.effect(a jsonb) RETURNS jsonb LANGUAGE sql"
                  " AS $$SELECT jsonb_build_object('doubled', (a->>'n')::int * 2)$$")
        c.execute("CREATE OR REPLACE FUNCTION every_app.sub(m sturdy.outbox, attempt int) RETURNS void"
                  " LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'no' USING ERRCODE = 'P0001'; END$$")
        c.execute("CREATE TABLE IF NOT EXISTS every_app.rows (id int PRIMARY KEY, state text NOT NULL)")
        c.execute("INSERT INTO every_app.rows SELECT i, 'new' FROM generate_series(1, 50) i ON CONFLICT DO NOTHING")
        c.execute("DROP ROLE IF EXISTS every_user")
        c.execute("CREATE ROLE every_user")

        token = call("claim", "SELECT sturdy.claim('every-w', '1 minute', 'me')")[0]
        assert call("renew", "SELECT sturdy.renew('every-w', %s, '2 minutes') > now()", token) == (True,)
        assert call("fence", "SELECT sturdy.fence('every-w', %s)::text", token) == ("",)
        assert call("record", "SELECT first FROM sturdy.record('every-w', 's1', '{\"a\": 1}', %s)", token) == (True,)
        assert call("supply", "SELECT sturdy.supply('every-w', 's1', '{\"a\": 2}')") == ({"a": 1},)
        assert call("load", "SELECT count(*) FROM sturdy.load('every-w')") == (1,)
        assert call("transact", "SELECT sturdy.transact('every-w', %s, 's2', 'every_app.effect(jsonb)', '{\"n\": 21}')",
                    token) == ({"doubled": 42},)
        assert call("release", "SELECT sturdy.release('every-w', %s)", token) == (True,)
        call("schedule", "SELECT sturdy.schedule('every-' || i, now(), 'every-q') FROM generate_series(1, 4) i")
        rows = c.execute("SELECT workflow, receipt FROM sturdy.take('every-q', max => 3)").fetchall()
        calls.append("take")
        assert len(rows) == 3
        assert call("done", "SELECT sturdy.done(%s, %s, 'every-q')", *rows[0]) == (True,)
        assert call("done_many", "SELECT sturdy.done_many(%s, %s, 'every-q')",
                    [w for w, _ in rows[1:]], [r for _, r in rows[1:]]) == (2,)
        (w, r) = c.execute("SELECT workflow, receipt FROM sturdy.take('every-q')").fetchone()
        (r,) = call("extend", "SELECT sturdy.extend(%s, %s, '5 minutes', 'every-q')", w, r)
        assert r is not None
        assert call("wake_at", "SELECT sturdy.wake_at(%s, %s, now() + interval '1 hour', 'every-q')", w, r) == (True,)
        assert call("arrive", "SELECT sturdy.arrive(%s, 'approved', 'true', 'every-q')", w) == (True,)
        (w, r, t) = c.execute("SELECT workflow, receipt, token FROM sturdy.take('every-q', claim => true)").fetchone()
        assert call("finish", "SELECT sturdy.finish(%s, %s, %s, 'end', '1', queue => 'every-q')", w, t, r) == (True,)
        # a failing pass on a distributed queue: the policy on the queue's
        # shard, the row dead at its second failure (the first by fail, the
        # second a lease that ran out), its instance failed on the coordinator
        call("retry_queue", "SELECT sturdy.retry_queue('every-fq', max_attempts => 2, backoff => '0 seconds')")
        c.execute("SELECT sturdy.start('every-f', 'every-fbk', '{}', NULL, 'every-fq')")
        (w, r, a) = c.execute("SELECT workflow, receipt, attempt FROM sturdy.take('every-fq')").fetchone()
        assert a == 1
        assert call("fail", "SELECT sturdy.fail(%s, %s, 'no', 'every-fq', code => 'P0001')", w, r) == (True,)
        (w, r, a) = c.execute("SELECT workflow, receipt, attempt FROM sturdy.take('every-fq', '10 milliseconds')").fetchone()
        assert a == 2
        time.sleep(0.05)
        assert c.execute("SELECT count(*) FROM sturdy.take('every-fq')").fetchone() == (0,)
        assert c.execute("SELECT attempts, visible_at = 'infinity', last_error FROM sturdy.queue WHERE queue = 'every-fq'"
                         ).fetchone() == (2, True, "the lease ran out")
        assert c.execute("SELECT status, last_error FROM sturdy.instances WHERE business_key = 'every-fbk'"
                         ).fetchone() == ("failed", "the lease ran out")
        assert c.execute("SELECT dead FROM sturdy.queue_stats WHERE queue = 'every-fq'").fetchone() == (1,)
        assert call("redrive", "SELECT sturdy.redrive(%s, 'every-fq')", w) == (True,)
        assert call("cancel", "SELECT sturdy.cancel(%s, 'every-fq')", w) == (True,)
        assert c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = 'every-fq'").fetchone() == (0,)
        call("limit_queue", "SELECT sturdy.limit_queue('every-q', running => 1)")
        assert call("pause", "SELECT sturdy.pause('every-q')") == (True,)
        assert call("resume", "SELECT sturdy.resume('every-q')") == (True,)
        call("queue_changed", "SELECT sturdy.queue_changed('every-q')")
        call("queue_backdated", "SELECT sturdy.queue_backdated('every-q')")
        [port] = nodes_holding(c, "sturdy.queue", ["every-q"])
        assert call("queue_node", "SELECT port FROM sturdy.queue_node('every-q')") == (port,)
        call("limit_queue", "SELECT sturdy.limit_queue('every-q')")
        call("subscribe", "SELECT sturdy.subscribe('every.ev', 'every_app.sub(sturdy.outbox, integer)', 1)")
        (outbox, deliveries) = call("emit", "SELECT * FROM sturdy.emit('every.ev', '{}', 'agg')")
        assert deliveries == 1
        assert call("pump", "SELECT dead_letter FROM sturdy.pump(10)") == (1,)
        (dead,) = c.execute("SELECT id FROM sturdy.deliveries WHERE outbox_id = %s", (outbox,)).fetchone()
        assert call("redrive", "SELECT sturdy.redrive(%s)", dead) == (True,)
        assert call("unsubscribe", "SELECT sturdy.unsubscribe('every.ev', 'every_app.sub(sturdy.outbox, integer)')") == (True,)
        (i,) = call("start", "SELECT sturdy.start('every', 'every-bk', '{}', 'every-key', 'every-start')")
        assert call("status", "SELECT status FROM sturdy.status('every-bk')") == ("pending",)
        assert call("transition", "SELECT sturdy.transition(%s, 'pending', 'running')", i) == (True,)
        assert call("watch", "SELECT status FROM sturdy.watch(%s)", i) == ("running",)
        assert call("schedule_many", "SELECT sturdy.schedule_many(ARRAY['every-j1', 'every-j2'],"
                    " ARRAY['{\"n\": 1}', NULL]::jsonb[], 'every-jobs')") == (2,)
        assert call("stuck", "SELECT count(*) FROM sturdy.stuck('1 hour') WHERE business_key = 'every-bk'") == (0,)
        assert call("batch", "SELECT done FROM sturdy.batch('every_app.rows', 'state = $1', 'state = $2',"
                    " ARRAY['done', 'new'], chunk => 20)") == (20,)
        call("batch_start", "SELECT sturdy.batch_start('every-job', 'every_app.rows', 'state = $1', 'state = $2',"
             " ARRAY['done', 'new'], chunk => 50)")
        assert call("batch_tick", "SELECT complete FROM sturdy.batch_tick('every-job')") is not None
        calls.append("batch_all")
        c.execute("CALL sturdy.batch_all('every_app.rows', 'state = $1', 'state = $2', ARRAY['new', 'done'])")
        assert c.execute("SELECT count(*) FROM every_app.rows WHERE state = 'new'").fetchone() == (50,)
        assert call("sample", "SELECT sturdy.sample() > 0") == (True,)
        assert call("sweep", "SELECT count(*) FROM sturdy.sweep('7 days', 10)") == (10,)
        call("grant_usage", "SELECT sturdy.grant_usage('every_user')")
        call("distribute", "SELECT sturdy.distribute(%s)", WITH_QUEUES)
        assert call("workflow_place", "SELECT sturdy.workflow_place('orders/77')") == ("orders",)
        for view in ("queue_stats", "outbox_stats", "batch_jobs", "health"):
            c.execute(f"SELECT count(*) FROM sturdy.{view}")
    assert functions - set(calls) == set(), "functions of the catalog this test does not call"
