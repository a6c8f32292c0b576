"""The model checker (model.py) for a fixed budget: randomized operations of
every kind from several connections at once, each step checked against the
queue's contract; a failure is shrunk and printed as SQL-ish lines.

  MODEL_SECONDS   the budget (default 60): `make test` spends about this per
                  PostgreSQL version; `make soak` runs model.py for longer
  MODEL_SEED      the first episode's seed (default: drawn, and printed)
  MODEL_SHRINK_SECONDS  time to shrink a failure (default 60)
  MODEL_AVOID, MODEL_TOLERATE, MODEL_MORE, MODEL_INJECT   as model.py's
                  --avoid, --tolerate, --more, --inject (model.py --help)
"""
import os
import random
import time

import pytest

import model


def test_the_queue_keeps_its_contract_under_random_concurrent_operations():
    seconds = float(os.environ.get("MODEL_SECONDS", "60"))
    seed = int(os.environ.get("MODEL_SEED") or random.randrange(1_000_000))
    shrink_seconds = float(os.environ.get("MODEL_SHRINK_SECONDS", "60"))
    print(f"\nmodel: seed {seed}, {seconds:g} s (MODEL_SEED={seed} to run the same episodes again)")
    started = time.monotonic()
    failure, episodes, steps = model.check(seconds, seed, shrink_seconds=shrink_seconds,
                                           out=lambda t: print(t, flush=True))
    print("model: seen: " + ", ".join(f"{k} {v}" for k, v in sorted(model.STATS.items())))
    print(f"model: {episodes} episodes, {steps} operations in {time.monotonic() - started:.1f} s, seed {seed}")
    if failure:
        lines = failure.splitlines()
        shrunk = [i for i, l in enumerate(lines) if l.startswith("model: shrunk from")]
        pytest.fail("\n".join(lines[:1] + (lines[shrunk[0]:] if shrunk else [])), pytrace=False)
