#!/usr/bin/env python3
"""The calls served without a statement (src/access/: schedule's and
claim's upserts, take's lease, done's delete, finish's lock, update and
insert) against the statements they stand for.

Two databases of one cluster, one build: in FAST the calls go the way they
go; in STMT every table the fast path serves carries an expression index,
which it refuses, so every call there runs its statement. The same calls, in
the same order, over a corpus of what users do to tables (constraints,
generated and domain-typed columns, indexes of their own or ours rebuilt,
triggers, publications, partitions, row-level security, rewrites between
calls, isolation levels), must give the same answers, the same SQLSTATEs and
the same rows. Lock and statement timeouts, cancels and a deadlock at each
wait a fast call can make must fail that call with the statement's SQLSTATE,
and never the server: a session opened at the start must still answer at
the end (the file's last test).
"""
import datetime
import re
import threading
import time

import psycopg
from psycopg import errors, sql
import pytest

from sturdy import SERVER

FAST, STMT = "sturdy_fp_fast", "sturdy_fp_stmt"
ROLE = "sturdy_fp_worker"

# An expression index on each table the fast path serves: it refuses the
# table (src/access/shape.rs), and the statement keeps the index.
REFUSE = [
    "CREATE INDEX fp_refuse ON sturdy.queue ((workflow || ''))",
    "CREATE INDEX fp_refuse_claims ON sturdy.claims ((workflow || ''))",
    "CREATE INDEX fp_refuse_checkpoints ON sturdy.checkpoints ((step || ''))",
    "CREATE INDEX fp_refuse_places ON sturdy.queue_places ((queue || ''))",
    "CREATE INDEX fp_refuse_key_places ON sturdy.queue_key_places ((key || ''))",
]


def dsn(db):
    return f"{SERVER} dbname={db}"


def admin(db="postgres"):
    return psycopg.connect(dsn(db), autocommit=True)


def fresh(db, setup, refuse):
    """Database `db` with pg_sturdy, `setup` run as its owner, and (with
    `refuse`) the indexes that send every call to its statement."""
    with admin() as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
        if not c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone():
            c.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(ROLE)))
    with admin(db) as c:
        c.execute("CREATE EXTENSION pg_sturdy")
        c.execute("SELECT sturdy.grant_usage(%s)", (ROLE,))
        for statement in setup + (REFUSE if refuse else []):
            c.execute(statement)


def outcome(cur, statement, params):
    """('ok', rows) or (SQLSTATE, None) of one statement."""
    try:
        cur.execute(statement, params)
        return ("ok", cur.fetchall() if cur.description else [])
    except psycopg.Error as e:
        return (e.sqlstate, None)


def normal_outcome(got):
    return (got[0], None if got[1] is None else [tuple(normal(v) for v in row) for row in got[1]])


TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def normal(v):
    """A value as both sides can agree on it: clock readings as whether they
    are there (each side has its own now())."""
    if isinstance(v, datetime.datetime):
        return "T"
    if isinstance(v, str) and TIMESTAMP.match(v):
        return "T"
    if isinstance(v, dict):
        return {k: normal(x) for k, x in v.items()}
    if isinstance(v, list):
        return [normal(x) for x in v]
    return v


def tables(c):
    """Every row of the tables the fast path writes, every column (the
    users' own included), in key order; `seq` as its rank (a statement's
    `nextval` runs before it finds a row to update, the fast path's only
    when it inserts: gaps differ, order does not). The places by what holds
    them, each with whether it is within its limit, not by number: a
    one-row take looks first from the place its backend held last (after a
    limit's change too, where the places were made anew), a statement from
    the first, so which free place a pass gets may differ, not what holds
    places nor how many there are."""
    out = {}
    within = {"queue_places": "(SELECT l.running FROM sturdy.queue_limits l WHERE l.queue = t.queue)",
              "queue_key_places": "(SELECT l.per_key FROM sturdy.queue_limits l WHERE l.queue = t.queue)"}
    for table, order in [("queue", "queue, workflow"), ("claims", "workflow"), ("checkpoints", "workflow, step"),
                         ("queue_places", "queue, workflow, receipt"),
                         ("queue_key_places", "queue, key, workflow, receipt")]:
        rank = " || jsonb_build_object('seq', dense_rank() OVER (ORDER BY seq))" if table == "queue" else ""
        if table in within:
            rank = (f" - 'place' || jsonb_build_object('within', t.place <= {within[table]})")
        rows = c.execute(f"SELECT to_jsonb(t){rank} FROM sturdy.{table} t ORDER BY {order}").fetchall()
        out[table] = [normal(r[0]) for r in rows]
    return out


