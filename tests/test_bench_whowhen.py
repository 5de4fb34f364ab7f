"""The Who&When benchmark in quick mode on the real dataset: structure, accuracies in [0, 1], the
last-step baseline recomputed from the raw JSON files, the substring rule never below exact match
on steps, and the interventional part reported as skipped. No timing assertions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.whowhen import (
    QUICK_LOGS,
    SUBSETS,
    default_dataset,
    format_whowhen_table,
    run_whowhen_bench,
)

DATASET = default_dataset()


@pytest.fixture(scope="module")
def result():
    return run_whowhen_bench(quick=True)


def _raw_logs(subset: str) -> list[dict]:
    paths = sorted((DATASET / subset).glob("*.json"), key=lambda p: int(p.stem))[:QUICK_LOGS]
    return [json.loads(p.read_text(encoding="utf-8")) for p in paths]


def test_structure_and_ranges(result):
    assert result["quick"] is True
    assert result["logs"] == {s: QUICK_LOGS for s in SUBSETS}
    assert {"last step", "first step", "last agent turn", "first agent turn"} <= set(result["methods"])
    assert any(name.startswith("random") for name in result["methods"])
    for by_subset in result["methods"].values():
        assert set(by_subset) == set(SUBSETS)
        for rules in by_subset.values():
            for rule in ("exact", "upstream"):
                assert set(rules[rule]) == {"agent", "step"}
                assert all(0.0 <= v <= 1.0 for v in rules[rule].values())


def test_last_step_matches_the_raw_files(result):
    for subset in SUBSETS:
        logs = _raw_logs(subset)
        step = sum(len(d["history"]) - 1 == int(d["mistake_step"]) for d in logs) / len(logs)
        authors = [re.sub(r" \((thought|termination condition|-> .*)\)$", "",
                          d["history"][-1].get("name") or d["history"][-1]["role"]) for d in logs]
        agent = sum(a.lower() == d["mistake_agent"].lower() for a, d in zip(authors, logs, strict=True)) / len(logs)
        exact = result["methods"]["last step"][subset]["exact"]
        assert exact["step"] == pytest.approx(step)
        assert exact["agent"] == pytest.approx(agent)


def test_substring_rule_never_below_exact_on_steps(result):
    for by_subset in result["methods"].values():
        for rules in by_subset.values():
            assert rules["upstream"]["step"] >= rules["exact"]["step"] - 1e-12


def test_interventional_is_skipped_and_the_table_says_so(result):
    assert "--policies" in result["interventional"]["skipped"]
    table = format_whowhen_table(result)
    assert "interventional attribution: skipped" in table
    assert "exact match" in table and "substring" in table
    for name in result["methods"]:
        assert name in table


def test_missing_dataset_names_the_path(tmp_path: Path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        run_whowhen_bench(quick=True, dataset=missing)
