"""The contract's errors as Python exceptions.

Every call raises one of these for an error the extension raises on
purpose, with the server's message and hint and its SQLSTATE in
`sqlstate`; anything else (a lost connection, a lock timeout) comes
through as psycopg raised it.
"""
from __future__ import annotations

import psycopg


class SturdyError(Exception):
    """An error pg_sturdy raised, with its SQLSTATE."""

    sqlstate: str | None

    def __init__(self, message: str, sqlstate: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.hint = hint


class Fenced(SturdyError):
    """SD001: the pass's token is no longer the workflow's current one (its
    claim was taken over, released or fenced). Stop the pass: nothing it
    writes lands."""


class Conflict(SturdyError):
    """SD002: the instance is already in a terminal status; nothing was
    written."""


class InvalidArgument(SturdyError, ValueError):
    """A class-22 error: an argument the extension refuses (NULL where one
    is required, an empty name, a lease that does not end after now, a
    value past its documented maximum). Nothing was written."""


class MissingObject(SturdyError, LookupError):
    """42P01/42883/42704: a table, function or role the call names does not
    exist."""


def translate(e: psycopg.Error) -> BaseException:
    """The exception to raise for `e`: one of ours where its SQLSTATE is
    one of the contract's, else `e` itself."""
    state = e.sqlstate
    if state is None:
        return e
    diag = e.diag
    message = diag.message_primary or str(e)
    hint = diag.message_hint
    if state == "SD001":
        return Fenced(message, state, hint)
    if state == "SD002":
        return Conflict(message, state, hint)
    if state.startswith("22"):
        return InvalidArgument(message, state, hint)
    if state in ("42P01", "42883", "42704"):
        return MissingObject(message, state, hint)
    return e
