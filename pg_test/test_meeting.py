"""Where a pass meets another call on its row: a wakeup, a cancel, a
failure, a lapse, an extend judged by an old now(), a dead row, the
policy tables written by hand, and the locks the calls take. Each test
reproduces one meeting and asserts what must hold there: a wakeup keeps
the pass's lease (and the pass's end then answers false and leaves the
row ready), every failure and lapse is counted, a dead row leaves only by
redrive or cancel, a stale end frees the place its pass held, extend never
answers without moving its place, cancel always fences its pass and frees
its place, the calls that end one pass never deadlock, a one-row take is
never empty beside a ready row, and the policy tables refuse what their
functions refuse.

Queues and workflows are named `meet-...`; each test cleans its own first.
"""
import time

import psycopg
import pytest

from sturdy import Worker, connect


# ---------------------------------------------------------------- helpers

def reset(c, q):
    """Queue `q` empty, without limits or a retry policy, and the claims
    and checkpoints of its workflows (named `q/...`) gone."""
    c.execute("DELETE FROM sturdy.queue WHERE queue = %s", (q,))
    c.execute("DELETE FROM sturdy.claims WHERE workflow LIKE %s", (q + "/%",))
    c.execute("DELETE FROM sturdy.checkpoints WHERE workflow LIKE %s", (q + "/%",))
    c.execute("SELECT sturdy.limit_queue(%s)", (q,))
    c.execute("SELECT sturdy.retry_queue(%s)", (q,))


def sqlstate(c, sql, args=()):
    """Run `sql` on `c` (autocommit): None, or the SQLSTATE it raised."""
    try:
        c.execute(sql, args)
    except psycopg.Error as e:
        return e.sqlstate
    return None


def row(c, q, w):
    """The row's state: (visible_at as text, since psycopg loads no
    'infinity'; leased_until, attempts, last_error)."""
    return c.execute("SELECT visible_at::text, leased_until, attempts, last_error FROM sturdy.queue"
                     " WHERE queue = %s AND workflow = %s", (q, w)).fetchone()


def wait_past(c, at, margin=0.05):
    """Sleep until the server's clock is `margin` seconds past `at`."""
    while c.execute("SELECT clock_timestamp() <= %s + make_interval(secs => %s)", (at, margin)).fetchone()[0]:
        time.sleep(0.02)


def take_one(q, lease="1 minute"):
    """A one-row take of `q` on a fresh connection: (workflow, receipt,
    attempt), or None."""
    with connect() as c:
        return c.execute("SELECT workflow, receipt, attempt FROM sturdy.take(%s, %s)", (q, lease)).fetchone()


def held_places(c, q, w):
    """Places of `q` a pass of `w` holds by the clock."""
    return c.execute("SELECT count(*) FROM sturdy.queue_places WHERE queue = %s AND workflow = %s"
                     " AND receipt > clock_timestamp()", (q, w)).fetchone()[0]


def wait_blocked_or_done(thread, pid, seconds=5):
    """Wait until the backend `pid` waits on a lock, or `thread` ended."""
    deadline = time.monotonic() + seconds
    with connect() as watch:
        while thread.is_alive() and time.monotonic() < deadline:
            waiting = watch.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                                    (pid,)).fetchone()
            if waiting and waiting[0]:
                return
            time.sleep(0.01)


# ------------------------------------------------------------ 1: cancel