# A step: (name, SQL, params) where params may be a function of the results
# so far (each side its own); or ("admin", [statements]) run as the owner.
def S(name, statement, params=()):
    return (name, statement, params)


def first(name, col):
    return lambda r: r[name][1][0][col] if r.get(name, ("", None))[1] else None


def expire(queue="q"):
    """Every lease of `queue` run out, by a statement on both sides."""
    return ("admin", [f"UPDATE sturdy.queue SET leased_until = now() - interval '1 hour' WHERE queue = '{queue}'"])


BASE = [
    S("s1", "SELECT sturdy.schedule('w1', now() - interval '1 minute', 'q')"),
    S("s2", "SELECT sturdy.schedule('w2', now() - interval '1 minute', 'q')"),
    S("s3", "SELECT sturdy.schedule('w3', now() + interval '1 hour', 'q')"),
    S("s4", "SELECT sturdy.schedule('w1', now() - interval '2 minutes', 'q')"),
    S("t1", "SELECT workflow, receipt, token FROM sturdy.take('q', '1 minute')"),
    S("d1", "SELECT sturdy.done(%s, %s::timestamptz, 'q')", lambda r: (first("t1", 0)(r), first("t1", 1)(r))),
    S("d2", "SELECT sturdy.done(%s, %s::timestamptz, 'q')", lambda r: (first("t1", 0)(r), first("t1", 1)(r))),
    S("t2", "SELECT workflow, receipt, token FROM sturdy.take('q', '1 minute', 2, true)"),
    expire(),
    S("t3", "SELECT workflow, receipt, token FROM sturdy.take('q', '1 minute')"),
    S("d3", "SELECT sturdy.done(%s, now(), 'q')", lambda r: (first("t3", 0)(r),)),
    S("c1", "SELECT sturdy.claim('c1', '1 minute')"),
    S("c2", "SELECT sturdy.claim('c1', '1 minute')"),
    S("r1", "SELECT * FROM sturdy.record('c1', 's1', '{\"a\": 1}', 1)"),
    S("f1", "SELECT sturdy.finish(%s, %s, %s::timestamptz, 'end', '{\"x\": 1}', queue => 'q')",
      lambda r: (first("t2", 0)(r), first("t2", 2)(r), first("t2", 1)(r))),
    S("f2", "SELECT sturdy.finish(%s, %s, %s::timestamptz, queue => 'q')",
      lambda r: (first("t3", 0)(r), first("t3", 2)(r) or 1, first("t3", 1)(r))),
    S("s5", "SELECT sturdy.schedule('w9', now(), 'other')"),
    S("t4", "SELECT workflow, receipt, token FROM sturdy.take('other')"),
    S("s6", "SELECT sturdy.schedule('m' || i, now() - interval '1 second', 'q') FROM generate_series(1, 5) i"),
    S("t5", "SELECT workflow, receipt, token FROM sturdy.take('q', '1 minute', 3, true)"),
    expire(),
    # (in the workflows' order: the rows of a take of several come in the
    # order its statement's runs found them, which the lapsed leases it
    # counts between runs can change from one database to the other)
    S("t6", "SELECT workflow, receipt, token FROM sturdy.take('q', '1 minute', 10) ORDER BY workflow"),
    S("s7", "SELECT sturdy.schedule(%s, now() - interval '1 second', 'q')", lambda r: (first("t6", 0)(r),)),
    S("d4", "SELECT sturdy.done(%s, %s::timestamptz, 'q')", lambda r: (first("t6", 0)(r), first("t6", 1)(r))),
    S("c3", "SELECT sturdy.claim('c2', '1 minute', 'me')"),
]


def took(name, queue):
    """The done of what step `name` took, on both sides."""
    return S(f"done {name}", f"SELECT sturdy.done(%s, %s::timestamptz, '{queue}')",
             lambda r: (first(name, 0)(r), first(name, 1)(r)))


def take1(name, queue):
    return S(name, f"SELECT workflow, receipt, token FROM sturdy.take('{queue}', '1 minute')")


