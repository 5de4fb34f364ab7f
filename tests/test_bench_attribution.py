"""The attribution benchmark runs in quick mode and reports what it promises: the planted culprit
found by every engine, structure of the result and the table; never a timing threshold."""

from __future__ import annotations

import math

import pytest

from benchmarks import attribution as bench
from benchmarks.attribution import (
    ANCHOR_INSTALL,
    STEP_COUNTS,
    PlantedAgent,
    anchor_module,
    answered_ok,
    format_attribution_table,
    planted_policies,
    run_attribution_bench,
    store_agent,
)
from otel_replay import ReplayPlan, replay
from otel_replay.trajectory import Store


@pytest.fixture(scope="module")
def result():
    return run_attribution_bench(quick=True)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_otel_replay_finds_the_planted_culprit_on_every_agent(result):
    assert result["quick"] is True
    ours = [r for r in result["rows"] if r["engine"] == "otel-replay"]
    assert sorted(r["steps"] for r in ours) == sorted(2 * list(STEP_COUNTS))
    assert {6, 12} <= set(STEP_COUNTS)
    for row in ours:
        assert row["planted"] == PlantedAgent.of(row["steps"]).culprit == row["steps"] - 3
        assert row["verdict"] == "culprit-found", row
        assert row["culprit"] == row["planted"] and row["correct"] is True, row
        assert _positive(row["policy_calls"]) and _positive(row["rollouts"]) and _positive(row["wall_ms"])
        assert row["store_ms"] >= 0 and row["stats_ms"] > 0 and row["assembly_ms"] >= 0
        assert 0 < row["stats_share"] < 1
        assert row["stats_ms"] + row["assembly_ms"] + row["store_ms"] <= row["wall_ms"]
    fixed = [r for r in ours if "--rollouts" in r["config"]]
    # the backward scan stops at the culprit: four boundaries from the end to it, fixed rollouts each; a
    # rollout whose re-decided step reproduces the recording costs one call, one that diverges up to 3
    for row in fixed:
        assert row["rollouts"] == 4 * bench.OTEL_ROLLOUTS
        assert 3 * bench.OTEL_ROLLOUTS <= row["policy_calls"] < bench.OTEL_ROLLOUTS * (1 + 2 + 3)


def test_agent_replay_rows_are_present_or_marked_skipped(result):
    table = format_attribution_table(result)
    theirs = [r for r in result["rows"] if r["engine"] == "agent_replay"]
    if anchor_module() is None:
        assert theirs == [] and result["agent_replay"] is None
        assert f"skipped: {ANCHOR_INSTALL}" in result["agent_replay_skipped"]
        assert f"skipped: {ANCHOR_INSTALL}" in table
        assert all(r["calls_ratio"] is None for r in result["rows"])
        return
    assert result["agent_replay_skipped"] is None
    assert sorted((r["steps"], r["config"].split(",")[0]) for r in theirs) == sorted(
        (s, m) for s in STEP_COUNTS for m in ("contrastive", "both"))
    for row in theirs:
        if row["skipped"]:
            assert row["config"].startswith("both") and "--quick" in row["skipped"]
            continue
        assert row["culprit"] == row["planted"] and row["correct"] is True, row
        assert _positive(row["policy_calls"]) and _positive(row["wall_ms"])
    for steps in STEP_COUNTS:
        contrastive = next(r for r in theirs if r["steps"] == steps and r["config"].startswith("contrastive"))
        # every step re-decided from itself on, ANCHOR_ROLLOUTS times: 60 * (1 + 2 + ... + N)
        assert contrastive["policy_calls"] == bench.ANCHOR_ROLLOUTS * steps * (steps + 1) // 2
        for row in (r for r in result["rows"] if r["engine"] == "otel-replay" and r["steps"] == steps):
            assert row["calls_ratio"] == pytest.approx(row["policy_calls"] / contrastive["policy_calls"])
    assert "Targets:" in table