def test_cancel_after_a_wakeup_fences_the_pass_and_frees_its_place():
    """running = 1: a pass taken with claim => true, a schedule of its
    workflow during it (a wakeup), then cancel: true, the pass's record
    raises SD001, and a take of another ready row of the queue gets it at
    once (the pass's place is free)."""
    q = "meet-cancel-woken"
    a, b = q + "/a", q + "/b"
    with connect() as c:
        reset(c, q)
        c.execute("SELECT sturdy.limit_queue(%s, running => 1)", (q,))
        c.execute("SELECT sturdy.schedule(%s, now() - interval '1 minute', %s)", (a, q))
        c.execute("SELECT sturdy.schedule(%s, now() - interval '30 seconds', %s)", (b, q))
    with connect() as worker, connect() as outside:
        w, _, token, *_ = worker.execute("SELECT * FROM sturdy.take(%s, '1 minute', claim => true)", (q,)).fetchone()
        assert w == a and token is not None
        outside.execute("SELECT sturdy.schedule(%s, now(), %s)", (a, q))
        assert outside.execute("SELECT sturdy.cancel(%s, %s)", (a, q)).fetchone()[0] is True
        fenced = sqlstate(worker, "SELECT * FROM sturdy.record(%s, 'step', '1', %s)", (a, token))
        next_take = take_one(q)
        held = held_places(outside, q, a)
        outside.execute("SELECT sturdy.limit_queue(%s)", (q,))
    assert fenced == "SD001", f"the cancelled pass's record was not fenced (got {fenced})"
    assert held == 0, "the cancelled pass still holds its place"
    assert next_take is not None and next_take[0] == b, f"the place was not freed: a take got {next_take}"


@pytest.mark.parametrize("counted_by", ["sweep", "take"])
def test_cancel_after_a_counted_lapse_fences_the_live_worker_and_frees_its_place(counted_by):
    """running = 1, backoff an hour: a pass taken with claim => true and a
    0.3 s lease outlives its lease (its worker lives on); a sweep('7 days')
    or a take counts the lapse (the row parks for its backoff). cancel is
    true, the worker's record with its token raises SD001, and the pass
    holds no place (with the sweep: a take of another ready row gets it at
    once)."""
    q = f"meet-cancel-lapsed-{counted_by}"
    a, b = q + "/a", q + "/b"
    with connect() as c:
        reset(c, q)
        c.execute("SELECT sturdy.limit_queue(%s, running => 1)", (q,))
        c.execute("SELECT sturdy.retry_queue(%s, backoff => '1 hour', jitter => 0)", (q,))
        c.execute("SELECT sturdy.schedule(%s, now() - interval '1 minute', %s)", (a, q))
        c.execute("SELECT sturdy.schedule(%s, now() - interval '30 seconds', %s)", (b, q))
    with connect() as worker, connect() as outside:
        w, receipt, token, *_ = worker.execute("SELECT * FROM sturdy.take(%s, '0.3 seconds', claim => true)",
                                              (q,)).fetchone()
        assert w == a and token is not None
        wait_past(outside, receipt)
        if counted_by == "sweep":
            lapsed = outside.execute("SELECT deleted FROM sturdy.sweep('7 days') WHERE kind = 'lapsed'").fetchone()[0]
            assert lapsed >= 1, "sweep did not count the lapse"
        else:
            got = outside.execute("SELECT workflow FROM sturdy.take(%s, '1 minute')", (q,)).fetchone()
            assert got == (b,), f"the take that counted the lapse got {got}"
        attempts = row(outside, q, a)[2]
        assert attempts == 1, f"the lapse was not counted (attempts {attempts})"
        assert outside.execute("SELECT sturdy.cancel(%s, %s)", (a, q)).fetchone()[0] is True
        fenced = sqlstate(worker, "SELECT * FROM sturdy.record(%s, 'step', '1', %s)", (a, token))
        held = held_places(outside, q, a)
        next_take = take_one(q) if counted_by == "sweep" else None
        outside.execute("SELECT sturdy.limit_queue(%s)", (q,))
        outside.execute("SELECT sturdy.retry_queue(%s)", (q,))
    assert fenced == "SD001", f"the cancelled pass's worker could still record (got {fenced})"
    assert held == 0, "the cancelled pass still holds its place"
    if counted_by == "sweep":
        assert next_take is not None and next_take[0] == b, f"the place was not free: a take got {next_take}"


# ----------------------------------------------------------- 2: infinity

