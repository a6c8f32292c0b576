"""A wakeup's NOTIFY payload in a SQL_ASCII database, where a queue's name
may hold any bytes: every client decodes it, whatever its encoding, and
gets the queue's name with the bytes outside printable ASCII (and the
backslash) written as \\xHH (docs/reference.md, Wakeups)."""
import json

import psycopg
import pytest

from sturdy import SERVER, run_node, wait_notifies

DB = "sturdy_ascii_wakeups"
# the queue's name as the server holds it: q, the byte 0xff, a backslash, x
QUEUE_SQL = r"E'q\xff\\x'"
PAYLOAD = r"q\xff\x5cx"


@pytest.fixture(scope="module")
def ascii_db():
    with psycopg.connect(f"{SERVER} dbname=postgres", autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB}")
        c.execute(f"CREATE DATABASE {DB} ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'")
    with psycopg.connect(f"{SERVER} dbname={DB}", autocommit=True) as c:
        c.execute("CREATE EXTENSION pg_sturdy")
    yield f"{SERVER} dbname={DB}"
    with psycopg.connect(f"{SERVER} dbname=postgres", autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


@pytest.mark.parametrize("client_encoding", ["UTF8", "SQL_ASCII", "LATIN1"])
@pytest.mark.parametrize("wakeup", ["schedule", "resume", "done of a held-back take"])
def test_a_listener_decodes_every_wakeup_whatever_the_queue_name_holds(ascii_db, client_encoding, wakeup):
    """A psycopg worker LISTENs, then the wakeup is sent for a queue named
    with a byte that is not UTF-8 (and a backslash): it used to raise a
    decoding error with no SQLSTATE on the statement that received it."""
    with psycopg.connect(ascii_db, autocommit=True, options=f"-c client_encoding={client_encoding}") as listener, \
            psycopg.connect(ascii_db, autocommit=True) as other:
        other.execute(f"DELETE FROM sturdy.queue WHERE queue = {QUEUE_SQL}")
        other.execute(f"SELECT sturdy.limit_queue({QUEUE_SQL})")
        other.execute(f"SELECT sturdy.resume({QUEUE_SQL})")
        listener.execute("LISTEN sturdy")
        if wakeup == "schedule":
            listener.execute(f"SELECT count(*) FROM sturdy.take({QUEUE_SQL})")
            other.execute(f"SELECT sturdy.schedule('w', now(), {QUEUE_SQL})")
        elif wakeup == "resume":
            other.execute(f"SELECT sturdy.pause({QUEUE_SQL})")
            other.execute(f"SELECT sturdy.resume({QUEUE_SQL})")
        else:
            other.execute(f"SELECT sturdy.schedule(w, now() - interval '1 minute', {QUEUE_SQL})"
                          " FROM (VALUES ('a'), ('b')) v(w)")
            other.execute(f"SELECT sturdy.limit_queue({QUEUE_SQL}, running => 1)")
            assert other.execute(f"SELECT count(*) FROM sturdy.take({QUEUE_SQL})").fetchone()[0] == 1
            assert listener.execute(f"SELECT count(*) FROM sturdy.take({QUEUE_SQL})").fetchone()[0] == 0
            # (the names come back as bytes in a SQL_ASCII database: done by the server's own values)
            other.execute(f"SELECT sturdy.done(workflow, leased_until, queue) FROM sturdy.queue"
                          f" WHERE queue = {QUEUE_SQL} AND leased_until > now()")
        got = wait_notifies(listener, 2.0)
        assert got == [("sturdy", PAYLOAD)]
        assert listener.execute("SELECT 1").fetchone() == (1,), "the listener's connection still works"
        other.execute(f"SELECT sturdy.limit_queue({QUEUE_SQL})")


def test_a_plain_queue_name_is_its_own_payload(ascii_db):
    with psycopg.connect(ascii_db, autocommit=True) as listener, psycopg.connect(ascii_db, autocommit=True) as other:
        listener.execute("LISTEN sturdy")
        listener.execute("SELECT count(*) FROM sturdy.take('mail-2 (eu)')")
        other.execute("SELECT sturdy.schedule('w', now(), 'mail-2 (eu)')")
        assert wait_notifies(listener, 2.0) == [("sturdy", "mail-2 (eu)")]


def test_a_node_postgres_listener_decodes_the_wakeup(ascii_db):
    run = run_node("node_listener.cjs", DB, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out == {"got": [r"nq\xff\x5cx"], "one": 1}
