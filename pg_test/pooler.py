"""PgBouncer in transaction mode in front of the suites' server, for the
tests of pg_sturdy behind a pooler (test_pooler.py, test_examples.py).

Two pools of the one database: `pooled` (three server connections shared by
every client) and `one_backend` (one: every client's transaction runs on the
same backend, so whatever a backend keeps for itself is met by the next
client). Clients connect over TCP on 127.0.0.1.

  STURDY_POOLER_PORT   where PgBouncer listens (default 55460; a free port the
                       kernel picks when something else holds that one)
"""
import os
import shutil
import socket
import subprocess
import tempfile
import time

import psycopg

from sturdy import DB, SERVER

PORT = int(os.environ.get("STURDY_POOLER_PORT", "55460"))
POOLED, ONE_BACKEND = "pooled", "one_backend"


def as_postgres(cmd, **kw):
    if os.getuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    return subprocess.Popen(cmd, **kw)


class PortTaken(Exception):
    """PgBouncer could not listen: something else holds the port."""


class Bouncer:
    """A PgBouncer of its own, started by `start` and stopped by `stop`."""

    def __init__(self):
        self.port = PORT
        self.binary = shutil.which("pgbouncer") or next(
            (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None)
        self.proc = None
        self.dir = None

    def start(self):
        # one of an earlier run that did not get to stop (its directory is
        # gone, its port may not be)
        subprocess.run(["pkill", "-KILL", "-f", f"pgbouncer {tempfile.gettempdir()}/sturdy_pooler_"],
                       check=False)
        # The port is in the kernel's range for outgoing connections, so a
        # client socket of anything else on the machine may hold it: then
        # PgBouncer listens on a port the kernel finds free.
        for attempt in range(5):
            try:
                return self._start()
            except PortTaken:
                self.stop()
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    self.port = s.getsockname()[1]
        raise RuntimeError(f"pgbouncer found no port to listen on: {self.log()}")

    def _start(self):
        server = dict(kv.split("=", 1) for kv in SERVER.split())
        self.dir = tempfile.mkdtemp(prefix="sturdy_pooler_")
        target = f"host={server['host']} port={server['port']} dbname={DB}"
        config = f"""[databases]
{POOLED} = {target} pool_size=3
{ONE_BACKEND} = {target} pool_size=1

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/users.txt
pool_mode = transaction
max_client_conn = 200
default_pool_size = 3
ignore_startup_parameters = extra_float_digits
logfile = {self.dir}/pgbouncer.log
"""
        with open(os.path.join(self.dir, "pgbouncer.ini"), "w") as f:
            f.write(config)
        with open(os.path.join(self.dir, "users.txt"), "w") as f:
            f.write('"postgres" ""\n')
        if os.getuid() == 0:
            subprocess.run(["chown", "-R", "postgres:", self.dir], check=True)
        self.proc = as_postgres([self.binary, os.path.join(self.dir, "pgbouncer.ini")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log()
                if "Address already in use" in log:
                    raise PortTaken()
                raise RuntimeError(f"pgbouncer exited: {log}")
            # its own word that it listens (a connection could reach
            # whatever else holds the port)
            if f"listening on 127.0.0.1:{self.port}" in self.log():
                return self
            time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not listen on {self.port}: {self.log()}")

    def log(self):
        try:
            with open(os.path.join(self.dir, "pgbouncer.log")) as f:
                return f.read()[-3000:]
        except OSError:
            return "(no log)"

    def dsn(self, pool=POOLED, user="postgres"):
        return f"host=127.0.0.1 port={self.port} dbname={pool} user={user}"

    def connect(self, pool=POOLED, user="postgres"):
        """A client through the pooler, as psycopg must be configured there:
        no protocol-level prepared statements (PgBouncer 1.18 does not carry
        them from one server connection to the next)."""
        return psycopg.connect(self.dsn(pool, user), autocommit=True, prepare_threshold=None)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            # as root the child is runuser: end pgbouncer itself, at once
            # (SIGTERM; SIGINT would wait for every client to leave, and a
            # pgbouncer left behind holds the port the next run listens on)
            pattern = f"pgbouncer {self.dir}/pgbouncer.ini"
            subprocess.run(["pkill", "-TERM", "-f", pattern], check=False)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                subprocess.run(["pkill", "-KILL", "-f", pattern], check=False)
                self.proc.wait(10)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