def test_infinity_is_refused_by_schedule_and_wake_at_and_a_far_parked_row_is_not_dead():
    """wake_at(..., 'infinity') of a pass and schedule(..., 'infinity'),
    of the leased row and of a new one, raise 22023 and write nothing.
    A row parked a hundred years ahead by a failure is not dead: it
    survives sweep('1 second') a second later, redrive answers false for
    it, queue_stats counts it in no `dead`."""
    q = "meet-infinity"
    a, new = q + "/a", q + "/new"
    with connect() as c:
        reset(c, q)
        c.execute("SELECT sturdy.schedule(%s, now() - interval '1 minute', %s)", (a, q))
        w, receipt = c.execute("SELECT workflow, receipt FROM sturdy.take(%s, '1 minute')", (q,)).fetchone()
        assert w == a
        before = row(c, q, a)
        woke = sqlstate(c, "SELECT sturdy.wake_at(%s, %s, 'infinity', %s)", (a, receipt, q))
        after_wake = row(c, q, a)
        scheduled = sqlstate(c, "SELECT sturdy.schedule(%s, 'infinity', %s)", (a, q))
        after_schedule = row(c, q, a)
        created = sqlstate(c, "SELECT sturdy.schedule(%s, 'infinity', %s)", (new, q))
        new_row = row(c, q, new)
        assert (woke, scheduled, created) == ("22023", "22023", "22023"), \
            f"wake_at, schedule of the leased row, schedule of a new one: {woke}, {scheduled}, {created}"
        assert after_wake == before and after_schedule == before, (before, after_wake, after_schedule)
        assert new_row is None, f"schedule 'infinity' created {new_row}"

        assert c.execute("SELECT sturdy.fail(%s, %s, 'x', %s, retry_at => now() + interval '100 years')",
                         (a, receipt, q)).fetchone()[0] is True
        visible, _, attempts, _ = row(c, q, a)
        assert attempts == 1 and visible != "infinity"
        time.sleep(1.1)
        c.execute("SELECT * FROM sturdy.sweep('1 second')")
        assert row(c, q, a) is not None, "sweep removed a row parked at a finite time"
        assert c.execute("SELECT sturdy.redrive(%s, %s)", (a, q)).fetchone()[0] is False
        assert c.execute("SELECT dead FROM sturdy.queue_stats WHERE queue = %s", (q,)).fetchone() == (0,)
        assert row(c, q, a)[:3] == (visible, None, 1)


# ----------------------------------------------------------- 3: dead rows

def test_a_dead_row_is_not_raised_by_arrive_or_schedule_only_by_redrive():
    """max_attempts = 1: a pass fails, the row is dead. arrive returns the
    value stored, yet the next take gets nothing and the row stays dead
    with the same attempts; a schedule of it, now, likewise. redrive then
    makes it takeable as attempt 1."""
    q = "meet-dead"
    a = q + "/a"
    with connect() as c:
        reset(c, q)
        c.execute("SELECT sturdy.retry_queue(%s, max_attempts => 1)", (q,))
        c.execute("SELECT sturdy.schedule(%s, now() - interval '1 minute', %s)", (a, q))
        _, receipt = c.execute("SELECT workflow, receipt FROM sturdy.take(%s)", (q,)).fetchone()
        assert c.execute("SELECT sturdy.fail(%s, %s, 'boom', %s)", (a, receipt, q)).fetchone()[0] is True
        dead = row(c, q, a)
        assert dead[0] == "infinity" and dead[1:] == (None, 1, "boom"), dead

        assert c.execute("SELECT sturdy.arrive(%s, 'webhook', '1', %s)", (a, q)).fetchone()[0] == 1
        after_arrive = take_one(q)
        state_arrive = row(c, q, a)
        c.execute("SELECT sturdy.schedule(%s, now(), %s)", (a, q))
        after_schedule = take_one(q)
        state_schedule = row(c, q, a)
        stats = c.execute("SELECT dead FROM sturdy.queue_stats WHERE queue = %s", (q,)).fetchone()
        assert after_arrive is None, f"arrive raised the dead row: a take got {after_arrive}"
        assert state_arrive == dead, f"arrive changed the dead row: {state_arrive}"
        assert after_schedule is None, f"schedule raised the dead row: a take got {after_schedule}"
        assert state_schedule == dead, f"schedule changed the dead row: {state_schedule}"
        assert stats == (1,)

        assert c.execute("SELECT sturdy.redrive(%s, %s)", (a, q)).fetchone()[0] is True
        got = take_one(q)
        assert got is not None and (got[0], got[2]) == (a, 1), f"after redrive a take got {got}"
        c.execute("SELECT sturdy.retry_queue(%s)", (q,))


