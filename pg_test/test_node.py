"""A worker's loop through node-postgres, which binds every parameter
untyped (node_worker.cjs, run with node)."""
from sturdy import run_node


def test_a_node_postgres_worker_loop():
    run = run_node("node_worker.cjs", timeout=600)
    print(run.stdout, run.stderr)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
