"""What nl2data-workflow-postgres 0.1.0's tests over its in-memory fake get
in place of the fake and of its store (test_nl2data.py adds one import
that rebinds the two names, nothing else): pg_sturdy's store over the
suites' server, with time scaled by SCALE.

Each "pool" is a fresh start of the store's namespace (`shared`, the
default config's, which the tests assert): what an earlier test left there
is removed, as a new fake starts empty.

The fake's clock moves when a test says so; the server's does not. Here a
test's `pool.clock.advance(s)` sleeps `s * SCALE`, and every lease length and
clock tolerance the test gives or takes by default is scaled alike (a 60 s
lease is 6 s, the 2 s tolerance 0.2 s), so each test's margins keep their
proportions; an advance of more than 150 s (an hour, in the cleanup
tests) moves only the time the test reads, `pool.clock.now()`, which is
otherwise the real time: those tests only pass it to `cleanup` as the
cutoff. `pool.states` is the workflow states stored in the namespace,
keyed as the fake keys them.

Each store built names the test that built it (pytest's
PYTEST_CURRENT_TEST) on a line of the file STURDY_NL2DATA_BUILT names, if
set: test_nl2data.py reads which of the published tests reached the store.
"""
import os
import time
from datetime import UTC, datetime, timedelta

from psycopg_pool import ConnectionPool

from pg_sturdy.nl2data import SturdyStateStore, SturdyStoreConfig

SCALE = 0.1
DSN = os.environ["NL2DATA_POSTGRES_DSN"]
_POOL = None


def _pool():
    global _POOL
    if _POOL is None:
        _POOL = ConnectionPool(DSN, min_size=1, max_size=8, open=True)
    return _POOL


class _Clock:
    def __init__(self):
        self.ahead = timedelta(0)

    def now(self):
        return datetime.now(UTC) + self.ahead

    def advance(self, seconds):
        if seconds > 150:
            self.ahead += timedelta(seconds=seconds)
        else:
            time.sleep(seconds * SCALE)


NAMESPACE = "shared"


class FakePostgresPool:
    """The store's namespace on the real server, emptied, shared by the
    stores a test builds on it."""

    def __init__(self, start=None):
        self.namespace = NAMESPACE
        self.clock = _Clock()
        process = f"nl2data:{NAMESPACE}"
        with _pool().connection() as c:
            c.execute("""
                WITH gone AS (DELETE FROM sturdy.instances WHERE process IN (%s, %s) RETURNING workflow),
                     keys AS (DELETE FROM sturdy.idempotency_keys WHERE process = %s),
                     steps AS (DELETE FROM sturdy.checkpoints c USING gone g WHERE c.workflow = g.workflow)
                DELETE FROM sturdy.claims WHERE pg_catalog.starts_with(workflow, %s)""",
                      (process, f"{process}:idempotency", f"{process}:idempotency", f"{process}:lease|"))

    @property
    def states(self):
        with _pool().connection() as c:
            keys = c.execute("SELECT business_key FROM sturdy.instances WHERE process = %s",
                             (f"nl2data:{self.namespace}",)).fetchall()
        return {tuple(k.split("|", 1)): k for (k,) in keys}


class PostgreSQLStateStore(SturdyStateStore):
    """pg_sturdy's store with the test's times scaled (see the module)."""

    def __init__(self, *, pool, now=None, config=None):
        built = os.environ.get("STURDY_NL2DATA_BUILT")
        if built:
            with open(built, "a") as f:
                f.write(os.environ["PYTEST_CURRENT_TEST"].rsplit(" (", 1)[0] + "\n")
        super().__init__(pool=_pool(), config=SturdyStoreConfig(
            namespace=pool.namespace, clock_tolerance_seconds=2.0 * SCALE, lease_ttl_seconds=120.0 * SCALE))

    def close(self):
        pass  # (the pool is every test's)

    def acquire_lease(self, workflow_id, *, ttl_seconds=None, **kw):
        return super().acquire_lease(workflow_id, ttl_seconds=None if ttl_seconds is None else ttl_seconds * SCALE,
                                     **kw)
