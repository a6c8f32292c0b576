"""`python -m pg_sturdy worker module:app --queue orders --concurrency 8 --drain 30s`

Runs the worker of an `App` (or of a handler function, with `--dsn` and
`--queue`) until SIGTERM or SIGINT: the first lets the passes in flight
finish for `--drain`, the second hands them back at once. Logs to stderr,
one record per pass failed with its traceback. Exits 0 after a stop, 1
when the worker cannot serve (`WorkerFailed`), 2 for a bad command line.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib
import inspect
import logging
import os
import re
import sys
from typing import Any

from .aio import AsyncWorker
from .app import App
from .worker import Worker, WorkerFailed

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """Seconds from `30`, `30s`, `500ms`, `2m`, `1h`."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(ms|s|m|min|h)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (30, 30s, 500ms, 2m, 1h)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def load(target: str) -> Any:
    """The object `module:attribute` names (the current directory first on
    the import path, as `python -m` has it)."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise SystemExit(f"pg_sturdy: {target!r}: name it as module:attribute (e.g. myapp.tasks:app)")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pg_sturdy", description="pg_sturdy's worker.")
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="run the worker of an App, or of a handler function")
    w.add_argument("target", help="module:attribute, an App or a handler function")
    w.add_argument("--queue", help="the queue to take from (default: the App's)")
    w.add_argument("--dsn", help="libpq connection string (default: the App's; for a function, PG* variables)")
    w.add_argument("--concurrency", type=int, default=1, help="passes at a time (default 1)")
    w.add_argument("--drain", type=duration, default=30.0, help="how long a stop waits for passes (default 30s)")
    w.add_argument("--lease", type=duration, default=30.0, help="each pass's lease (default 30s)")
    w.add_argument("--give-up", type=duration, default=300.0,
                   help="exit 1 after this long without a successful take (default 300s)")
    w.add_argument("--no-listen", action="store_true", help="poll instead of LISTEN (behind PgBouncer)")
    w.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(threadName)s: %(message)s")
    target = load(args.target)
    options: dict[str, Any] = dict(concurrency=args.concurrency, drain=args.drain, give_up=args.give_up,
                                   lease=dt.timedelta(seconds=args.lease), listen=not args.no_listen)
    if isinstance(target, App):
        if args.dsn:
            target.dsn = args.dsn
        if args.queue:
            target.queue = args.queue
        worker = target.worker(**options)
    elif callable(target):
        if not args.queue:
            raise SystemExit("pg_sturdy: a handler function needs --queue")
        cls = AsyncWorker if inspect.iscoroutinefunction(target) else Worker
        worker = cls(args.dsn or "", args.queue, target, **options)
    else:
        raise SystemExit(f"pg_sturdy: {args.target} is neither an App nor a handler function")
    log = logging.getLogger("pg_sturdy")
    log.info("worker on queue %s, %d at a time", worker.queue, worker.concurrency)
    try:
        if isinstance(worker, AsyncWorker):
            asyncio.run(worker.serve())
        else:
            worker.run()
    except WorkerFailed as e:
        log.error("%s", e)
        return 1
    log.info("worker on queue %s stopped", worker.queue)
    return 0


if __name__ == "__main__":
    sys.exit(main())
