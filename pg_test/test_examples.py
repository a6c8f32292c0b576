"""The example workers of examples/ (Python with psycopg 3, Node with npm
`pg`, Rust with tokio-postgres), each run as a user runs it: against the
server directly (sleeping on LISTEN) and through PgBouncer in transaction
mode (polling, wake => false). Each run works through a backlog with one
worker killed (SIGKILL) a third of the way and another stopped (SIGTERM)
two thirds of the way, replacements started beside them: every job ends
finished once, its three steps recorded in order, none left behind, and
every worker asked to stop exits cleanly."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from sturdy import SERVER, connect

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = 600
STEPS = ["reserve", "charge", "ship"]


@pytest.fixture(scope="module")
def rust_worker():
    target = os.path.join(ROOT, "target", "examples")
    subprocess.run(["cargo", "build", "--release", "--quiet", "--manifest-path",
                    os.path.join(ROOT, "examples", "rust", "Cargo.toml")],
                   env=dict(os.environ, CARGO_TARGET_DIR=target), check=True, timeout=900)
    return os.path.join(target, "release", "sturdy-worker")


def command(language, route, queue, rust_worker, bouncer):
    """The example's command line for `route`: "direct" (LISTEN) or
    "pooled" (through PgBouncer, --poll)."""
    server = dict(kv.split("=", 1) for kv in SERVER.split())
    db = os.environ.get("STURDY_DB", "sturdy_concurrency")
    if route == "direct":
        dsn = f"host={server['host']} port={server['port']} user={server.get('user', 'postgres')} dbname={db}"
        url = f"postgresql://{server.get('user', 'postgres')}@/{db}?host={server['host']}&port={server['port']}"
        extra = []
    else:
        dsn = bouncer.dsn()
        url = f"postgresql://postgres@127.0.0.1:{dsn.split('port=')[1].split()[0]}/pooled"
        extra = ["--poll"]
    extra += ["--lease", "2"]
    if language == "python":
        return [sys.executable, os.path.join(ROOT, "examples", "python", "worker.py"), dsn, queue, *extra]
    if language == "node":
        return [shutil.which("node"), os.path.join(ROOT, "examples", "node", "worker.js"), url, queue, *extra]
    return [rust_worker, dsn, queue, *extra]


def finished(queue):
    with connect() as c:
        return JOBS - c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = %s", (queue,)).fetchone()[0]


def wait_until(what, seconds):
    deadline = time.monotonic() + seconds
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("route", ["direct", "pooled"])
@pytest.mark.parametrize("language", ["python", "node", "rust"])
def test_an_example_worker_finishes_every_job_once_through_a_kill_and_a_stop(language, route, request):
    if language == "node" and shutil.which("node") is None:
        pytest.skip("node is not installed (scripts/bootstrap.sh installs it)")
    bouncer = request.getfixturevalue("bouncer") if route == "pooled" else None
    rust_worker = request.getfixturevalue("rust_worker") if language == "rust" else None
    queue = f"ex-{language}-{route}"
    prefix = f"job-{language}-{route}-"
    with connect() as c:
        for table in ("checkpoints", "claims"):
            c.execute(f"DELETE FROM sturdy.{table} WHERE workflow LIKE %s", (prefix + "%",))
        c.execute("DELETE FROM sturdy.queue WHERE queue = %s", (queue,))
        c.execute("SELECT sturdy.schedule(%s || i, now(), %s) FROM generate_series(1, %s) i", (prefix, queue, JOBS))
    env = dict(os.environ, NODE_PATH=os.path.join(os.environ.get("NODE_DIR", "/opt/pg_sturdy/node"), "node_modules"),
               # the Python example runs on the client of this checkout
               PYTHONPATH=os.path.join(ROOT, "clients", "python", "src"))
    cmd = command(language, route, queue, rust_worker, bouncer)
    start = lambda: subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    workers = [start(), start()]
    try:
        assert wait_until(lambda: finished(queue) >= JOBS // 3, 120), "no progress"
        workers[0].send_signal(signal.SIGKILL)
        workers.append(start())
        assert wait_until(lambda: finished(queue) >= 2 * JOBS // 3, 120), "no progress after the kill"
        workers[1].send_signal(signal.SIGTERM)
        assert workers[1].wait(15) == 0, workers[1].stdout.read()[-2000:]
        workers.append(start())
        assert wait_until(lambda: finished(queue) == JOBS, 120), f"{JOBS - finished(queue)} jobs left behind"
        for w in workers[2:]:
            w.send_signal(signal.SIGTERM)
        for w in workers[2:]:
            assert w.wait(15) == 0, w.stdout.read()[-2000:]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    with connect() as c:
        steps = c.execute("""
            SELECT count(DISTINCT workflow), count(*),
                   count(*) FILTER (WHERE value->'after' <> CASE step WHEN 'reserve' THEN '[]'::jsonb
                                                          WHEN 'charge' THEN '["reserve"]'
                                                          ELSE '["charge", "reserve"]' END)
              FROM sturdy.checkpoints WHERE workflow LIKE %s""", (prefix + "%",)).fetchone()
        held = c.execute("SELECT count(*) FROM sturdy.claims WHERE workflow LIKE %s AND held_until > now()",
                         (prefix + "%",)).fetchone()[0]
        pids = c.execute("SELECT count(DISTINCT value->'pid') FROM sturdy.checkpoints WHERE workflow LIKE %s",
                         (prefix + "%",)).fetchone()[0]
    assert steps == (JOBS, JOBS * len(STEPS), 0), f"(jobs with steps, steps, out of order): {steps}"
    assert held == 0, f"{held} claims still held after every worker stopped"
    assert pids >= 3, f"the steps came from {pids} workers: the replacements did no work"
