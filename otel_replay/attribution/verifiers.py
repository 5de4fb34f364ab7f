"""Verifiers map a rollout's final output to a score in [0, 1]; below the threshold is a failure.

A verifier is `fn(final_output, rollout) -> number`. Built in: `--expect-contains TEXT`,
`--expect-regex RE`, `--expect-json-schema FILE`; else `--verifier pkg.mod:fn`.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from otel_replay.errors import OtelReplayError

Verifier = Callable[[str, Any], float]


class VerifierError(OtelReplayError):
    """A verifier could not be loaded, or returned something that is not a score."""


def expect_contains(text: str) -> Verifier:
    def verify(final_output: str, rollout: Any = None) -> float:
        return 1.0 if text in final_output else 0.0
    return verify


def expect_regex(pattern: str) -> Verifier:
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise VerifierError(f"--expect-regex {pattern!r}: {exc}") from exc

    def verify(final_output: str, rollout: Any = None) -> float:
        return 1.0 if compiled.search(final_output) else 0.0
    return verify


def expect_json_schema(path: Path) -> Verifier:
    try:
        import jsonschema
    except ImportError as exc:
        raise VerifierError("--expect-json-schema needs the jsonschema package: pip install jsonschema") from exc
    try:
        schema = json.loads(Path(path).read_text())
        validator = jsonschema.Draft202012Validator(schema)
    except (OSError, ValueError, jsonschema.SchemaError) as exc:
        raise VerifierError(f"--expect-json-schema {path}: {exc}") from exc

    def verify(final_output: str, rollout: Any = None) -> float:
        try:
            return 1.0 if validator.is_valid(json.loads(final_output)) else 0.0
        except ValueError:
            return 0.0
    return verify


def build(spec: str) -> Verifier:
    """A verifier from its spec: "contains:TEXT", "regex:RE", "json-schema:FILE" or "pkg.mod:fn"."""
    kind, _, value = spec.partition(":")
    if kind == "contains":
        return expect_contains(value)
    if kind == "regex":
        return expect_regex(value)
    if kind == "json-schema":
        return expect_json_schema(Path(value))
    return load(spec)


def load(spec: str) -> Verifier:
    """`pkg.mod:fn`."""
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise VerifierError(f"--verifier {spec!r}: use the form pkg.module:function")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise VerifierError(f"--verifier {spec!r}: {exc}") from exc
    if not callable(fn):
        raise VerifierError(f"--verifier {spec!r} is not callable")
    # cast: an imported callable, whose signature can only be checked by calling it (score() checks its result)
    return cast(Verifier, fn)


def score(verifier: Verifier, final_output: str, rollout: Any) -> float:
    """Call the verifier and check its contract (a finite number in [0, 1])."""
    value = verifier(final_output, rollout)
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= 1:
        raise VerifierError(f"the verifier returned {value!r}; it must return a number in [0, 1]")
    return float(value)
