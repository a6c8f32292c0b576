"""A worker's loop through node-postgres, which binds every parameter
untyped (node_worker.cjs, run with node)."""
import os
import shutil
import subprocess

import pytest

from sturdy import SERVER


def test_a_node_postgres_worker_loop():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (scripts/bootstrap.sh installs it)")
    conn = dict(kv.split("=", 1) for kv in SERVER.split())
    env = dict(os.environ, NODE_PATH=os.path.join(os.environ.get("NODE_DIR", "/opt/pg_sturdy/node"), "node_modules"))
    script = os.path.join(os.path.dirname(__file__), "node_worker.cjs")
    run = subprocess.run([node, script, conn["host"], conn["port"]], env=env, capture_output=True, text=True,
                         timeout=600)
    print(run.stdout, run.stderr)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
