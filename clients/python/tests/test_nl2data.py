"""nl2data-workflow-postgres 0.1.0's own tests against pg_sturdy's store
(`pg_sturdy.nl2data.SturdyStateStore`): its integration tests, from its
sdist, with only the fixture that builds the store changed
(nl2data_fixture.py), every assertion as published. Its other tests drive an
in-memory fake with a clock a server cannot follow (clients/python/README.md
lists them, and test_nl2data_store.py carries what applies)."""
import os
import re
import subprocess
import sys
import tarfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
SDIST = "nl2data-workflow-postgres==0.1.0"
CACHE = os.environ.get("STURDY_NL2DATA_CACHE", "/tmp/pg_sturdy_nl2data")
TESTS = "nl2data_workflow_postgres-0.1.0/tests/test_workflow_postgres_integration.py"
CARRIED = ("contract", "concurrency", "", "security")
# Carried tests that cannot hold against a real server, each for its reason
# (clients/python/README.md lists them with the rest of what does not run).
NOT_CARRIED = {
    # asserts expires_at == the fake clock's now + 60 s exactly: a real
    # server's now is not the test's (test_nl2data_store.py checks it
    # within a second)
    "contract": ["TestLeaseLifecycle::test_acquire_claims_with_token_and_expiry"],
    "concurrency": [],
    "": [
        # set the fake's stored schema version, read its tables
        "TestSchemaCompatibility::test_newer_schema_is_rejected_without_modification",
        # inspect the package's own SQL text and migrations
        "TestSchemaCompatibility::test_schema_metadata_is_namespace_qualified",
        "TestSchemaCompatibility::test_schema_constants_are_versioned_and_additive",
        # write a snapshot into the fake's table by hand (test_nl2data_store.py
        # writes one into pg_sturdy's checkpoint instead)
        "TestSerializationSafety::test_malformed_stored_snapshot_is_a_structured_error",
        "TestSerializationSafety::test_unsupported_snapshot_version_is_rejected",
    ],
    # make the fake's next statement raise (fail_next)
    "security": ["TestErrorRedaction::test_backend_error_message_is_redacted"],
}


def published(name=TESTS):
    """A test file of the sdist (downloaded once)."""
    os.makedirs(CACHE, exist_ok=True)
    archive = os.path.join(CACHE, "nl2data_workflow_postgres-0.1.0.tar.gz")
    if not os.path.exists(archive):
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--no-binary", ":all:", "-d", CACHE, SDIST], check=True, timeout=300)
    with tarfile.open(archive) as t:
        # (published with CRLF line ends)
        return t.extractfile(name).read().decode().replace("\r\n", "\n")


def with_our_fixture(text):
    """The file with its `shared_backend` fixture (decorator to the end of
    the function) replaced by ours; nothing else touched."""
    start = text.index('@pytest.fixture(scope="module")\ndef shared_backend(')
    end = text.index("\n\n\n", start)
    with open(os.path.join(HERE, "nl2data_fixture.py")) as f:
        ours = f.read().rstrip("\n")
    patched = text[:start] + ours + text[end:]
    assert patched.count("def test_") == text.count("def test_")
    return patched


def test_the_published_integration_tests_pass_against_sturdy_store(dsn, tmp_path):
    pytest.importorskip("nl2data_workflow_postgres", reason="pip install './clients/python[nl2data]'")
    path = tmp_path / "test_workflow_postgres_integration.py"
    path.write_text(with_our_fixture(published()))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(path)],
                         capture_output=True, text=True, timeout=600, cwd=str(tmp_path),
                         env=dict(os.environ, PYTHONPATH=SRC, NL2DATA_POSTGRES_DSN=dsn))
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert re.search(r"\b8 passed\b", summary) and "skipped" not in summary, summary


def with_our_store(text):
    """The file with one import added after its own: the names
    PostgreSQLStateStore and FakePostgresPool rebound to nl2data_shim.py's."""
    import ast
    last = max(n.end_lineno for n in ast.parse(text).body if isinstance(n, (ast.Import, ast.ImportFrom)))
    lines = text.split("\n")
    lines.insert(last, "from nl2data_shim import FakePostgresPool, PostgreSQLStateStore  # pg_sturdy's, a real server")
    return "\n".join(lines)


@pytest.mark.parametrize("kind", CARRIED, ids=lambda k: k or "unit")
def test_the_published_tests_over_the_fake_pass_against_sturdy_store(kind, dsn, tmp_path):
    """Its tests over the in-memory fake, run on the real server with the
    fake and its store rebound to nl2data_shim.py's (pg_sturdy's store,
    times scaled), every test and assertion as published, but those
    NOT_CARRIED says."""
    pytest.importorskip("nl2data_workflow_postgres", reason="pip install './clients/python[nl2data]'")
    name = "test_workflow_postgres" + (f"_{kind}" if kind else "") + ".py"
    text = with_our_store(published(TESTS.replace("test_workflow_postgres_integration.py", name)))
    path = tmp_path / name
    path.write_text(text)
    total = text.count("    def test_")
    deselect = [f"--deselect={name}::{t}" for t in NOT_CARRIED[kind]]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *deselect, name],
                         capture_output=True, text=True, timeout=900, cwd=str(tmp_path),
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, HERE]), NL2DATA_POSTGRES_DSN=dsn))
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed == total - len(NOT_CARRIED[kind]) and "skipped" not in summary, summary