# ------------------------------------------------------- 4: stale ending

def test_a_stale_fail_answers_false_and_frees_the_place_its_pass_held():
    """running = 1. A fail with the receipt an extend replaced answers
    false and counts nothing. Then, the row's lease moved by hand after the
    take (the place still held by the take's receipt): done, wake_at and
    fail with the take's receipt each answer false, and each frees the
    place: a take of another ready row gets it at once."""
    q = "meet-stale-fail"
    a, b = q + "/a", q + "/b"

    def fill(c):
        c.execute("DELETE FROM sturdy.queue WHERE queue = %s", (q,))
        c.execute("SELECT sturdy.limit_queue(%s, running => 1)", (q,))
        c.execute("SELECT sturdy.schedule(%s, now() - interval '1 minute', %s)", (a, q))
        c.execute("SELECT sturdy.schedule(%s, now() - interval '30 seconds', %s)", (b, q))
        w, r = c.execute("SELECT workflow, receipt FROM sturdy.take(%s, '1 minute')", (q,)).fetchone()
        assert w == a
        return r

    with connect() as c:
        reset(c, q)
        r1 = fill(c)
        r2 = c.execute("SELECT sturdy.extend(%s, %s, '2 minutes', %s)", (a, r1, q)).fetchone()[0]
        assert r2 is not None and r2 != r1
        assert c.execute("SELECT sturdy.fail(%s, %s, 'x', %s)", (a, r1, q)).fetchone()[0] is False
        assert row(c, q, a)[1:3] == (r2, None), "a fail with a stale receipt wrote the row"

        enders = {
            "done": "SELECT sturdy.done(%s, %s, %s)",
            "wake_at": "SELECT sturdy.wake_at(%s, %s, now() + interval '1 hour', %s)",
            "fail": "SELECT sturdy.fail(%s, %s, 'x', %s)",
        }
        freed = {}
        for name, sql in enders.items():
            r1 = fill(c)
            c.execute("UPDATE sturdy.queue SET leased_until = leased_until + interval '1 second'"
                      " WHERE queue = %s AND workflow = %s", (q, a))
            answer = c.execute(sql, (a, r1, q)).fetchone()[0]
            got = take_one(q)
            freed[name] = (answer, got[0] if got else None)
        c.execute("SELECT sturdy.limit_queue(%s)", (q,))
    assert freed == {name: (False, b) for name in enders}, \
        f"(answer, what a take then got) for each stale end: {freed}"


# ------------------------------------------------------------ 5: extend

