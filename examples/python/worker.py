"""A pg_sturdy worker in Python, on the client (clients/python): each job's
three steps run once each (a step an earlier pass recorded is replayed, not
redone), then the pass finishes. Sleeps on LISTEN, or polls behind PgBouncer
(--poll); SIGTERM lets the job in hand finish (for up to 30 s), a second
SIGTERM hands it back at once. On Citus,
--on-queue-node takes on the node that holds the queue (sturdy.queue_node),
where a pass costs what it costs on one server; DSN is the coordinator.

    python3 worker.py DSN [QUEUE] [--poll] [--lease SECONDS] [--on-queue-node]
"""
import argparse
import os
from datetime import timedelta

from pg_sturdy import Worker

STEPS = ("reserve", "charge", "ship")


def handle(p):
    for i, step in enumerate(STEPS):
        p.step(step, lambda: {"step": step, "workflow": p.workflow, "pid": os.getpid(), "after": sorted(STEPS[:i])})


cli = argparse.ArgumentParser(description="A pg_sturdy worker.")
cli.add_argument("dsn")
cli.add_argument("queue", nargs="?", default="default")
cli.add_argument("--poll", action="store_true", help="poll instead of LISTEN (behind a transaction pooler)")
cli.add_argument("--lease", type=float, default=30, help="seconds between heartbeats times three")
cli.add_argument("--on-queue-node", action="store_true", help="on Citus: take on the node that holds the queue")
args = cli.parse_args()
Worker(args.dsn, args.queue, handle, lease=timedelta(seconds=args.lease), listen=not args.poll,
       on_queue_node=args.on_queue_node).run()
