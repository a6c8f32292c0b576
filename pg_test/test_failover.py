"""Failover: a primary and a synchronous standby on loopback (streaming
replication, synchronous_commit = on), both started here as the postgres OS
user. Under a load of workers (take with a claim, record, finish; one
workflow in five fails its first two passes), the primary is stopped with
-m immediate and the standby promoted; the workers reconnect to it. Every
finish a commit acknowledged is on the new primary, nothing is half-done,
fencing tokens go on from where they were (a claim on the new primary beats
every token issued on the old one), the queue drains with no row handed to
two takers, and each workflow's attempts were counted once each across the
failover, none lost and none invented. Its tests run in order, each on
what the one before left.
"""
import datetime
import os
import shutil
import subprocess
import threading
import time

import psycopg
import pytest

from sturdy import Finishes, attempt_problems, failing_pass, lost_connection, needs

BINDIR = os.environ.get("STURDY_BINDIR", "")
DIR = os.environ.get("STURDY_FAILOVER_DIR", "/tmp/pg_sturdy_failover")
PORT = int(os.environ.get("STURDY_FAILOVER_PORT", "55450"))
PRIMARY, STANDBY = os.path.join(DIR, "primary"), os.path.join(DIR, "standby")
JOBS, LEASE = 4000, 2


def as_pg(*cmd, check=True):
    if os.getuid() == 0:
        cmd = ("runuser", "-u", "postgres", "--", *cmd)
    out = subprocess.run(cmd, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr or out.stdout}")
    return out


def pg(name):
    return os.path.join(BINDIR, name)


def dsn(node, port):
    return f"host={node} port={port} user=postgres dbname=postgres connect_timeout=5"


def conf(node, *lines):
    with open(os.path.join(node, "data", "postgresql.auto.conf"), "a") as f:
        f.write("\n".join(lines) + "\n")


def start(node):
    as_pg(pg("pg_ctl"), "-D", os.path.join(node, "data"), "-l", os.path.join(node, "server.log"), "-w", "-t", "60",
          "start")


def setup():
    shutil.rmtree(DIR, ignore_errors=True)
    for node in (PRIMARY, STANDBY):
        os.makedirs(node)
    if os.getuid() == 0:
        subprocess.run(["chown", "-R", "postgres:", DIR], check=True)
    as_pg(pg("initdb"), "-D", os.path.join(PRIMARY, "data"), "-U", "postgres", "-A", "trust", "--no-sync")
    conf(PRIMARY, f"port = {PORT}", "listen_addresses = ''", f"unix_socket_directories = '{PRIMARY}'",
         "wal_level = replica", "max_wal_senders = 4", "synchronous_standby_names = 'standby1'",
         "synchronous_commit = on")
    start(PRIMARY)
    as_pg(pg("pg_basebackup"), "-D", os.path.join(STANDBY, "data"), "-h", PRIMARY, "-p", str(PORT), "-U", "postgres",
          "-X", "stream", "--no-sync")
    open_standby = os.path.join(STANDBY, "data", "standby.signal")
    as_pg("touch", open_standby)
    conf(STANDBY, f"port = {PORT + 1}", f"unix_socket_directories = '{STANDBY}'",
         f"primary_conninfo = 'host={PRIMARY} port={PORT} user=postgres application_name=standby1'",
         "synchronous_standby_names = ''")
    start(STANDBY)
    with psycopg.connect(dsn(PRIMARY, PORT), autocommit=True) as c:
        c.execute("CREATE EXTENSION pg_sturdy")
        c.execute("SELECT sturdy.retry_queue('fo', backoff => '0 seconds', jitter => 0)")
        c.execute(f"SELECT sturdy.schedule('job-' || i, now() - interval '1 s', 'fo') FROM generate_series(1, {JOBS}) i")
        for _ in range(60):
            state = c.execute("SELECT sync_state FROM pg_stat_replication").fetchone()
            if state and state[0] == "sync":
                return
            time.sleep(0.5)
    raise RuntimeError("the standby never became synchronous")