# Limited queues: the places one-row takes lock and write, the dones that
# free them where the take left them or by the row's key, lapsed leases,
# a key met without places, a batch (its statement on both sides).
LIMITED = [
    ("admin", ["SELECT sturdy.limit_queue('lq', running => 2)", "SELECT sturdy.limit_queue('kq', per_key => 1)"]),
    S("ls", "SELECT sturdy.schedule('l' || i, now() - interval '1 minute' + i * interval '1 second', 'lq')"
            " FROM generate_series(1, 5) i"),
    S("ks", "SELECT sturdy.schedule('k' || i, now() - interval '1 minute' + i * interval '1 second', 'kq',"
            " key => 'key' || (i % 2)) FROM generate_series(1, 5) i"),
    take1("lt1", "lq"), take1("lt2", "lq"), take1("lt3", "lq"),
    took("lt1", "lq"), take1("lt4", "lq"),
    take1("kt1", "kq"), take1("kt2", "kq"), take1("kt3", "kq"),
    took("kt1", "kq"), take1("kt4", "kq"),
    S("kw", "SELECT sturdy.wake_at(%s, %s::timestamptz, now() + interval '1 hour', 'kq')",
      lambda r: (first("kt4", 0)(r), first("kt4", 1)(r))),
    S("kn", "SELECT sturdy.schedule('k9', now() - interval '2 minutes', 'kq', key => 'fresh')"),
    take1("kt5", "kq"), took("kt5", "kq"),
    expire("lq"), expire("kq"),
    take1("lt5", "lq"), took("lt2", "lq"), take1("lt6", "lq"), took("lt5", "lq"),
    take1("kt6", "kq"), took("kt2", "kq"), take1("kt7", "kq"),
    S("lb", "SELECT workflow, receipt, token FROM sturdy.take('lq', '1 minute', 2)"),
    S("lbd", "SELECT sturdy.done_many(array[%s], array[%s::timestamptz], 'lq')",
      lambda r: (first("lb", 0)(r), first("lb", 1)(r))),
    take1("lt7", "lq"),
    # limits changed under passes in flight: lowered (the queues settle:
    # their takes count the places held, by the statements), then raised
    # again (the passes keep their places)
    ("admin", ["SELECT sturdy.limit_queue('lq', running => 1)", "SELECT sturdy.limit_queue('kq', per_key => 2)"]),
    take1("lt8", "lq"), took("lt7", "lq"), take1("lt9", "lq"), took("lt6", "lq"), take1("lt10", "lq"),
    take1("kt8", "kq"), take1("kt9", "kq"),
    ("admin", ["SELECT sturdy.limit_queue('lq', running => 3)", "SELECT sturdy.limit_queue('kq', per_key => 1)"]),
    take1("lt11", "lq"), took("lt10", "lq"), take1("lt12", "lq"),
    take1("kt10", "kq"), took("kt8", "kq"), took("kt9", "kq"), take1("kt11", "kq"),
]


def rewrite_between(command, one_transaction):
    """A take of one row (whose done goes first to the place the take left
    the row at), `command`, then the done of what it took: in one
    transaction or in three."""
    steps = [
        S("s", "SELECT sturdy.schedule('r' || i, now() - interval '1 minute', 'rw') FROM generate_series(1, 3) i"),
        S("begin", "BEGIN") if one_transaction else None,
        S("t", "SELECT workflow, receipt, token FROM sturdy.take('rw', '1 minute')"),
        ("admin", [command]),
        S("d", "SELECT sturdy.done(%s, %s::timestamptz, 'rw')", lambda r: (first("t", 0)(r), first("t", 1)(r))),
        S("t2", "SELECT workflow, receipt, token FROM sturdy.take('rw', '1 minute')"),
        S("end", "COMMIT") if one_transaction else None,
    ]
    return [s for s in steps if s]


