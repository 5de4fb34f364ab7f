"""Outcomes: failure is what the verifier says. The demo's failing run has span status ok; once
`attribute` (or `watch`) has scored it, `traces --failed` lists it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from otel_replay import Store
from otel_replay.cli import main as cli
from otel_replay.testing.planted import TOPOLOGIES, record_planted
from otel_replay.testing.support_agent import record_support_run
from tests.helpers import needs_openai_v2

pytestmark = needs_openai_v2  # every test here records or runs the demo's agent (openai-v2)

DEMO_VERIFIER = "otel_replay.testing.support_agent:refunded"
PLANTED = "otel_replay.testing.planted_policies:single-late"


@pytest.fixture(autouse=True)
def _clean_registry():
    yield
    from otel_replay.replay import policies

    policies.registry.clear()


def run(root, *args: str, code: int | None = 0) -> str:
    out = CliRunner().invoke(cli, ["--store", str(root), *args])
    if code is not None:
        assert out.exit_code == code, out.output
    return out.output


def listed(root, *args: str) -> dict[str, str]:
    """trace id -> status, as `traces --json` prints them."""
    return {row["trace_id"]: row["status"] for row in map(json.loads, run(root, "traces", "--json", *args).splitlines())}


def test_the_demos_failing_run_is_listed_failed_once_attribute_has_scored_it(tmp_path):
    root = tmp_path / "store"
    trace_id, _ = record_support_run(root)
    assert listed(root) == {trace_id: "ok"} and listed(root, "--failed") == {}  # spans say nothing went wrong

    run(root, "attribute", "--trace-id", trace_id, "--policies", "otel_replay.testing.support_policies",
        "--verifier", DEMO_VERIFIER, "--max-policy-calls", "10", code=None)
    assert listed(root, "--failed") == {trace_id: "failed"}
    assert "failures: 0 traces with a span error; 1 of 1 traces scored by a verifier" in run(root, "status")
    (outcome,) = Store(root).sql("select * from outcomes").to_pylist()
    assert (outcome["verifier"], outcome["score"], outcome["passed"], outcome["source"]) == \
        (DEMO_VERIFIER, 0.0, False, "attribute")
    where = "trace_id in (select trace_id from outcomes where not passed)"
    assert Store(root).sql(f"select trace_id from traces where {where}").column("trace_id").to_pylist() == [trace_id]  # noqa: S608


def test_watch_scores_new_traces_and_only_the_failures_are_listed_failed(tmp_path):
    root = tmp_path / "store"
    failing = record_planted(root, TOPOLOGIES["single-late"])
    passing = record_planted(root, TOPOLOGIES["control"])
    assert listed(root, "--failed") == {}
    run(root, "watch", "--once", "--settle", "0", "--policies", PLANTED, "--expect-contains", "OK",
        "--max-policy-calls", "10")
    assert listed(root) == {failing: "failed", passing: "ok"} and listed(root, "--failed") == {failing: "failed"}
    by_source = Store(root).sql("select trace_id, source, passed from outcome_rows order by trace_id, source")
    assert sorted(map(tuple, map(dict.values, by_source.to_pylist()))) == sorted(
        [(failing, "attribute", False), (failing, "watch", False), (passing, "watch", True)])


def test_a_verifier_that_raises_leaves_the_trace_unscored_with_the_reason_and_the_watcher_goes_on(tmp_path,
                                                                                              monkeypatch):
    (tmp_path / "picky.py").write_text("def check(out, rollout):\n    if out == 'FAIL':\n"
                                       "        raise ValueError('cannot judge')\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    root = tmp_path / "store"
    failing = record_planted(root, TOPOLOGIES["single-late"])
    passing = record_planted(root, TOPOLOGIES["control"])
    out = run(root, "watch", "--once", "--settle", "0", "--policies", PLANTED, "--verifier", "picky:check", "--json")
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["trace_id"] for e in events if e["event"] == "unscored"] == [failing]
    assert not any(e["event"] == "attributing" for e in events)
    rows = {r["trace_id"]: r for r in Store(root).sql("select * from outcomes").to_pylist()}
    assert rows[failing]["score"] is None and "ValueError: cannot judge" in rows[failing]["reason"]
    assert rows[passing]["passed"] is True
    again = run(root, "watch", "--once", "--settle", "0", "--policies", PLANTED, "--verifier", "picky:check", "--json")
    assert not [line for line in again.splitlines() if '"unscored"' in line]  # scored once, not every poll
