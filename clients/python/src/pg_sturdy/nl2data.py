"""nl2data-core's workflow store on pg_sturdy: `SturdyStateStore` implements
the interfaces `nl2data-workflow-postgres`'s `PostgreSQLStateStore` does
(`StateStore`, `IdempotencyStore`, `WorkflowLeaseStore`,
`FencedStateStore`), with pg_sturdy's own concepts instead of tables of its
own (pip install './clients/python[nl2data]'):

- a workflow state is a workflow instance (`start`), process
  `nl2data:<namespace>`, business key `<scope namespace>|<workflow id>`; its
  status moves by `transition` (compare-and-set on the instance's revision,
  which is the state's revision: 1 at create, one more each update; terminal
  statuses never left), and each revision's snapshot is a checkpoint of the
  instance's workflow, `state/<revision>` (first writer wins);
  nl2data's statuses map onto the instance's (created and queued are
  pending, closed is cancelled), the exact one kept in the snapshot;
- a lease is a claim (`claim`, `renew`, `release`) of the workflow
  `nl2data:<namespace>:lease|<scope namespace>|<workflow id>`, its owner the
  claim's owner; fencing tokens come from the claim and never go back, not
  even after `cleanup` (which forgets an expired lease's owner but keeps its
  token), so no holder of an old token can write again;
- an idempotency key is a pg_sturdy idempotency key (`start` with
  `idempotency_key`, its expiry `sturdy.idempotency_ttl`), of an instance
  of process `nl2data:<namespace>:idempotency` whose variables are the
  binding; completing it moves that instance to succeeded, the outcome's
  fingerprint its checkpoint `outcome`.

All times are the server's. A reservation without an expiry is kept for the
longest `sturdy.idempotency_ttl` allows (about 24 days) and reported with
none. Every statement the store runs is bounded by the config's
`command_timeout_seconds` (`statement_timeout`, set for each of its
transactions); one cancelled by it raises `SharedStoreError` with code
`STORE_TIMEOUT`.
"""
from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterator

import psycopg
from nl2data.errors import ErrorCode
from psycopg.rows import tuple_row

from nl2data_core.workflow.durable import (DurableWorkflowRecord, IdempotencyConflictError, IdempotencyRecord,
                                           IdempotencyStatus, WorkflowSerializationError, deserialize_snapshot,
                                           serialize_snapshot, tenant_scope_namespace)
from nl2data_core.workflow.lease import WorkflowLease, validate_lease_identity
from nl2data_core.workflow.models import (TERMINAL_STATUSES, WorkflowState, WorkflowStateError, WorkflowStatus,
                                          WorkflowTransitionError)
from nl2data_core.workflow.shared_errors import SharedStoreError, SharedStoreErrorCode, normalize_shared_error

from .client import Sturdy
from .errors import Fenced, SturdyError

_FINGERPRINT = re.compile(r"^sha256:[0-9a-f]{64}$")
_IDENTIFIER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-\.]{0,127}$")
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_NAMESPACE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")

# nl2data's statuses on an instance's
_INSTANCE_STATUS = {
    WorkflowStatus.CREATED: "pending", WorkflowStatus.QUEUED: "pending", WorkflowStatus.RUNNING: "running",
    WorkflowStatus.SUCCEEDED: "succeeded", WorkflowStatus.FAILED: "failed", WorkflowStatus.CLOSED: "cancelled",
}
# the longest sturdy.idempotency_ttl (an integer of milliseconds)
_LONGEST_TTL_MS = 2_147_483_647
# the bounds nl2data-workflow-postgres puts on its command timeout (seconds)
_COMMAND_TIMEOUT = (0.1, 120.0)

__all__ = ["SturdyStateStore", "SturdyStoreConfig"]


@dataclass(frozen=True)
class SturdyStoreConfig:
    """The settings the store reads; `WorkflowPostgresConfig` of
    nl2data-workflow-postgres has them too and may be passed instead."""

    namespace: str = "shared"
    clock_tolerance_seconds: float = 2.0
    lease_ttl_seconds: float = 120.0
    cleanup_batch_size: int = 500
    # the longest any one statement of the store may run
    command_timeout_seconds: float = 10.0


def _scope(fingerprint: str | None) -> str:
    return tenant_scope_namespace(fingerprint) if fingerprint is not None else ""