def run(db, steps, mode, role):
    """Run `steps` against `db`: each in its own transaction at isolation
    level `mode` (or autocommit, or all in one transaction with 'one'). The
    outcome of each, and the tables after."""
    results, outcomes = {}, []
    with psycopg.connect(dsn(db), autocommit=True) as c:
        cur = c.cursor()
        if role:
            c.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(ROLE)))
        if mode == "one":
            c.execute("BEGIN")
        for step in steps:
            if step[0] == "admin":
                for statement in ["RESET ROLE"] + step[1] + ([f"SET ROLE {ROLE}"] if role else []):
                    got = outcome(cur, statement, ())
                    outcomes.append(("admin", statement, got[0]))
                continue
            name, statement, params = step
            if callable(params):
                params = params(results)
            wrap = mode not in ("autocommit", "one") and c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            if wrap:
                c.execute(f"BEGIN ISOLATION LEVEL {mode}")
            got = outcome(cur, statement, params)
            if wrap:
                c.execute("COMMIT" if got[0] == "ok" else "ROLLBACK")
            results[name] = got
            outcomes.append((name, statement, normal_outcome(got)))
        if c.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            c.execute("ROLLBACK" if c.info.transaction_status == psycopg.pq.TransactionStatus.INERROR else "COMMIT")
        c.execute("RESET ROLE")
        return outcomes, tables(c)


def differ(setup, steps, mode="autocommit", role=True):
    """Run `steps` on both sides after `setup`: the differences, if any."""
    fresh(FAST, setup, False)
    fresh(STMT, setup, True)
    fast, fast_tables = run(FAST, steps, mode, role)
    stmt, stmt_tables = run(STMT, steps, mode, role)
    diffs = [f"{a[0]} ({a[1]}): fast {a[2]!r}, statement {b[2]!r}" for a, b in zip(fast, stmt) if a[2] != b[2]]
    for table in fast_tables:
        if fast_tables[table] != stmt_tables[table]:
            diffs.append(f"sturdy.{table}: fast {fast_tables[table]!r}, statement {stmt_tables[table]!r}")
    return diffs


def same(setup, steps=BASE, **kw):
    diffs = differ(setup, steps, **kw)
    assert not diffs, "; ".join(diffs[:4])


# --- The five defects, each as it was found -----------------------------------------------------


def refused(c, statement, error, what):
    """`statement` must raise `error`; `what` says what went wrong if not."""
    try:
        c.execute(statement)
    except error:
        return
    raise AssertionError(what)


PARTITION = [
    "CREATE TABLE public.all_queues (LIKE sturdy.queue INCLUDING DEFAULTS) PARTITION BY LIST (queue)",
    "ALTER TABLE public.all_queues ATTACH PARTITION sturdy.queue FOR VALUES IN ('q', 'rw')",
]


def test_take_keeps_a_check_constraint():
    """A lease that would break a CHECK of the user's raises 23514, as the
    statement does, and stores nothing."""
    fresh(FAST, ["ALTER TABLE sturdy.queue ADD CONSTRAINT at_most_one_take CHECK (takes <= 1)"], False)
    with admin(FAST) as c:
        c.execute("SELECT sturdy.schedule('c1', now(), 'q')")
        c.execute("SELECT * FROM sturdy.take('q', '10 milliseconds')")
        # (its lease long run out: the failure counted, its backoff over, the
        # row leased again as the next attempt)
        c.execute("UPDATE sturdy.queue SET leased_until = now() - interval '1 hour'")
        refused(c, "SELECT * FROM sturdy.take('q', '10 milliseconds')", errors.CheckViolation,
                "the second take broke the CHECK without an error")
        (takes,) = c.execute("SELECT takes FROM sturdy.queue").fetchone()
        assert takes == 1, f"takes = {takes}"


def test_take_recomputes_a_stored_generated_column():
    fresh(FAST, ["ALTER TABLE sturdy.queue ADD COLUMN lease_copy timestamptz GENERATED ALWAYS AS (leased_until) STORED"],
          False)
    with admin(FAST) as c:
        c.execute("SELECT sturdy.schedule('g1', now(), 'g')")
        c.execute("SELECT * FROM sturdy.take('g')")
        row = c.execute("SELECT lease_copy IS NOT DISTINCT FROM leased_until, lease_copy IS NULL FROM sturdy.queue").fetchone()
        assert row == (True, False), f"(lease_copy = leased_until, lease_copy IS NULL) = {row}"


def test_schedule_gives_a_domain_typed_column_its_default():
    fresh(FAST, ["CREATE DOMAIN public.tenant_t AS text NOT NULL DEFAULT 'main'",
                 "ALTER TABLE sturdy.queue ADD COLUMN tenant public.tenant_t"], False)
    with admin(FAST) as c:
        c.execute("SELECT sturdy.schedule('d1', now(), 'q')")
        (tenant,) = c.execute("SELECT tenant FROM sturdy.queue WHERE workflow = 'd1'").fetchone()
        assert tenant == "main", f"tenant = {tenant!r}"


