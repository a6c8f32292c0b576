#!/usr/bin/env python3
"""The demo's second act: a worker that sleeps on LISTEN instead of polling.

The worker's take finds nothing, which tells pg_sturdy a worker waits on the
queue; a workflow is scheduled and its NOTIFY wakes the worker (blocked on
`LISTEN sturdy`), which takes it with a claim, records two steps and suspends itself with wake_at until an
approval arrives. The approval comes through arrive (value and wakeup in one
commit); the NOTIFY wakes the worker, which finishes the workflow with done.

  scripts/demo_worker.py "host=... port=... user=... dbname=..."
"""
import json
import sys
import threading
import time

import psycopg

DSN = sys.argv[1]
QUEUE = "orders"
T0 = time.monotonic()


def say(who, text):
    print(f"  [{time.monotonic() - T0:5.2f}s] {who:8} {text}", flush=True)


def one_pass(c, workflow, receipt, token):
    """What a worker does with one taken workflow; returns when the pass ends."""
    steps = dict(c.execute("SELECT step, value FROM sturdy.load(%s)", (workflow,)).fetchall())
    say("worker", f"took {workflow} (token {token}); done so far: {sorted(steps) or 'nothing'}")
    if "approval" not in steps:
        for step, value in [("validate", '{"ok": true}'), ("reserve-stock", '{"sku": "X-1", "qty": 2}')]:
            if step not in steps:
                c.execute("SELECT * FROM sturdy.record(%s, %s, %s, %s)", (workflow, step, value, token))
                say("worker", f"recorded {step}")
        (suspended,) = c.execute(
            "SELECT sturdy.wake_at(%s, %s, now() + interval '1 hour', %s)", (workflow, receipt, QUEUE)
        ).fetchone()
        c.execute("SELECT sturdy.release(%s, %s)", (workflow, token))
        say("worker", f"waiting for an approval: wake_at(+1 hour) -> {suspended}; claim released")
        return False
    c.execute("SELECT * FROM sturdy.record(%s, 'ship', '{\"carrier\": \"ups\"}', %s)", (workflow, token))
    (finished,) = c.execute("SELECT sturdy.done(%s, %s, %s)", (workflow, receipt, QUEUE)).fetchone()
    c.execute("SELECT sturdy.release(%s, %s)", (workflow, token))
    say("worker", f"approved by {steps['approval']['by']}: recorded ship, done -> {finished}")
    return True


def worker(listening, finished):
    with psycopg.connect(DSN, autocommit=True) as c:
        c.execute("LISTEN sturdy")
        while not finished.is_set():
            while rows := c.execute(
                "SELECT workflow, receipt, token FROM sturdy.take(%s, '30 seconds', 10, claim => true)", (QUEUE,)
            ).fetchall():
                for workflow, receipt, token in rows:
                    if one_pass(c, workflow, receipt, token):
                        finished.set()
            if finished.is_set():
                return
            # the take that found nothing told pg_sturdy a worker is waiting on
            # this queue: the next schedule there sends one NOTIFY
            say("worker", "queue empty: idle, blocked on LISTEN sturdy (a real worker also polls)")
            listening.set()
            woken = [n.payload for n in c.notifies(timeout=10, stop_after=1)]
            if not woken:
                say("worker", "no wakeup in 10 s; giving up")
                return
            say("worker", f"woken: NOTIFY sturdy, '{woken[0]}'")


def main():
    listening, finished = threading.Event(), threading.Event()
    t = threading.Thread(target=worker, args=(listening, finished))
    t.start()
    listening.wait()
    with psycopg.connect(DSN, autocommit=True) as app:
        app.execute("SELECT sturdy.schedule('order-7', queue => %s)", (QUEUE,))
        say("app", "schedule('order-7', queue => 'orders')")
        time.sleep(1.0)
        ready, leased, sleeping = app.execute(
            "SELECT ready, leased, sleeping FROM sturdy.queue_stats WHERE queue = %s", (QUEUE,)
        ).fetchone()
        say("app", f"queue_stats: ready {ready}, leased {leased}, sleeping {sleeping}")
        app.execute("SELECT sturdy.arrive('order-7', 'approval', '{\"by\": \"dana\"}', %s)", (QUEUE,))
        say("webhook", "arrive('order-7', 'approval', {\"by\": \"dana\"}) -- value and wakeup in one commit")
    t.join()
    with psycopg.connect(DSN, autocommit=True) as c:
        for step, value in c.execute("SELECT step, value FROM sturdy.load('order-7')"):
            say("history", f"{step:14} {json.dumps(value)}")
        (left,) = c.execute("SELECT count(*) FROM sturdy.queue WHERE queue = %s", (QUEUE,)).fetchone()
        say("app", f"rows left in queue '{QUEUE}': {left}")
    sys.exit(0 if finished.is_set() else 1)


if __name__ == "__main__":
    main()
