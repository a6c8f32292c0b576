"""The tests of nl2data-workflow-postgres 0.1.0 that could not run as
published against pg_sturdy's store (test_nl2data.py says why), carried
here with real time and pg_sturdy's tables, their assertions kept; and
where the store keeps that package's promises its own tests do not check
(tokens that never go back, the command timeout)."""
import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

nl2data = pytest.importorskip("pg_sturdy.nl2data", reason="pip install './clients/python[nl2data]'")
from nl2data_core.workflow.durable import WorkflowSerializationError  # noqa: E402
from nl2data_core.workflow.models import WorkflowState, WorkflowStatus  # noqa: E402
from nl2data_core.workflow.shared_errors import SharedStoreError, SharedStoreErrorCode  # noqa: E402

SCOPE_A = "sha256:" + "a" * 64


@pytest.fixture
def store(dsn):
    from psycopg_pool import ConnectionPool
    pool = ConnectionPool(dsn, min_size=1, max_size=2, open=True)
    s = nl2data.SturdyStateStore(pool=pool, config=nl2data.SturdyStoreConfig(namespace=f"t{uuid.uuid4().hex[:10]}"))
    yield s
    s.close()


def test_acquire_claims_with_token_and_expiry(store, conn):
    """(TestLeaseLifecycle) the lease's end is the server's now plus the TTL:
    within a second of it here, where the fake's clock made it exact."""
    lease = store.acquire_lease("wf-1", owner_id="worker-a", tenant_scope_fingerprint=SCOPE_A, ttl_seconds=60.0)
    now = conn.execute("SELECT now()").fetchone()[0]
    assert lease.owner_id == "worker-a"
    assert lease.tenant_scope_fingerprint == SCOPE_A
    assert lease.fencing_token == 1
    assert abs(lease.expires_at - (now + timedelta(seconds=60.0))) < timedelta(seconds=1)
    assert lease.valid(now=datetime.now(UTC)) is True


def stored_snapshot(conn, store, workflow_id, value):
    """Write `value` over the workflow's stored snapshot, where the store
    keeps it: its instance's checkpoint of the current revision."""
    conn.execute("""UPDATE sturdy.checkpoints c SET value = %s::jsonb
                      FROM sturdy.instances i
                     WHERE i.process = %s AND i.business_key = %s AND c.workflow = i.workflow
                       AND c.step = 'state/1'""", (json.dumps(value), f"nl2data:{store.schema}", f"|{workflow_id}"))


def test_malformed_stored_snapshot_is_a_structured_error(store, conn):
    """(TestSerializationSafety)"""
    store.create(WorkflowState(workflow_id="wf-1", request_id="req-1", status=WorkflowStatus.CREATED))
    # (jsonb holds only JSON: the malformed snapshot is one whose state is
    # not a state)
    stored_snapshot(conn, store, "wf-1", {"schema_version": 1, "state": "{not-json"})
    with pytest.raises(WorkflowSerializationError) as excinfo:
        store.get("wf-1")
    assert excinfo.value.code.value == "INVALID_INPUT"


def test_unsupported_snapshot_version_is_rejected(store, conn):
    """(TestSerializationSafety)"""
    state = WorkflowState(workflow_id="wf-1", request_id="req-1", status=WorkflowStatus.CREATED)
    store.create(state)
    stored_snapshot(conn, store, "wf-1", {"schema_version": 99, "state": state.serialize_safe()})
    with pytest.raises(WorkflowSerializationError) as excinfo:
        store.get("wf-1")
    assert excinfo.value.code.value == "UNSUPPORTED_SCHEMA_VERSION"


def test_token_never_goes_back_after_release_or_cleanup(store):
    """pg_sturdy's own promise beside nl2data's: a lease released, or
    forgotten by cleanup, keeps its token, so the next acquire fences every
    holder of an earlier one (the original store deletes the row and starts
    again at 1)."""
    first = store.acquire_lease("wf-t", owner_id="a", ttl_seconds=1.0)
    assert store.release_lease("wf-t", owner_id="a", fencing_token=first.fencing_token) is True
    assert store.inspect_lease("wf-t") is None
    second = store.acquire_lease("wf-t", owner_id="b", ttl_seconds=1.0)
    assert second.fencing_token > first.fencing_token
    store.cleanup(terminal_before=datetime.now(UTC), expired_before=datetime.now(UTC) + timedelta(seconds=10),
                  max_records=10)
    assert store.inspect_lease("wf-t") is None
    third = store.acquire_lease("wf-t", owner_id="c", ttl_seconds=1.0)
    assert third.fencing_token > second.fencing_token