def test_done_after_a_truncate_in_its_own_transaction_answers_false():
    fresh(FAST, [], False)
    with admin(FAST) as c:
        c.execute("SELECT sturdy.schedule('t1', now(), 't')")
        c.execute("BEGIN")
        workflow, receipt = c.execute("SELECT workflow, receipt FROM sturdy.take('t')").fetchone()
        c.execute("TRUNCATE sturdy.queue")
        (removed,) = c.execute("SELECT sturdy.done(%s, %s, 't')", (workflow, receipt)).fetchone()
        c.execute("ROLLBACK")
        assert removed is False, f"done answered {removed!r}"


def test_a_partition_constraint_is_kept():
    """sturdy.queue attached as a partition for queue 'q': a schedule into
    another queue raises 23514, as the statement's insert does."""
    fresh(FAST, PARTITION, False)
    with admin(FAST) as c:
        c.execute("SELECT sturdy.schedule('p1', now(), 'q')")
        refused(c, "SELECT sturdy.schedule('p2', now(), 'elsewhere')", errors.CheckViolation,
                "a row outside the partition's bounds went in")


# --- Waits: a timeout, a cancel or a deadlock fails the call, never the server ------------------

# (name, set-up run once, holder's statements in an open transaction, the
# call that waits for it). The call runs as the worker role.
WAITS = [
    ("the sequence's lock (a new row's seq)", [],
     ["ALTER SEQUENCE sturdy.queue_seq CACHE 1"],
     "SELECT sturdy.schedule('new', now(), 'q')"),
    ("a row lock (schedule's update)", ["SELECT sturdy.schedule('x', now(), 'q')"],
     ["SELECT FROM sturdy.queue WHERE workflow = 'x' FOR UPDATE"],
     "SELECT sturdy.schedule('x', now(), 'q')"),
    ("an insert of the same key", [],
     ["SELECT sturdy.schedule('y', now(), 'q')"],
     "SELECT sturdy.schedule('y', now(), 'q')"),
    ("a row lock (done's delete)", ["SELECT sturdy.schedule('z', now() - interval '1 hour', 'dq')",
                                    "UPDATE sturdy.queue SET leased_until = '2100-01-01' WHERE workflow = 'z'"],
     ["SELECT FROM sturdy.queue WHERE workflow = 'z' FOR UPDATE"],
     "SELECT sturdy.done('z', '2100-01-01'::timestamptz, 'dq')"),
    ("a claim's row lock (claim)", ["SELECT sturdy.claim('k', '1 second')", "SELECT pg_sleep(1.1)"],
     ["SELECT FROM sturdy.claims WHERE workflow = 'k' FOR UPDATE"],
     "SELECT sturdy.claim('k', '1 minute')"),
    ("a claim's row lock (finish)", ["SELECT sturdy.schedule('f', now() - interval '1 hour', 'fq')",
                                     "UPDATE sturdy.queue SET leased_until = '2100-01-01' WHERE workflow = 'f'",
                                     "SELECT sturdy.claim('f', '1 hour')"],
     ["SELECT FROM sturdy.claims WHERE workflow = 'f' FOR UPDATE"],
     "SELECT sturdy.finish('f', 1, '2100-01-01'::timestamptz, 'last', '1', queue => 'fq')"),
    ("the table's lock (take)", ["SELECT sturdy.schedule('l', now(), 'lq')"],
     ["LOCK TABLE sturdy.queue IN ACCESS EXCLUSIVE MODE"],
     "SELECT * FROM sturdy.take('lq')"),
]


def until_waiting(db, pid):
    """Return once backend `pid` waits on a lock (or after 5 s)."""
    with admin(db) as k:
        for _ in range(200):
            if k.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]:
                return
            time.sleep(0.025)