def test_extend_after_its_lease_passed_by_the_clock_answers_null_and_never_doubles_running():
    """running = 1: row A taken with a one-second lease; a transaction T
    reads now() (before A's receipt); once A's receipt has passed by the
    clock another connection takes row B (ahead of A in take's order, so
    that take never meets A). extend of A in T, whose now() is still
    before the receipt, answers NULL, and at no point do two rows of the
    queue hold a lease by the clock."""
    q = "meet-extend"
    a, b = q + "/a", q + "/b"
    with connect() as c:
        reset(c, q)
        c.execute("SELECT sturdy.limit_queue(%s, running => 1)", (q,))
        c.execute("SELECT sturdy.schedule(%s, now(), %s)", (a, q))
        w, ra = c.execute("SELECT workflow, receipt FROM sturdy.take(%s, '1 second')", (q,)).fetchone()
        assert w == a
        c.execute("SELECT sturdy.schedule(%s, now() - interval '1 hour', %s)", (b, q))
    leased = "SELECT count(*) FROM sturdy.queue WHERE queue = %s AND leased_until > clock_timestamp()"
    counts = []
    with connect(autocommit=False) as t, connect() as other:
        (t_now,) = t.execute("SELECT now()").fetchone()
        assert t_now < ra
        wait_past(other, ra)
        got = other.execute("SELECT workflow FROM sturdy.take(%s, '1 minute')", (q,)).fetchone()
        assert got == (b,), f"the take after A's receipt got {got}"
        counts.append(other.execute(leased, (q,)).fetchone()[0])
        extended = t.execute("SELECT sturdy.extend(%s, %s, '10 seconds', %s)", (a, ra, q)).fetchone()[0]
        counts.append(t.execute(leased, (q,)).fetchone()[0])
        t.commit()
        counts.append(other.execute(leased, (q,)).fetchone()[0])
        other.execute("SELECT sturdy.limit_queue(%s)", (q,))
    assert extended is None, f"extend of a lease passed by the clock answered {extended}"
    assert max(counts) <= 1, f"rows leased at once under running = 1 (after the take, in T, after T): {counts}"


# ------------------------------------------------------ 6: no deadlocks

ENDERS = {
    "finish": "SELECT sturdy.finish(%(w)s, %(token)s, %(receipt)s, queue => %(q)s)",
    "done": "SELECT sturdy.done(%(w)s, %(receipt)s, %(q)s)",
    "fail": "SELECT sturdy.fail(%(w)s, %(receipt)s, 'x', %(q)s)",
    "extend": "SELECT sturdy.extend(%(w)s, %(receipt)s, '1 minute', %(q)s) IS NOT NULL",
    "wake_at": "SELECT sturdy.wake_at(%(w)s, %(receipt)s, now() + interval '1 hour', %(q)s)",
}


@pytest.mark.parametrize("ender", list(ENDERS))
def test_cancel_and_the_end_of_the_same_pass_never_deadlock(ender):
    """A pass taken with claim => true; session S1 begins and fences the
    claim (holding its row, as a worker's transaction that recorded a step
    does); session S2 cancels the workflow, which waits for the claim (every
    call on a pass locks the claim before the queue row); then S1 ends the
    pass (finish, done, fail, extend or wake_at) and commits. Neither gets
    40P01 (today: cancel held the queue row and waited for the claim, S1's
    end held the claim and waited for the row). S1's end goes first and
    succeeds; the cancel then answers whether a row was left to cancel (not
    after finish or done), and where it cancels, the pass is fenced."""
    q = f"meet-deadlock-{ender}"
    a = q + "/a"
    with connect() as c:
        reset(c, q)
        c.execute("SELECT sturdy.schedule(%s, now() - interval '1 minute', %s)", (a, q))
        w, receipt, token, *_ = c.execute("SELECT * FROM sturdy.take(%s, '1 minute', claim => true)", (q,)).fetchone()
        assert w == a and token is not None
    got = {}
    with connect(autocommit=False) as s1, connect() as s2:
        s1.execute("SELECT sturdy.fence(%s, %s)", (a, token))

        def cancel():
            try:
                got["cancel"] = s2.execute("SELECT sturdy.cancel(%s, %s)", (a, q)).fetchone()[0]
            except psycopg.Error as e:
                got["cancel"] = e.sqlstate

        pid = s2.info.backend_pid
        t = Worker(target=cancel)
        t.start()
        wait_blocked_or_done(t, pid)
        try:
            got["end"] = s1.execute(ENDERS[ender], {"w": a, "token": token, "receipt": receipt, "q": q}).fetchone()[0]
            s1.commit()
        except psycopg.Error as e:
            got["end"] = e.sqlstate
            s1.rollback()
        t.join(30)
        assert not t.is_alive(), "the cancel never returned"
    assert "40P01" not in got.values(), f"a deadlock: {got}"
    assert got["end"] not in (False, None) and not isinstance(got["end"], str), \
        f"the pass's {ender}, holding its claim, answered {got['end']} beside a waiting cancel"
    row_left = ender not in ("finish", "done")
    assert got["cancel"] is row_left, f"cancel answered {got['cancel']} after {ender}"
    if row_left:
        with connect() as c:
            assert sqlstate(c, "SELECT * FROM sturdy.record(%s, 'after', '1', %s)", (a, token)) == "SD001"


