"""ALTER EXTENSION pg_sturdy UPDATE from every released version: the
extension created at the old version and filled through its API, then
updated. Every row is still there, the catalog (functions, tables, columns,
indexes, constraints, views, comments, privileges, what pg_dump keeps) equals
a fresh install's, and the new functions work.
"""
import psycopg
import pytest

from sturdy import SERVER as CONN

RELEASED = ["0.1.0"]

# 0.1.0's API: claims, checkpoints, the queue
FILL = """
SELECT sturdy.claim('up-' || i) FROM generate_series(1, 10) i;
SELECT sturdy.record('up-' || i, 'step', to_jsonb(i), 1) FROM generate_series(1, 10) i;
SELECT sturdy.supply('up-1', 'approval', '"yes"');
SELECT sturdy.schedule('up-' || i, now() + interval '1 hour', 'up-q') FROM generate_series(1, 5) i;
SELECT sturdy.release('up-2', 1);
SELECT sturdy.schedule('up-ready', now() - interval '1 minute', 'up-q2');
CREATE TABLE public.up_receipt AS SELECT workflow, receipt FROM sturdy.take('up-q2');
"""

# The catalog as a user and pg_dump see it: each query's rows, as text.
CATALOG = {
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid),
               l.lanname, p.prokind, p.provolatile, p.proisstrict, p.proparallel, p.prosecdef, p.proconfig,
               p.prorows, p.proacl, obj_description(p.oid, 'pg_proc'),
               CASE WHEN l.lanname = 'c' THEN p.prosrc ELSE md5(p.prosrc) END
          FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
         WHERE p.pronamespace = 'sturdy'::regnamespace""",
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.relacl, obj_description(c.oid, 'pg_class'),
               c.reloptions, CASE WHEN c.relkind = 'v' THEN pg_get_viewdef(c.oid) END
          FROM pg_class c WHERE c.relnamespace = 'sturdy'::regnamespace""",
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), co.collname, col_description(c.oid, a.attnum)
          FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
          LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
          LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
         WHERE c.relnamespace = 'sturdy'::regnamespace""",
    "indexes": """
        SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index i
          JOIN pg_class c ON c.oid = i.indrelid WHERE c.relnamespace = 'sturdy'::regnamespace""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
         WHERE connamespace = 'sturdy'::regnamespace""",
    "kept by pg_dump": """
        SELECT cfg::regclass::text, cond FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS x(cfg, cond)
         WHERE e.extname = 'pg_sturdy'""",
    "members": """
        SELECT pg_describe_object(classid, objid, objsubid) FROM pg_depend
         WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
           AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_sturdy')""",
}


def catalog(c):
    return {name: sorted(repr(r) for r in c.execute(q).fetchall()) for name, q in CATALOG.items()}


# Each table's rows, in the columns every version has (0.2.0 adds
# queue.seq, filled in by the update, and the claims' and checkpoints'
# place, NULL but under Citus), and for the queue when each row is next
# handed out: 0.1.0's visible_at, 0.2.0's later of visible_at and
# leased_until (the update moves a lease there).
KEPT = {"claims": "(r.workflow, r.token, r.held_until, r.owner, r.claimed_at)",
        "checkpoints": "(r.workflow, r.step, r.value, r.token, r.recorded_at)",
        "queue": "(r.queue, r.workflow, greatest(r.visible_at, (to_jsonb(r) ->> 'leased_until')::timestamptz), "
                 "r.taken_at, r.takes, r.scheduled_at)"}


def rows(c):
    return {t: c.execute(f"SELECT coalesce(string_agg({cols}::text, ',' ORDER BY {cols}::text), '') FROM sturdy.{t} r"
                         ).fetchone()[0] for t, cols in KEPT.items()}


