"""pytest's hooks for pg_test/: every test's worker threads are checked
after it, so a thread that died fails the test it belongs to; tests marked
`last` run after the others; a test marked `begun_early(f)` gets what `f`
returned when the session started (once its tests are chosen), for what
must age meanwhile; `bouncer` is PgBouncer in front of the server for a
module's tests (pooler.py)."""
import pytest

from pooler import Bouncer
from sturdy import THREAD_ERRORS

BEGUN = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "last: run after every other test of the session")
    config.addinivalue_line("markers", "begun_early(f): f() runs when the session starts; the test gets its value")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)  # stable: the rest keep their order


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    for item in session.items:
        marker = item.get_closest_marker("begun_early")
        if marker and item.nodeid not in BEGUN:
            BEGUN[item.nodeid] = marker.args[0]()


@pytest.fixture
def begun_early(request):
    return BEGUN.pop(request.node.nodeid)


@pytest.fixture(autouse=True)
def threads_must_not_die():
    THREAD_ERRORS.clear()
    yield
    if THREAD_ERRORS:
        errors = THREAD_ERRORS[:3]
        THREAD_ERRORS.clear()
        pytest.fail(f"a thread of the test died: {errors}")


@pytest.fixture(scope="module")
def bouncer():
    """PgBouncer in transaction mode in front of the server (pooler.py), for
    a module's tests; skipped (and counted) where it is not installed."""
    b = Bouncer()
    if b.binary is None:
        pytest.skip("pgbouncer is not installed (scripts/bootstrap.sh installs it)")
    b.start()
    yield b
    b.stop()
