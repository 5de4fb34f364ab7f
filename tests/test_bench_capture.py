"""The capture benchmark runs end to end in quick mode and reports every metric.

Timing thresholds are never asserted: the machines are shared and noisy.
"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.capture import METRICS, format_capture_table, run_capture_bench


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_capture_bench(quick=True, store_dir=tmp_path_factory.mktemp("bench"))


def test_every_metric_is_reported_with_its_target(result: dict) -> None:
    assert set(result["metrics"]) == set(METRICS)
    for key, (label, unit, target, op) in METRICS.items():
        metric = result["metrics"][key]
        assert metric["label"] == label
        assert metric["unit"] == unit
        assert metric["target"] == target
        assert metric["op"] == op
        assert metric["passed"] in ((None,) if target is None else (True, False)), key


def test_numbers_are_positive_and_finite(result: dict) -> None:
    for key, metric in result["metrics"].items():
        for field in ("replay", "batch", "ratio_vs_batch"):
            value = metric.get(field)
            if field == "replay" or value is not None:
                assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, field, value)


def test_baseline_and_ratios_are_present(result: dict) -> None:
    assert "BatchSpanProcessor" in result["baseline"]
    paired = ("on_end_genai_4kb", "on_end_genai_50kb", "on_end_ignored", "on_end_dropping",
              "producer_slowdown", "writer_spans_per_s", "stored_vs_raw")
    for key in paired:
        assert result["metrics"][key]["batch"] > 0, key
        assert result["metrics"][key]["ratio_vs_batch"] > 0, key


def test_the_run_did_what_it_claims(result: dict) -> None:
    metrics = result["metrics"]
    assert metrics["on_end_genai_50kb"]["payload_bytes"] > 10 * metrics["on_end_genai_4kb"]["payload_bytes"]
    assert 3000 < metrics["on_end_genai_4kb"]["payload_bytes"] < 6000
    assert metrics["on_end_dropping"]["replay_dropped_fraction"] > 0.5
    assert result["writer"]["written_spans"] == result["writer"]["spans"]
    assert result["writer"]["stored_bytes_per_round"] > 0
    stages = result["writer"]["stages"]
    assert stages["spans"] == result["writer"]["spans"]
    assert all(us > 0 for us in stages["us_per_span"].values())
    assert stages["total_us_per_span"] == pytest.approx(sum(stages["us_per_span"].values()))
    assert stages["parquet_write_ceiling_spans_per_s"] > stages["spans_per_thread_s"]
    storage = result["storage"]
    assert storage["steps"] == 2 * 20 * storage["runs"]
    assert 0 < storage["stored_bytes"] < storage["raw_bytes"]
    assert {"message_rows", "span_rows", "step_rows"} <= set(storage["stored_bytes_by_table"])
    assert result["machine"]["cpus"] >= 1
    assert result["quick"] is True


def test_result_is_json_ready(result: dict) -> None:
    assert json.loads(json.dumps(result))["metrics"].keys() == result["metrics"].keys()


def test_table_names_every_metric_and_both_processors(result: dict) -> None:
    table = format_capture_table(result)
    for label, *_ in METRICS.values():
        assert label in table
    assert "ReplayProcessor" in table and "BatchSpanProcessor" in table
    assert "pass" in table or "FAIL" in table
    assert "Writer stages, µs per span" in table and "parquet write" in table
    assert f"a fixed miniature of record work took {result['machine']['record_work_ms']:.1f} ms" in table
    header, rule = table.splitlines()[:2]
    assert header.startswith("| metric") and set(rule) <= {"|", "-"}


def test_beside_the_otlp_exporter_both_sides_are_measured(result: dict) -> None:
    versus = result["versus_otlp"]
    # every span reached disk in each CPU round (the bench raises otherwise), and both start-ups ran
    assert versus["cpu"]["replay_us"] > 0 and versus["cpu"]["otlp_us"] > 0 and versus["cpu"]["spans"] > 0
    assert versus["startup"]["replay_s"] > 0 and versus["startup"]["otel_s"] > 0
    table = format_capture_table(result)
    assert "start-up: import and create" in table and "CPU per distinct 4 KB GenAI span" in table