class Load(Finishes):
    """Workers until stopped or their connection dies. With `killed`, a lost
    connection ends a worker quietly; any other error is noted in `errors`
    (and every error is, without `killed`)."""

    def __init__(self, node, port, killed=True):
        self.node, self.port, self.killed = node, port, killed
        self.finished, self.tokens, self.taken, self.errors = set(), {}, [], []
        self.attempts, self.failed = {}, set()
        self.lock, self.stop = threading.Lock(), threading.Event()


    def worker(self):
        try:
            with psycopg.connect(dsn(self.node, self.port), autocommit=True) as c:
                while not self.stop.is_set():
                    row = c.execute("SELECT workflow, receipt, token, attempt"
                                    f" FROM sturdy.take('fo', '{LEASE} s', 1, true)").fetchone()
                    if row is None:
                        return
                    workflow, receipt, token, attempt = row
                    with self.lock:
                        self.taken.append((workflow, receipt))
                        self.attempts.setdefault(workflow, []).append(attempt)
                        if token is not None:
                            self.tokens[workflow] = max(token, self.tokens.get(workflow, 0))
                    if token is None:
                        continue
                    if failing_pass(workflow, attempt):
                        if c.execute("SELECT sturdy.fail(%s, %s, 'planned', 'fo')", (workflow, receipt)).fetchone()[0]:
                            with self.lock:
                                self.failed.add((workflow, receipt))  # its lease ended here
                        continue
                    try:
                        c.execute("SELECT * FROM sturdy.record(%s, 'work', '1', %s)", (workflow, token))
                        c.execute("SELECT sturdy.finish(%s, %s, %s, 'final', '\"done\"', queue => 'fo')",
                                  (workflow, token, receipt))
                    except psycopg.Error as e:
                        # a pass that outlived its lease (a stall of the
                        # machine) is fenced by the one that took the row
                        # next: it stops, and that one carries on
                        if e.sqlstate != "SD001":
                            raise
                        continue
                    with self.lock:
                        self.finished.add(workflow)
        except psycopg.Error as e:
            if not (self.killed and lost_connection(e)):
                with self.lock:
                    self.errors.append(f"{e.sqlstate}: {e}")

    def run(self, n=3):
        self.threads = [threading.Thread(target=self.worker) for _ in range(n)]
        for t in self.threads:
            t.start()

    def join(self):
        for t in self.threads:
            t.join()


def until_leases_lapse(c):
    """Wait until every claim and every queue lease on the server has
    lapsed, by its clock: a claim or take then succeeds, whatever this
    machine's pace."""
    deadline = time.monotonic() + 60
    while not c.execute("SELECT coalesce((SELECT max(held_until) FROM sturdy.claims) < clock_timestamp(), true)"
                        " AND coalesce((SELECT max(leased_until) FROM sturdy.queue) < clock_timestamp(), true)"
                        ).fetchone()[0]:
        assert time.monotonic() < deadline, "leases still held after a minute"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def failed_over():
    """The load on the primary, the primary stopped mid-load and the standby
    promoted: the load, the new primary, and what it holds finished and
    queued."""
    needs("STURDY_BINDIR")
    try:
        setup()
        load = Load(PRIMARY, PORT)
        load.run()
        assert load.until_finished(50), f"the load did not work: {len(load.finished)} finishes, {load.errors[:3]}"
        as_pg(pg("pg_ctl"), "-D", os.path.join(PRIMARY, "data"), "-m", "immediate", "stop")
        load.stop.set()
        load.join()
        as_pg(pg("pg_ctl"), "-D", os.path.join(STANDBY, "data"), "-w", "promote")
        new = (STANDBY, PORT + 1)
        with psycopg.connect(dsn(*new), autocommit=True) as c:
            final = {w for (w,) in c.execute("SELECT workflow FROM sturdy.checkpoints WHERE step = 'final'")}
            queued = {w for (w,) in c.execute("SELECT workflow FROM sturdy.queue WHERE queue = 'fo'")}
        yield load, new, final, queued
    finally:
        for node in (PRIMARY, STANDBY):
            as_pg(pg("pg_ctl"), "-D", os.path.join(node, "data"), "-m", "immediate", "stop", check=False)