# ------------------------------------------------ 7: empty takes, ready rows

@pytest.mark.parametrize("policy", ["no-backoff", "defaults"])
def test_a_one_row_take_never_comes_back_empty_beside_a_ready_row(policy):
    """20 rows taken with a one-second lease by a connection that closes
    without done; one more row scheduled ready after them; 1.5 s later,
    one-row takes, each on a fresh connection: the first hands out a row,
    and no take comes back empty while a row is ready by its transaction's
    now() (never leased, or, without backoff, its lease run out). Without
    backoff all 21 rows are handed out; with the default policy (a second
    of backoff from the lease's end) at least the new row."""
    q = f"meet-empty-{policy}"
    with connect() as c:
        reset(c, q)
        if policy == "no-backoff":
            c.execute("SELECT sturdy.retry_queue(%s, backoff => '0 seconds', jitter => 0)", (q,))
        c.execute("SELECT sturdy.schedule(%s || '/' || i, now() - interval '1 minute' + i * interval '1 ms', %s)"
                  " FROM generate_series(1, 20) i", (q, q))
    with connect() as gone:
        assert gone.execute("SELECT count(*) FROM sturdy.take(%s, '1 second', max => 20)", (q,)).fetchone()[0] == 20
    with connect() as c:
        c.execute("SELECT sturdy.schedule(%s, now(), %s)", (q + "/new", q))
    time.sleep(1.5)
    ready_sql = ("SELECT count(*) FROM sturdy.queue WHERE queue = %s AND visible_at <= now()"
                 " AND (leased_until IS NULL OR (%s AND leased_until <= now()))")
    handed, empty_beside = [], None
    for _ in range(60):
        with connect(autocommit=False) as c:
            got = c.execute("SELECT workflow FROM sturdy.take(%s, '1 minute')", (q,)).fetchone()
            if got is None:
                ready = c.execute(ready_sql, (q, policy == "no-backoff")).fetchone()[0]
                c.commit()
                if ready:
                    empty_beside = ready
                break
            c.commit()
            handed.append(got[0])
    with connect() as c:
        c.execute("SELECT sturdy.retry_queue(%s)", (q,))
    assert handed, "the first one-row take came back empty beside the ready row"
    assert empty_beside is None, f"a take came back empty beside {empty_beside} ready rows after {len(handed)} takes"
    if policy == "no-backoff":
        assert sorted(handed) == sorted([f"{q}/{i}" for i in range(1, 21)] + [q + "/new"]), handed
    else:
        assert q + "/new" in handed, handed


# -------------------------------------------------- 8: the policy tables

ROLE = "meet_app"


def make_role(c):
    c.execute(f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN"
              f" EXECUTE 'DROP OWNED BY {ROLE}'; END IF; END $$")
    c.execute(f"DROP ROLE IF EXISTS {ROLE}")
    c.execute(f"CREATE ROLE {ROLE} NOLOGIN")
    c.execute("SELECT sturdy.grant_usage(%s)", (ROLE,))


def drop_role(c):
    c.execute("RESET ROLE")
    c.execute(f"DROP OWNED BY {ROLE}")
    c.execute(f"DROP ROLE {ROLE}")