def wait_outcome(db, holder, call, how):
    """Hold `holder` open in one session; run `call` in another, ended by
    `how` (lock_timeout, statement_timeout, cancel, deadlock): its SQLSTATE,
    then whether it goes through once the holder is gone."""
    with admin(db) as h, admin(db) as w:
        h.execute("BEGIN")
        for statement in holder:
            h.execute(statement)
        pid = w.info.backend_pid
        canceller = None
        if how == "lock_timeout":
            w.execute("SET lock_timeout = '300ms'")
        elif how == "statement_timeout":
            w.execute("SET statement_timeout = '300ms'")
        elif how == "cancel":
            def cancel():
                until_waiting(db, pid)
                with admin(db) as k:
                    k.execute("SELECT pg_cancel_backend(%s)", (pid,))
            canceller = threading.Thread(target=cancel)
            canceller.start()
        elif how == "deadlock":
            # the waiter holds a lock the holder then asks for; the waiter,
            # whose wait began first and whose deadlock_timeout ends first,
            # finds the cycle
            w.execute("SET deadlock_timeout = '1s'")
            w.execute("BEGIN")
            w.execute("LOCK TABLE sturdy.batches IN ACCESS EXCLUSIVE MODE")

            def close_the_cycle():
                until_waiting(db, pid)
                try:
                    h.execute("SET deadlock_timeout = '10s'")
                    h.execute("LOCK TABLE sturdy.batches IN ACCESS SHARE MODE")
                except psycopg.Error:
                    pass
            canceller = threading.Thread(target=close_the_cycle)
            canceller.start()
        w.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(ROLE)))
        try:
            w.execute(call)
            code = "ok"
        except psycopg.Error as e:
            code = e.sqlstate
        if canceller:
            if how == "deadlock":
                w.execute("ROLLBACK")
            canceller.join()
        h.execute("ROLLBACK")
        w.execute("RESET lock_timeout")
        w.execute("RESET statement_timeout")
        try:
            w.execute(call)
            after = "ok"
        except psycopg.Error as e:
            after = e.sqlstate
        return code, after


EXPECTED = {"lock_timeout": "55P03", "statement_timeout": "57014", "cancel": "57014", "deadlock": "40P01"}


def waits_end_the_call_not_the_server(hows):
    with admin() as watcher:
        started = watcher.execute("SELECT pg_postmaster_start_time()").fetchone()
        failures = []
        for name, setup, holder, call in WAITS:
            for how in hows:
                if how == "deadlock" and not name.startswith("the sequence"):
                    continue
                got = {}
                for db, refuse in [(FAST, False), (STMT, True)]:
                    fresh(db, setup, refuse)
                    got[db] = wait_outcome(db, holder, call, how)
                    # alive, and not restarted
                    assert watcher.execute("SELECT pg_postmaster_start_time()").fetchone() == started
                if got[FAST][0] != EXPECTED[how] or got[FAST] != got[STMT]:
                    failures.append(f"{name}, {how}: fast {got[FAST]}, statement {got[STMT]}")
        assert not failures, "; ".join(failures)


def test_a_lock_timeout_at_any_wait_fails_the_call_not_the_server():
    waits_end_the_call_not_the_server(["lock_timeout"])


def test_a_statement_timeout_or_a_cancel_at_any_wait_fails_the_call_not_the_server():
    waits_end_the_call_not_the_server(["statement_timeout", "cancel"])


def test_a_deadlock_at_the_sequences_lock_fails_the_call_not_the_server():
    waits_end_the_call_not_the_server(["deadlock"])


# --- The differential corpus --------------------------------------------------------------------


def test_differential_untouched_tables():
    same([])


def test_differential_isolation_levels():
    for mode in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE", "one"]:
        diffs = differ([], BASE, mode=mode)
        assert not diffs, f"{mode}: " + "; ".join(diffs[:4])


def test_differential_limited_queues():
    for mode in ["autocommit", "READ COMMITTED", "REPEATABLE READ", "one"]:
        diffs = differ([], LIMITED, mode=mode)
        assert not diffs, f"{mode}: " + "; ".join(diffs[:4])


def test_differential_as_the_owner():
    same([], role=False)


def test_differential_check_constraints():
    same(["ALTER TABLE sturdy.queue ADD CONSTRAINT at_most_one_take CHECK (takes <= 1)",
          "ALTER TABLE sturdy.claims ADD CONSTRAINT short_lease CHECK (token < 2)",
          "ALTER TABLE sturdy.checkpoints ADD CONSTRAINT small CHECK (pg_catalog.length(step) < 3)"])


