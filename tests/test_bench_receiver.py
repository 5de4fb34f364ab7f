"""The receiver benchmark runs end to end in quick mode and reports every metric.

Timing thresholds are never asserted: the machines are shared and noisy.
"""

from __future__ import annotations

import json
import math
import os

import pytest

from benchmarks.receiver import (
    DURABLE_METRICS,
    METRICS,
    format_receiver_table,
    percentile,
    run_receiver_bench,
)
from otel_replay.capture.receiver_workers import auto_workers


@pytest.fixture(scope="module", params=[("encoded", None), ("exporter", 1)], ids=["encoded-workers", "exporter-1"])
def result(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    client, workers = request.param
    out = run_receiver_bench(quick=True, store_dir=tmp_path_factory.mktemp("bench"), workers=workers, client=client)
    assert out["client"] == client and out["workers"] == (workers or auto_workers())
    return out


def test_every_metric_is_reported_with_its_target_and_baseline(result: dict) -> None:
    assert set(result["metrics"]) == set(METRICS)
    for key, (label, unit, target, op) in METRICS.items():
        metric = result["metrics"][key]
        assert (metric["label"], metric["unit"], metric["target"], metric["op"]) == (label, unit, target, op)
        assert metric["passed"] in ((None,) if target is None else (True, False)), key
        for field in ("receiver", "baseline", "ratio_vs_baseline"):
            assert isinstance(metric[field], float) and math.isfinite(metric[field]) and metric[field] > 0, (key, field)


def test_the_run_did_what_it_claims(result: dict) -> None:
    assert result["quick"] is True and "discards" in result["baseline"]
    assert len(result["rounds"]) == result["sizes"]["rounds"]
    for round_ in result["rounds"]:
        assert 0 < round_["received_s"] <= round_["stored_s"] and round_["baseline_s"] > 0
        # the receiver decoded and stored every span in that time: its CPU for them is not zero, and no
        # more than every core busy for the whole round allows (+ a margin for the clock's ticks)
        cpu_s = round_["cpu_us_per_span"] * result["sizes"]["spans"] / 1e6
        assert 0 < cpu_s <= round_["stored_s"] * (os.cpu_count() or 1) + 0.1
    assert result["request_bytes_per_round"] > result["sizes"]["spans"] * result["payload_bytes_per_span"] * 0.8
    assert json.loads(json.dumps(result))["metrics"].keys() == result["metrics"].keys()
    assert result["costs"]["client_encode_us"] > 0 and result["costs"]["receiver_decode_us"] > 0


def test_durable_mode_ran_on_the_same_load_and_is_compared_with_the_in_memory_one(result: dict) -> None:
    """Each round ran the in-memory and the durable receiver on the same spans; every row holds both
    modes and their per-round ratio (no threshold: a ratio, not a time, is the figure)."""
    assert set(result["durable"]) == set(DURABLE_METRICS)
    for round_ in result["rounds"]:
        durable = round_["durable"]
        assert 0 < durable["received_s"] <= durable["stored_s"] and durable["written_twice"] >= 0
        for r in (round_, durable):
            assert 0 < r["p50_latency_ms"] <= r["p99_latency_ms"]
    for key, (label, unit, _) in DURABLE_METRICS.items():
        row = result["durable"][key]
        assert (row["label"], row["unit"]) == (label, unit)
        assert all(isinstance(row[f], float) and math.isfinite(row[f]) and row[f] > 0 for f in ("memory", "durable", "ratio"))
    if len(result["rounds"]) == 1:  # the ratio is the one round's
        r = result["rounds"][0]
        spans = result["sizes"]["spans"]
        assert math.isclose(result["durable"]["accepted_spans_per_s"]["ratio"],
                            (spans / r["durable"]["received_s"]) / (spans / r["received_s"]))
    table = format_receiver_table(result)
    assert "--durable vs in-memory, same run and load" in table and "durable / in-memory" in table
    for label, *_ in DURABLE_METRICS.values():
        assert label in table


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) == 0.0


def test_table_names_every_metric_and_both_servers(result: dict) -> None:
    table = format_receiver_table(result)
    for label, *_ in METRICS.values():
        assert label in table
    assert "OtlpReceiver" in table and result["baseline"] in table
    assert "pass" in table or "FAIL" in table
    assert "the exporter encodes one in" in table
    assert "CPU per stored span (" + ("its workers' processes" if result["workers"] > 1 else "the receiver's process") in table
    assert f"a fixed miniature of record work took {result['machine']['record_work_ms']:.1f} ms" in table
    assert f"OtlpReceiver(workers={result['workers']})" in table
    assert ("requests encoded (OTLP protobuf) before the clock" if result["client"] == "encoded"
            else "the Python SDK's exporter") in table
    header, rule = table.splitlines()[:2]
    assert header.startswith("| metric") and set(rule) <= {"|", "-"}


def test_an_unknown_client_is_refused() -> None:
    with pytest.raises(ValueError, match="encoded, exporter"):
        run_receiver_bench(quick=True, client="curl")
