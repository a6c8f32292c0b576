"""What a handler sees of its pass, and how it says how the pass ends.

`Pass` (sync) and `AsyncPass` (asyncio) share everything but the waiting
for the server: the checkpoints read once a pass, the instance read at
most once, step values made JSON by one encoder, and the errors below.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import threading
import uuid
from typing import Any, Callable, TypeVar

from psycopg.types.json import Jsonb

from .calls import Receipt

T = TypeVar("T")

# A wait with no deadline sleeps this long at most between looks: a value
# that arrives wakes it at once (`arrive` schedules the workflow).
NO_DEADLINE = dt.timedelta(days=3650)

# The checkpoint a handler's return value is recorded under (by `finish`, in
# the commit that ends the pass), which `Handle.result()` reads.
RESULT_STEP = "$result"


class WaitTimeout(Exception):
    """`wait_for`'s deadline passed with no value. Catch it to take another
    path; left uncaught it fails the workflow without a retry (a retry
    would reach the same passed deadline at once)."""


class DoNotRetry(Exception):
    """Raise it (or a subclass) for a failure no retry can mend: the
    workflow ends now instead of at the queue's `max_attempts`. An
    instance moves to `failed` with the error; a workflow of your own has
    its queue row removed and the error recorded as its `$error`
    checkpoint."""


class RetryAfter(Exception):
    """Raise it to fail this attempt and be taken again at a time of your
    choosing (`delay`: seconds or a timedelta from now, or an aware
    datetime) rather than after the queue's backoff. It counts as a failed
    attempt, so `max_attempts` still ends a workflow that never succeeds."""

    def __init__(self, delay: float | dt.timedelta | dt.datetime, message: str = ""):
        super().__init__(message or f"retry after {delay}")
        self.delay = delay

    def at(self, now: dt.datetime) -> dt.datetime:
        """The retry time, given the server's now."""
        d = self.delay
        if isinstance(d, dt.datetime):
            return d
        return now + (d if isinstance(d, dt.timedelta) else dt.timedelta(seconds=float(d)))


class NotJSON(DoNotRetry, TypeError):
    """A step's value the encoder cannot make JSON. Raised after the step's
    function ran and before anything is recorded; the workflow fails
    without a retry, which would run the function again."""


class Waiting(BaseException):
    """Ends the pass until `at` (raised by `wait_for` and `sleep`; a
    BaseException, so a handler's `except Exception` does not swallow
    it)."""

    def __init__(self, at: dt.datetime):
        self.at = at


def encode(value: Any) -> Any:
    """The default encoder of step values and results beyond what `json`
    takes: datetimes, dates and times as ISO 8601 text, UUIDs and Decimals
    as text, sets as sorted lists, enums by value, dataclasses as objects.
    Anything else raises `TypeError` (then `NotJSON`)."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    if isinstance(value, (set, frozenset)):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


class Json:
    """Values to jsonb and back through one encoder (`default`, as
    `json.dumps` takes it): what a step records is what a replay
    returns, so a step returns the value as JSON gave it back, its first
    run included."""

    def __init__(self, default: Callable[[Any], Any] | None = encode):
        self.default = default

    def dumps(self, value: Any, what: str) -> Jsonb:
        try:
            text = json.dumps(value, default=self.default, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise NotJSON(f"{what} is not JSON: {e}") from e
        return Jsonb(value, dumps=lambda _: text)

    def roundtrip(self, value: Any, what: str) -> Any:
        """The value as the server will give it back."""
        return json.loads(self.dumps(value, what).dumps(value))


class Instance:
    """The workflow instance a pass belongs to (`sturdy.start`'s row)."""

    __slots__ = ("id", "process", "business_key", "variables")

    def __init__(self, id: int, process: str, business_key: str, variables: dict[str, Any]):
        self.id, self.process, self.business_key, self.variables = id, process, business_key, variables

    def __repr__(self) -> str:
        return f"Instance(id={self.id}, process={self.process!r}, business_key={self.business_key!r})"


INSTANCE_SQL = "SELECT id, process, business_key, variables FROM sturdy.instances WHERE workflow = %s"


def process_of(workflow: str) -> str:
    """The process a workflow runs, from its name: a started instance's
    workflow is `process/<id>`, so the name up to its last `/` (the whole
    name where it has none)."""
    head, sep, _ = workflow.rpartition("/")
    return head if sep and head else workflow


class PassBase:
    """What a pass is, sync or async alike."""

    def __init__(self, queue: str, workflow: str, receipt: Receipt, token: int | None, attempt: int,
                 json_: Json, input: Any = None):
        self.queue = queue
        # the job's input (`schedule_many`), as `take` handed it out
        self.input = input
        self.workflow = workflow
        self.receipt = receipt
        self.token = token
        self.attempt = attempt
        self.status: str | None = None
        self.result: Any = None
        self.json = json_
        self._lock = threading.Lock()
        self._ended = False
        self._steps: dict[str, Any] | None = None
        self._instance: Instance | None | bool = False  # False: not read yet
        self._sleeps = 0

    @property
    def process(self) -> str:
        """The process this pass runs, read from the workflow's name (no
        round trip): `process/<instance id>` for a started instance."""
        return process_of(self.workflow)

    def _token(self) -> int:
        if self.token is None:
            raise RuntimeError("steps need the pass's claim: take with claim=True")
        return self.token

    def _sleep_name(self, name: str | None) -> str:
        self._sleeps += 1
        return name if name is not None else f"sleep.{self._sleeps}"

    @staticmethod
    def _deadline(now: dt.datetime, duration: dt.timedelta | float) -> str:
        d = duration if isinstance(duration, dt.timedelta) else dt.timedelta(seconds=float(duration))
        return (now + d).isoformat()
