"""A randomized, stateful, concurrent model checker of the queue.

A seed drives a controller that issues every queue operation over several
connections (four workers and an operator, each statement run in the
connection's own thread, so one blocked on a lock is only "waiting" and the
controller goes on), records a history (connection, arguments, result or
SQLSTATE, the server's clock_timestamp() before and after), and checks it
after every step against a reference model of the contract:

  * the lease: a wakeup (`schedule`, `arrive`) on a pass in flight keeps
    its lease, so no take gets the row before the lease ends, and the
    pass's `done`, `finish` and `wake_at` answer false, `fail` counts; a
    lapsed lease is counted once, by the take or `sweep` that meets it;
  * a first-writer register per (workflow, step), an increasing token per
    workflow, fencing (`record` of a cancelled, failed or superseded pass
    raises SD001), an idempotency key per `start`;
  * capacity: never more passes in flight than `running` or `per_key`
    allow, by intervals of the server's clock, and no place held by a pass
    that ended;
  * no workflow lost, attempts counted once and never going back except by
    `redrive`, dead exactly at `max_attempts`, never handed out, a finite
    park never dead, `'infinity'` refused with 22023;
  * a one-row take comes back with a row whenever one is ready within the
    limits; no SQLSTATE outside the documented ones (40P01, XX000, ...);
  * a job's input: what a take hands out, and what the row holds, is the
    input of the row's last `schedule_many` (NULL for a row that came back
    by `schedule`, `arrive` or `start` after it left), kept by every other
    call and by a dead row.

Not reached (yet): `transact`, `per_second` limits, the order of
priorities, NOTIFY wakeups.

On a failure it prints the seed and the step, shrinks the recorded history
(replays with operations removed, delta-debugging style, keeping the
shortest that still fails the same invariant) and prints it as SQL-ish
lines.

  python3 pg_test/model.py --seconds 60 --seed 7      # episodes with seeds 7, 8, ...
  python3 pg_test/model.py --seed 9 --episodes 1      # the episode of seed 9 again
  python3 pg_test/model.py --seed 9 --replay '[...]'  # a history a failure printed
  --avoid inf,wakeup,burst,kill,limits   leave out operation variants (to look past a defect found)
  --tolerate CODE,...                    count these invariants' violations, do not stop at them
  --more bursts,lapses                   more calls at once on one pass; more lapsed leases ahead of ready rows
  --inject retry                         a defect of the model's own, to try the checker and its shrinking

A seed drives the choices, but what a choice refers to (the pass a `done`
ends, the receipt it sends) comes from what the server answered, so an
episode run again with its seed is the same only as far as the server's
timing allows; a printed history (--replay) is the same operations exactly.
History lines: step, [connection], the server's clock_timestamp() before
and after the call (seconds from the episode's start), the call with its
arguments (receipts and times as seconds from the start), its answer.

The server comes from STURDY_SERVER / STURDY_DB (sturdy.py). Each episode
uses its own queues and workflows (`mc-<tag>-...`) and deletes them after.
Invariant codes: R1-... a wakeup on a pass in flight keeps its lease (its
done/finish/wake_at answer false, its fail and its lapse count); R2-infinity
'infinity' refused (22023); R3-... a dead row stays dead and is never handed
out; R4-place-after-fail a stale fail frees its place; R5-extend never a new
receipt for a lapsed or stale pass; R6-deadlock; R7-take-empty a one-row take
finds a ready row within the limits; R9-fence / R9-place-after-cancel cancel
fences the claim and frees the place; and capacity-running,
capacity-per-key, place-after-end, extend-place, lost-workflow,
survived-removal, attempts, dead, retry-time, backoff, register,
token-order, idempotency, sqlstate, hang, liveness, server-lost,
R-input (a take or the row with another input than the last
schedule_many's), <call>-result (an answer the contract does not allow).
"""
import argparse
import datetime as dt
import json
import os
import queue as queuelib
import random
import re
import sys
import threading
import time

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sturdy import DSN  # noqa: E402

UTC = dt.timezone.utc
EPS = 0.03          # seconds of slack around an operation's interval for "a lease ran out then"
WAIT = 2.0          # a statement still running after this is "waiting"; the controller goes on
HANG = 20.0         # one still blocked after this much is a failure (every call is autocommit)
WORKERS = 4
OPERATOR = 4
QUEUES = ("a", "b")
WFS = {"a": [f"a{i}" for i in range(7)], "b": [f"b{i}" for i in range(5)]}
KEYS = (None, None, "k0", "k1")
STEPS = ("s0", "s1")
# SQLSTATEs a call may raise at all (the model says when each is expected).
DOCUMENTED = {"SD001", "SD002", "22023", "22004", "55000"}
# Operation variants the generator leaves out (--avoid): to look past a
# defect already found. "inf": no 'infinity' schedule, wake_at or retry_at;
# "wakeup": no schedule or arrive of a row in a pass; "burst": no calls at
# once; "kill": no pg_terminate_backend; "limits": no limit_queue calls.
AVOID = set(os.environ.get("MODEL_AVOID", "").replace(",", " ").split())
# Invariants whose violations are counted and printed but do not stop the
# run (--tolerate): to look past a defect already found. Only for checks
# after which the model stays right (extend-result, R9-fence, register, ...).
TOLERATE = set(os.environ.get("MODEL_TOLERATE", "").replace(",", " ").split())
# A defect of the model's own, to try the checker and its shrinking on a
# correct build (--inject): "retry" fails a take that hands out a second
# attempt (needs a schedule, a take, a failure and a take again).
INJECT = set(os.environ.get("MODEL_INJECT", "").replace(",", " ").split())
# More of one kind of operation (--more): "bursts" (a third of the steps
# are calls at once on one pass: races, deadlocks), "lapses" (piles of
# lapsed leases ahead of ready rows).
MORE = set(os.environ.get("MODEL_MORE", "").replace(",", " ").split())


# What the checks saw, over every episode of the process (printed at the end).
STATS = {}


def count(what, n=1):
    STATS[what] = STATS.get(what, 0) + n


class Violation(Exception):
    def __init__(self, code, message, step=None):
        message = re.sub(r"mc-[0-9a-f]+-", "", message)
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.step = code, message, step


def ts(x):
    return dt.datetime.fromtimestamp(x, UTC)


def fmt_t(x, base):
    return "-" if x is None else f"{x - base:+.3f}"


# --------------------------------------------------------------------------
# Connections: one thread each, so a statement blocked on a lock only waits.
# --------------------------------------------------------------------------

