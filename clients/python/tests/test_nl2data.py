"""nl2data-workflow-postgres 0.1.0's own tests against pg_sturdy's store
(`pg_sturdy.nl2data.SturdyStateStore`): its integration tests, from its
sdist, with only the fixture that builds the store changed
(nl2data_fixture.py), every assertion as published; its tests over an
in-memory fake, with the fake and its store rebound to pg_sturdy's on the
real server (nl2data_shim.py); and of its import-boundary tests, the two
that check nl2data-core. clients/python/README.md lists which of them reach
the store, which do not run and why; test_nl2data_store.py carries what
applies of those that do not."""
import ast
import json
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
# Carried tests that never build a store: they check nl2data-core's
# serialization and error mapping, or that package's own config and pool
# builder, whatever the store (a class's name stands for all its tests).
STORE_FREE = {
    "contract": [],
    "concurrency": [],
    "": [
        "TestWorkflowPostgresConfig",
        "TestSerializationSafety::test_snapshot_round_trips_exactly",
        "TestSerializationSafety::test_snapshot_contains_only_safe_fields",
        "TestTenantNamespaces::test_scope_namespace_derivation",
        "TestErrorNormalization",
    ],
    "security": [
        "TestSnapshotSafety",
        "TestErrorRedaction::test_build_pool_error_does_not_leak_dsn",
        "TestConfigIsCredentialFree",
    ],
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


def published_ids(text):
    """Class::test of every test method in a published file."""
    return {f"{c.name}::{f.name}" for c in ast.parse(text).body if isinstance(c, ast.ClassDef)
            for f in c.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")}


def named(ids, names):
    """Those of `ids` that `names` names, a class standing for its tests."""
    return {i for i in ids if any(i == n or i.startswith(n + "::") for n in names)}


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
    built = tmp_path / "built"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *deselect, name],
                         capture_output=True, text=True, timeout=900, cwd=str(tmp_path),
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, HERE]), NL2DATA_POSTGRES_DSN=dsn,
                                  STURDY_NL2DATA_BUILT=str(built)))
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed == total - len(NOT_CARRIED[kind]) and "skipped" not in summary, summary
    # which of them built pg_sturdy's store: all that ran but STORE_FREE's
    ids = published_ids(text)
    assert len(ids) == total
    ran = ids - named(ids, NOT_CARRIED[kind])
    reached = {line.split("::", 1)[1] for line in built.read_text().split()} if built.exists() else set()
    assert reached == ran - named(ids, STORE_FREE[kind]), sorted(reached ^ (ran - named(ids, STORE_FREE[kind])))


BOUNDARY = TESTS.replace("integration", "import_boundary")


def test_the_published_import_boundary_tests_of_nl2data_core_pass(tmp_path):
    """The two of its import-boundary tests that check nl2data-core
    (`nl2data` and `nl2data_core.workflow` load no psycopg), as published, in
    a fresh interpreter of the environment pg_sturdy's nl2data extras
    install. The other two check that package's own lazy driver, which
    pg_sturdy does not have (clients/python/README.md)."""
    pytest.importorskip("nl2data_core", reason="pip install './clients/python[nl2data]'")
    path = tmp_path / "test_workflow_postgres_import_boundary.py"
    path.write_text(published(BOUNDARY))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                          "-k", "TestBaseImportRemainsPostgresFree", str(path)],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert re.search(r"\b2 passed, 2 deselected\b", summary) and "skipped" not in summary, summary


IMPORTS = """
import json, sys
import pg_sturdy
base = sorted(m for m in ("nl2data", "nl2data_core", "nl2data_workflow_postgres", "psycopg_pool") if m in sys.modules)
import pg_sturdy.nl2data as store
print(json.dumps({"base": base, "store": "psycopg_pool" in sys.modules, "all": sorted(store.__all__)}))
"""


def test_the_import_boundaries_of_pg_sturdy_and_its_store(tmp_path):
    """pg_sturdy's own boundaries, in a fresh interpreter: `import pg_sturdy`
    loads neither nl2data, its packages nor psycopg_pool (the nl2data extra
    is optional); `pg_sturdy.nl2data` loads psycopg_pool only for a store
    given a dsn, and exports the store and its config."""
    pytest.importorskip("nl2data_core", reason="pip install './clients/python[nl2data]'")
    probe = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, timeout=120,
                           cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=SRC))
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == {"base": [], "store": False, "all": ["SturdyStateStore", "SturdyStoreConfig"]}
