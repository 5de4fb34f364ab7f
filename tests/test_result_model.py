"""The typed report rows (attribution/model.py): each row's `to_dict` is its object in the JSON report,
`from_dict` reads it back (older reports' too), and the dict spelling of earlier versions still reads."""

from __future__ import annotations

import json

import jsonschema
import pytest

from otel_replay.attribution.model import Culprit, Repair, ShapleyValue, StepBlame
from otel_replay.attribution.result import AttributionResult
from otel_replay.export.report import report_schema

STEP = {"index": 2, "span_id": "00f067aa0ba902b7", "name": "chat gpt", "kind": "llm", "agent": None,
        "estimate": 0.9, "ci_low": 0.5, "ci_high": 1.0, "fail_held": 1.0, "fail_resampled": 0.1,
        "held_ci": [0.8, 1.0], "resampled_ci": [0.0, 0.3], "n_held": 20, "n_resampled": 20, "verdict": "decisive",
        "culprit": True, "rank": 1, "output": "lookup_order({'order_id': 'A-1042'})", "stopped": "decided",
        "to_decide": None, "calls_per_rollout": 3.0}
CULPRIT = {k: STEP[k] for k in ("index", "span_id", "name", "kind", "agent", "estimate", "ci_low", "ci_high",
                                "fail_held", "fail_resampled")}
REPAIR = {"step_index": 2, "output": [{"role": "assistant", "parts": [{"type": "text", "content": "ok"}]}],
          "fail_rate": 0.0, "ci_low": 0.0, "ci_high": 0.27, "rollouts": 20, "drift": 0.08, "valid": True,
          "verdict": "valid"}
SHAPLEY = {"index": 2, "span_id": "00f067aa0ba902b7", "name": "chat gpt", "kind": "llm", "value": 0.8,
           "ci_low": 0.4, "ci_high": 1.0, "samples": 6, "verdict": "contributing", "culprit": False, "rank": 1}


def _document() -> dict:
    return {"schema": "otel-replay/attribution-report/1", "job_id": "j0123456789ab", "trace_id": "ab" * 16,
            "method": "both", "verdict": "culprit-found", "recorded_score": 0.0, "threshold": 0.5, "credit": False,
            "steps": [STEP], "rollouts": 80, "policy_calls": 200, "repair": REPAIR,
            "explanation": {"what": "w", "where": "x", "why": "y", "fix": "z", "causal_trace": "2:chat gpt[decisive]"},
            "alpha": 0.05, "epsilon": 0.1, "sequential": True, "max_rollouts": 400, "tests": 1, "candidates": [],
            "untested": [], "budget_exhausted": False, "max_policy_calls": None, "shapley": [SHAPLEY],
            "culprit": CULPRIT}


@pytest.mark.parametrize(("cls", "data"), [(StepBlame, STEP), (Culprit, CULPRIT), (Repair, REPAIR),
                                           (ShapleyValue, SHAPLEY)])
def test_each_row_is_its_report_object(cls, data):
    row = cls.from_dict(data)
    assert row.to_dict() == data and list(row.to_dict()) == list(data)  # the same keys, in the same order
    assert row["index" if "index" in data else "step_index"] == data.get("index", data.get("step_index"))
    assert row.get("nothing", "default") == "default"
    with pytest.raises(KeyError):
        row["nothing"]


def test_the_report_document_round_trips_byte_for_byte():
    document = _document()
    jsonschema.validate(document, report_schema())
    result = AttributionResult.from_report(document)
    assert isinstance(result.steps[0], StepBlame) and result.steps[0].held_ci == (0.8, 1.0)
    assert isinstance(result.culprit, Culprit) and isinstance(result.repair, Repair)
    assert isinstance(result.shapley[0], ShapleyValue)
    assert result.to_json() == json.dumps(document, indent=2, ensure_ascii=False)
    assert AttributionResult.from_json(result.to_json()) == result


def test_older_rows_take_their_defaults():
    old_step = {k: v for k, v in STEP.items() if k not in ("stopped", "to_decide", "calls_per_rollout")}
    assert StepBlame.from_dict(old_step).stopped is None
    assert Repair.from_dict({k: v for k, v in REPAIR.items() if k != "verdict"} | {"valid": False}).verdict == "invalid"
    old_value = {k: v for k, v in SHAPLEY.items() if k not in ("span_id", "name", "kind", "culprit")}
    value = ShapleyValue.from_dict(old_value)
    assert value.span_id is None and not value.culprit
    assert value.to_dict() == old_value | {"culprit": False}  # identity left out, as the older report had it
    document = _document()
    del document["tests"]
    assert AttributionResult.from_report(document).tests == 1 == len(document["steps"])  # alpha over every step
    document["steps"] = [STEP, STEP | {"index": 3}]
    assert AttributionResult.from_report(document).tests == 2