def connect_waiting(seconds=60):
    """A connection, waiting up to `seconds` for a server that restarts
    (after a crash it is in recovery for a while)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return psycopg.connect(DSN, autocommit=True)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def lost_connection(e):
    return (getattr(e, "sqlstate", None) is None and isinstance(e, psycopg.OperationalError)) or \
        (getattr(e, "sqlstate", None) or "").startswith("08") or \
        getattr(e, "sqlstate", None) in ("57P01", "57P02", "57P03")


class Link:
    """A connection and the thread that runs its statements."""

    def __init__(self, name):
        self.name = name
        self.conn = None
        self.pid = None
        self.jobs = queuelib.Queue()
        self.busy = None
        self.thread = threading.Thread(target=self._loop, name=f"mc-{name}", daemon=True)
        self.thread.start()

    def _connect(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
        self.conn = connect_waiting(10)
        self.conn.execute("SET lock_timeout = '30s'")
        self.pid = self.conn.info.backend_pid

    def _loop(self):
        while True:
            op = self.jobs.get()
            if op is None:
                break
            try:
                self._run(op)
            except BaseException as e:  # noqa: BLE001 -- reported as the op's result
                op.status, op.msg = "err", f"checker: {e!r}"
            finally:
                op.finished.set()

    def _clock(self):
        return self.conn.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()[0]

    def _run(self, op):
        for attempt in range(2):
            try:
                if self.conn is None or self.conn.closed or self.conn.broken:
                    self._connect()
                    op.reconnected = True
                op.t0 = self._clock()
                break
            except psycopg.Error as e:
                if not lost_connection(e) or attempt == 1:
                    raise
                self.conn = None
        try:
            if op.spec.get("stale"):
                # in a transaction that began `stale` seconds before the call
                with self.conn.transaction():
                    self.conn.execute("SELECT now()")
                    time.sleep(op.spec["stale"])
                    op.t0 = self._clock()
                    cur = self.conn.execute(op.sql, op.params)
                    op.rows = cur.fetchall() if cur.description else []
            else:
                cur = self.conn.execute(op.sql, op.params)
                op.rows = cur.fetchall() if cur.description else []
            op.status = "ok"
        except psycopg.Error as e:
            op.status, op.sqlstate, op.msg = "err", e.sqlstate, str(e).splitlines()[0] if str(e) else repr(e)
            if lost_connection(e):
                op.lost = True
                try:
                    self.conn.close()
                except Exception:
                    pass
                self.conn = None
                return
        try:
            op.t1 = self._clock()
        except psycopg.Error as e:
            if not lost_connection(e):
                raise
            self._connect()     # killed just after the call: its clock is read afresh, a later bound
            op.reconnected = True
            op.t1 = self._clock()

    def submit(self, op):
        op.finished = threading.Event()
        self.busy = op
        self.jobs.put(op)

    def close(self):
        self.jobs.put(None)
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass


class Op:
    """One call of the history: the abstract operation (what the seed chose,
    replayable) and what happened when it ran."""

    def __init__(self, spec, step):
        self.spec, self.step = spec, step
        self.k, self.c = spec["k"], spec.get("c", OPERATOR)
        self.sql, self.params, self.meta = None, (), {}
        self.t0 = self.t1 = None
        self.status, self.rows, self.sqlstate, self.msg = None, None, None, None
        self.lost = self.reconnected = False
        self.skipped = False
        self.finished = None

    def line(self, base, names):
        def show(v):
            if isinstance(v, dt.datetime):
                return f"'{fmt_t(v.timestamp(), base)}'"
            if isinstance(v, dt.timedelta):
                return f"'{v.total_seconds():g}s'"
            if isinstance(v, str):
                for full, short in names:
                    v = v.replace(full, short)
                return repr(v)
            if isinstance(v, list):
                return "[" + ", ".join(show(x) for x in v) + "]"
            return repr(v)
        if self.skipped:
            return f"{self.step:4d} [c{self.c}] -- {self.k} {self.spec} skipped (nothing to refer to)"
        text = self.sql
        for p in self.params:
            text = text.replace("%s", show(p), 1)
        for full, short in names:
            text = text.replace(full, short)
        if self.status == "ok" and self.k == "sleep":
            return f"{self.step:4d} [--] sleep {self.spec['s']} s"
        text = text.replace("SELECT workflow, receipt, extract(epoch from receipt)::float8, token, attempt FROM ",
                            "SELECT * FROM ")
        text = text.replace("SELECT extract(epoch from r)::float8, r FROM ", "SELECT ").replace(" r WHERE", " WHERE")
        if text.endswith(") r"):
            text = text[:-2]
        if self.spec.get("stale"):
            text = f"BEGIN (now() {self.spec['stale']} s back); {text}; COMMIT"
        if self.status == "ok":
            rows = self.rows
            if self.k == "take":
                rows = [(w, rdt, tok, att, inp) if inp is not None else (w, rdt, tok, att) for (w, rdt, _, tok, att, inp) in rows]
            elif self.k == "extend":
                rows = [(r[1],) for r in rows]
            res = rows if rows is None or len(rows) != 1 or len(rows[0]) != 1 else rows[0][0]
            if isinstance(res, dt.datetime):
                res = f"'{fmt_t(res.timestamp(), base)}'"
            if isinstance(res, list):
                res = "[" + ", ".join("(" + ", ".join(f"'{fmt_t(x.timestamp(), base)}'" if isinstance(x, dt.datetime)
                                                      else repr(x) for x in r) + ")" for r in res) + "]"
            out = f"-> {'ok' if res == '' else res}"
        elif self.status == "err":
            out = f"-> ERROR {self.sqlstate} {self.msg[:100] if self.msg else ''}"
            out += " (connection lost)" if self.lost else ""
        else:
            out = "-> (still waiting)"
        for full, short in names:
            out = out.replace(full, short)
        who = f"c{self.c}" if isinstance(self.c, int) else self.c
        return f"{self.step:4d} [{who}] {fmt_t(self.t0, base)}..{fmt_t(self.t1, base)} {text} {out}"


# --------------------------------------------------------------------------
# The reference model.
# --------------------------------------------------------------------------

class Pass:
    n = 0

    def __init__(self, wf, q, key, take, receipt, rdt, lease, token, conn):
        Pass.n += 1
        self.id = Pass.n
        self.wf, self.q, self.key = wf, q, key
        self.take = take
        self.start = take.t1               # in flight at the latest from here
        self.now = receipt - lease         # the take's now(), exactly
        self.receipt, self.rdt = receipt, rdt
        self.receipts = [(receipt, rdt)]
        self.token, self.conn = token, conn
        self.end = None                    # (earliest end, kind): an ender started then
        self.counted = False               # its lapse counted (by a take, sweep or fail)
        self.woken = None                  # a wakeup landed while it ran: (its time)
        self.ambig = False
        self.sticky = False

    def end_at(self):
        e = self.receipt
        if self.end is not None:
            e = min(e, self.end[0])
        return e


class Row:
    def __init__(self, q, wf):
        self.q, self.wf = q, wf
        self.present = False
        self.dead = False
        self.attempts = 0
        self.key = None
        self.pass_ = None
        self.unc = False        # the model cannot say what the row is now: resync at the next snapshot
        self.maybe0 = False     # a schedule may have reset attempts
        self.instance = None    # instance id where the row is an instance's
        self.expect_vis = None  # (earliest, latest, why) its visible_at must be, after a fail
        self.input = None       # its input (schedule_many's; None: NULL), known unless unc


class Snapshot:
    def __init__(self, t_before, t_after, rows, places, paused):
        self.tb, self.ta, self.rows, self.places, self.paused = t_before, t_after, rows, places, paused


class Model:
    def __init__(self, tag):
        self.tag = tag
        self.qname = {q: f"mc-{tag}-{q}" for q in QUEUES}
        self.process = f"mc-{tag}-p"
        self.rows = {}
        for q in QUEUES:
            for w in WFS[q]:
                self.rows[self.full(w)] = Row(q, self.full(w))
        self.passes = []
        self.latest = {}                   # wf -> its newest pass
        self.old_rc = {}                   # wf -> a receipt of it that is stale
        self.tokens = {}                   # wf -> newest token issued
        self.old_tok = {}
        self.fenced = {}                   # wf -> tokens up to this are fenced
        self.tok_unknown = set()           # wfs whose claim the model cannot follow (a lost call, a sweep)
        self.tok_reset = set()             # wfs whose claim a sweep may have deleted (tokens begin again)
        self.released = set()
        self.register = {}                 # (wf, step) -> json text first written; None: unknown
        self.reg_unknown = set()
        self.reg_first = set()
        self.idem = {}                     # idempotency key -> instance id
        self.instances = []                # local order -> wf
        self.inst_status = {}              # wf -> 'live' | 'terminal' | None (unknown)
        self.limits = {q: [] for q in QUEUES}  # (t0, t1, running, per_key)
        self.retry = {q: [] for q in QUEUES}   # (t0, t1, max_attempts, backoff)
        self.paused = {q: False for q in QUEUES}
        self.pause_unknown = set()
        self.prev_paused = None
        self.plan = []
        self.lost_takes = []               # (q, t0, t1 or None)
        self.violations = []
        self.tolerated = {}

    def full(self, local):
        if local.startswith("i"):
            i = int(local[1:])
            return self.instances[i] if i < len(self.instances) else None
        return f"mc-{self.tag}-{local}"

    def short_names(self):
        return [(f"mc-{self.tag}-", "")]

    # ---- policies in force ----

    def in_force(self, hist, t, default):
        """The value of a setting at server time t: the last call that
        committed before it; None where a call was under way at t."""
        val = default
        for (t0, t1, *v) in hist:
            if t1 is None or (t0 - EPS <= t <= t1 + EPS):
                return None
            if t1 < t:
                val = tuple(v)
        return val

    def max_attempts(self, q, t):
        v = self.in_force(self.retry[q], t, (25, 1.0))
        return None if v is None else v[0]

    def backoff(self, q, t, n):
        v = self.in_force(self.retry[q], t, (25, 1.0))
        return None if v is None else min(10.0, v[1] * 2 ** (n - 1))

    def limit(self, q, t):
        return self.in_force(self.limits[q], t, (None, None))

    def fail(self, code, msg, op=None):
        v = Violation(code, msg, op.step if op else None)
        self.violations.append(v)
        if code in TOLERATE:
            self.tolerated[code] = self.tolerated.get(code, 0) + 1
            return
        raise v

    # ---- receipts and tokens the abstract operations refer to ----

    def receipt_of(self, wf, which):
        p = self.latest.get(wf)
        if which == "cur":
            return p.rdt if p else None
        old = self.old_rc.get(wf)
        return old if old is not None else dt.datetime(2000, 1, 1, tzinfo=UTC)

    def token_of(self, wf, which):
        if which == "cur":
            return self.tokens.get(wf)
        return self.old_tok.get(wf, 1 if wf in self.tokens else None)

    def pass_by_receipt(self, wf, rc):
        for p in reversed(self.passes):
            if p.wf == wf and any(abs(r - rc) < 1e-7 for r, _ in p.receipts):
                return p
        return None

    def classify(self, wf, rc, op):
        """What the receipt `rc` (epoch) of `wf` is at `op`: 'live' (the row's
        pass in flight by the clock), 'lapsed' (its lease ran out,
        uncounted), 'stale', or 'amb' (the model cannot tell)."""
        R = self.rows.get(wf)
        p = self.pass_by_receipt(wf, rc)
        if R is None or p is None:
            return "stale", p
        if R.unc or p.ambig:
            return "amb", p
        if p is not R.pass_ or abs(p.receipt - rc) > 1e-7 or p.counted:
            return "stale", p
        if p.end is not None:
            e = p.end[2]
            return ("amb" if e is not None and (e.t1 is None or e.t1 > op.t0) else "stale"), p
        if p.receipt > op.t1 + EPS:
            return "live", p
        if p.receipt < op.t0 - EPS:
            return "lapsed", p
        return "amb", p

    def end_pass(self, p, op, kind, at=None):
        """The pass ended (an ender started at `op`'s t0, or at `at`)."""
        if p is not None and p.end is None:
            t = at if at is not None else (op.t0 if op is not None and op.t0 is not None else time.time())
            p.end = (t, kind, op)

    def fence(self, wf):
        if wf in self.tokens:
            self.fenced[wf] = self.tokens[wf]

    def write_register(self, wf, step, value, got, first, op, concurrent=False):
        """A first-writer-wins write of (wf, step) of `value` answered `got`
        (json text) and `first` (None: not said). Beside other writes the
        model does not know which came first, but one value is stored and
        at most one write is first."""
        k = (wf, step)
        if first and k in self.reg_first:
            self.fail("register", f"{wf}/{step}: a second write answered first=true ({got}; the first stored"
                      f" {self.register.get(k)})", op)
        if first:
            self.reg_first.add(k)
        if k in self.reg_unknown:
            self.register[k] = got
            self.reg_unknown.discard(k)
            return
        have = self.register.get(k)
        if have is None:
            if not concurrent:
                if first is False:
                    self.fail("register", f"{wf}/{step}: first write answered first=false ({got})", op)
                if json.loads(got) != json.loads(value):
                    self.fail("register", f"{wf}/{step}: first write of {value} answered {got}", op)
            self.register[k] = got
        else:
            if first and not concurrent:
                self.fail("register", f"{wf}/{step}: overwritten: {have} then {got} with first=true", op)
            if json.loads(got) != json.loads(have):
                self.fail("register", f"{wf}/{step}: holds {have}, a later write answered {got}", op)

    # ---- an operation's answer ----

    def observe(self, op, concurrent):
        """Check `op`'s answer against the model and update it. `concurrent`:
        other calls ran beside it (then the model tolerates any order)."""
        if op.skipped or op.k in ("sleep",):
            return
        wf = op.meta.get("wf")
        R = self.rows.get(wf) if wf else None
        if op.status == "err" and not op.lost:
            expected = op.meta.get("expect_error")
            if op.sqlstate is None and (op.msg or "").startswith("checker:"):
                self.fail("checker-error", op.msg, op)
            if op.sqlstate == "40P01":
                self.fail("R6-deadlock", f"{op.k} deadlocked: {op.msg}", op)
            count(f"errors {op.sqlstate}")
            if op.sqlstate not in DOCUMENTED:
                self.fail("sqlstate", f"{op.k} raised {op.sqlstate}: {op.msg}", op)
            if op.sqlstate == "22023" and expected != "22023":
                self.fail("sqlstate", f"{op.k} refused valid input: {op.msg}", op)
            if op.sqlstate in ("SD001", "SD002") and op.k not in ("record", "finish"):
                self.fail("sqlstate", f"{op.k} raised {op.sqlstate}: {op.msg}", op)
        if op.lost:
            count("calls cut by a kill")
            # the call may or may not have committed
            for w in op.meta.get("touches", []):
                if w in self.rows:
                    self.rows[w].unc = True
                self.tok_unknown.add(w)
            if op.k == "take":
                self.lost_takes.append((op.meta["q"], op.t0, None))
                for w, r in self.rows.items():
                    if r.q == op.meta["q"]:
                        r.unc = True
            if op.k in ("limit_queue", "retry_queue"):
                hist = self.limits if op.k == "limit_queue" else self.retry
                hist[op.meta["q"]].append((op.t0, None, None, None))
            if op.k in ("pause", "resume"):
                self.pause_unknown.add(op.meta["q"])
            if op.meta.get("step") and wf:
                self.reg_unknown.add((wf, op.meta["step"]))
            if op.k == "start":
                self.lost_starts = True
            return
        if R is not None and concurrent:
            R.unc = True
        if R is not None:
            R.expect_vis = None   # a later call on the row: only the fail's own snapshot checks it
        for w in op.meta.get("wfs", []):
            if w in self.rows:
                self.rows[w].expect_vis = None
        getattr(self, "on_" + op.k)(op, R, concurrent)

    def expect_22023(self, op, code, what):
        if op.status == "ok":
            self.fail(code, f"{what} was accepted ({op.rows}); expected 22023", op)
        return op.status == "err" and op.sqlstate == "22023"

    def on_schedule(self, op, R, concurrent):
        if op.meta["at"] == "inf":
            self.expect_22023(op, "R2-infinity", "schedule(..., 'infinity')")
            return
        if op.status != "ok":
            return
        self.wakeup(op, R, op.meta["at_abs"])
        self.rekeyed(R, op.meta["key"], concurrent)
        R.key = op.meta["key"]

    def rekeyed(self, R, key, concurrent):
        """A schedule giving the row another key during a pass: the old
        key's place may stay held until the pass's receipt (reference.md,
        per_key: a pass ended from another connection finds its place by
        the row's key). Beside a call that ended the pass (a cancel in the
        same burst, observed first), the pass it may have met is the
        row's latest."""
        p = R.pass_ if R.pass_ is not None or not concurrent else self.latest.get(R.wf)
        if p is not None and p.key != key:
            p.sticky = True

    def on_schedule_many(self, op, R, concurrent):
        if op.meta["at"] == "inf":
            self.expect_22023(op, "R2-infinity", "schedule_many(..., 'infinity')")
            return
        if op.status != "ok":
            return
        count("schedule_many rows", len(op.meta["wfs"]))
        known = not concurrent and not any(self.rows[w].unc for w in op.meta["wfs"])
        live = 0
        for w, inp, key in zip(op.meta["wfs"], op.meta["inputs"], op.meta["keys"]):
            R = self.rows[w]
            if concurrent:
                R.unc = True
            dead = R.present and R.dead
            self.wakeup(op, R, op.meta["at_abs"])
            if dead:
                continue  # stays dead, its input with it (rule 3)
            live += 1
            self.rekeyed(R, key, concurrent)
            R.key, R.input = key, inp
        if known and op.rows[0][0] != live:
            self.fail("schedule_many-count", f"schedule_many answered {op.rows[0][0]}; {live} rows were not dead", op)

    def wakeup(self, op, R, at):
        if not R.present:
            R.present, R.dead, R.attempts, R.pass_, R.key, R.input = True, False, 0, None, None, None
            return
        if R.dead:
            return  # stays dead (rule 3): checked at the snapshot
        R.maybe0 = True
        p = R.pass_
        if p is not None and p.end is None and not p.counted:
            if p.receipt > op.t1 + EPS:
                p.woken = at if at is not None else op.t1
                count("wakeups on a pass in flight")
            else:
                p.ambig = True
                R.unc = True

    def on_arrive(self, op, R, concurrent):
        if op.status != "ok":
            return
        self.write_register(R.wf, op.meta["step"], op.meta["value"], json.dumps(op.rows[0][0]), None, op, concurrent)
        self.wakeup(op, R, None)

    def on_take(self, op, R, concurrent):
        if op.status != "ok":
            return
        q, lease = op.meta["q"], op.meta["lease"]
        count("takes")
        count("passes", len(op.rows))
        if len(op.rows) > op.meta["max"]:
            self.fail("take-max", f"take(max => {op.meta['max']}) handed out {len(op.rows)}", op)
        op.meta["passes"] = []
        kinds = op.meta.get("other_kinds", {})
        for (w, rdt, rc, token, attempt, inp) in op.rows:
            R = self.rows.get(w)
            if R is None or R.q != q:
                self.fail("phantom", f"take handed out {w}, not a row of {q}", op)
            now = rc - lease
            p = R.pass_
            conc = bool(kinds.get(w, set()) - {"take"}) or op.meta.get("late", False)
            expected = None if (R.unc or conc) else R.attempts + 1
            if (p is not None and p.ambig and not p.counted) or R.maybe0:
                expected = None
            if not R.unc and not conc:
                if not R.present:
                    self.fail("phantom", f"take handed out {w}, which the model says left the queue", op)
                if R.dead:
                    self.fail("R3-dead-handed-out", f"take handed out {w}, dead (attempts {R.attempts})", op)
            if p is not None and p.end is None and not p.counted and not p.ambig:
                if p.receipt > now + 0.001:
                    if not R.unc and not conc:
                        why = " (a wakeup landed during it)" if p.woken is not None else ""
                        self.fail("R1-double-lease", f"take at {now:.3f} handed out {w} while pass #{p.id}'s lease"
                                  f" runs to {p.receipt:.3f}{why}", op)
                elif expected is not None:
                    expected += 1  # the lapse counted first
                    mx = self.max_attempts(q, now)
                    if mx is not None and R.attempts + 1 >= mx:
                        self.fail("R3-dead-handed-out", f"take handed out {w} whose lapse was failure {R.attempts + 1}"
                                  f" of max_attempts {mx}: it is dead", op)
                p.counted = True
                count("lapsed passes handed out again")
                self.end_pass(p, None, "lapse", at=p.receipt)
                self.tok_unknown.add(w)
            if not R.unc and not conc and inp != R.input:
                self.fail("R-input", f"take handed out {w} with input {inp}; its last schedule_many gave"
                          f" {R.input}", op)
            if "retry" in INJECT and attempt >= 2:
                self.fail("injected", f"take handed out {w} as attempt {attempt} (--inject retry)", op)
            if expected is not None and attempt != expected:
                self.fail("attempts", f"take handed out {w} as attempt {attempt}, expected {expected}"
                          f" (attempts {R.attempts}{', pass lapsed uncounted' if expected == R.attempts + 2 else ''})", op)
            if token is not None and w in self.tokens and w not in self.tok_reset and token <= self.tokens[w]:
                self.fail("token-order", f"{w}: token {token} after {self.tokens[w]}", op)
            if token is not None:
                if w in self.tok_reset and token <= self.tokens.get(w, 0):
                    self.fenced.pop(w, None)   # the claim was swept and begun again
                self.tok_reset.discard(w)
                if w in self.tokens:
                    self.old_tok[w] = self.tokens[w]
                self.tokens[w] = token
                if conc or R.unc:
                    self.tok_unknown.add(w)     # a cancel or fail beside it may have fenced it
                else:
                    self.tok_unknown.discard(w)
                self.released.discard(w)
            if w in self.latest:
                self.old_rc[w] = self.latest[w].rdt
            np = Pass(w, q, R.key, op, rc, rdt, lease, token, op.c)
            self.passes.append(np)
            self.latest[w] = np
            op.meta["passes"].append(np)
            R.pass_, R.present, R.dead, R.attempts = np, True, False, attempt - 1
            R.expect_vis = None
            R.maybe0 = False

    def ender(self, op, R, concurrent, kind, result_true_removes):
        """done, finish, wake_at: the receipt rule. Returns (class, pass)."""
        cls, p = self.classify(R.wf, op.meta["rc"], op)
        if concurrent:
            cls = "amb"
        res = op.rows[0][0]
        if cls == "live":
            want = p.woken is None
            count(f"{kind} of a pass in flight" + (" after a wakeup" if p.woken is not None else ""))
            if res != want:
                why = "a wakeup landed during the pass" if p.woken is not None else "the pass is in flight, no wakeup"
                code = "R1-wakeup-during-pass" if p.woken is not None else f"{kind}-result"
                self.fail(code, f"{kind} of a live pass answered {res}; expected {want} ({why})", op)
        elif cls == "stale" and res:
            self.fail(f"{kind}-result", f"{kind} with a stale receipt answered true", op)
        if cls in ("live", "lapsed") or (cls == "amb" and res):
            self.end_pass(p, op, kind)
        elif cls == "amb" and p is not None:
            p.ambig = True   # it may have lost to a call beside it (an extend, a take): the model cannot say
        if cls in ("lapsed", "amb"):
            R.unc = True
        if res and result_true_removes:
            R.present, R.pass_ = False, None
        return cls, p

    def on_done(self, op, R, concurrent):
        if op.status == "ok":
            self.ender(op, R, concurrent, "done", True)

    def on_done_many(self, op, R, concurrent):
        if op.status != "ok":
            return
        n = op.rows[0][0]
        lo = hi = 0
        for w, rc in zip(op.meta["wfs"], op.meta["rcs"]):
            cls, p = self.classify(w, rc, op)
            if concurrent:
                cls = "amb"
            if cls == "live":
                if p.woken is None:
                    lo += 1
                    hi += 1
            elif cls != "stale":
                hi += 1
            if cls in ("live", "lapsed"):
                self.end_pass(p, op, "done_many")
            elif cls == "amb" and p is not None:
                p.ambig = True
            self.rows[w].unc = True  # which ones went: the snapshot says
        if not lo <= n <= hi:
            self.fail("done_many-result", f"done_many removed {n}; expected {lo}..{hi}", op)

    def check_token(self, op, wf, token):
        """Whether `token` must be fenced (True), must not be (False), or either (None)."""
        if wf not in self.tokens or token is None:
            return None
        if token < self.tokens[wf] or token <= self.fenced.get(wf, 0):
            return True     # superseded or fenced, whatever the model missed
        if token > self.tokens[wf] and wf not in self.tok_unknown:
            return True     # never issued
        if wf in self.tok_unknown or wf in self.released:
            return None
        return False

    def on_finish(self, op, R, concurrent):
        fenced = None if concurrent else self.check_token(op, R.wf, op.meta["token"])
        if op.status == "err":
            if op.sqlstate == "SD001" and fenced is False:
                self.fail("R9-fence", f"finish with the current token {op.meta['token']} raised SD001", op)
            return
        if fenced:
            self.fail("R9-fence", f"finish with fenced token {op.meta['token']} (newest {self.tokens.get(R.wf)},"
                      f" fenced up to {self.fenced.get(R.wf)}) was not refused", op)
        if op.meta.get("step"):
            k = (R.wf, op.meta["step"])
            self.reg_unknown.add(k)  # finish does not say what it stored
        if op.meta.get("status"):
            self.inst_status[R.wf] = "terminal"
        self.released.add(R.wf)
        self.ender(op, R, concurrent, "finish", True)

    def on_wake_at(self, op, R, concurrent):
        if op.meta["at"] == "inf":
            self.expect_22023(op, "R2-infinity", "wake_at(..., 'infinity')")
            return
        if op.status == "ok":
            self.ender(op, R, concurrent, "wake_at", False)

    def on_extend(self, op, R, concurrent):
        if op.status != "ok":
            return
        r, rdt = op.rows[0]
        cls, p = self.classify(R.wf, op.meta["rc"], op)
        if r is None:
            if cls == "live" and p.woken is None and not concurrent and op.t0 + op.meta["lease"] > p.receipt + EPS:
                self.fail("extend-result", f"extend of a live pass (lease to {p.receipt - op.t0:+.3f} s) by"
                          f" {op.meta['lease']} s answered NULL", op)
            return
        now = r - op.meta["lease"]
        if p is None:
            self.fail("R5-extend", "extend of a receipt no take returned answered a new receipt", op)
        if op.meta["rc"] <= now + 1e-6 and not p.ambig:
            self.fail("R5-extend", f"extend at {now:.3f} renewed pass #{p.id} whose lease ended at {op.meta['rc']:.3f}"
                      f" ({now - op.meta['rc']:.3f} s before)", op)
        # the clock judges a lease, not the extend's now(): read just before
        # the call, it is behind the clock the call reads
        if op.meta["rc"] <= op.t0 and not p.ambig:
            self.fail("R5-extend", f"extend renewed pass #{p.id} whose lease ended at {op.meta['rc']:.3f},"
                      f" {op.t0 - op.meta['rc']:.3f} s before the clock read ahead of the call", op)
        if cls == "stale" and not concurrent:
            self.fail("R5-extend", f"extend of a stale receipt of {R.wf} (pass #{p.id}) answered a new receipt", op)
        self.old_rc[R.wf] = p.rdt
        p.receipt, p.rdt = r, rdt
        p.receipts.append((r, rdt))

    def on_fail(self, op, R, concurrent):
        if op.meta.get("retry") == "inf":
            self.expect_22023(op, "R2-infinity", "fail(retry_at => 'infinity')")
            return
        if op.status != "ok":
            return
        cls, p = self.classify(R.wf, op.meta["rc"], op)
        if concurrent:
            cls = "amb"
        res = op.rows[0][0]
        if cls == "live" and not res:
            why = " (a wakeup landed during the pass)" if p.woken is not None else ""
            self.fail("R1-fail-during-pass" if p.woken is not None else "fail-result",
                      f"fail of a live pass answered false{why}", op)
        if cls == "stale" and res:
            self.fail("fail-result", "fail with a stale receipt answered true", op)
        if cls in ("live", "lapsed") or (cls == "amb" and res):
            self.end_pass(p, op, "fail")
        elif cls == "amb" and p is not None:
            p.ambig = True
        if res:
            if concurrent:
                self.tok_unknown.add(R.wf)
            else:
                self.fence(R.wf)
            if cls == "live":
                R.attempts += 1
                mx = self.max_attempts(R.q, op.t0)
                if mx is None:
                    R.unc = True
                else:
                    R.dead = R.attempts >= mx
                    retry = op.meta.get("retry")
                    b = self.backoff(R.q, op.t0, R.attempts)
                    if not R.dead and retry is None and b is not None:
                        R.expect_vis = (op.t0 + b, op.t1 + b, f"the backoff {b:g} s after the failure")
                    elif not R.dead and retry == 0.0:
                        R.expect_vis = (op.t0, op.t1, "retry_at => now()")
                    elif not R.dead and retry is not None:
                        R.expect_vis = (op.meta["retry_abs"], op.meta["retry_abs"], "retry_at")
                    if R.dead and R.wf in self.inst_status:
                        self.inst_status[R.wf] = "terminal"
                p.counted = True
            else:
                if p is not None:
                    p.counted = True
                R.unc = True
        elif cls in ("lapsed", "amb"):
            R.unc = True

    def on_cancel(self, op, R, concurrent):
        if op.status != "ok":
            return
        res = op.rows[0][0]
        if not concurrent and not R.unc and res != R.present:
            self.fail("cancel-result", f"cancel answered {res}; the row is {'there' if R.present else 'gone'}", op)
        if res:
            p = R.pass_
            if p is not None and (p.end is None or p.end[1] == "lapse") and not concurrent and not R.unc:
                self.fence(R.wf)   # in flight, lapsed, or lapsed and counted: fenced (rule 9)
            else:
                self.tok_unknown.add(R.wf)
            if p is not None:
                self.end_pass(p, op, "cancel")
            R.present, R.pass_ = False, None
            if R.wf in self.inst_status:
                self.inst_status[R.wf] = None

    def on_redrive(self, op, R, concurrent):
        if op.status != "ok":
            return
        res = op.rows[0][0]
        if not concurrent and not R.unc and res != (R.present and R.dead):
            self.fail("redrive-result", f"redrive answered {res}; the row is {'dead' if R.dead else 'not dead'}"
                      f"{'' if R.present else ' (gone)'}", op)
        if res:
            R.dead, R.attempts = False, 0

    def on_record(self, op, R, concurrent):
        fenced = None if concurrent else self.check_token(op, R.wf, op.meta["token"])
        if op.status == "err":
            if op.sqlstate == "SD001" and fenced:
                count("fenced records refused")
            if op.sqlstate == "SD001" and fenced is False:
                self.fail("R9-fence", f"record with the current token {op.meta['token']} raised SD001", op)
            return
        if fenced:
            why = "a cancel" if self.fenced.get(R.wf, 0) >= op.meta["token"] else "a newer claim"
            self.fail("R9-fence", f"record with token {op.meta['token']} wrote after {why} fenced it", op)
        got, first = op.rows[0]
        self.write_register(R.wf, op.meta["step"], op.meta["value"], json.dumps(got), first, op, concurrent)

    def on_start(self, op, R, concurrent):
        if op.status != "ok":
            return
        iid = op.rows[0][0]
        key = op.meta["idem"]
        if key is not None and key in self.idem and self.idem[key] != iid:
            self.fail("idempotency", f"start with key {key} made instance {iid}, the key's first made {self.idem[key]}", op)
        if key is not None:
            self.idem[key] = iid
        wf = f"{self.process}/{iid}"
        if wf not in self.rows:
            self.instances.append(wf)
            R = Row("a", wf)
            R.instance = iid
            self.rows[wf] = R
            R.present, R.attempts = True, 0
            self.inst_status[wf] = "live"
            if concurrent:
                R.unc = True

    def on_sweep(self, op, R, concurrent):
        if op.status != "ok":
            return
        kinds = dict(op.rows)
        for w, r in self.rows.items():
            if r.dead or r.instance is not None:
                r.unc = True  # may go past retention
            if r.pass_ is not None and r.pass_.end is None and r.pass_.receipt < op.t1 + EPS:
                pass  # a lapse it may count: the snapshot allows one more attempt
        if kinds.get("claims", 0):
            for w in self.instances:
                self.tok_unknown.add(w)
                self.tok_reset.add(w)
        if kinds.get("checkpoints", 0):
            for w in self.instances:
                for st in STEPS:
                    self.reg_unknown.add((w, st))
                    self.reg_first.discard((w, st))

    def on_limit_queue(self, op, R, concurrent):
        if op.status == "ok":
            self.limits[op.meta["q"]].append((op.t0, op.t1, op.meta["running"], op.meta["per_key"]))

    def on_retry_queue(self, op, R, concurrent):
        if op.status == "ok":
            self.retry[op.meta["q"]].append((op.t0, op.t1, op.meta["max"], op.meta["backoff"]))

    def on_pause(self, op, R, concurrent, to=True):
        if op.status != "ok":
            return
        q = op.meta["q"]
        res = op.rows[0][0]
        if self.prev_paused is not None:
            self.paused[q] = self.prev_paused.get(self.qname[q], False)
        known = q not in self.pause_unknown and not concurrent and self.prev_paused is not None
        if known and res != (self.paused[q] != to):
            self.fail(f"{op.k}-result",
                      f"{op.k} answered {res}; the queue was {'paused' if self.paused[q] else 'not paused'}", op)
        self.paused[q] = to
        if concurrent:
            self.pause_unknown.add(q)

    def on_resume(self, op, R, concurrent):
        self.on_pause(op, R, concurrent, to=False)

    def on_kill(self, op, R, concurrent):
        pass

    # ---- the state the server shows between steps ----

    def check_snapshot(self, B, A, step_ops):
        steps_redrive = {o.meta.get("wf") for o in step_ops if o.k == "redrive"}
        for wf, R in self.rows.items():
            D = A.rows.get(wf)
            if D is not None and D["q"] != self.qname[R.q]:
                continue
            p = R.pass_
            if R.unc:
                prev = B.rows.get(wf) if B else None
                if prev is not None and D is not None and wf not in steps_redrive:
                    removed = any(o.k in ("done", "finish", "cancel", "sweep") and o.meta.get("wf") in (wf, None)
                                  or (o.k == "done_many" and wf in o.meta.get("wfs", [])) for o in step_ops)
                    if D["attempts"] < prev["attempts"] and not R.maybe0 and not removed:
                        self.fail("attempts", f"{wf}: attempts went back {prev['attempts']} -> {D['attempts']}"
                                  " without a redrive")
                    counters = sum(1 for o in step_ops if (o.k in ("take", "sweep") and o.meta.get("q", R.q) in (R.q, None))
                                   or (o.k == "fail" and o.meta.get("wf") == wf) or o.k == "sweep")
                    if D["attempts"] > prev["attempts"] + counters and not prev["dead"]:
                        self.fail("attempts", f"{wf}: attempts {prev['attempts']} -> {D['attempts']} in one step of"
                                  f" {[o.k for o in step_ops]}: a failure counted twice")
                    if prev["dead"] and not D["dead"] and not removed:
                        self.fail("R3-dead-revived", f"{wf}: dead row alive again without a redrive"
                                  f" (step of {[o.k for o in step_ops]})")
                self.resync(R, D, A)
                continue
            if R.present and D is None:
                self.fail("lost-workflow", f"{wf} left its queue; the model says it is there"
                          f" ({'dead' if R.dead else 'live'}, attempts {R.attempts})")
            if not R.present and D is not None:
                self.fail("survived-removal", f"{wf} is still in its queue after a call that answered it removed")
            if D is None:
                continue
            if D["input"] != R.input:
                self.fail("R-input", f"{wf} holds input {D['input']}; its last schedule_many gave {R.input}")
            lapsed = p is not None and p.end is None and not p.counted and p.receipt < A.ta
            moved = p is not None and (D["leased_until"] is None or abs(D["leased_until"] - p.receipt) > 1e-6)
            if lapsed and D["attempts"] == R.attempts + 1 and moved:
                # a take or sweep met the lapse and counted it
                count("lapses counted by a take or sweep")
                p.counted = True
                self.end_pass(p, None, "lapse", at=p.receipt)
                R.attempts += 1
                # counted under the policy of the moment it was met: between the lease's end and now
                mxs = {self.max_attempts(R.q, p.receipt), self.max_attempts(R.q, A.tb)}
                mx = None if None in mxs or len(mxs) > 1 else mxs.pop()
                if mx is not None:
                    R.dead = R.attempts >= mx
                    if not R.dead and not D["dead"] and D["visible_at"] is not None and p.woken is None:
                        bs = {self.backoff(R.q, p.receipt, R.attempts), self.backoff(R.q, A.tb, R.attempts)}
                        b = None if None in bs else min(bs)
                        if b is not None and all(abs(D["visible_at"] - (p.receipt + x)) > 0.01 for x in bs):
                            self.fail("backoff", f"{wf}: lapse {R.attempts} counted visible at"
                                      f" +{D['visible_at'] - p.receipt:.3f} s"
                                      f" after the lease's end; backoff is {b}")
                else:
                    R.dead = D["dead"]
            elif lapsed and not p.ambig and p.receipt < A.tb - EPS and D["attempts"] == R.attempts and moved:
                why = f" (a wakeup landed during it at {p.woken:.3f})" if p.woken is not None else ""
                self.fail("R1-lapse-not-counted", f"{wf}: pass #{p.id}'s lease ran out at {p.receipt:.3f};"
                          " the row is no longer"
                          f" leased by it but its failure was not counted (attempts {D['attempts']}){why}")
            if R.dead != D["dead"]:
                if R.dead:
                    self.fail("R3-dead-revived", f"{wf}: dead row is alive (visible_at {fmt_t(D['visible_at'], A.tb)},"
                              f" attempts {D['attempts']}) after {[o.k for o in step_ops]}")
                self.fail("dead", f"{wf}: dead (attempts {D['attempts']}); the model says live, attempts {R.attempts}"
                          f" (max_attempts {self.max_attempts(R.q, A.tb)})")
            if D["attempts"] != R.attempts and not (R.maybe0 and D["attempts"] == 0):
                self.fail("attempts", f"{wf}: attempts {D['attempts']} in the table; the model counts {R.attempts}")
            R.attempts = D["attempts"]
            R.maybe0 = False
            R.key = D["key"]
            if R.expect_vis is not None and not D["dead"] and D["visible_at"] is not None:
                lo, hi, why = R.expect_vis
                if not lo - 0.002 <= D["visible_at"] <= hi + 0.002:
                    self.fail("retry-time", f"{wf}: visible at {fmt_t(D['visible_at'], A.tb)} after a fail; expected"
                              f" {fmt_t(lo, A.tb)}..{fmt_t(hi, A.tb)} ({why})")
            R.expect_vis = None
            if p is not None and p.end is None and not p.counted and not p.ambig and p.receipt > A.ta + EPS:
                if D["leased_until"] is None or abs(D["leased_until"] - p.receipt) > 1e-6:
                    why = f" after a wakeup (schedule/arrive) landed on it" if p.woken is not None else ""
                    self.fail("R1-lease-dropped" if p.woken is not None else "lease-lost",
                              f"{wf}: pass #{p.id} in flight until {fmt_t(p.receipt, A.tb)} but the row's leased_until is"
                              f" {fmt_t(D['leased_until'], A.tb)}{why}")
        self.check_places(A)

    def resync(self, R, D, A):
        R.unc, R.maybe0, R.expect_vis = False, False, None
        R.present = D is not None
        if D is None:
            R.pass_ = None
            return
        R.dead, R.attempts, R.key, R.input = D["dead"], D["attempts"], D["key"], D["input"]
        p = R.pass_
        if p is not None and p.end is None:
            if D["leased_until"] is None or abs(D["leased_until"] - p.receipt) > 1e-6:
                p.ambig = True
                self.end_pass(p, None, "resync", at=A.tb)

    def check_places(self, A):
        for (qn, key, wf, rc) in A.places:
            if rc is None or rc <= A.ta + EPS:
                continue
            count("held places checked")
            p = self.pass_by_receipt(wf, rc)
            if p is None:
                continue  # a take whose answer was lost, or a receipt outside the model
            if p.ambig or (key is not None and p.sticky):
                continue
            where = f"per_key place of {key}" if key is not None else "running place"
            if p.end is not None and p.end[1] not in ("resync",):
                kind = p.end[1]
                code = {"fail": "R4-place-after-fail", "cancel": "R9-place-after-cancel"}.get(kind, "place-after-end")
                self.fail(code, f"{where} still held by {wf} until {fmt_t(rc, A.tb)}"
                          f" after its pass #{p.id} ended by {kind}")
            if abs(p.receipt - rc) > 1e-6:
                self.fail("extend-place", f"{where} held by {wf} to an old receipt {fmt_t(rc, A.tb)} of pass #{p.id}"
                          f" (its receipt is {fmt_t(p.receipt, A.tb)})")

    def check_capacity(self, take, A):
        """At the instant the take's passes are surely in flight (its
        commit, by its t1), count the passes surely in flight beside them."""
        q = take.meta["q"]
        x = take.t1
        if x is None or not take.meta.get("passes"):
            return
        lim = self.limit(q, x)
        if lim is None:
            return
        running, per_key = lim
        if running is not None or per_key is not None:
            count("takes checked against a limit")
        for (lq, t0, t1) in self.lost_takes:
            if lq == q and t0 is not None and t0 > x - 1.2:
                return
        changes = [(t0, t1) for (t0, t1, *_) in self.limits[q]]

        def overlaps_change(p):
            return any(t1 is None or (t0 <= p.take.t1 + EPS and p.take.t0 <= t1 + EPS) for t0, t1 in changes)
        live = [p for p in self.passes if p.q == q and p.start is not None and p.start <= x + 1e-6 and p.end_at() > x
                and not p.ambig and not overlaps_change(p)]
        if running is not None and len(live) > running:
            self.fail("capacity-running", f"{len(live)} passes of {q} in flight at {fmt_t(x, A.tb)}"
                      f" with running => {running}: "
                      + ", ".join(f"#{p.id} {p.wf} from {fmt_t(p.start, A.tb)} to {fmt_t(p.end_at(), A.tb)}"
                                  for p in live), take)
        if per_key is not None:
            for p in take.meta["passes"]:
                if p.key is None:
                    continue
                same = [o for o in live if o.key == p.key and not o.sticky]
                if len(same) > per_key:
                    self.fail("capacity-per-key", f"{len(same)} passes of key {p.key} in flight with per_key => {per_key}: "
                              + ", ".join(f"#{o.id} {o.wf}" for o in same), take)

    def check_empty_take(self, take, B):
        """A one-row take that came back empty while a row was surely ready
        within the limits (rule 7)."""
        q = take.meta["q"]
        t = take.t0
        if B is None or B.paused.get(self.qname[q], False) or q in self.pause_unknown:
            return
        lim = self.limit(q, t)
        mx = self.max_attempts(q, t)
        if lim is None or mx is None:
            return
        running, per_key = lim
        for (lq, t0, _) in self.lost_takes:
            if lq == q and t0 > t - 1.2:
                return
        possibly = [p for p in self.passes if p.q == q and not p.counted
                    and (p.receipt if (p.ambig or p.sticky) else p.end_at()) > t - EPS]
        if any(p.ambig for p in possibly):
            return
        if running is not None and len(possibly) >= running:
            return
        count("empty one-row takes checked for a ready row")
        for wf, D in B.rows.items():
            R = self.rows.get(wf)
            if R is None or R.q != q or D["dead"] or D["visible_at"] is None or R.unc:
                continue
            p = R.pass_
            if p is not None and not p.counted and p.end is None:
                if p.receipt > t - EPS or p.ambig or p.woken is not None:
                    continue
                b = self.backoff(q, p.receipt, D["attempts"] + 1)
                if D["attempts"] + 1 >= mx or b is None or p.receipt + b > t - EPS:
                    continue
            elif p is not None and p.end is not None and p.end[1] in ("resync",):
                continue
            if D["visible_at"] > t - EPS:
                continue
            if per_key is not None and D["key"] is not None:
                if sum(1 for o in possibly if o.key == D["key"]) >= per_key:
                    continue
            ahead = sum(1 for w, r in self.rows.items() if r.q == q and r.pass_ is not None and r.pass_.end is None
                        and not r.pass_.counted and r.pass_.receipt < t)
            self.fail("R7-take-empty", f"take(max => 1) of {q} came back empty while {wf} was ready since"
                      f" {fmt_t(D['visible_at'], B.tb)} (attempts {D['attempts']}; {len(possibly)} passes in flight,"
                      f" running {running}; {ahead} lapsed leases not counted yet)", take)


# --------------------------------------------------------------------------
# Generating operations (abstract, so that a history can be replayed).
# --------------------------------------------------------------------------

def gen_op(rng, m, links_busy):
    """The next abstract operation, chosen by `rng` from what the model holds."""
    if m.plan:
        return m.plan.pop(0)
    live = [p for p in m.passes[-40:] if p.end is None and not p.counted]
    recent = [p for p in m.passes[-20:]]
    r = rng.random()
    if "bursts" in MORE and rng.random() < 0.35:
        r = 0.65
    elif "lapses" in MORE and rng.random() < 0.15:
        r = 0.94
    worker = rng.randrange(WORKERS)

    def pick_pass():
        if live and rng.random() < 0.85:
            p = rng.choice(live)
        elif recent:
            p = rng.choice(recent)
        else:
            return None
        return p

    def local(wf):
        if wf in m.instances:
            return f"i{m.instances.index(wf)}"
        return wf[len(f"mc-{m.tag}-"):]

    def at_choice():
        x = rng.random()
        if x < 0.45:
            return "now"
        if x < 0.55:
            return -0.5
        if x < 0.75:
            return round(rng.uniform(0.2, 1.5), 2)
        if x < 0.85 or "inf" in AVOID:
            return 3600.0
        return "inf"

    def any_wf():
        q = rng.choice(QUEUES)
        w = rng.choice(WFS[q])
        for _ in range(20):
            if "wakeup" not in AVOID or not any(p.wf == m.full(w) for p in live):
                break
            w = rng.choice(WFS[q])
        return w

    def pass_conn(p):
        return p.conn if rng.random() < 0.8 else rng.randrange(WORKERS)

    if r < 0.16 and rng.random() < 0.25:
        q = rng.choice(QUEUES)
        ws = rng.sample(WFS[q], min(len(WFS[q]), rng.choice([1, 2, 3])))
        return {"k": "schedule_many", "c": rng.choice([worker, OPERATOR]), "wfs": ws, "q": q, "at": at_choice(),
                "prio": rng.choice([0, 0, 0, 1, 2]), "keys": [rng.choice(KEYS) for _ in ws],
                "inputs": [None if rng.random() < 0.2 else n for n in range(len(ws))]}
    if r < 0.16:
        w = any_wf()
        return {"k": "schedule", "c": rng.choice([worker, OPERATOR]), "wf": w, "at": at_choice(),
                "prio": rng.choice([0, 0, 0, 1, 2]), "key": rng.choice(KEYS)}
    if r < 0.34:
        return {"k": "take", "c": worker, "q": rng.choice(QUEUES), "lease": rng.choice([0.2, 0.3, 0.5, 1.0]),
                "max": rng.choice([1, 1, 1, 2, 3, 5]), "claim": rng.random() < 0.6}
    if r < 0.62:
        p = pick_pass()
        if p is None:
            return {"k": "sleep", "s": 0.1}
        w = local(p.wf)
        rc = "cur" if rng.random() < 0.85 else "stale"
        x = rng.random()
        c = pass_conn(p)
        if x < 0.22:
            return {"k": "done", "c": c, "wf": w, "rc": rc}
        if x < 0.30:
            ws = [local(o.wf) for o in live if o.q == p.q and o.conn == p.conn][:5] or [w]
            return {"k": "done_many", "c": c, "wfs": ws, "q": p.q}
        if x < 0.45 and p.token is not None:
            return {"k": "finish", "c": c, "wf": w, "rc": rc, "tok": "cur" if rng.random() < 0.85 else "old",
                    "step": rng.choice([None, "s0", "s1"]),
                    "status": "succeeded" if (p.wf in m.instances and rng.random() < 0.5) else None}
        if x < 0.55:
            return {"k": "wake_at", "c": c, "wf": w, "rc": rc,
                    "at": rng.choice(["now", 0.5, 1.0, 3600.0, 3600.0 if "inf" in AVOID else "inf"])}
        if x < 0.67:
            spec = {"k": "extend", "c": c, "wf": w, "rc": rc, "lease": rng.choice([0.3, 0.5, 1.0])}
            if rng.random() < 0.3:
                # a heartbeat in a transaction begun a while ago: its now()
                # is behind the clock, which is what judges the lease
                spec["stale"] = rng.choice([0.1, 0.2, 0.4])
            return spec
        if x < 0.82:
            return {"k": "fail", "c": c, "wf": w, "rc": rc,
                    "retry": rng.choice([None, None, None, 0.0, 0.5, 0.5 if "inf" in AVOID else "inf"])}
        return {"k": "record", "c": c, "wf": w, "tok": "cur" if rng.random() < 0.8 else "old",
                "step": rng.choice(STEPS)}
    if r < 0.66 and "burst" not in AVOID:
        # a burst: several calls on one pass at once, each on its own connection
        p = pick_pass()
        if p is None:
            return {"k": "sleep", "s": 0.1}
        w = local(p.wf)
        kinds = rng.sample(["cancel", "done", "finish", "fail", "extend", "wake_at", "take", "record"]
                           + ([] if "wakeup" in AVOID else ["schedule"]), 3)
        conns = rng.sample(range(WORKERS + 1), len(kinds))
        subs = []
        for k, c in zip(kinds, conns):
            if k == "take":
                subs.append({"k": "take", "c": c, "q": p.q, "lease": 0.5, "max": 2, "claim": True})
            elif k == "schedule":
                subs.append({"k": "schedule", "c": c, "wf": w, "at": "now", "prio": 0, "key": None})
            elif k == "cancel":
                subs.append({"k": "cancel", "c": c, "wf": w})
            elif k == "finish":
                if p.token is None:
                    continue
                subs.append({"k": "finish", "c": c, "wf": w, "rc": "cur", "tok": "cur", "step": "s1", "status": None})
            elif k == "record":
                subs.append({"k": "record", "c": c, "wf": w, "tok": "cur", "step": "s0"})
            elif k == "extend":
                subs.append({"k": "extend", "c": c, "wf": w, "rc": "cur", "lease": 0.5})
            elif k == "wake_at":
                subs.append({"k": "wake_at", "c": c, "wf": w, "rc": "cur", "at": 0.3})
            elif k == "fail":
                subs.append({"k": "fail", "c": c, "wf": w, "rc": "cur", "retry": None})
            else:
                subs.append({"k": k, "c": c, "wf": w, "rc": "cur"})
        workers_in = [x["c"] for x in subs if x["c"] != OPERATOR]
        if "kill" not in AVOID and workers_in and OPERATOR not in [x["c"] for x in subs] and rng.random() < 0.15:
            # kill a connection while its call runs (mid-statement or just after)
            subs.append({"k": "kill", "c": OPERATOR, "target": rng.choice(workers_in)})
        return {"k": "burst", "ops": subs}
    if r < 0.69:
        return {"k": "cancel", "c": rng.choice([worker, OPERATOR]), "wf": any_wf()}
    if r < 0.72:
        dead = [w for w, R in m.rows.items() if R.dead and R.present and w not in m.instances]
        w = local(rng.choice(dead)) if dead and rng.random() < 0.8 else any_wf()
        return {"k": "redrive", "c": OPERATOR, "wf": w}
    if r < 0.76:
        return {"k": "arrive", "c": rng.choice([worker, OPERATOR]), "wf": any_wf(), "step": rng.choice(STEPS)}
    if r < 0.78:
        return {"k": "start", "c": OPERATOR, "idem": rng.choice([None, "x0", "x1", "x2"])}
    if r < 0.80:
        return {"k": "sweep", "c": OPERATOR, "older": rng.choice([3600.0, 3600.0, 0.5])}
    if r < 0.82 and "limits" not in AVOID:
        return {"k": "limit_queue", "c": OPERATOR, "q": rng.choice(QUEUES), "running": rng.choice([None, 1, 2, 3]),
                "per_key": rng.choice([None, None, 1, 2])}
    if r < 0.83:
        return {"k": "retry_queue", "c": OPERATOR, "q": rng.choice(QUEUES), "max": rng.choice([2, 3]),
                "backoff": rng.choice([0.0, 0.0, 0.1, 0.2])}
    if r < 0.845:
        return {"k": rng.choice(["pause", "resume", "resume"]), "c": OPERATOR, "q": rng.choice(QUEUES)}
    if r < 0.855 and "kill" not in AVOID:
        return {"k": "kill", "c": OPERATOR, "target": worker}
    if r < 0.92:
        return {"k": "sleep", "s": rng.choice([0.1, 0.2, 0.3, 0.5, 1.1])}
    if r < 0.95:
        # a pile of lapsed leases ahead of a ready row, then a one-row take (rule 7)
        q = rng.choice(QUEUES)
        w1, w2 = rng.sample(range(WORKERS), 2)
        m.plan = [{"k": "take", "c": w2, "q": q, "lease": 0.2, "max": 5, "claim": False},
                  {"k": "schedule", "c": OPERATOR, "wf": rng.choice(WFS[q]), "at": "now", "prio": 0, "key": None},
                  {"k": "sleep", "s": 0.35},
                  {"k": "take", "c": rng.randrange(WORKERS), "q": q, "lease": 0.3, "max": 1, "claim": rng.random() < 0.5}]
        return {"k": "take", "c": w1, "q": q, "lease": 0.2, "max": 5, "claim": False}
    # a take that should find a row behind lapsed leases: a one-row take
    return {"k": "take", "c": worker, "q": rng.choice(QUEUES), "lease": rng.choice([0.2, 0.3]), "max": 1,
            "claim": rng.random() < 0.5}


SETUP = [
    {"k": "retry_queue", "c": OPERATOR, "q": "a", "max": 3, "backoff": 0.0},
    {"k": "retry_queue", "c": OPERATOR, "q": "b", "max": 2, "backoff": 0.1},
    {"k": "limit_queue", "c": OPERATOR, "q": "a", "running": 2, "per_key": 1},
]


# --------------------------------------------------------------------------
# Running a history.
# --------------------------------------------------------------------------

def at_sql(at):
    if at == "now":
        return "now()", ()
    if at == "inf":
        return "'infinity'::timestamptz", ()
    return "%s", (ts(time.time() + at),)


class Run:
    def __init__(self, seed, tag=None, log=None):
        self.seed = seed
        self.tag = tag or f"{seed % 100000:05d}{random.Random().randrange(36 ** 3):03x}"
        self.m = Model(self.tag)
        self.links = [Link(f"c{i}") for i in range(WORKERS + 1)]
        self.obs = connect_waiting(60)
        self.history = []
        self.specs = []
        self.base = None
        self.prev = None
        self.log = log

    # -- resolving an abstract operation into a statement --

    def resolve(self, spec, op):
        m, k = self.m, spec["k"]
        qn = lambda q: m.qname[q]  # noqa: E731
        if k == "sleep":
            op.sql, op.params = f"-- sleep {spec['s']}", ()
            return True
        wf = m.full(spec["wf"]) if "wf" in spec else None
        if "wf" in spec and (wf is None or wf not in m.rows):
            return False
        R = m.rows.get(wf)
        q = spec.get("q") or (R.q if R else None)
        meta = op.meta
        meta["wf"], meta["q"], meta["touches"] = wf, q, [wf] if wf else []
        if k in ("done", "finish", "wake_at", "extend", "fail"):
            rdt = m.receipt_of(wf, spec["rc"])
            if rdt is None:
                return False
            meta["rc"], meta["rdt"] = rdt.timestamp(), rdt
        if k in ("finish", "record"):
            tok = m.token_of(wf, spec["tok"])
            if tok is None:
                return False
            meta["token"] = tok
        if k == "schedule":
            a, ap = at_sql(spec["at"])
            meta["at"], meta["key"] = spec["at"], spec["key"]
            meta["at_abs"] = ap[0].timestamp() if ap else None
            if spec["at"] == "inf":
                meta["expect_error"] = "22023"
            op.sql = f"SELECT sturdy.schedule(%s, {a}, %s, priority => %s, key => %s)"
            op.params = (wf, *ap, qn(q), spec["prio"], spec["key"])
        elif k == "schedule_many":
            ws = [m.full(w) for w in spec["wfs"]]
            if any(w is None or w not in m.rows for w in ws):
                return False
            a, ap = at_sql(spec["at"])
            meta["at"], meta["at_abs"] = spec["at"], (ap[0].timestamp() if ap else None)
            meta["wfs"], meta["touches"], meta["keys"] = ws, ws, spec["keys"]
            # each input names the call and the row: a take's answer says which write it saw
            meta["inputs"] = [None if i is None else {"step": op.step, "c": op.c, "n": i} for i in spec["inputs"]]
            if spec["at"] == "inf":
                meta["expect_error"] = "22023"
            op.sql = (f"SELECT sturdy.schedule_many(%s::text[], %s::jsonb[], %s, {a}, priority => %s,"
                      " keys => %s::text[])")
            op.params = (ws, [None if i is None else json.dumps(i) for i in meta["inputs"]], qn(q), *ap,
                         spec["prio"], spec["keys"])
        elif k == "take":
            meta["lease"], meta["max"] = spec["lease"], spec["max"]
            op.sql = ("SELECT workflow, receipt, extract(epoch from receipt)::float8, token, attempt, input"
                      " FROM sturdy.take(%s, %s, max => %s, claim => %s)")
            op.params = (qn(q), dt.timedelta(seconds=spec["lease"]), spec["max"], spec["claim"])
            # the rows it may meet
            meta["touches"] = [w for w, r in m.rows.items() if r.q == q]
        elif k == "done":
            op.sql, op.params = "SELECT sturdy.done(%s, %s, %s)", (wf, meta["rdt"], qn(q))
        elif k == "done_many":
            ws, rds = [], []
            for lw in spec["wfs"]:
                w = m.full(lw)
                if w is None or w not in m.rows or w not in m.latest:
                    continue
                ws.append(w)
                rds.append(m.latest[w].rdt)
            if not ws:
                return False
            meta["wfs"], meta["rcs"], meta["touches"] = ws, [r.timestamp() for r in rds], ws
            op.sql, op.params = "SELECT sturdy.done_many(%s::text[], %s::timestamptz[], %s)", (ws, rds, qn(q))
        elif k == "finish":
            step = spec.get("step")
            meta["step"], meta["status"] = step, spec.get("status")
            val = json.dumps({"finish": op.step}) if step else None
            op.sql = "SELECT sturdy.finish(%s, %s, %s, step => %s, value => %s::jsonb, status => %s, queue => %s)"
            op.params = (wf, meta["token"], meta["rdt"], step, val, spec.get("status"), qn(q))
        elif k == "wake_at":
            a, ap = at_sql(spec["at"])
            meta["at"] = spec["at"]
            if spec["at"] == "inf":
                meta["expect_error"] = "22023"
            op.sql = f"SELECT sturdy.wake_at(%s, %s, {a}, %s)"
            op.params = (wf, meta["rdt"], *ap, qn(q))
        elif k == "extend":
            meta["lease"] = spec["lease"]
            op.sql = "SELECT extract(epoch from r)::float8, r FROM sturdy.extend(%s, %s, %s, %s) r"
            op.params = (wf, meta["rdt"], dt.timedelta(seconds=spec["lease"]), qn(q))
        elif k == "fail":
            meta["retry"] = spec["retry"]
            if spec["retry"] is None:
                op.sql = "SELECT sturdy.fail(%s, %s, 'boom', %s, code => 'MC001')"
                op.params = (wf, meta["rdt"], qn(q))
            else:
                a, ap = at_sql(spec["retry"] if spec["retry"] != 0.0 else "now")
                meta["retry_abs"] = ap[0].timestamp() if ap else None
                if spec["retry"] == "inf":
                    meta["expect_error"] = "22023"
                op.sql = f"SELECT sturdy.fail(%s, %s, 'boom', %s, retry_at => {a}, code => 'MC001')"
                op.params = (wf, meta["rdt"], qn(q), *ap)
        elif k == "cancel":
            op.sql, op.params = "SELECT sturdy.cancel(%s, %s)", (wf, qn(q))
        elif k == "redrive":
            op.sql, op.params = "SELECT sturdy.redrive(%s, %s)", (wf, qn(q))
        elif k == "arrive":
            meta["step"], meta["value"] = spec["step"], json.dumps({"arrive": op.step})
            op.sql = "SELECT sturdy.arrive(%s, %s, %s::jsonb, %s)"
            op.params = (wf, spec["step"], meta["value"], qn(q))
        elif k == "record":
            meta["step"], meta["value"] = spec["step"], json.dumps({"record": op.step})
            op.sql = "SELECT recorded, first FROM sturdy.record(%s, %s, %s::jsonb, %s)"
            op.params = (wf, spec["step"], meta["value"], meta["token"])
        elif k == "start":
            meta["idem"] = spec["idem"]
            meta["q"] = "a"
            op.sql = "SELECT sturdy.start(%s, %s, '{}'::jsonb, idempotency_key => %s, queue => %s)"
            op.params = (m.process, f"bk{op.step}", spec["idem"], qn("a"))
        elif k == "sweep":
            op.sql = "SELECT kind, deleted FROM sturdy.sweep(%s, 1000)"
            op.params = (dt.timedelta(seconds=spec["older"]),)
            meta["touches"] = list(m.rows)
        elif k == "limit_queue":
            meta["running"], meta["per_key"] = spec["running"], spec["per_key"]
            op.sql = "SELECT sturdy.limit_queue(%s, running => %s, per_key => %s)"
            op.params = (qn(q), spec["running"], spec["per_key"])
        elif k == "retry_queue":
            meta["max"], meta["backoff"] = spec["max"], spec["backoff"]
            op.sql = ("SELECT sturdy.retry_queue(%s, max_attempts => %s, backoff => %s,"
                      " max_backoff => '10 seconds', jitter => 0)")
            op.params = (qn(q), spec["max"], dt.timedelta(seconds=spec["backoff"]))
        elif k in ("pause", "resume"):
            op.sql, op.params = f"SELECT sturdy.{k}(%s)", (qn(q),)
        elif k == "kill":
            pid = self.links[spec["target"]].pid
            if pid is None:
                return False
            op.sql, op.params = "SELECT pg_terminate_backend(%s)", (pid,)
        else:
            raise ValueError(k)
        return True

    # -- the controller --

    def snapshot(self):
        c = self.obs
        tb = c.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()[0]
        qs = list(self.m.qname.values())
        rows = {}
        for (q, w, dead, vis, lu, att, fa, key, inp) in c.execute(
                "SELECT queue, workflow, visible_at = 'infinity',"
                " CASE WHEN isfinite(visible_at) THEN extract(epoch from visible_at)::float8 END,"
                " extract(epoch from leased_until)::float8, COALESCE(attempts, 0),"
                " extract(epoch from failed_at)::float8, key, input FROM sturdy.queue WHERE queue = ANY(%s)", (qs,)):
            rows[w] = {"q": q, "dead": dead, "visible_at": vis, "leased_until": lu, "attempts": att,
                       "failed_at": fa, "key": key, "input": inp}
        places = c.execute(
            "SELECT queue, NULL::text, workflow, extract(epoch from receipt)::float8 FROM sturdy.queue_places"
            " WHERE queue = ANY(%s) AND workflow IS NOT NULL"
            " UNION ALL SELECT queue, key, workflow, extract(epoch from receipt)::float8 FROM sturdy.queue_key_places"
            " WHERE queue = ANY(%s) AND workflow IS NOT NULL", (qs, qs)).fetchall()
        paused = dict(c.execute("SELECT queue, paused FROM sturdy.queue_limits WHERE queue = ANY(%s)", (qs,)).fetchall())
        ta = c.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()[0]
        if self.base is None:
            self.base = tb
        return Snapshot(tb, ta, rows, places, paused)

    def wait_link(self, link, seconds):
        op = link.busy
        if op is None:
            return True
        if op.finished.wait(seconds):
            link.busy = None
            return True
        return False

    def issue(self, specs, step):
        """Issue these operations at once, each on its connection; wait up to
        WAIT for them. Returns the ops."""
        ops = []
        for spec in specs:
            op = Op(spec, step)
            self.history.append(op)
            if not self.resolve(spec, op):
                op.skipped = True
                continue
            if spec["k"] == "sleep":
                op.status = "ok"
                time.sleep(spec["s"])
                continue
            link = self.links[op.c]
            if not self.wait_link(link, HANG):
                self.m.fail("hang", f"{link.busy.k} on c{op.c} still blocked after {HANG} s: {link.busy.sql}", link.busy)
            ops.append(op)
        for op in ops:
            self.links[op.c].submit(op)
        deadline = time.monotonic() + WAIT
        for op in ops:
            op.finished.wait(max(0.0, deadline - time.monotonic()))
        return ops

    def pending(self):
        return [l.busy for l in self.links if l.busy is not None and not l.busy.finished.is_set()]

    def step(self, spec, i):
        specs = spec["ops"] if spec["k"] == "burst" else [spec]
        count("operations", len(specs))
        if spec["k"] == "burst":
            count("bursts (calls at once)")
        ops = self.issue(specs, i)
        both = self.unobserved + ops
        fin = [o for o in both if o.finished.is_set()]
        self.unobserved = [o for o in both if not o.finished.is_set()]
        for l in self.links:
            if l.busy is not None and l.busy.finished.is_set():
                l.busy = None
        fin.sort(key=lambda o: (o.t1 if o.t1 is not None else float("inf")))
        group = fin + self.unobserved
        for o in fin:
            if o.status is None:
                o.status = "err"
            mine = set(o.meta.get("touches", []))
            kinds = {}
            for x in group:
                if x is not o:
                    for w in x.meta.get("touches", []):
                        kinds.setdefault(w, set()).add(x.k)
            o.meta["other_kinds"] = kinds
            conc = bool(mine & set(kinds)) or o.meta.get("late", False)
            self.m.observe(o, conc)
        for o in self.unobserved:
            o.meta["late"] = True
            for w in o.meta.get("touches", []):
                if w in self.m.rows:
                    self.m.rows[w].unc = True
        if not self.unobserved:
            snap = self.snapshot()
            for o in fin:
                if o.k == "take" and o.status == "ok":
                    self.m.check_capacity(o, snap)
                    if (o.meta["max"] == 1 and not o.rows and len(fin) == 1 and not o.meta.get("late")
                            and self.prev_i == i - 1):
                        self.m.check_empty_take(o, self.prev)
            self.m.check_snapshot(self.prev, snap, fin)
            self.prev, self.prev_i = snap, i
            self.m.prev_paused = snap.paused
            self.m.pause_unknown.clear()
        else:
            self.m.prev_paused = None

    def finale(self):
        """Let every lease run out, resume, take and finish everything ready:
        what is left must be dead or parked in the future."""
        for l in self.links:
            if not self.wait_link(l, HANG):
                self.m.fail("hang", f"{l.busy.k} on {l.name} still blocked after {HANG} s")
        time.sleep(1.1)
        c = self.obs
        step = (max(o.step for o in self.history) + 1) if self.history else 0

        def run(sql, params):
            # the finale's calls go into the history too (on the observer's connection, [ob])
            op = Op({"k": "finale", "c": "ob"}, step)
            op.sql, op.params = sql, params
            self.history.append(op)
            op.t0 = c.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()[0]
            op.rows = c.execute(sql, params).fetchall()
            op.status = "ok"
            op.t1 = c.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()[0]
            return op.rows
        for q in QUEUES:
            run("SELECT sturdy.resume(%s)", (self.m.qname[q],))
        for q in QUEUES:
            qn = self.m.qname[q]
            for _ in range(60):
                rows = run("SELECT workflow, receipt FROM sturdy.take(%s, '5 seconds', max => 10)", (qn,))
                if not rows:
                    break
                for w, rc in rows:
                    run("SELECT sturdy.done(%s, %s, %s)", (w, rc, qn))
            left = c.execute("SELECT workflow, visible_at = 'infinity', leased_until, visible_at <= now()"
                             " FROM sturdy.queue WHERE queue = %s AND visible_at <= now() AND visible_at <> 'infinity'",
                             (qn,)).fetchall()
            stuck = [w for (w, dead, lu, ready) in left]
            if stuck:
                self.m.fail("liveness", f"{qn}: rows ready but never handed out after every lease ran out: {stuck}")

    def cleanup(self):
        c = self.obs
        qs = list(self.m.qname.values())
        pat = f"mc-{self.tag}-%"
        try:
            for q in qs:
                c.execute("SELECT sturdy.limit_queue(%s)", (q,))
                c.execute("SELECT sturdy.retry_queue(%s)", (q,))
                c.execute("SELECT sturdy.resume(%s)", (q,))
            c.execute("DELETE FROM sturdy.queue WHERE queue = ANY(%s)", (qs,))
            c.execute("DELETE FROM sturdy.queue_places WHERE queue = ANY(%s)", (qs,))
            c.execute("DELETE FROM sturdy.queue_key_places WHERE queue = ANY(%s)", (qs,))
            c.execute("DELETE FROM sturdy.queue_limits WHERE queue = ANY(%s)", (qs,))
            c.execute("DELETE FROM sturdy.queue_waiters WHERE queue = ANY(%s)", (qs,))
            c.execute("DELETE FROM sturdy.checkpoints WHERE workflow LIKE %s", (pat,))
            c.execute("DELETE FROM sturdy.claims WHERE workflow LIKE %s", (pat,))
            c.execute("DELETE FROM sturdy.idempotency_keys WHERE process = %s", (self.m.process,))
            c.execute("DELETE FROM sturdy.instances WHERE process = %s", (self.m.process,))
        except psycopg.Error as e:
            print(f"model: cleanup of {self.tag}: {e}", file=sys.stderr)

    def close(self):
        for l in self.links:
            if l.busy is not None and not l.busy.finished.is_set():
                try:
                    self.obs.execute("SELECT pg_cancel_backend(%s)", (l.pid,))
                except psycopg.Error:
                    pass
                l.busy.finished.wait(5)
        self.cleanup()
        for l in self.links:
            l.close()
        self.obs.close()

    def execute(self, specs=None, steps=250, deadline=None, final=True):
        """Run the setup, then `specs` (a replay) or `steps` generated by the
        seed, until `deadline`. Returns (violation or None, specs run)."""
        rng = random.Random(self.seed)
        self.unobserved = []
        self.prev_i = None
        ran = []
        try:
            for i, s in enumerate(SETUP):
                self.step(s, -len(SETUP) + i)
            self.prev, self.prev_i = self.snapshot(), -1
            self.m.prev_paused = self.prev.paused
            n = len(specs) if specs is not None else steps
            for i in range(n):
                if deadline is not None and time.monotonic() > deadline:
                    break
                spec = specs[i] if specs is not None else gen_op(rng, self.m, None)
                spec = json.loads(json.dumps(spec))
                ran.append(spec)
                self.step(spec, i)
            if final:
                self.finale()
            return None, ran
        except Violation as v:
            if v.step is None:
                v.step = len(ran) - 1
            return v, ran
        except psycopg.OperationalError as e:
            # the observer's connection went: the server crashed or restarted
            v = Violation("server-lost", f"the server went away: {str(e).splitlines()[0]}", len(ran) - 1)
            return v, ran

    def render(self, last=None):
        base = self.base or 0
        names = self.m.short_names()
        out = [o.line(base, names) for o in self.history if o.step >= 0 and (last is None or o.step <= last)]
        return "\n".join(out)


# --------------------------------------------------------------------------
# Episodes, shrinking, the budget loop.
# --------------------------------------------------------------------------

TOLERATED = {}


def prune(run, ran):
    """The operations of `ran` without those that were skipped (they
    referred to nothing, so they issued nothing): the same replay."""
    skipped = {id(o.spec) for o in run.history if o.skipped}
    out = []
    for spec in ran:
        if id(spec) in skipped:
            continue
        if spec["k"] == "burst":
            subs = [x for x in spec["ops"] if id(x) not in skipped]
            if not subs:
                continue
            spec = dict(spec, ops=subs)
        out.append(spec)
    return out


def run_once(seed, specs=None, steps=250, deadline=None, final=True, pruned=None):
    r = Run(seed)
    try:
        v, ran = r.execute(specs, steps, deadline, final)
        if pruned is not None:
            pruned[:] = prune(r, ran[:v.step + 1] if v is not None and v.step is not None and v.step >= 0 else ran)
        text = r.render()
        for code, n in r.m.tolerated.items():
            TOLERATED[code] = TOLERATED.get(code, 0) + n
        return v, ran, text
    finally:
        r.close()


def strip(specs):
    for s in specs:
        s.pop("_late", None)
        for x in s.get("ops", []):
            x.pop("_late", None)
    return specs


def shrink(seed, specs, code, budget, out=print, tries=2):
    """Delta debugging over the operations: the shortest list found within
    `budget` seconds that still fails `code`. Each candidate is replayed
    up to `tries` times (a real server's timing)."""
    deadline = time.monotonic() + budget
    best = strip([dict(s) for s in specs])
    best_text = None

    def fails(cand):
        nonlocal best_text
        for _ in range(tries):
            if time.monotonic() > deadline:
                return False
            pruned = []
            v, ran, text = run_once(seed, strip([json.loads(json.dumps(s)) for s in cand]),
                                    final=code in ("liveness", "server-lost"), pruned=pruned)
            if v is not None and v.code == code:
                best_text = text
                # what it ran up to the failure, less the operations that referred to nothing
                cand[:] = strip(pruned)
                return True
        return False

    n = 2
    while len(best) >= 2 and time.monotonic() < deadline:
        size = max(1, len(best) // n)
        chunks = [best[i:i + size] for i in range(0, len(best), size)]
        reduced = False
        for i in range(len(chunks)):
            cand = [s for j, c in enumerate(chunks) if j != i for s in c]
            if cand and fails(cand):
                best, n, reduced = cand, max(n - 1, 2), True
                out(f"model: shrunk to {len(best)} operations")
                break
        if not reduced:
            if size == 1:
                break
            n = min(len(best), n * 2)
    return best, best_text


def check(seconds, seed, episode_steps=250, shrink_seconds=None, out=print, max_episodes=None):
    """The budget loop: episodes of up to `episode_steps` operations with
    seeds seed, seed+1, ..., until `seconds` have passed (or
    `max_episodes`). Returns (failure report or None, episodes, steps)."""
    started = time.monotonic()
    deadline = started + seconds
    episodes = steps_total = 0
    while time.monotonic() < deadline and episodes < (max_episodes or 10_000):
        s = seed + episodes
        t = time.monotonic()
        v, ran, text = run_once(s, steps=episode_steps, deadline=deadline)
        episodes += 1
        steps_total += len(ran)
        if v is None:
            continue
        report = [f"model: FAILED seed={s} (episode {episodes} of --seed {seed}) at step {v.step} of {len(ran)},"
                  f" {time.monotonic() - t:.1f} s into the episode ({steps_total} operations in all):"
                  f" {v.code}: {v.message}",
                  "model: the history up to the failure:", text,
                  f"model: its operations: python3 pg_test/model.py --seed {s}"
                  f" --replay '{json.dumps(strip(ran[:v.step + 1]))}'"]
        out("\n".join(report))
        sb = shrink_seconds if shrink_seconds is not None else min(max(30.0, seconds), 600.0)
        upto = strip(ran[:v.step + 1] if v.step is not None and v.step >= 0 else ran)
        flaky = v.code in ("R6-deadlock", "hang", "server-lost")  # timing: more tries a candidate
        best, best_text = shrink(s, upto, v.code, sb, out=out, tries=4 if flaky else 2)
        tail = [f"model: shrunk from {len(upto)} to {len(best)} operations, same invariant {v.code}; replay with:",
                f"  python3 pg_test/model.py --seed {s} --replay '{json.dumps(best)}'"]
        if best_text:
            tail.append("model: the shrunk history:\n" + best_text)
        out("\n".join(tail))
        return "\n".join(report + tail), episodes, steps_total
    return None, episodes, steps_total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--steps", type=int, default=250, help="operations per episode")
    ap.add_argument("--episodes", type=int, default=None, help="at most this many episodes")
    ap.add_argument("--shrink-seconds", type=float, default=None,
                    help="time to shrink a failure (default: --seconds, 30 to 600)")
    ap.add_argument("--avoid", default=None,
                    help="leave out operation variants: inf,wakeup,burst,kill,limits (or env MODEL_AVOID)")
    ap.add_argument("--tolerate", default=None, help="invariants to count but not stop at (or env MODEL_TOLERATE)")
    ap.add_argument("--more", default=None, help="more of: bursts, lapses (or env MODEL_MORE)")
    ap.add_argument("--inject", default=None, help="a defect of the model's own, to try the checker: retry")
    ap.add_argument("--replay", default=None, help="a JSON list of operations (as a shrink prints) to run once")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1_000_000)
    if a.avoid:
        AVOID.update(a.avoid.replace(",", " ").split())
    if a.more:
        MORE.update(a.more.split(","))
    if a.inject:
        INJECT.update(a.inject.split(","))
    if a.tolerate:
        TOLERATE.update(a.tolerate.replace(",", " ").split())
    if a.replay:
        v, ran, text = run_once(seed, json.loads(a.replay))
        print(text)
        print(f"model: {'FAILED ' + v.code + ': ' + v.message if v else 'passed'}")
        sys.exit(1 if v else 0)
    print(f"model: seed {seed}, {a.seconds:g} s", flush=True)
    f, episodes, steps = check(a.seconds, seed, a.steps, a.shrink_seconds, out=lambda t: print(t, flush=True),
                               max_episodes=a.episodes)
    print("model: seen: " + ", ".join(f"{k} {v}" for k, v in sorted(STATS.items())))
    print(f"model: {'FAILED' if f else 'passed'}: {episodes} episodes, {steps} operations, --seed {seed}"
          + (f"; tolerated: {TOLERATED}" if TOLERATED else ""))
    sys.exit(1 if f else 0)


if __name__ == "__main__":
    main()
