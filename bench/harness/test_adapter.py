"""The harness adapter's output and arithmetic, without a server: its
records have exactly the fields CONTRIBUTING_ADAPTERS.md documents (and,
where `HARNESS` names a checkout of the harness, its own parser reads them
as samples), every tick carries the required metrics with their windows,
the latency histogram keeps 3 significant figures in bounded memory, and
the producer credits offered load on real elapsed time."""
import json
import os
import random
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import main as adapter  # noqa: E402

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
# the fields of the documented records (CONTRIBUTING_ADAPTERS.md, "JSONL
# out"), and instance_id, which the harness reads when present
DESCRIPTOR = {"kind", "system", "event_tables", "extensions", "version", "schema_version", "db_name",
              "started_at", "instance_id"}
SAMPLE = {"t", "system", "kind", "subject_kind", "subject", "metric", "value", "window_s", "instance_id"}
REQUIRED = {"claim_p50_ms": 30.0, "claim_p95_ms": 30.0, "claim_p99_ms": 30.0, "enqueue_rate": None,
            "completion_rate": None, "queue_depth": 0.0}


def test_the_descriptor_has_the_documented_fields_and_the_manifests_tables():
    d = adapter.descriptor("v", "0.2.0", "pg_sturdy_bench", 0, 1765100000.123)
    assert set(d) == DESCRIPTOR
    assert d["kind"] == "descriptor" and d["system"] == "pg_sturdy"
    assert ISO.match(d["started_at"]) and d["started_at"] == "2025-12-07T09:33:20.123Z"
    manifest = json.load(open(os.path.join(HERE, "adapter.json")))
    # the harness aborts a run whose descriptor drops a table or extension of the manifest
    assert set(manifest["event_tables"]) <= set(d["event_tables"])
    assert set(manifest["extensions"]) <= set(d["extensions"])
    assert d["event_tables"][0] == "sturdy.queue", "the hot table first: active readers scan it"
    assert json.loads(json.dumps(d)) == d


@pytest.mark.parametrize("instance", [0, 1])
def test_every_tick_carries_the_required_metrics_with_their_windows(monkeypatch, instance):
    monkeypatch.setenv("SAMPLE_EVERY_S", "5")
    monkeypatch.setenv("BENCH_INSTANCE_ID", str(instance))
    a = adapter.Adapter()
    for ms in (1.0, 2.0, 3.0, 100.0):
        a.claim.add(ms)
    a.depth = 42
    records = a.tick_records(1765100005.0, enqueued=4000, completed=3500)
    by_metric = {r["metric"]: r for r in records}
    for r in records:
        assert set(r) == SAMPLE, r
        assert r["kind"] == "adapter" and r["subject_kind"] == "adapter" and r["subject"] == ""
        assert ISO.match(r["t"]) and isinstance(r["value"], float) and isinstance(r["window_s"], float)
        assert r["instance_id"] == instance
    required = set(REQUIRED) - ({"queue_depth"} if instance else set())
    assert required <= set(by_metric), "the observer metrics come from instance 0 only"
    assert by_metric["enqueue_rate"]["value"] == 800.0 and by_metric["enqueue_rate"]["window_s"] == 5.0
    assert by_metric["completion_rate"]["value"] == 700.0 and by_metric["completion_rate"]["window_s"] == 5.0
    assert by_metric["claim_p50_ms"]["value"] == 2.0 and by_metric["claim_p99_ms"]["value"] == 100.0
    assert all(by_metric[m]["window_s"] == 30.0 for m in ("claim_p50_ms", "claim_p95_ms", "claim_p99_ms"))
    if instance == 0:
        assert by_metric["queue_depth"]["value"] == 42.0 and by_metric["queue_depth"]["window_s"] == 0.0


def test_the_harness_parses_the_records_as_samples():
    harness = os.environ.get("HARNESS")
    if not harness:
        pytest.skip("HARNESS not set: the harness's own parser is not here")
    sys.path.insert(0, harness)
    from bench_harness.metrics import parse_adapter_record

    a = adapter.Adapter()
    a.claim.add(5.0)
    for r in a.tick_records(1765100005.0, 10, 10):
        sample = parse_adapter_record(json.dumps(r), run_id="t", expected_system="pg_sturdy", bench_start=0.0,
                                      get_phase=lambda: ("clean", "clean"))
        assert sample is not None, r


def test_the_rolling_window_forgets_what_is_older_than_thirty_seconds(monkeypatch):
    monkeypatch.setenv("SAMPLE_EVERY_S", "5")
    a = adapter.Adapter()
    a.claim.add(1000.0)
    assert a.claim.roll().percentile(99) == 1000.0
    for _ in range(6):
        a.claim.add(1.0)
        window = a.claim.roll()
    assert window.percentile(99) == 1.0, "six ticks of 5 s later the slow one is out of the window"


def test_the_histogram_keeps_three_significant_figures_in_bounded_memory():
    rng = random.Random(7)
    values = [rng.lognormvariate(0, 2) for _ in range(200_000)]
    h = adapter.Histogram()
    for v in values:
        h.add(v)
    values.sort()
    for p in (50, 95, 99, 99.9):
        exact = values[int(p / 100 * len(values)) - 1]
        assert abs(h.percentile(p) - exact) <= 0.01 * exact, (p, h.percentile(p), exact)
    decades = {k[0] for k in h.counts}
    assert len(h.counts) <= 900 * len(decades), "at most 900 keys a decade"


def test_the_producer_credits_offered_load_on_real_elapsed_time():
    now = [0.0]
    credit = adapter.Credit(clock=lambda: now[0])
    rng = random.Random(3)
    sent = 0
    while now[0] < 60.0:
        now[0] += rng.choice([0.001, 0.025, 0.025, 0.2, 1.3])  # stalls included
        sent += credit.take(800.0)
    assert abs(sent - 800.0 * now[0]) < 1.0, (sent, 800.0 * now[0])