def refused_updates(c, table, q, updates, put_back):
    """Each `UPDATE table SET <update>` of queue q's row, as the role, on
    the row as `put_back` (run as the superuser) writes it: its SQLSTATE,
    and whether the row was left as it was."""
    out = {}
    for update in updates:
        c.execute("RESET ROLE")
        put_back()
        c.execute(f"SET ROLE {ROLE}")
        read = f"SELECT row_to_json(t)::text FROM sturdy.{table} t WHERE queue = %s"
        before = c.execute(read, (q,)).fetchone()
        assert before is not None
        state = sqlstate(c, f"UPDATE sturdy.{table} SET {update} WHERE queue = %s", (q,))
        out[update] = (state, c.execute(read, (q,)).fetchone() == before)
    c.execute("RESET ROLE")
    return out


POLICY_UPDATES = {
    # the issue's: a NaN jitter stuck the queue (22008 at every failure), a
    # jitter of 5 put retries in the past, a rate of 1e308 overflowed
    "named": (["jitter = 'NaN'", "jitter = 5", "max_attempts = 0", "backoff = '-1 second'"],
              ["per_second = 1e308", "running = 100000", "burst = 0"]),
    # the other bounds the functions hold
    "others": (["max_backoff = '-1 second'", "max_backoff = '2 years'", "backoff = '2 years'",
                "max_attempts = 1000001"],
               ["per_key = 1001", "burst = 1000001", "per_second = 0"]),
}


@pytest.mark.parametrize("which", list(POLICY_UPDATES))
def test_the_policy_tables_refuse_what_retry_queue_and_limit_queue_refuse(which):
    """As a role given grant_usage: UPDATEs of sturdy.queue_retry and of
    sturdy.queue_limits past the bounds retry_queue and limit_queue hold
    (jitter NaN or 5, max_attempts 0, backoff -1 s; per_second 1e308,
    running 100000, burst 0; and the others: max_backoff -1 s or two years,
    backoff two years, max_attempts 1,000,001, per_key 1001, burst
    1,000,001, per_second 0) each fail with 23514 (a check violation) and
    change nothing."""
    q = f"meet-policy-{which}"
    retry_updates, limit_updates = POLICY_UPDATES[which]
    with connect() as c:
        reset(c, q)
        make_role(c)
        retry_policy = lambda: c.execute("SELECT sturdy.retry_queue(%s, max_attempts => 5, backoff => '2 seconds',"
                                         " max_backoff => '1 minute', jitter => 0.2)", (q,))
        limit = lambda: c.execute("SELECT sturdy.limit_queue(%s, running => 3, per_key => 2, per_second => 10,"
                                  " burst => 5)", (q,))
        try:
            retry = refused_updates(c, "queue_retry", q, retry_updates, retry_policy)
            limits = refused_updates(c, "queue_limits", q, limit_updates, limit)
        finally:
            drop_role(c)
            c.execute("SELECT sturdy.limit_queue(%s)", (q,))
            c.execute("SELECT sturdy.retry_queue(%s)", (q,))
    got = {**retry, **limits}
    assert got == {u: ("23514", True) for u in got}, f"(SQLSTATE, row unchanged) for each UPDATE: {got}"


# ---------------------------------------------- 9: woken passes that fail

def test_a_workflow_woken_during_every_pass_still_counts_its_failures():
    """max_attempts 3, backoff 0.1 s, no jitter. Each pass (a 0.3 s lease)
    gets an arrive for its workflow, then crashes (no done: its lease runs
    out). The row is handed out as attempts 1, 2, 3, is then dead
    (visible_at 'infinity', attempts 3), and its takes stop: no more in 15
    rounds (8 s at most)."""
    q = "meet-woken-fails"
    a = q + "/a"
    with connect() as c:
        reset(c, q)
        c.execute("SELECT sturdy.retry_queue(%s, max_attempts => 3, backoff => '0.1 second', jitter => 0)", (q,))
        c.execute("SELECT sturdy.schedule(%s, now() - interval '1 minute', %s)", (a, q))
    takes, deadline = [], time.monotonic() + 15
    with connect() as worker, connect() as outside:
        for i in range(20):
            if time.monotonic() > deadline:
                break
            got = worker.execute("SELECT workflow, receipt, attempt FROM sturdy.take(%s, '0.3 seconds')",
                                 (q,)).fetchone()
            if got is None:
                time.sleep(0.1)
                continue
            takes.append(got[2])
            outside.execute("SELECT sturdy.arrive(%s, 'ev', to_jsonb(%s::int), %s)", (a, i, q))
            wait_past(outside, got[1])  # the pass crashed: its lease runs out
        outside.execute("SELECT * FROM sturdy.sweep('7 days')")  # (counts a last lapse no take met)
        visible, _, attempts, error = row(outside, q, a)
        outside.execute("SELECT sturdy.retry_queue(%s)", (q,))
    assert takes == [1, 2, 3], f"attempts handed out: {takes}"
    assert (visible, attempts) == ("infinity", 3), (visible, attempts, error)