def test_differential_stored_generated_columns():
    same(["ALTER TABLE sturdy.queue ADD COLUMN lease_copy timestamptz GENERATED ALWAYS AS (leased_until) STORED",
          "ALTER TABLE sturdy.claims ADD COLUMN token_copy bigint GENERATED ALWAYS AS (token * 2) STORED",
          "ALTER TABLE sturdy.checkpoints ADD COLUMN step_copy text GENERATED ALWAYS AS (step || '!') STORED"])


def test_differential_domain_typed_columns_with_defaults():
    same(["CREATE DOMAIN public.tenant_t AS text NOT NULL DEFAULT 'main'",
          "CREATE DOMAIN public.positive AS int CHECK (VALUE > 0)",
          "ALTER TABLE sturdy.queue ADD COLUMN tenant public.tenant_t",
          "ALTER TABLE sturdy.claims ADD COLUMN tenant public.tenant_t",
          "ALTER TABLE sturdy.checkpoints ADD COLUMN tenant public.tenant_t",
          "ALTER TABLE sturdy.queue ADD COLUMN weight public.positive"])


def test_differential_columns_added_with_defaults_and_dropped():
    same(["ALTER TABLE sturdy.queue ADD COLUMN gone int",
          "ALTER TABLE sturdy.queue ADD COLUMN note text DEFAULT 'n'",
          "ALTER TABLE sturdy.queue DROP COLUMN gone",
          "ALTER TABLE sturdy.claims ADD COLUMN gone int",
          "ALTER TABLE sturdy.claims DROP COLUMN gone",
          "ALTER TABLE sturdy.claims ADD COLUMN at timestamptz DEFAULT now()",
          "ALTER TABLE sturdy.checkpoints ADD COLUMN gone int",
          "ALTER TABLE sturdy.checkpoints DROP COLUMN gone"])


def test_differential_users_own_partial_and_expression_indexes():
    same(["CREATE INDEX mine_partial ON sturdy.queue (workflow) WHERE takes > 0",
          "CREATE UNIQUE INDEX mine_unique ON sturdy.queue (workflow, queue, seq)",
          "CREATE INDEX mine_expr ON sturdy.claims (pg_catalog.lower(workflow))"])


def test_differential_our_index_rebuilt_descending():
    same(["DROP INDEX sturdy.queue_visible",
          "CREATE INDEX queue_visible ON sturdy.queue (queue, visible_at DESC, seq)"])


def test_differential_our_index_rebuilt_nulls_first_or_with_another_operator_class():
    same(["DROP INDEX sturdy.queue_visible",
          "CREATE INDEX queue_visible ON sturdy.queue (queue text_pattern_ops, visible_at, seq NULLS FIRST)",
          "ALTER TABLE sturdy.claims DROP CONSTRAINT claims_pkey",
          "ALTER TABLE sturdy.claims ADD CONSTRAINT claims_pkey PRIMARY KEY (workflow)",
          "CREATE INDEX claims_desc ON sturdy.claims (workflow DESC)"])


def test_differential_our_index_rebuilt_with_a_nondeterministic_collation():
    with admin() as c:
        c.execute("BEGIN")
        try:
            c.execute("CREATE COLLATION public.fp_probe (provider = icu, locale = 'und-u-ks-level2', deterministic = false)")
        except psycopg.errors.FeatureNotSupported:
            pytest.skip("this server is built without ICU")
        finally:
            c.execute("ROLLBACK")
    same(["CREATE COLLATION public.folded (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
          "DROP INDEX sturdy.queue_visible",
          'CREATE INDEX queue_visible ON sturdy.queue (queue COLLATE public.folded, visible_at, seq)'],
         # first in the index, and equal to 'q' there: a scan that took its
         # bytes for the end of queue 'q' would stop before 'q''s rows
         [S("s0", "SELECT sturdy.schedule('cased', now() - interval '1 hour', 'Q')")] + BASE)


def test_differential_triggers():
    same(["CREATE TABLE public.audit (what text)",
          "GRANT INSERT ON public.audit TO " + ROLE,
          """CREATE FUNCTION public.note() RETURNS trigger LANGUAGE plpgsql AS
             $$BEGIN INSERT INTO public.audit VALUES (TG_TABLE_NAME || ' ' || TG_OP); RETURN NEW; END$$""",
          "CREATE TRIGGER note AFTER INSERT OR UPDATE OR DELETE ON sturdy.queue FOR EACH ROW EXECUTE FUNCTION public.note()",
          "CREATE TRIGGER note AFTER INSERT OR UPDATE ON sturdy.claims FOR EACH ROW EXECUTE FUNCTION public.note()"],
         BASE + [S("audit", "SELECT what, count(*) FROM public.audit GROUP BY what ORDER BY what")])


