"""The client's tests run against a server with pg_sturdy installed, the
suites' own (scripts/suites.sh sets these):

  STURDY_SERVER   libpq settings without a database ("host=... port=... user=...")
  STURDY_DB       the database (default sturdy_concurrency)

Without STURDY_SERVER every test is skipped, and counted so.
"""
import os
import sys

import psycopg
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

SERVER = os.environ.get("STURDY_SERVER", "")
DB = os.environ.get("STURDY_DB", "sturdy_concurrency")
DSN = f"{SERVER} dbname={DB}"


@pytest.fixture
def dsn():
    if not SERVER:
        pytest.skip("STURDY_SERVER not set: run through scripts/suites.sh")
    return DSN


@pytest.fixture
def conn(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def effects(conn):
    """client_test.effect(jsonb): one row per call, in the caller's
    transaction (what `transact` needs to be exactly once)."""
    conn.execute("CREATE SCHEMA IF NOT EXISTS client_test")
    conn.execute("CREATE TABLE IF NOT EXISTS client_test.effects (workflow text, step text, pid int)")
    conn.execute("""CREATE OR REPLACE FUNCTION client_test.effect(arg jsonb) RETURNS jsonb LANGUAGE sql AS $$
                      INSERT INTO client_test.effects VALUES (arg->>'workflow', arg->>'step', pg_backend_pid())
                      RETURNING to_jsonb(arg->>'step') $$""")
    return conn
