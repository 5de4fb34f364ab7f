"""The reliability benchmark runs end to end and reports every figure the issue asks for.

The default test runs tiny sizes (one store failure, two kills; the gRPC flood as in the quick run, 3 x 64
calls of 15 MB, the adversarial run's: smaller floods rarely show its cost); the quick run, which is what
`otel-replay bench reliability --quick` does, is marked slow. Timings are never asserted.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from benchmarks.reliability import (
    FLOOD_RSS_BOUND,
    QUICK,
    format_reliability_table,
    fuzz_figures,
    fuzz_text,
    run_reliability_bench,
)
from otel_replay.cli import main as cli

TINY = replace(QUICK, overload_s=1.5, fault_s=0.3, kills=2, max_kill_delay_s=0.6, read_s=1, damaged=4, fuzz_s=0,
               kinds=("deleted",), full_disk_hold_s=0.3)


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
    assert set(result["seconds"]) == {"overload", "failures", "full_disk", "flood", "crashes", "readers", "torn",
                                      "corruption", "fuzz"}


def test_collect_on_a_full_disk_stores_every_span_it_acknowledged_after_its_first_refusal(result: dict) -> None:
    """Lost: only spans acknowledged before the first refusal (the writer's first failed write; how long
    before it is a timing, reported, not asserted). From the first refusal on, every request is refused
    with a retry delay, and once the disk has room again everything acknowledged is stored."""
    d = result["receiver"]["full_disk"]
    assert d["mechanism"] in ("tmpfs", "rlimit") and d["written_before"]
    assert d["acked_spans"] > 0 and d["lost_beyond_window"] == 0 and d["lost_spans"] == d["lost_in_window"]
    assert d["stored_acked_spans"] == d["acked_spans"] - d["lost_spans"]
    assert d["refused_with_retry"] == d["during_after_refusal"] > 0
    assert set(d["answers"]["during"]) >= {"http 503", "grpc UNAVAILABLE"}
    assert d["resumed_s"] is not None and d["acked_after_mend"] >= 10 and d["lost_after_mend"] == 0
    assert d["exit_ok"], d["stopped"]


def test_an_unauthenticated_grpc_flood_is_refused_and_the_exporter_with_the_token_gets_through(result: dict) -> None:
    f = result["receiver"]["flood"]
    assert sum(f["codes"].values()) == f["flood_calls"] == 192 and f["unauthenticated"] > 0 and f["flood_ok"] == 0
    assert set(f["codes"]) <= {"UNAUTHENTICATED", "RESOURCE_EXHAUSTED"}  # more than 64 calls at once: the latter
    assert f["legitimate_exports"] > 0 and f["legitimate_successes"] == f["legitimate_exports"]
    assert f["legitimate_stored"] == f["legitimate_spans"] > 0
    assert f["warm"] and f["samples"] > 0 and f["rss_peak"] > 0 and f["exit_ok"], f["stopped"]


def test_an_unauthenticated_grpc_flood_costs_collect_less_than_one_message(result: dict) -> None:
    flood = result["receiver"]["flood"]
    assert flood["rss_growth"] < FLOOD_RSS_BOUND, flood


def test_table_names_every_figure(result: dict) -> None:
    table = format_reliability_table(result)
    for label in ("overload: byte cap vs peak held", "overload: drops counted", "overload: resident memory growth",
                  "service thread span.end()", "store failure: deleted", "crashes: kill -9 while writing",
                  "crashes: spans lost beyond the unflushed queue", "readers during writes",
                  "collect, store full (", "answers while it is", "after room is made",
                  "gRPC flood without the token: collect's memory", "refused; exporter with it",
                  "batches seen in part", "torn batch: import killed after its span segment",
                  "damaged segments: found by doctor", "inputs fuzzed (count, time)"):
        assert label in table
    header, rule = table.splitlines()[:2]
    assert header.startswith("| figure") and set(rule) <= {"|", "-"}
    # timings are not asserted: the offered rate (how fast this loaded machine ends spans in 1.5 s) and how
    # long before the first refusal the lost acknowledgements were; the flood's memory is the xfail above
    timed = ("overload: offered", "acknowledged vs stored", "collect's memory")
    held = [line for line in table.split("inputs fuzzed")[0].splitlines() if not any(t in line for t in timed)]
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
    assert result["receiver"]["full_disk"]["lost_beyond_window"] == 0
    flood = result["receiver"]["flood"]
    assert flood["flood_ok"] == 0 and flood["legitimate_successes"] == flood["legitimate_exports"] > 0
