"""Built-in verifiers and the verifier contract."""

from __future__ import annotations

import json

import pytest

from otel_replay.attribution import verifiers
from otel_replay.attribution.job import build_verifier


def test_expect_contains_and_regex():
    assert build_verifier("contains:refunded")("Done: refunded $5", None) == 1.0
    assert build_verifier("contains:refunded")("no refund", None) == 0.0
    regex = build_verifier(r"regex:refunded \$\d+\.\d{2}")
    assert regex("I've refunded $89.50.", None) == 1.0 and regex("refunded $89", None) == 0.0
    with pytest.raises(verifiers.VerifierError, match="--expect-regex"):
        build_verifier("regex:(unclosed")


def test_expect_json_schema(tmp_path):
    schema = tmp_path / "answer.schema.json"
    schema.write_text(json.dumps({"type": "object", "required": ["refund"], "properties": {"refund": {"type": "number"}}}))
    verify = build_verifier(f"json-schema:{schema}")
    assert verify('{"refund": 89.5}', None) == 1.0
    assert verify('{"refund": "lots"}', None) == 0.0
    assert verify("not json at all", None) == 0.0
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(verifiers.VerifierError, match="broken.json"):
        build_verifier(f"json-schema:{tmp_path / 'broken.json'}")


@pytest.mark.parametrize("value", ["yes", 1.5, -0.1, float("nan"), None, [1]])
def test_a_score_outside_the_contract_is_refused(value):
    with pytest.raises(verifiers.VerifierError, match="must return a number in \\[0, 1\\]"):
        verifiers.score(lambda out, run: value, "x", None)


def test_booleans_and_integers_are_scores():
    assert verifiers.score(lambda out, run: True, "x", None) == 1.0
    assert verifiers.score(lambda out, run: 0, "x", None) == 0.0
