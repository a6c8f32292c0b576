"""The test's three-step workflow with a wait for an approval, as a user
writes it (test_worker.py runs it in processes it kills):

    python3 flow_worker.py DSN QUEUE
"""
import os
import sys
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
from pg_sturdy import Worker  # noqa: E402


def order(p):
    effect = "client_test.effect(jsonb)"  # inserts a row, in the transaction that records the step
    p.transact("reserve", effect, {"workflow": p.workflow, "step": "reserve"})
    approved = p.wait_for("approval", within=timedelta(minutes=10))
    p.transact("charge", effect, {"workflow": p.workflow, "step": "charge", "approved": approved})
    p.transact("ship", effect, {"workflow": p.workflow, "step": "ship"})


Worker(sys.argv[1], sys.argv[2], order, lease=timedelta(seconds=2), status="succeeded").run()
