"""A storm through every call the fast path serves (`schedule`'s upsert,
`claim`'s, `record`'s insert, a one-row `take`'s lease, `done` by key and
at the place its take left the row, `finish`'s lock, update and insert),
from eight connections at once, with plain indexes of the user's own on
the hot tables, so that its leases and updates are not HOT and it writes
their index entries itself. Then `amcheck`: every btree of those tables
checked against its heap (`bt_index_parent_check(..., heapallindexed =>
true)`: no row missing from an index) and every heap (`verify_heapam`); and
each index scanned whole against a sequential scan of its table: the same
rows, nothing missing, nothing extra."""
import random
import threading
import time

import psycopg
from psycopg import sql

from sturdy import SERVER, Worker, start_and_join

DB = "sturdy_storm"
TABLES = ["queue", "claims", "checkpoints"]
# plain btrees on columns the calls write: leases, claims and steps are not
# HOT, and every index entry of theirs is written by the fast path
OWN_INDEXES = [
    "CREATE INDEX storm_leased ON sturdy.queue (leased_until)",
    "CREATE INDEX storm_taken ON sturdy.queue (taken_at, takes)",
    "CREATE INDEX storm_held ON sturdy.claims (held_until, token)",
    "CREATE INDEX storm_token ON sturdy.checkpoints (token, recorded_at)",
]
WORKERS, ROUNDS = 8, 400


def connect(db=DB):
    return psycopg.connect(f"{SERVER} dbname={db}", autocommit=True)


def storm(seed, counts, lock):
    rng = random.Random(seed)
    done = 0
    with connect() as c:
        for i in range(ROUNDS):
            w = f"w{rng.randrange(300)}"
            q = f"q{rng.randrange(3)}"
            try:
                kind = rng.randrange(8)
                if kind == 0:  # schedule: a new key, or onto a row there; some with a
                    # priority (an entry in queue_prioritized, or one gone from it) or a key
                    c.execute("SELECT sturdy.schedule(%s, now() - interval '1 second', %s, %s, %s)",
                              (w, q, rng.choice([0, 0, 0, 1, 2]), rng.choice([None, None, "k1", "k2"])))
                elif kind == 1:  # a pass: take with a claim, record, finish
                    row = c.execute("SELECT workflow, receipt, token FROM sturdy.take(%s, '1 minute', 1, true)",
                                    (q,)).fetchone()
                    if row and row[2] is not None:
                        c.execute("SELECT * FROM sturdy.record(%s, %s, '1', %s)", (row[0], f"s{i}", row[2]))
                        c.execute("SELECT sturdy.finish(%s, %s, %s, 'end', '\"ok\"', queue => %s)",
                                  (row[0], row[2], row[1], q))
                        done += 1
                elif kind == 2:  # take and done, the done at the take's place
                    row = c.execute("SELECT workflow, receipt FROM sturdy.take(%s, '1 minute')", (q,)).fetchone()
                    if row:
                        c.execute("SELECT sturdy.done(%s, %s, %s)", (row[0], row[1], q))
                        done += 1
                elif kind == 3:  # a done by key, with a receipt that may be stale
                    c.execute("SELECT sturdy.done(workflow, leased_until, queue) FROM sturdy.queue"
                              " WHERE queue = %s AND workflow = %s AND leased_until IS NOT NULL", (q, w))
                elif kind == 4:  # claim: a new key, or a takeover
                    c.execute("SELECT sturdy.claim(%s, '50 milliseconds')", (w,))
                elif kind == 5:  # record under the current token
                    token = c.execute("SELECT token FROM sturdy.claims WHERE workflow = %s", (w,)).fetchone()
                    if token:
                        c.execute("SELECT * FROM sturdy.record(%s, %s, '2', %s)", (w, f"r{rng.randrange(5)}", token[0]))
                elif kind == 6:  # a batch take and its done_many
                    rows = c.execute("SELECT workflow, receipt FROM sturdy.take(%s, '1 minute', 5)", (q,)).fetchall()
                    if rows:
                        c.execute("SELECT sturdy.done_many(%s, %s, %s)",
                                  ([r[0] for r in rows], [r[1] for r in rows], q))
                        done += len(rows)
                else:  # a take left to lapse (its lease short), taken again later
                    c.execute("SELECT count(*) FROM sturdy.take(%s, '10 milliseconds')", (q,))
            except psycopg.Error as e:
                # a record fenced by a takeover since its token was read: as
                # the contract says
                if e.sqlstate != "SD001":
                    raise
    with lock:
        counts.append(done)