def test_differential_publications():
    same(["CREATE PUBLICATION everything FOR TABLE sturdy.queue, sturdy.claims, sturdy.checkpoints"])


def test_differential_a_publication_without_replica_identity():
    same(["ALTER TABLE sturdy.queue REPLICA IDENTITY NOTHING",
          "ALTER TABLE sturdy.claims REPLICA IDENTITY NOTHING",
          "CREATE PUBLICATION everything FOR TABLE sturdy.queue, sturdy.claims"])


def test_differential_the_queue_as_a_partition():
    same(PARTITION)


def test_differential_row_level_security():
    same(["ALTER TABLE sturdy.queue ENABLE ROW LEVEL SECURITY",
          "CREATE POLICY not_other ON sturdy.queue USING (queue <> 'other') WITH CHECK (workflow <> 'm3')",
          "ALTER TABLE sturdy.claims ENABLE ROW LEVEL SECURITY",
          "CREATE POLICY mine ON sturdy.claims USING (workflow <> 'c2')"])


def test_differential_privileges_revoked():
    same([f"REVOKE DELETE ON sturdy.queue FROM {ROLE}",
          f"REVOKE UPDATE ON sturdy.claims FROM {ROLE}"])


def test_differential_truncate_vacuum_full_and_cluster_between_calls():
    failures = []
    for command in ["TRUNCATE sturdy.queue", "VACUUM FULL sturdy.queue",
                    "CLUSTER sturdy.queue USING queue_visible", "VACUUM (TRUNCATE) sturdy.queue"]:
        for one in [False, True]:
            if one and command.startswith("VACUUM"):
                continue  # not in a transaction block
            diffs = differ([], rewrite_between(command, one), role=False)
            if diffs:
                failures.append(f"{command}{' in one transaction' if one else ''}: " + "; ".join(diffs[:3]))
    assert not failures, " | ".join(failures)



def test_differential_a_table_inheriting_from_ours():
    """A statement reaches the rows of a table that inherits from ours (a
    take leases them, a done deletes them): the fast path must hand every
    call to its statement."""
    same(["CREATE TABLE public.more_queue () INHERITS (sturdy.queue)",
          "CREATE TABLE public.more_claims () INHERITS (sturdy.claims)",
          "CREATE TABLE public.more_checkpoints () INHERITS (sturdy.checkpoints)",
          "INSERT INTO public.more_queue (queue, workflow, visible_at, scheduled_at)"
          " VALUES ('q', 'inherited', now() - interval '2 hours', now())",
          "INSERT INTO public.more_claims (workflow, token, held_until, claimed_at)"
          " VALUES ('c1', 7, now() - interval '1 hour', now())"])


def test_differential_rules():
    """A rule on our tables rewrites the statement; the fast path has none
    to rewrite, so it must hand the call over."""
    same(["CREATE TABLE public.rule_log (what text)",
          "GRANT INSERT ON public.rule_log TO " + ROLE,
          "CREATE RULE log_delete AS ON DELETE TO sturdy.queue DO ALSO INSERT INTO public.rule_log VALUES ('queue')",
          "CREATE RULE log_update AS ON UPDATE TO sturdy.claims DO ALSO INSERT INTO public.rule_log VALUES ('claims')"],
         BASE + [S("rules", "SELECT what, count(*) FROM public.rule_log GROUP BY what ORDER BY what")])


def test_differential_a_read_only_transaction():
    """Every write in a read-only transaction fails with 25006 before it
    writes, on both sides."""
    same([], [S("ro", "SET default_transaction_read_only = on")] + BASE)

@pytest.fixture(scope="module", autouse=True)
def sentinel():
    """A session opened before the first test, and the databases dropped
    after the last."""
    with admin() as c:
        yield c, c.info.backend_pid
    for db in (FAST, STMT):
        with admin() as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))


def test_the_session_opened_first_outlived_every_test(sentinel):
    """Runs last (pytest keeps a file's order): no test restarted the server."""
    c, pid = sentinel
    try:
        alive = c.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
    except psycopg.Error:
        alive = False
    assert alive, "the server restarted: the session opened first is gone"