class SturdyStateStore:
    """nl2data-core's workflow store on pg_sturdy (see the module)."""

    def __init__(self, *, dsn: str | None = None, config: Any = None, pool: Any = None,
                 now: Callable[[], datetime] | None = None):
        if (dsn is None) == (pool is None):
            raise ValueError("give exactly one of dsn and pool")
        self._config = config if config is not None else SturdyStoreConfig()
        if _NAMESPACE.fullmatch(self._config.namespace) is None:
            raise ValueError("namespace must be an identifier")
        timeout = self._config.command_timeout_seconds
        if not _COMMAND_TIMEOUT[0] <= timeout <= _COMMAND_TIMEOUT[1]:
            raise ValueError("command_timeout_seconds must be from 0.1 to 120")
        self._statement_timeout = f"{int(timeout * 1000)}ms"
        if pool is None:
            from psycopg_pool import ConnectionPool
            pool = ConnectionPool(dsn, min_size=1, max_size=5, open=True)
        self._pool = pool
        self._closed = False
        self._process = f"nl2data:{self._config.namespace}"
        # (the server's clock decides every time; `now` is accepted for the
        # interface's constructor and not used)
        del now
        if self.schema_version() != 1:
            raise SharedStoreError(SharedStoreErrorCode.SCHEMA_MISMATCH,
                                   "pg_sturdy is not installed in this database: CREATE EXTENSION pg_sturdy")

    # What the store is

    @property
    def schema(self) -> str:
        return self._config.namespace

    def schema_version(self) -> int:
        """The version of this mapping onto pg_sturdy: 1."""
        with self._transaction() as s:
            found = self._rows(s, "SELECT count(*) FROM pg_catalog.pg_extension WHERE extname = 'pg_sturdy'")
        return 1 if found[0][0] else 0

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(Exception):
                self._pool.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Sturdy]:
        if self._closed:
            raise SharedStoreError(SharedStoreErrorCode.STORE_UNAVAILABLE, "shared state store is closed")
        try:
            with self._pool.connection() as conn:
                with conn.transaction():
                    # (for this transaction only: the pool's connection
                    # keeps its own setting for whoever takes it next)
                    conn.execute("SELECT pg_catalog.set_config('statement_timeout', %s, true)",
                                 (self._statement_timeout,), prepare=False)
                    yield Sturdy(conn)
        except (WorkflowStateError, WorkflowTransitionError, IdempotencyConflictError, SharedStoreError,
                WorkflowSerializationError, ValueError) as e:
            if isinstance(e, SturdyError) and not isinstance(e, ValueError):
                raise _shared(e) from e
            raise
        except Fenced as e:
            raise SharedStoreError(SharedStoreErrorCode.FENCING_REJECTED, "workflow lease ownership was lost") from e
        except (psycopg.Error, SturdyError) as e:
            raise _shared(e) from e

    # Reading rows (tuples, whatever the pool's row factory)

    @staticmethod
    def _rows(s: Sturdy, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with s.conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(sql, params, prepare=False)
            return cur.fetchall() if cur.description else []

    def _instance(self, s: Sturdy, process: str, key: str, lock: bool = False) -> tuple[Any, ...] | None:
        """The newest instance of the business key: id, workflow, status,
        the state's revision (the instance's, less its `base`), variables,
        created_at, updated_at."""
        rows = self._rows(s, "SELECT id, workflow, status,"
                             " revision - COALESCE((variables->>'base')::bigint, 0), variables, created_at, updated_at"
                             " FROM sturdy.instances WHERE business_key = %s AND process = %s"
                             " ORDER BY id DESC LIMIT 1" + (" FOR UPDATE" if lock else ""), (key, process))
        return rows[0] if rows else None

    def _snapshot(self, s: Sturdy, workflow: str, revision: int, workflow_id: str) -> WorkflowState:
        rows = self._rows(s, "SELECT value FROM sturdy.checkpoints WHERE workflow = %s AND step = %s",
                          (workflow, f"state/{revision}"))
        try:
            if not rows:
                raise WorkflowSerializationError("snapshot missing", code=ErrorCode.INVALID_INPUT)
            return deserialize_snapshot(json.dumps(rows[0][0]))
        except WorkflowSerializationError as e:
            raise WorkflowSerializationError(f"stored snapshot for workflow '{workflow_id}' is malformed",
                                             code=e.code, details={"workflow_id": workflow_id}) from e

    def _state_key(self, workflow_id: str, scope: str | None) -> str:
        return f"{_scope(scope)}|{workflow_id}"

    def _lease_workflow(self, workflow_id: str, scope: str | None) -> str:
        return f"{self._process}:lease|{_scope(scope)}|{workflow_id}"

    # StateStore

    def create(self, state: WorkflowState) -> None:
        key = self._state_key(state.workflow_id, state.tenant_scope_fingerprint)
        with self._transaction() as s:
            # one create of a workflow id at a time: the second finds the first
            self._rows(s, "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(%s, 0))",
                       (f"{self._process}|{key}",))
            if self._instance(s, self._process, key) is not None:
                raise WorkflowStateError(f"workflow '{state.workflow_id}' already exists",
                                         details={"workflow_id": state.workflow_id})
            # (a state created in a status other than pending takes the
            # instance one transition there: `base`, what the instance's
            # revision is ahead of the state's)
            moves = _INSTANCE_STATUS[state.status] != "pending"
            instance = s.start(self._process, key, {"request_id": state.request_id, "base": int(moves)},
                               queue=self._process)
            workflow = self._rows(s, "SELECT workflow FROM sturdy.instances WHERE id = %s", (instance,))[0][0]
            # the instance is the record: no pass of it runs from the queue
            s.cancel(workflow, self._process)
            if moves:
                s.transition(instance, "pending", _INSTANCE_STATUS[state.status])
            s.supply(workflow, "state/1", json.loads(serialize_snapshot(state)))

    def get(self, workflow_id: str, *, tenant_scope_fingerprint: str | None = None) -> WorkflowState | None:
        with self._transaction() as s:
            found = self._instance(s, self._process, self._state_key(workflow_id, tenant_scope_fingerprint))
            if found is None:
                return None
            return self._snapshot(s, found[1], found[3], workflow_id)

    def get_revision(self, workflow_id: str, *, tenant_scope_fingerprint: str | None = None) -> int | None:
        with self._transaction() as s:
            found = self._instance(s, self._process, self._state_key(workflow_id, tenant_scope_fingerprint))
            return None if found is None else int(found[3])

    def get_checkpoint(self, workflow_id: str, request_id: str, *,
                       tenant_scope_fingerprint: str | None = None) -> WorkflowState | None:
        state = self.get(workflow_id, tenant_scope_fingerprint=tenant_scope_fingerprint)
        return state if state is not None and state.request_id == request_id else None

    def get_record(self, workflow_id: str, *,
                   tenant_scope_fingerprint: str | None = None) -> DurableWorkflowRecord | None:
        with self._transaction() as s:
            found = self._instance(s, self._process, self._state_key(workflow_id, tenant_scope_fingerprint))
            if found is None:
                return None
            state = self._snapshot(s, found[1], found[3], workflow_id)
            return DurableWorkflowRecord(
                workflow_id=workflow_id, request_id=state.request_id,
                tenant_scope_fingerprint=tenant_scope_fingerprint,
                scope_namespace=_scope(tenant_scope_fingerprint), status=state.status, revision=int(found[3]),
                snapshot=serialize_snapshot(state), created_at=found[5], updated_at=found[6], expires_at=None)

    def update(self, workflow_id: str, expected_status: Any, state: Any, *, expected_version: int | None = None,
               tenant_scope_fingerprint: str | None = None, owner_id: str | None = None,
               fencing_token: int | None = None) -> None:
        if state.workflow_id != workflow_id:
            raise WorkflowStateError("workflow snapshot identity does not match the requested workflow",
                                     details={"workflow_id": workflow_id})
        if state.tenant_scope_fingerprint != tenant_scope_fingerprint:
            raise WorkflowStateError(f"workflow '{workflow_id}' tenant scope mismatch",
                                     details={"workflow_id": workflow_id})
        expected = WorkflowStatus(expected_status)
        with self._transaction() as s:
            found = self._instance(s, self._process, self._state_key(workflow_id, tenant_scope_fingerprint),
                                   lock=True)
            if found is None:
                raise WorkflowStateError(f"workflow '{workflow_id}' not found", details={"workflow_id": workflow_id})
            instance, workflow, _, revision = found[0], found[1], found[2], int(found[3])
            stored = self._snapshot(s, workflow, revision, workflow_id)
            if stored.status in TERMINAL_STATUSES:
                if state.status == stored.status:
                    return
                raise WorkflowTransitionError(f"cannot transition from terminal status '{stored.status.value}'",
                                              details={"workflow_id": workflow_id})
            if stored.status != expected:
                raise WorkflowStateError(f"workflow '{workflow_id}' status changed concurrently",
                                         details={"workflow_id": workflow_id})
            if expected_version is not None and expected_version != revision:
                raise WorkflowStateError(f"workflow '{workflow_id}' version changed concurrently",
                                         details={"workflow_id": workflow_id})
            if owner_id is not None and fencing_token is not None:
                self._fence(s, workflow_id, tenant_scope_fingerprint, owner_id, fencing_token)
            moved = s.transition(instance, _INSTANCE_STATUS[stored.status], _INSTANCE_STATUS[state.status],
                                 expected_revision=revision + int(found[4].get("base", 0)))
            written = s.supply(workflow, f"state/{revision + 1}", json.loads(serialize_snapshot(state)))
            if not moved or written != json.loads(serialize_snapshot(state)):
                raise WorkflowStateError(f"workflow '{workflow_id}' version changed concurrently",
                                         details={"workflow_id": workflow_id})

    def list_ids(self, *, tenant_scope_fingerprint: str | None = None) -> tuple[str, ...]:
        prefix = f"{_scope(tenant_scope_fingerprint)}|"
        with self._transaction() as s:
            keys = self._rows(s, "SELECT DISTINCT business_key FROM sturdy.instances WHERE process = %s"
                                 " AND pg_catalog.starts_with(business_key, %s)", (self._process, prefix))
        return tuple(sorted(k[len(prefix):] for (k,) in keys))

    def cleanup(self, *, terminal_before: datetime, expired_before: datetime, max_records: int) -> int:
        if max_records < 1:
            raise ValueError("max_records must be at least 1")
        batch = min(max_records, self._config.cleanup_batch_size)
        tolerance = self._config.clock_tolerance_seconds
        with self._transaction() as s:
            finished = self._rows(s, """
                WITH gone AS (
                    SELECT id, workflow FROM sturdy.instances
                     WHERE process = %s AND finished_at <= %s ORDER BY finished_at, id LIMIT %s FOR UPDATE SKIP LOCKED),
                steps AS (DELETE FROM sturdy.checkpoints c USING gone g WHERE c.workflow = g.workflow),
                rows AS (DELETE FROM sturdy.queue q USING gone g WHERE q.workflow = g.workflow)
                DELETE FROM sturdy.instances i USING gone g WHERE i.id = g.id RETURNING 1""",
                                  (self._process, terminal_before, batch))
            keys = self._rows(s, """
                WITH gone AS (
                    DELETE FROM sturdy.idempotency_keys k
                     WHERE k.ctid = ANY (ARRAY(SELECT x.ctid FROM sturdy.idempotency_keys x
                                                WHERE x.process = %s AND x.expires_at <= %s
                                                ORDER BY x.expires_at LIMIT %s FOR UPDATE SKIP LOCKED))
                    RETURNING k.instance),
                binding AS (SELECT i.id, i.workflow FROM sturdy.instances i JOIN gone g ON g.instance = i.id),
                steps AS (DELETE FROM sturdy.checkpoints c USING binding b WHERE c.workflow = b.workflow),
                rows AS (DELETE FROM sturdy.queue q USING binding b WHERE q.workflow = b.workflow)
                DELETE FROM sturdy.instances i USING binding b WHERE i.id = b.id RETURNING 1""",
                              (f"{self._process}:idempotency", expired_before, batch))
            # a lease is forgotten (ended, its owner gone), its token kept: a
            # later acquire still fences every holder of an older one
            leases = self._rows(s, """
                UPDATE sturdy.claims SET owner = NULL, held_until = LEAST(held_until, now())
                 WHERE workflow = ANY (ARRAY(SELECT c.workflow FROM sturdy.claims c
                                              WHERE pg_catalog.starts_with(c.workflow, %s) AND c.owner IS NOT NULL
                                                AND c.held_until <= %s::timestamptz - %s * interval '1 second'
                                              ORDER BY c.held_until LIMIT %s FOR UPDATE SKIP LOCKED))
                RETURNING 1""", (f"{self._process}:lease|", expired_before, tolerance, batch))
        return len(finished) + len(keys) + len(leases)

    # IdempotencyStore

    def _check_identity(self, key: str, request_id: str | None = None, workflow_id: str | None = None,
                        scope: str | None = None) -> None:
        if _KEY.fullmatch(key) is None:
            raise WorkflowStateError("idempotency key is not identifier-safe", details={"idempotency_key": key[:128]})
        if request_id is not None and _IDENTIFIER.fullmatch(request_id) is None:
            raise WorkflowStateError("idempotency request identity is not identifier-safe",
                                     details={"request_id": request_id[:128]})
        if workflow_id is not None and _IDENTIFIER.fullmatch(workflow_id) is None:
            raise WorkflowStateError("idempotency workflow identity is not identifier-safe",
                                     details={"workflow_id": workflow_id[:128]})
        if scope is not None and _FINGERPRINT.fullmatch(scope) is None:
            raise WorkflowStateError("idempotency scope must be a sha256 fingerprint",
                                     details={"tenant_scope_fingerprint": scope[:128]})

    def _idempotency(self, s: Sturdy, key: str, scope: str | None, lock: bool = False
                     ) -> tuple[IdempotencyRecord, int, str] | None:
        rows = self._rows(s, """
            SELECT i.id, i.workflow, i.status, i.variables, k.created_at, i.updated_at,
                   (SELECT c.value FROM sturdy.checkpoints c WHERE c.workflow = i.workflow AND c.step = 'outcome')
              FROM sturdy.idempotency_keys k JOIN sturdy.instances i ON i.id = k.instance
             WHERE k.process = %s AND k.key = %s""" + (" FOR UPDATE OF i" if lock else ""),
                          (f"{self._process}:idempotency", f"{_scope(scope)}|{key}"))
        if not rows:
            return None
        instance, workflow, status, variables, created, updated, outcome = rows[0]
        expires = variables.get("expires_at")
        record = IdempotencyRecord(
            idempotency_key=key, request_id=variables["request_id"], tenant_scope_fingerprint=scope,
            scope_namespace=_scope(scope), workflow_id=variables["workflow_id"],
            status=IdempotencyStatus.COMPLETED if status == "succeeded" else IdempotencyStatus.RESERVED,
            terminal_outcome_fingerprint=outcome, created_at=created, updated_at=updated,
            expires_at=datetime.fromisoformat(expires) if expires else None)
        return record, instance, workflow

    def reserve_idempotency(self, key: str, *, request_id: str, workflow_id: str,
                            tenant_scope_fingerprint: str | None = None,
                            expires_at: datetime | None = None) -> IdempotencyRecord:
        self._check_identity(key, request_id, workflow_id, tenant_scope_fingerprint)
        with self._transaction() as s:
            now = self._rows(s, "SELECT now()")[0][0]
            ttl_ms = _LONGEST_TTL_MS if expires_at is None else max(
                1, min(_LONGEST_TTL_MS, int((expires_at - now).total_seconds() * 1000)))
            self._rows(s, "SELECT pg_catalog.set_config('sturdy.idempotency_ttl', %s, true)", (f"{ttl_ms}ms",))
            binding = {"request_id": request_id, "workflow_id": workflow_id,
                       "expires_at": None if expires_at is None else expires_at.isoformat()}
            name = f"{_scope(tenant_scope_fingerprint)}|{key}"
            process = f"{self._process}:idempotency"
            instance = s.start(process, name, binding, idempotency_key=name, queue=process)
            found = self._idempotency(s, key, tenant_scope_fingerprint)
            if found is None or found[1] != instance:
                raise WorkflowStateError(f"idempotency key '{key}' not found", details={"idempotency_key": key})
            record, _, workflow = found
            s.cancel(workflow, process)
            if record.request_id != request_id:
                raise IdempotencyConflictError(f"idempotency key '{key}' is bound to a different request",
                                               details={"idempotency_key": key})
            if record.workflow_id != workflow_id:
                raise IdempotencyConflictError(f"idempotency key '{key}' is bound to a different workflow",
                                               details={"idempotency_key": key})
            return record

    def complete_idempotency(self, key: str, *, workflow_id: str, terminal_outcome_fingerprint: str,
                             tenant_scope_fingerprint: str | None = None, owner_id: str | None = None,
                             fencing_token: int | None = None) -> IdempotencyRecord:
        self._check_identity(key, workflow_id=workflow_id, scope=tenant_scope_fingerprint)
        if _FINGERPRINT.fullmatch(terminal_outcome_fingerprint) is None:
            raise WorkflowStateError("terminal outcome reference must be a sha256 fingerprint",
                                     details={"idempotency_key": key})
        with self._transaction() as s:
            found = self._idempotency(s, key, tenant_scope_fingerprint, lock=True)
            if found is None:
                raise WorkflowStateError(f"idempotency key '{key}' not found", details={"idempotency_key": key})
            record, instance, workflow = found
            if record.workflow_id != workflow_id:
                raise IdempotencyConflictError(f"idempotency key '{key}' is bound to a different workflow",
                                               details={"idempotency_key": key})
            if record.status == IdempotencyStatus.COMPLETED:
                raise IdempotencyConflictError(f"idempotency key '{key}' is already completed",
                                               details={"idempotency_key": key})
            if owner_id is not None and fencing_token is not None:
                self._fence(s, workflow_id, tenant_scope_fingerprint, owner_id, fencing_token)
            s.supply(workflow, "outcome", terminal_outcome_fingerprint)
            s.transition(instance, "pending", "succeeded")
            done = self._idempotency(s, key, tenant_scope_fingerprint)
            assert done is not None
            return done[0]

    def get_idempotency(self, key: str, *, tenant_scope_fingerprint: str | None = None) -> IdempotencyRecord | None:
        with self._transaction() as s:
            found = self._idempotency(s, key, tenant_scope_fingerprint)
        return None if found is None else found[0]

    # WorkflowLeaseStore

    def _lease(self, s: Sturdy, workflow_id: str, scope: str | None, lock: bool = False
               ) -> tuple[str | None, int, datetime, datetime, bool] | None:
        """The claim: owner, token, held_until, claimed_at, and whether it is
        valid past the clock tolerance."""
        rows = self._rows(s, "SELECT owner, token, held_until, claimed_at,"
                             " held_until > now() + %s * interval '1 second'"
                             " FROM sturdy.claims WHERE workflow = %s" + (" FOR UPDATE" if lock else ""),
                          (self._config.clock_tolerance_seconds, self._lease_workflow(workflow_id, scope)))
        return rows[0] if rows else None

    def _fence(self, s: Sturdy, workflow_id: str, scope: str | None, owner_id: str, token: int) -> None:
        lease = self._lease(s, workflow_id, scope, lock=True)
        if lease is None or lease[0] != owner_id or lease[1] != token or not lease[4]:
            raise SharedStoreError(SharedStoreErrorCode.FENCING_REJECTED,
                                   f"workflow '{workflow_id}' lease ownership was lost",
                                   details={"workflow_id": workflow_id})

    def acquire_lease(self, workflow_id: str, *, owner_id: str, tenant_scope_fingerprint: str | None = None,
                      ttl_seconds: float | None = None) -> WorkflowLease:
        validate_lease_identity(workflow_id, owner_id=owner_id, scope=tenant_scope_fingerprint)
        ttl = self._config.lease_ttl_seconds if ttl_seconds is None else ttl_seconds
        if not 1 <= ttl <= 86_400:
            raise ValueError("ttl_seconds must be from 1 to 86400")
        with self._transaction() as s:
            held = self._lease(s, workflow_id, tenant_scope_fingerprint, lock=True)
            # taken over only once the lease ended longer ago than the
            # tolerance (a released or forgotten one, without an owner, at once)
            if held is not None and held[0] is not None and self._rows(s, "SELECT %s::timestamptz > now() - %s * interval '1 second'",
                                               (held[2], self._config.clock_tolerance_seconds))[0][0]:
                raise SharedStoreError(SharedStoreErrorCode.LEASE_BUSY, f"workflow '{workflow_id}' lease is busy",
                                       details={"workflow_id": workflow_id})
            token = s.claim(self._lease_workflow(workflow_id, tenant_scope_fingerprint), f"{ttl} seconds", owner_id)
            if token is None:
                raise SharedStoreError(SharedStoreErrorCode.LEASE_BUSY, f"workflow '{workflow_id}' lease is busy",
                                       details={"workflow_id": workflow_id})
            lease = self._lease(s, workflow_id, tenant_scope_fingerprint)
            assert lease is not None
            return WorkflowLease(workflow_id=workflow_id, tenant_scope_fingerprint=tenant_scope_fingerprint,
                                 owner_id=owner_id, fencing_token=token, expires_at=lease[2], updated_at=lease[3])

    def renew_lease(self, workflow_id: str, *, owner_id: str, fencing_token: int,
                    tenant_scope_fingerprint: str | None = None) -> WorkflowLease:
        validate_lease_identity(workflow_id, owner_id=owner_id, scope=tenant_scope_fingerprint)
        with self._transaction() as s:
            held = self._lease(s, workflow_id, tenant_scope_fingerprint, lock=True)
            if held is None or held[0] is None:
                why = "has no lease"
            elif held[0] != owner_id or held[1] != fencing_token:
                why = "lease ownership was superseded"
            elif not held[4]:
                why = "lease has expired"
            else:
                until = s.renew(self._lease_workflow(workflow_id, tenant_scope_fingerprint), fencing_token,
                                f"{self._config.lease_ttl_seconds} seconds")
                if until is not None:
                    return WorkflowLease(workflow_id=workflow_id, tenant_scope_fingerprint=tenant_scope_fingerprint,
                                         owner_id=owner_id, fencing_token=fencing_token, expires_at=until,
                                         updated_at=self._rows(s, "SELECT now()")[0][0])
                why = "lease has expired"
            raise SharedStoreError(SharedStoreErrorCode.FENCING_REJECTED, f"workflow '{workflow_id}' {why}",
                                   details={"workflow_id": workflow_id})

    def release_lease(self, workflow_id: str, *, owner_id: str, fencing_token: int,
                      tenant_scope_fingerprint: str | None = None) -> bool:
        validate_lease_identity(workflow_id, owner_id=owner_id, scope=tenant_scope_fingerprint)
        with self._transaction() as s:
            held = self._lease(s, workflow_id, tenant_scope_fingerprint, lock=True)
            if held is None or held[0] != owner_id or held[1] != fencing_token:
                return False
            s.release(self._lease_workflow(workflow_id, tenant_scope_fingerprint), fencing_token)
            # released: no owner, the token kept
            self._rows(s, "UPDATE sturdy.claims SET owner = NULL WHERE workflow = %s",
                       (self._lease_workflow(workflow_id, tenant_scope_fingerprint),))
            return True

    def inspect_lease(self, workflow_id: str, *, tenant_scope_fingerprint: str | None = None) -> WorkflowLease | None:
        with self._transaction() as s:
            held = self._lease(s, workflow_id, tenant_scope_fingerprint)
        if held is None or held[0] is None:
            return None
        return WorkflowLease(workflow_id=workflow_id, tenant_scope_fingerprint=tenant_scope_fingerprint,
                             owner_id=held[0], fencing_token=held[1], expires_at=held[2], updated_at=held[3])


def _shared(e: BaseException) -> SharedStoreError:
    """A server or driver error as nl2data's store errors are: its code by
    kind, the message redacted."""
    if isinstance(e, Fenced):
        return SharedStoreError(SharedStoreErrorCode.FENCING_REJECTED, "workflow lease ownership was lost", cause=e)
    if isinstance(e, psycopg.errors.QueryCanceled):
        # (a statement past the command timeout, or one cancelled by the
        # server: nl2data's own mapping makes it STORE_TIMEOUT)
        return normalize_shared_error(e)
    if isinstance(e, psycopg.errors.UniqueViolation):
        return SharedStoreError(SharedStoreErrorCode.STATE_CONFLICT, "shared state conflict", cause=e)
    if isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError)):
        return SharedStoreError(SharedStoreErrorCode.STORE_UNAVAILABLE, "shared state backend is unreachable",
                                cause=e)
    return normalize_shared_error(e)