def test_concurrency_gives_the_same_result(result):
    c = result["concurrency"]
    assert c["concurrency"] == [1, 32]
    assert c["same_result"] is True and c["correct"] is True
    assert c["culprit"] == c["planted"] == PlantedAgent.of(c["steps"]).culprit
    assert all(_positive(c["wall_s"][str(n)]) for n in c["concurrency"])
    assert _positive(c["speedup"]) and _positive(c["speedup_without_store"])
    assert c["latency_ms"] == 1000 * bench.QUICK.latency_s and c["rollouts"] > 0


def test_table_has_a_line_per_row(result):
    lines = format_attribution_table(result).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| steps | engine |"))
    body = []
    for line in lines[header + 2:]:
        if not line.startswith("| "):
            break
        body.append(line)
    skipped = [line for line in body if "| skipped |" in line and "agent_replay" in line]
    assert len(body) - len(skipped) == len(result["rows"])  # plus one "skipped" line per size without agent_replay
    assert sum(line.startswith("| concurrency |") for line in lines) == 1
    assert lines[-1].startswith("Targets: every verdict names the planted culprit: pass")


@pytest.mark.parametrize("steps", [3, 5, 6, 12])
def test_the_planted_agent_fails_only_because_of_its_last_decision(tmp_path, steps):
    agent = PlantedAgent.of(steps)
    traj = Store(tmp_path).trajectory(store_agent(tmp_path, agent))
    assert len(traj.steps) == steps and traj.steps[agent.culprit].kind == "llm"
    assert [s.kind for s in traj.steps][agent.culprit:] == ["llm"] + ["tool"] * agent.per_turn[-1] + ["llm"]
    policies = planted_policies(agent)
    factual = replay(traj, ReplayPlan.factual(), policies=policies)
    assert factual.ok and factual.final_output == "FAIL" and answered_ok(factual.final_output) == 0.0
    good = [agent.decision(len(agent.per_turn) - 1, "good")]
    fixed = replay(traj, ReplayPlan.do(agent.culprit, good), policies=policies)
    assert fixed.ok and fixed.final_output == "OK" and answered_ok(fixed.final_output) == 1.0
    # re-decided from the start, the run fails exactly when the last decision comes out bad
    for seed in range(20):
        run = replay(traj, ReplayPlan.resample_from(0), seed, policies=policies)
        last = next(o for o in run.steps if o.index == agent.culprit)
        choices = {p["arguments"]["choice"] for m in last.outputs for p in m["parts"] if p["type"] == "tool_call"}
        assert run.ok and run.final_output == ("FAIL" if choices == {"bad"} else "OK"), (seed, choices)


def test_the_agent_replay_agent_is_the_same_agent():
    ar = anchor_module()
    if ar is None:
        pytest.skip(f"agent_replay is not installed ({ANCHOR_INSTALL})")
    from benchmarks.attribution import USER, Counter, anchor_agent, anchor_verifier

    for steps in STEP_COUNTS:
        agent = PlantedAgent.of(steps)
        counter = Counter()
        traj = ar.record(anchor_agent(agent, counter, recording=True), {"question": USER["parts"][0]["content"]},
                         session_id="s", verifier=anchor_verifier)
        assert counter.n == steps  # one produce= call per recorded step
        kinds = [s.kind.value for s in traj.steps]
        assert kinds[agent.culprit:] == ["llm"] + ["tool"] * agent.per_turn[-1] + ["llm"] and len(kinds) == steps
        assert traj.result == "FAIL"


def test_without_agent_replay_its_rows_are_skipped(monkeypatch):
    monkeypatch.setattr(bench, "anchor_module", lambda: None)
    monkeypatch.setattr(bench, "STEP_COUNTS", (5,))
    monkeypatch.setattr(bench, "QUICK", bench.Sizes(repeats=1, latency_s=0.001, anchor_both=()))
    small = run_attribution_bench(quick=True)
    assert {r["engine"] for r in small["rows"]} == {"otel-replay"}
    assert all(r["correct"] and r["calls_ratio"] is None for r in small["rows"])
    table = format_attribution_table(small)
    assert f"skipped: {ANCHOR_INSTALL}" in table and "| 5 | agent_replay | contrastive / both | skipped |" in table
