"""What the tests against a running server share: where the server is, a
connection, and worker threads whose deaths fail their test.

The server comes from the environment (scripts/suites.sh sets it):
  STURDY_SERVER   libpq settings without a database ("host=... port=... user=...")
  STURDY_DB       the database with pg_sturdy installed (default sturdy_concurrency)
  STURDY_BINDIR   the server's bin directory, for tests that run its programs
  STURDY_DATADIR  the cluster's data directory, for the crash test
"""
import os
import threading
import time

import psycopg

SERVER = os.environ.get("STURDY_SERVER", "")
DB = os.environ.get("STURDY_DB", "sturdy_concurrency")
DSN = f"{SERVER} dbname={DB}"

# Exceptions raised in any test's threads: a worker that dies fails its test
# (conftest.py checks after each), rather than leaving the others to finish
# the work.
THREAD_ERRORS = []


class Worker(threading.Thread):
    def run(self):
        try:
            super().run()
        except BaseException as e:  # recorded for the check; the thread ends here
            THREAD_ERRORS.append(f"{self.name}: {e!r}")


def connect(autocommit=True):
    return psycopg.connect(DSN, autocommit=autocommit)


def floors_shared(c):
    """Whether the takes of this server's connections share floors (and the
    schedule of scans from the start): PostgreSQL 17 and later, or 15 with
    the library preloaded."""
    return c.execute(
        "SELECT current_setting('server_version_num')::int >= 170000"
        " OR 'pg_sturdy' = ANY (string_to_array(replace(current_setting('shared_preload_libraries'), ' ', ''), ','))"
    ).fetchone()[0]


def start_and_join(threads):
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def commit_a_second_late(worker, started, sql):
    """Start `worker`, and once it says it has `started`, run `sql` in a
    transaction that commits a second after it began (its now() a second in
    the past at commit); wait for the worker. Returns when it committed."""
    worker.start()
    started.wait(5)
    with connect(autocommit=False) as a:
        a.execute(sql)
        time.sleep(1.0)
        a.commit()
        committed = time.monotonic()
    worker.join()
    return committed


def run_node(script, *args, timeout):
    """Run the node-postgres script `script` (in pg_test/) with the server's
    host and port and `args`; skips the test where node is missing. Returns
    the finished process."""
    import shutil
    import subprocess

    import pytest

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (scripts/bootstrap.sh installs it)")
    conn = dict(kv.split("=", 1) for kv in SERVER.split())
    env = dict(os.environ, NODE_PATH=os.path.join(os.environ.get("NODE_DIR", "/opt/pg_sturdy/node"), "node_modules"))
    return subprocess.run([node, os.path.join(os.path.dirname(__file__), script), conn["host"], conn["port"], *args],
                          env=env, capture_output=True, text=True, timeout=timeout)


def wait_notifies(conn, seconds):
    """Notifications that reach `conn` within `seconds`."""
    got = []
    for n in conn.notifies(timeout=seconds, stop_after=None):
        got.append((n.channel, n.payload))
    return got


def lost_connection(e):
    """Whether the psycopg error `e` is the connection going with the server
    (what a kill or an immediate stop does), not an error of a statement."""
    return (e.sqlstate is None and isinstance(e, psycopg.OperationalError)) or \
        (e.sqlstate or "").startswith("08") or e.sqlstate in ("57P01", "57P02", "57P03")


class Finishes:
    """For a load whose acknowledged finishes are kept in `self.finished`."""

    def until_finished(self, n, seconds=60):
        """Wait until `n` finishes were acknowledged (a kill must come
        mid-load): whether they were, within `seconds`."""
        deadline = time.monotonic() + seconds
        while len(self.finished) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(self.finished) >= n


def failing_pass(workflow, attempt):
    """Whether the crash and failover loads fail this pass (`fail`) rather
    than finish it: one workflow in five (`job-N`, N a multiple of 5) fails
    its first two attempts."""
    return int(workflow.rsplit("-", 1)[1]) % 5 == 0 and attempt < 3


def attempt_problems(seen, crashes, workers):
    """What the attempts the takes handed out (`seen`: workflow -> the
    attempts, in any order) say was lost or invented. Every pass a take
    hands out either fails (`fail`, or its lease runs out, counted by the
    next take) or ends the row, so a workflow's attempts are 1, 2, 3, ...
    each once. A repeat is a failure that was not counted; a number missing
    is one counted that no pass made, except where a crash kept a take's
    commit and lost its answer (that lease then runs out and counts): one
    number a workflow per crash, one take a worker per crash."""
    problems, missing = [], 0
    for workflow, attempts in seen.items():
        distinct = sorted(set(attempts))
        if len(distinct) < len(attempts):
            problems.append(f"{workflow}: attempts {sorted(attempts)} repeat (a failure lost)")
        gaps = distinct[-1] - len(distinct)
        if gaps > crashes:
            problems.append(f"{workflow}: attempts {distinct} skip {gaps} (failures invented)")
        missing += gaps
    if missing > crashes * workers:
        problems.append(f"{missing} attempts skipped in all, more than {workers} takes in flight at each of {crashes} crashes")
    return problems


def needs(*names):
    """The values of these environment variables; the test is skipped (and
    counted, with the reason) where one is unset."""
    import pytest

    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not set: run through scripts/suites.sh")
    return [os.environ[n] for n in names]
