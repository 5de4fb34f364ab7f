"""Redaction's configuration: a rules file (YAML or JSON) read and checked, and the payload switches.

Every error names the file and the field (`RedactionConfigError`); `Redactor.from_file` and
`Redactor.from_config` (`otel_replay.normalize.redact`) build a redactor from what this reads.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from otel_replay.errors import OtelReplayError
from otel_replay.normalize.detectors import BUILTINS

PLACEHOLDER = "[REDACTED:{name}]"


class RedactionConfigError(OtelReplayError, ValueError):
    """A redaction rule, or a rules file, is invalid."""


def read_rules(path: Path) -> Any:
    """The document of a YAML (.yaml, .yml) or JSON rules file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RedactionConfigError(f"cannot read redaction rules {path}: {exc}") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise RedactionConfigError(f"{path}: YAML rules need PyYAML (pip install pyyaml); "
                                       "or write the rules as JSON") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise RedactionConfigError(f"{path}: not valid YAML: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RedactionConfigError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
                                   f"{exc.msg}); YAML files need a .yaml suffix") from None


def redactor_options(data: Any, source: str = "redaction rules") -> dict[str, Any]:
    """The `Redactor` keyword arguments a rules document asks for; errors name `source` and the field."""
    if not isinstance(data, Mapping):
        raise RedactionConfigError(f"{source}: expected a mapping of rules, got {type(data).__name__}")
    unknown = set(data) - {"builtins", "disable", "patterns", "attributes", "functions", "placeholder"}
    if unknown:
        raise RedactionConfigError(f"{source}: unknown field(s) {', '.join(sorted(unknown))}; expected builtins, "
                                   "disable, patterns, attributes, functions, placeholder")
    patterns = data.get("patterns") or {}
    if not isinstance(patterns, Mapping):
        raise RedactionConfigError(f"{source}: patterns must map a rule name to a regex")
    try:
        return {"builtins": data.get("builtins", True), "disable": data.get("disable") or (), "patterns": patterns,
                "attributes": rule_names(data.get("attributes") or (), "attributes"),
                "functions": [import_function(spec) for spec in rule_names(data.get("functions") or (), "functions")],
                "placeholder": data.get("placeholder", PLACEHOLDER)}
    except RedactionConfigError as exc:
        raise RedactionConfigError(f"{source}: {exc}") from None


def rule_names(value: Any, field: str) -> list[str]:
    """A list of names from a rules field (built-in ones checked against `BUILTINS`)."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise RedactionConfigError(f"{field} must be a list of names, got {value!r}")
    names = list(value)
    if field in ("builtins", "disable"):
        unknown = [n for n in names if n not in BUILTINS]
        if unknown:
            raise RedactionConfigError(f"{field}: unknown built-in detector(s) {', '.join(map(str, unknown))}; "
                                       f"the built-ins are {', '.join(BUILTINS)}")
    if not all(isinstance(n, str) and n for n in names):
        raise RedactionConfigError(f"{field} must be a list of non-empty strings, got {names!r}")
    return names


def compile_pattern(name: Any, regex: Any) -> tuple[str, re.Pattern[str], int | str]:
    """A user rule: its name, its regex, and the group whose match is replaced ("secret", else all)."""
    if not isinstance(name, str) or not name or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise RedactionConfigError(f"patterns: rule name {name!r} must be letters, digits, '_', '-' or '.'")
    try:
        compiled = regex if isinstance(regex, re.Pattern) else re.compile(regex)
    except (re.error, TypeError) as exc:
        raise RedactionConfigError(f"patterns.{name}: invalid regex {regex!r}: {exc}") from None
    if compiled.match(""):
        raise RedactionConfigError(f"patterns.{name}: the regex {compiled.pattern!r} matches the empty string")
    return name, compiled, ("secret" if "secret" in compiled.groupindex else 0)


def attribute_rules(attributes: Iterable[str]) -> tuple[frozenset[str], re.Pattern[str] | None]:
    """Attribute names to redact: the exact ones (lower case), and one regex for the globs."""
    names = rule_names(attributes, "attributes")
    exact = frozenset(n.lower() for n in names if not any(c in n for c in "*?["))
    globs = [fnmatch.translate(n.lower()) for n in names if any(c in n for c in "*?[")]
    return exact, (re.compile("|".join(globs)) if globs else None)


def import_function(spec: str) -> Callable[[str], str]:
    """The callable a 'module:function' rule names."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise RedactionConfigError(f"functions: {spec!r} must be 'module:function'")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise RedactionConfigError(f"functions: cannot import {spec!r}: {exc}") from None
    if not callable(fn):
        raise RedactionConfigError(f"functions: {spec!r} is not callable")
    return fn


