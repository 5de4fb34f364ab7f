"""The reliability benchmark runs end to end and reports every figure the issue asks for.

The default test runs tiny sizes (one store failure, two kills); the quick run, which is what
`otel-replay bench reliability --quick` does, is marked slow. Timings are never asserted.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from otel_replay.bench.reliability import (
    QUICK,
    format_reliability_table,
    fuzz_figures,
    fuzz_text,
    run_reliability_bench,
)
from otel_replay.cli import main as cli

TINY = replace(QUICK, overload_s=1.5, fault_s=0.3, kills=2, max_kill_delay_s=0.6, read_s=1, damaged=4, fuzz_s=0,
               kinds=("deleted",))


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_reliability_bench(quick=True, store_dir=tmp_path_factory.mktemp("reliability"), sizes=TINY)


def test_every_part_reports_and_holds(result: dict) -> None:
    overload, crashes = result["overload"], result["crashes"]
    assert overload["peak_held_bytes"] <= overload["queue_bytes"] < overload["cap_bytes"]
    assert overload["rss_growth"] <= overload["memory_bound"] == overload["cap_bytes"]  # the cap bounds it all
    assert overload["dropped"] + overload["accepted"] == overload["offered"] and overload["dropped"] > 0
    assert overload["exceptions"] == []
    assert result["failures"]["deleted"]["exceptions"] == 0 and result["failures"]["deleted"]["resumed"]
    assert crashes["kills"] == 2 and crashes["survived"] == 2 and crashes["lost_flushed_max"] == 0
    assert result["readers"]["errors"] == [] and result["readers"]["partial_batches_seen"] == 0
    assert [k["after"] for k in result["torn"]["kills"]] == ["message_rows", "span_rows"]
    assert all(k["visible_rows"] == 0 and k["torn_found"] == 1 and k["stored_steps"] == result["torn"]["spans"]
               for k in result["torn"]["kills"])
    assert result["corruption"]["undetected_harmful"] == 0 and result["corruption"]["clean_after_doctor"]
    assert result["fuzz"] == {"available": False, "why": "not run (no time given)"}
    assert set(result["seconds"]) == {"overload", "failures", "crashes", "readers", "torn", "corruption", "fuzz"}


def test_table_names_every_figure(result: dict) -> None:
    table = format_reliability_table(result)
    for label in ("overload: byte cap vs peak held", "overload: drops counted", "overload: resident memory growth",
                  "service thread span.end()", "store failure: deleted", "crashes: kill -9 while writing",
                  "crashes: spans lost beyond the unflushed queue", "readers during writes",
                  "batches seen in part", "torn batch: import killed after its span segment",
                  "damaged segments: found by doctor", "inputs fuzzed (count, time)"):
        assert label in table
    header, rule = table.splitlines()[:2]
    assert header.startswith("| figure") and set(rule) <= {"|", "-"}
    # the offered rate is a timing (how fast this loaded machine ends spans in 1.5 s): not asserted
    held = [line for line in table.split("inputs fuzzed")[0].splitlines() if "overload: offered" not in line]
    assert "FAIL" not in "\n".join(held).replace("store failure", ""), table


def test_result_is_json_ready(result: dict) -> None:
    assert json.loads(json.dumps(result))["crashes"]["kills"] == 2


def test_fuzz_line_sums_the_harness_summary() -> None:
    summary = {"otlp_json": {"inputs": 1200, "seconds": 2.0, "crashes": 0},
               "jaeger": {"inputs": 800, "seconds": 2.0, "crashes": 0}}  # fuzz_summary's documented shape
    line = fuzz_text({"available": True, "targets": summary})
    assert line == "2,000 inputs in 4 s over 2 targets, 0 crashes (otlp_json 1,200, jaeger 800)"
    assert fuzz_text({"available": False, "why": "atheris missing"}) == "not available: atheris missing"
    summary["jaeger"] = {"inputs": 0, "seconds": 0, "crashes": 0, "attempts": 3, "harness_error": "the fuzzer exited"}
    summary["otlp_json"]["harness_retries"] = ["the corpus directory is gone"]
    line = fuzz_text({"available": True, "targets": summary})
    assert line.endswith("0 crashes (otlp_json 1,200, jaeger 0); 1 did not run (harness failure, not a crash): "
                         "jaeger: the fuzzer exited; restarted after a harness failure: otlp_json")


@pytest.mark.slow
def test_fuzz_figures_come_from_the_fuzzing_harness_when_it_is_there() -> None:
    figures = fuzz_figures(1)
    line = fuzz_text(figures)
    if figures["available"]:
        assert "inputs in" in line and all(t["inputs"] > 0 for t in figures["targets"].values())
    else:
        assert line.startswith("not available: ")


@pytest.mark.slow
def test_the_quick_command_prints_the_figures(tmp_path) -> None:
    out = CliRunner().invoke(cli, ["bench", "reliability", "--quick", "--json", str(tmp_path / "r.json")])
    assert out.exit_code == 0, out.output
    assert "crashes: spans lost beyond the unflushed queue" in out.output
    result = json.loads((tmp_path / "r.json").read_text())
    assert set(result["failures"]) == {"disk_full", "read_only", "permission_denied", "deleted", "not_a_directory"}
    assert result["crashes"]["lost_flushed_max"] == 0