def test_a_wakeup_during_a_pass_keeps_its_lease_and_its_done_leaves_the_row_ready():
    """A pass under way gets an arrive for its workflow: a take on another
    connection, the lease still running, does not hand the row out again;
    the pass's done answers false, and the row is then ready (a take gets
    it)."""
    q = "meet-woken-done"
    a = q + "/a"
    with connect() as c:
        reset(c, q)
        c.execute("SELECT sturdy.schedule(%s, now() - interval '1 minute', %s)", (a, q))
    with connect() as worker, connect() as outside:
        w, receipt = worker.execute("SELECT workflow, receipt FROM sturdy.take(%s, '1 minute')", (q,)).fetchone()
        assert w == a
        outside.execute("SELECT sturdy.arrive(%s, 'ev', '1', %s)", (a, q))
        during = take_one(q)
        done = worker.execute("SELECT sturdy.done(%s, %s, %s)", (a, receipt, q)).fetchone()[0]
        after = take_one(q)
    assert during is None, f"a take during the woken pass handed the row out again: {during}"
    assert done is False, "done of a woken pass removed the row"
    assert after is not None and after[0] == a, f"the woken row was not ready after done: {after}"


# ------------------------------------ +: limit_queue under repeatable read

@pytest.mark.parametrize("when", ["committed-before", "committing-during"])
def test_limit_queue_under_repeatable_read_beside_a_keyed_take_raises_no_unique_violation(when):
    """per_key = 1, a row of a key with no places yet. A keyed take makes
    the key's places and leases the row, committing before a repeatable-read
    transaction's limit_queue (its snapshot older than the take's commit),
    or while that limit_queue runs. limit_queue succeeds or raises 40001,
    never 23505."""
    q = f"meet-rr-{when}"
    a = q + "/a"
    with connect() as c:
        reset(c, q)
        c.execute("SELECT sturdy.limit_queue(%s, per_key => 1)", (q,))
        c.execute("SELECT sturdy.schedule(%s, now() - interval '1 minute', %s, key => 'k1')", (a, q))
    got = {}
    with connect(autocommit=False) as rr, connect(autocommit=False) as taker:
        rr.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ

        def set_limit():
            try:
                rr.execute("SELECT sturdy.limit_queue(%s, per_key => 2)", (q,))
                rr.commit()
                got["limit"] = None
            except psycopg.Error as e:
                got["limit"] = e.sqlstate
                rr.rollback()

        if when == "committed-before":
            rr.execute("SELECT 1")  # the snapshot, before the take
            assert taker.execute("SELECT workflow FROM sturdy.take(%s)", (q,)).fetchone() == (a,)
            taker.commit()
            set_limit()
        else:
            assert taker.execute("SELECT workflow FROM sturdy.take(%s)", (q,)).fetchone() == (a,)
            rr.execute("SELECT 1")  # the snapshot, before the take commits
            pid = rr.info.backend_pid
            t = Worker(target=set_limit)
            t.start()
            wait_blocked_or_done(t, pid)
            taker.commit()
            t.join(30)
            assert not t.is_alive()
    with connect() as c:
        c.execute("SELECT sturdy.limit_queue(%s)", (q,))
    assert got["limit"] in (None, "40001"), f"limit_queue under repeatable read raised {got['limit']}"