def test_a_storm_through_every_fast_call_leaves_every_index_whole():
    with psycopg.connect(f"{SERVER} dbname=postgres", autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB)))
    with connect() as c:
        c.execute("CREATE EXTENSION pg_sturdy")
        c.execute("CREATE EXTENSION amcheck")
        for statement in OWN_INDEXES:
            c.execute(statement)
    counts, lock = [], threading.Lock()
    stop = threading.Event()

    def vacuum():
        with connect() as c:
            while not stop.is_set():
                c.execute("VACUUM sturdy.queue, sturdy.claims")
                time.sleep(0.2)

    vacuumer = Worker(target=vacuum)
    vacuumer.start()
    try:
        start_and_join([Worker(target=storm, args=(seed, counts, lock)) for seed in range(WORKERS)])
    finally:
        stop.set()
        vacuumer.join()
    assert len(counts) == WORKERS, "a worker died (see the thread errors)"
    with connect() as c:
        rows = {t: c.execute(f"SELECT count(*) FROM sturdy.{t}").fetchone()[0] for t in TABLES}
        print(f"     {sum(counts)} rows done or finished by {WORKERS} workers; left: {rows}")
        assert sum(counts) > WORKERS * 10, f"the storm did little: {counts}"
        indexes = c.execute(
            "SELECT i.indexrelid::regclass::text, i.indrelid::regclass::text,"
            " coalesce(pg_get_expr(i.indpred, i.indrelid), 'true') FROM pg_index i"
            " JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace"
            " WHERE n.nspname = 'sturdy' AND t.relname = ANY (%s) ORDER BY 1", (TABLES,)).fetchall()
        assert len(indexes) >= 4 + len(OWN_INDEXES), indexes
        problems = []
        for index, _, _ in indexes:
            try:
                c.execute("SELECT bt_index_parent_check(%s::regclass, heapallindexed => true)", (index,))
            except psycopg.Error as e:
                problems.append(f"{index}: {e.sqlstate} {str(e).strip()}")
        for table in TABLES:
            corrupt = c.execute("SELECT count(*) FROM verify_heapam(%s::regclass)", (f"sturdy.{table}",)).fetchone()[0]
            if corrupt:
                problems.append(f"sturdy.{table}: verify_heapam reported {corrupt} problems")
        # each index scanned whole, against a sequential scan of its table
        c.execute("SET enable_seqscan = off")
        c.execute("SET enable_bitmapscan = off")
        c.execute("SET enable_indexonlyscan = off")
        # (a partial index against the rows its predicate admits)
        for index, table, where in indexes:
            keys = c.execute("SELECT pg_get_indexdef(%s::regclass)", (index,)).fetchone()[0]
            keys = keys.split(" WHERE ")[0]
            cols = keys[keys.rindex("(") + 1:keys.rindex(")")]
            query = f"SELECT ctid::text FROM {table} WHERE {where} ORDER BY {cols}"
            plan = "\n".join(r[0] for r in c.execute("EXPLAIN " + query))
            if index.split(".")[-1] not in plan:
                problems.append(f"{index}: the planner would not scan it ({plan.splitlines()[0]})")
                continue
            by_index = sorted(r[0] for r in c.execute(query))
            c.execute("RESET enable_seqscan")
            by_heap = sorted(r[0] for r in c.execute(f"SELECT ctid::text FROM {table} WHERE {where}"))
            c.execute("SET enable_seqscan = off")
            if by_index != by_heap:
                missing, extra = set(by_heap) - set(by_index), set(by_index) - set(by_heap)
                problems.append(f"{index}: {len(by_index)} rows by the index, {len(by_heap)} by the heap"
                                f" (missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]}"
                                f"{', twice' if len(by_index) != len(set(by_index)) else ''})")
    with psycopg.connect(f"{SERVER} dbname=postgres", autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB)))
    assert not problems, problems
