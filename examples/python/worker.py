"""A pg_sturdy worker in Python (psycopg 3). Takes each job with a claim,
does its steps once each (a step recorded by an earlier pass is not done
again), finishes it; sleeps on LISTEN when the queue is empty, or polls
with backoff (--poll: behind PgBouncer in transaction mode, which cannot
LISTEN). SIGTERM ends it cleanly: a job in hand is handed back at once.

    python3 worker.py DSN [QUEUE] [--poll] [--lease SECONDS]
"""
import argparse
import os
import signal
import time
from datetime import timedelta

import psycopg
from psycopg.types.json import Jsonb

STEPS = ("reserve", "charge", "ship")


def do_step(step, workflow, done):
    """The job's real work: here, a value saying who did it after what."""
    return {"step": step, "workflow": workflow, "pid": os.getpid(), "after": sorted(done)}


def run_pass(conn, queue, workflow, receipt, token, stopping):
    done = {step for (step,) in conn.execute("SELECT step FROM sturdy.load(%s)", (workflow,))}
    for step in STEPS:
        if stopping():  # hand the job back now, not when its lease ends
            conn.execute("SELECT sturdy.wake_at(%s, %s, now(), %s)", (workflow, receipt, queue))
            conn.execute("SELECT sturdy.release(%s, %s)", (workflow, token))
            return
        if step not in done:
            value = Jsonb(do_step(step, workflow, done))
            conn.execute("SELECT recorded FROM sturdy.record(%s, %s, %s, %s)", (workflow, step, value, token))
            done.add(step)
    conn.execute("SELECT sturdy.finish(%s, %s, %s, queue => %s)", (workflow, token, receipt, queue))


def main():
    cli = argparse.ArgumentParser(description="A pg_sturdy worker.")
    cli.add_argument("dsn")
    cli.add_argument("queue", nargs="?", default="default")
    cli.add_argument("--poll", action="store_true", help="poll instead of LISTEN (behind a transaction pooler)")
    cli.add_argument("--lease", type=float, default=30, help="seconds a pass may take before another may take over")
    args = cli.parse_args()
    queue, poll, lease = args.queue, args.poll, timedelta(seconds=args.lease)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    # prepare_threshold=None: no named prepared statements, which PgBouncer
    # 1.18 in transaction mode cannot carry from one server connection to the next
    conn = psycopg.connect(args.dsn, autocommit=True, prepare_threshold=None)
    if not poll:
        conn.execute("LISTEN sturdy")
    backoff = 0.05
    while not stop:
        job = conn.execute("SELECT workflow, receipt, token FROM sturdy.take(%s, %s,"
                           " claim => true, wake => %s)", (queue, lease, not poll)).fetchone()
        if job is None:
            if poll:  # nobody can wake a poller: back off up to a second
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
            else:  # the empty take asked for a NOTIFY; the timeout catches a missed one
                for _ in conn.notifies(timeout=1, stop_after=1):
                    pass
            continue
        backoff = 0.05
        workflow, receipt, token = job
        if token is None:  # another pass still holds the workflow: the row comes back later
            continue
        try:
            run_pass(conn, queue, workflow, receipt, token, lambda: bool(stop))
        except psycopg.Error as e:
            if e.sqlstate != "SD001":
                raise
            # fenced: a newer pass owns the workflow; drop this one
    conn.close()


if __name__ == "__main__":
    main()