def test_the_command_timeout_is_the_originals_setting_with_its_default():
    original = pytest.importorskip("nl2data_workflow_postgres", reason="pip install './clients/python[nl2data-tests]'")
    ours = nl2data.SturdyStoreConfig().command_timeout_seconds
    assert ours == original.WorkflowPostgresConfig(namespace="shared").command_timeout_seconds == 10.0
    with pytest.raises(ValueError):
        nl2data.SturdyStateStore(pool=object(), config=nl2data.SturdyStoreConfig(command_timeout_seconds=0.0))


def renewal_past_the_timeout(dsn, store, lock, params=()):
    """Renew a lease while another transaction holds its row (`lock`): the
    error the store raises, and how long the renewal ran."""
    lease = store.acquire_lease("wf-slow", owner_id="worker-a", ttl_seconds=60.0)
    with psycopg.connect(dsn) as holder:
        # (a store that does not time out would wait for the lock forever:
        # the server ends the holder after 5 s, and the renewal then passes)
        holder.execute("SET LOCAL idle_in_transaction_session_timeout = '5s'")
        holder.execute(lock, params)
        began = time.monotonic()
        with pytest.raises(SharedStoreError) as excinfo:
            store.renew_lease("wf-slow", owner_id="worker-a", fencing_token=lease.fencing_token)
        took = time.monotonic() - began
        holder.rollback()
    # the store serves on once the row is free
    assert store.renew_lease("wf-slow", owner_id="worker-a", fencing_token=lease.fencing_token).owner_id == "worker-a"
    return excinfo.value, took


@pytest.mark.parametrize("config", ["SturdyStoreConfig", "WorkflowPostgresConfig"])
def test_a_statement_past_the_command_timeout_is_cancelled_as_the_original_cancels_it(dsn, conn, config):
    """A renewal that waits on a row lock longer than command_timeout_seconds
    is cancelled by the server and raised as SharedStoreError STORE_TIMEOUT,
    by pg_sturdy's store with either config and by the original store on the
    same server, in a schema of its own dropped afterwards."""
    original = pytest.importorskip("nl2data_workflow_postgres", reason="pip install './clients/python[nl2data-tests]'")
    namespace = f"t{uuid.uuid4().hex[:10]}"
    configs = {"SturdyStoreConfig": nl2data.SturdyStoreConfig, "WorkflowPostgresConfig": original.WorkflowPostgresConfig}
    from psycopg_pool import ConnectionPool
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        ours = nl2data.SturdyStateStore(pool=pool, config=configs[config](namespace=namespace,
                                                                          command_timeout_seconds=0.5))
        error, took = renewal_past_the_timeout(
            dsn, ours, "SELECT 1 FROM sturdy.claims WHERE workflow = %s FOR UPDATE",
            (ours._lease_workflow("wf-slow", None),))
    assert error.code is SharedStoreErrorCode.STORE_TIMEOUT and error.retryable is True
    assert 0.5 <= took < 5.0, took

    theirs = original.PostgreSQLStateStore(
        dsn=dsn, config=original.WorkflowPostgresConfig(namespace=namespace, command_timeout_seconds=0.5))
    try:
        expected, _ = renewal_past_the_timeout(dsn, theirs, f'SELECT 1 FROM "{namespace}".workflow_leases FOR UPDATE')
    finally:
        theirs.close()
        conn.execute(f'DROP SCHEMA IF EXISTS "{namespace}" CASCADE')
    assert (type(error), error.code, error.message, error.retryable, type(error.__cause__)) == (
        type(expected), expected.code, expected.message, expected.retryable, type(expected.__cause__))
