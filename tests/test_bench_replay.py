"""The replay benchmark runs in quick mode and reports what it promises; never a timing threshold."""

from __future__ import annotations

import math

import pytest

from benchmarks.replay import (
    ANCHOR_INSTALL,
    MODES,
    STEP_COUNTS,
    Agent,
    anchor_module,
    build_trajectory,
    format_replay_table,
    instant_policies,
    run_replay_bench,
)
from otel_replay import ReplayPlan, replay


@pytest.fixture(scope="module")
def result():
    return run_replay_bench(quick=True)


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_quick_run_has_a_row_for_every_agent_size_and_mode(result):
    assert result["quick"] is True
    assert sorted((r["steps"], r["mode"]) for r in result["rows"]) == sorted(
        (steps, mode) for steps in STEP_COUNTS for mode in MODES)
    assert {6, 50} <= set(STEP_COUNTS) and set(MODES) == {"factual", "re-decide"}
    for row in result["rows"]:
        assert _positive(row["otel_replay_us_per_step"]), row
        assert row["rounds"] > 0 and row["calls_per_batch"] >= 1


def test_agent_replay_columns_are_present_or_marked_skipped(result):
    table = format_replay_table(result)
    if anchor_module() is None:
        assert result["agent_replay"] is None
        assert ANCHOR_INSTALL in result["agent_replay_skipped"] and ANCHOR_INSTALL in table
        assert all(r["agent_replay_us_per_step"] is None and r["ratio"] is None for r in result["rows"])
        assert table.count("skipped") >= 2 * len(result["rows"])
    else:
        assert result["agent_replay_skipped"] is None
        for row in result["rows"]:
            assert _positive(row["agent_replay_us_per_step"]) and _positive(row["ratio"]), row
            assert row["ratio"] == pytest.approx(row["otel_replay_us_per_step"] / row["agent_replay_us_per_step"])
        assert "Target:" in table


def test_table_has_a_line_per_row(result):
    table = format_replay_table(result).splitlines()
    assert table[0].startswith("| steps | mode | otel-replay µs/step")
    body = [line for line in table[2:] if line.startswith("| ")]
    assert len(body) == len(result["rows"])


@pytest.mark.parametrize("steps", [3, 6, 7, 50])
def test_the_benchmarked_agent_replays_as_the_mode_says(steps):
    """What is timed is a correct replay: factual serves every step, re-decide re-runs every step."""
    agent = Agent.of(steps)
    traj = build_trajectory(agent)
    assert len(traj.steps) == steps
    assert [s.kind for s in traj.steps].count("llm") == len(agent.turns) + 1
    policies = instant_policies(agent)
    answer = agent.answer["parts"][0]["content"]
    factual = replay(traj, ReplayPlan.factual(), policies=policies)
    assert [o.source for o in factual.steps] == ["recording"] * steps and factual.policy_calls == 0
    redo = replay(traj, ReplayPlan.resample_from(0), policies=policies)
    assert [o.source for o in redo.steps] == ["policy"] * steps and redo.policy_calls == steps
    assert redo.ok and factual.ok and factual.final_output == redo.final_output == answer
    assert redo.diverged_at == 1  # the first tool result differs from the recording


def test_anchor_agent_is_equivalent_when_agent_replay_is_installed():
    ar = anchor_module()
    if ar is None:
        pytest.skip(f"agent_replay is not installed ({ANCHOR_INSTALL})")
    from benchmarks.replay import USER, _anchor_case, anchor_agent, recorded_result

    agent = Agent.of(6)
    traj = ar.record(anchor_agent(agent, recorded_result), {"question": USER["parts"][0]["content"]},
                     session_id="s")
    assert [s.kind.value for s in traj.steps] == ["llm", "tool", "llm", "tool", "tool", "llm"]
    calls = _anchor_case(ar, agent)
    assert set(calls) == set(MODES)