@pytest.fixture(scope="module")
def fresh():
    """A fresh install's version, catalog and the signals sturdy.health shows."""
    with psycopg.connect(f"{CONN} dbname=postgres", autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS sturdy_fresh")
        c.execute("CREATE DATABASE sturdy_fresh")
    with psycopg.connect(f"{CONN} dbname=sturdy_fresh", autocommit=True) as c:
        c.execute("CREATE EXTENSION pg_sturdy")
        current = c.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_sturdy'").fetchone()[0]
        yield current, catalog(c), [r[0] for r in c.execute("SELECT signal FROM sturdy.health ORDER BY signal")]


@pytest.fixture(scope="module", params=RELEASED)
def updated(request):
    """A database created at a released version, filled through its API and
    updated: the version, a connection to it, and its rows before the update."""
    version = request.param
    db = "sturdy_from_" + version.replace(".", "_")
    with psycopg.connect(f"{CONN} dbname=postgres", autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {db}")
        c.execute(f"CREATE DATABASE {db}")
    with psycopg.connect(f"{CONN} dbname={db}", autocommit=True) as c:
        c.execute(f"CREATE EXTENSION pg_sturdy VERSION '{version}'")
        c.execute(FILL)
        before = rows(c)
        c.execute("ALTER EXTENSION pg_sturdy UPDATE")
        yield version, c, before


def test_updates_to_the_current_version(fresh, updated):
    current, _, _ = fresh
    _, c, _ = updated
    assert c.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_sturdy'").fetchone()[0] == current


def test_every_row_is_still_there(updated):
    _, c, before = updated
    assert rows(c) == before
    # placed by nothing on one server
    assert c.execute("SELECT (SELECT count(*) FROM sturdy.claims WHERE place IS NOT NULL)"
                     " + (SELECT count(*) FROM sturdy.checkpoints WHERE place IS NOT NULL)").fetchone() == (0,)


def test_the_catalog_equals_a_fresh_installs(fresh, updated):
    _, fresh_catalog, _ = fresh
    _, c, _ = updated
    now = catalog(c)
    differ = {k: (sorted(set(now[k]) - set(fresh_catalog[k]))[:3], sorted(set(fresh_catalog[k]) - set(now[k]))[:3])
              for k in CATALOG if now[k] != fresh_catalog[k]}
    assert not differ, [f"{k}: only after the update {a}, only in a fresh install {b}" for k, (a, b) in differ.items()]


def test_old_and_new_functions_work_after_the_update(fresh, updated):
    _, _, signals = fresh
    _, c, _ = updated
    # fence: the current token passes, a stale one raises SD001
    c.execute("SELECT sturdy.fence('up-1', 1)")
    with pytest.raises(psycopg.Error) as stale:
        c.execute("SELECT sturdy.fence('up-2', 0)")
    assert stale.value.sqlstate == "SD001", f"fence with a stale token: {stale.value.sqlstate}"
    assert c.execute("SELECT count(*) FROM sturdy.load('up-1')").fetchone()[0] == 2
    assert c.execute("SELECT sturdy.start('p', 'k')").fetchone()[0] is not None
    assert c.execute("SELECT deliveries FROM sturdy.emit('e', '1')").fetchone()[0] == 0
    health = c.execute("SELECT signal, ok FROM sturdy.health ORDER BY signal").fetchall()
    assert [signal for signal, _ in health] == signals and all(ok for _, ok in health), \
        f"health: {health}, a fresh install shows {signals}, each ok"
    # a pass in flight across the update: its row stays leased, and its
    # receipt still ends it
    assert c.execute("SELECT count(*) FROM sturdy.take('up-q2')").fetchone()[0] == 0, \
        "a row leased before the update was taken again"
    assert c.execute("SELECT sturdy.done(workflow, receipt, 'up-q2') FROM public.up_receipt").fetchone()[0], \
        "done with a receipt from before the update"
    # flow control, new in this version, on an updated schema
    c.execute("SELECT sturdy.schedule('lim-' || i, now() - interval '1 minute', 'up-lim') FROM generate_series(1, 3) i")
    c.execute("SELECT sturdy.limit_queue('up-lim', running => 1)")
    assert c.execute("SELECT count(*) FROM sturdy.take('up-lim', max => 3)").fetchone()[0] == 1, \
        "the running limit after the update"
    assert c.execute("SELECT sturdy.pause('up-lim')").fetchone()[0]
    assert c.execute("SELECT paused FROM sturdy.queue_stats WHERE queue = 'up-lim'").fetchone()[0]
    # priorities and keys on the updated schema: every row of 0.1.0 at the
    # default priority, without a key; a prioritized row goes first, and
    # per_key holds a key to its limit
    assert c.execute("SELECT count(*) FROM sturdy.queue WHERE priority <> 0 OR key IS NOT NULL").fetchone()[0] == 0
    c.execute("SELECT sturdy.schedule('pk-' || i, now() - interval '1 minute', 'up-keyed', key => 'k')"
              " FROM generate_series(1, 3) i")
    c.execute("SELECT sturdy.schedule('pk-hot', now(), 'up-keyed', priority => 4, key => 'other')")
    c.execute("SELECT sturdy.limit_queue('up-keyed', per_key => 1)")
    got = [r[0] for r in c.execute("SELECT workflow FROM sturdy.take('up-keyed', max => 5)")]
    assert sorted(got) == ["pk-1", "pk-hot"], f"took {got}"


@pytest.mark.parametrize("version", RELEASED)
def test_a_role_granted_before_the_update_still_schedules_and_takes(version):
    """take and schedule read and bump a sequence 0.1.0 did not have. Its own
    database: its grants would differ from a fresh install's catalog."""
    db = "sturdy_grants_from_" + version.replace(".", "_")
    with psycopg.connect(f"{CONN} dbname=postgres", autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {db}")
        c.execute("DROP ROLE IF EXISTS sturdy_up_worker")
        c.execute(f"CREATE DATABASE {db}")
        c.execute("CREATE ROLE sturdy_up_worker")
    try:
        with psycopg.connect(f"{CONN} dbname={db}", autocommit=True) as c:
            c.execute(f"CREATE EXTENSION pg_sturdy VERSION '{version}'")
            c.execute("SELECT sturdy.grant_usage('sturdy_up_worker')")
            c.execute("ALTER EXTENSION pg_sturdy UPDATE")
            c.execute("SET ROLE sturdy_up_worker")
            c.execute("SELECT sturdy.schedule('g-1', now()), sturdy.schedule('g-0', now() - interval '1 minute')")
            got = [r[0] for r in c.execute("SELECT workflow FROM sturdy.take(max => 5)")]
            assert got == ["g-0", "g-1"], f"took {got}"
    finally:
        with psycopg.connect(f"{CONN} dbname=postgres", autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
            c.execute("DROP ROLE IF EXISTS sturdy_up_worker")