def test_every_acknowledged_finish_is_on_the_new_primary(failed_over):
    load, _, final, _ = failed_over
    lost = load.finished - final
    print(f"     {len(load.finished)} acknowledged finishes before the failover")
    assert not lost and not load.errors, f"{len(lost)} lost, e.g. {sorted(lost)[:3]}; errors {load.errors[:3]}"


def test_nothing_half_done_on_the_new_primary(failed_over):
    _, _, final, queued = failed_over
    assert not final & queued, f"{len(final & queued)} finished but still queued"


def test_tokens_stay_monotonic_across_the_failover(failed_over):
    """Every workflow the old primary gave a token for, those held at the
    failover first: once their leases lapse, a claim on the new primary
    beats every token the old one issued (finished ones were released,
    which keeps the token)."""
    load, new, final, _ = failed_over
    held = [w for w in load.tokens if w not in final]
    checked = held + [w for w in load.tokens if w in final][:20]
    assert checked, "no workflow was given a token: nothing to check"
    behind = []
    with psycopg.connect(dsn(*new), autocommit=True) as c:
        until_leases_lapse(c)
        for workflow in checked:
            token = load.tokens[workflow]
            got = c.execute("SELECT sturdy.claim(%s, '1 s')", (workflow,)).fetchone()[0]
            if got is None or got <= token:
                behind.append((workflow, token, got))
    print(f"     {len(checked)} workflows checked, {len(held)} held at the failover")
    assert not behind, [f"claimed {g} after {t} for {w}" for w, t, g in behind]


def test_the_load_resumes_on_the_new_primary_and_drains_never_handing_a_row_out_twice(failed_over):
    _, new, _, _ = failed_over
    with psycopg.connect(dsn(*new), autocommit=True) as c:
        until_leases_lapse(c)
    drain = Load(*new, killed=False)
    drain.run()
    drain.join()
    with psycopg.connect(dsn(*new), autocommit=True) as c:
        left, done = c.execute("SELECT (SELECT count(*) FROM sturdy.queue WHERE queue = 'fo'),"
                               " (SELECT count(DISTINCT workflow) FROM sturdy.checkpoints WHERE step = 'final')"
                               ).fetchone()
    # at once: a take whose lease began (its receipt less the lease) before
    # the lease of the workflow's take before it ended (at its receipt, or
    # where that pass failed)
    leases = {}
    for workflow, receipt in drain.taken:
        leases.setdefault(workflow, []).append(receipt)
    lapse = datetime.timedelta(seconds=LEASE)
    twice = sorted(w for w, rs in leases.items()
                   if any(b - lapse < a and (w, a) not in drain.failed for a, b in zip(sorted(rs), sorted(rs)[1:])))
    assert (left, done) == (0, JOBS) and not twice and not drain.errors, \
        (f"{left} left, {done} of {JOBS} finished, {len(twice)} taken twice at once {twice[:3]};"
         f" errors {drain.errors[:3]}")
    failed_over[0].drained = drain


def test_each_attempt_was_counted_once_across_the_failover(failed_over):
    """Over the load on the old primary and the drain on the new one (the
    test before): the failing workflows' two planned failures, and the
    leases the failover cut short, each counted once."""
    load = failed_over[0]
    drain = getattr(load, "drained", None)
    assert drain is not None, "the drain did not run"
    seen = {}
    for part in (load, drain):
        for workflow, attempts in part.attempts.items():
            seen.setdefault(workflow, []).extend(attempts)
    assert len(seen) == JOBS, f"{len(seen)} of {JOBS} workflows were ever taken"
    short = [w for w, a in seen.items() if failing_pass(w, 1) and max(a) < 3]
    problems = attempt_problems(seen, crashes=1, workers=3)
    assert not short and not problems, (short[:3], problems[:5])
