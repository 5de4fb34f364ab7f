"""Redaction: secrets and personal data out of payloads and attributes before anything is stored.

`Redactor` finds API keys, bearer tokens, emails, card numbers (Luhn-checked) and the user's own
rules (regexes, attribute or JSON field names, callables) in text and JSON values, and replaces
each finding with a placeholder such as `[REDACTED:email]`. `Privacy` applies a redactor, and the
per-kind payload switches (`capture_payloads`), to a normalized span: the capture writer, `ingest`
(imports) and the OTLP receiver call it after normalization and before rows are built, so secrets
never reach a message body, a content address or an attribute column. Built-in detectors are on
by default.

Placeholders are deterministic (the same text redacts to the same bytes every time), so a held
step's live inputs still hash equal to its recorded inputs and replay binds as before. A step
whose inputs contained a redaction is flagged (`step_rows.redacted`): a policy that re-runs it sees
the placeholder, not the secret, and replay reports that as a caveat.

The detectors and their speed: `otel_replay.normalize.detectors`. Messages repeated across an
agent loop's turns are the same objects (normalize memoizes them), so each is redacted once.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from otel_replay.normalize.content import CONTENT_EVENTS
from otel_replay.normalize.conventions import ADAPTERS
from otel_replay.normalize.detectors import (
    BUILTINS,
    MIN_BUILTIN_LENGTH,
    SCANS,
    SENSITIVE_NAME,
    Hit,
    find,
)
from otel_replay.normalize.pipeline import NormalizedSpan
from otel_replay.normalize.records import SpanEvent, SpanRecord
from otel_replay.normalize.step import STEP_KINDS, StepContent

PLACEHOLDER = "[REDACTED:{name}]"
NONE: frozenset[str] = frozenset()
_PROTOCOL_KEYS = frozenset({"role", "type"})  # message format, never content
_MEMO_MAX = 50_000
_MEMO_MAX_BYTES = 16 * 1024 * 1024  # payload text the message memo keeps alive (capture's memory stays bounded)


def _rough_size(message: Any) -> int:
    """The text a canonical message holds (its parts' string fields), cheaply."""
    parts = message.get("parts") if isinstance(message, dict) else None
    if not isinstance(parts, list):
        return 256
    return 256 + sum(len(v) for p in parts if isinstance(p, dict) for v in p.values() if isinstance(v, str))


class RedactionConfigError(ValueError):
    """A redaction rule, or a rules file, is invalid."""


# -- the redactor ---------------------------------------------------------------------------------
class Redactor:
    """Replaces secrets in text, JSON values and attributes with `[REDACTED:<name>]`.

    :param builtins: True (every built-in detector, the default), False (none), or the names of
        the built-ins to use (see `BUILTINS`).
    :param disable: built-in names to turn off (e.g. ``{"email"}``).
    :param patterns: your own rules, name -> regex; the whole match is replaced, or only the
        group named ``secret`` when the regex has one.
    :param attributes: attribute names (or globs, ``app.user.*``), matched case-insensitively,
        whose whole value is replaced; they are matched against the keys of JSON objects inside
        payloads (tool-call arguments, structured results) too.
    :param functions: callables ``text -> text`` applied to every string after the rules above;
        a changed string counts as a redaction named after the function.
    :param placeholder: the replacement, with ``{name}`` for the rule's name.
    """

    def __init__(self, *, builtins: bool | Iterable[str] = True, disable: Iterable[str] = (),
                 patterns: Mapping[str, str | re.Pattern[str]] | None = None, attributes: Iterable[str] = (),
                 functions: Iterable[Callable[[str], str]] = (), placeholder: str = PLACEHOLDER) -> None:
        names = set(BUILTINS) if builtins is True else set() if builtins is False else set(_names(builtins, "builtins"))
        names -= set(_names(disable, "disable"))
        self.builtins = tuple(n for n in BUILTINS if n in names)
        self._enabled = frozenset(self.builtins)
        self._scans = tuple(s for s in SCANS if s.names & self._enabled)
        self._cards = "credit_card" in self._enabled
        self._patterns = tuple(_compile_pattern(name, regex) for name, regex in (patterns or {}).items())
        self._exact, self._globs = _attribute_rules(attributes)
        self._functions = tuple(functions)
        for fn in self._functions:
            if not callable(fn):
                raise RedactionConfigError(f"functions: {fn!r} is not callable")
        if "{name}" not in placeholder:
            raise RedactionConfigError(f"placeholder {placeholder!r} must contain {{name}}")
        self.placeholder = placeholder
        self._fields = "sensitive_field" in self._enabled or bool(self._exact) or self._globs is not None
        self._min_length = MIN_BUILTIN_LENGTH if not (self._patterns or self._functions) else 1
        self._field_cache: dict[str, str | None] = {}
        self._memo: dict[int, tuple[Any, Any, frozenset[str]]] = {}
        self._memo_bytes = 0

    def __repr__(self) -> str:
        extra = [f"{len(self._patterns)} patterns"] if self._patterns else []
        rules = len(self._exact) + (self._globs is not None)
        extra += [f"{rules} attribute rules"] if rules else []
        extra += [f"{len(self._functions)} functions"] if self._functions else []
        return f"Redactor(builtins={list(self.builtins)}{', ' if extra else ''}{', '.join(extra)})"

    # -- configuration from a file ----------------------------------------------------------------
    @classmethod
    def from_config(cls, data: Any, source: str = "redaction rules") -> Redactor:
        """A redactor from a rules document (the shape `from_file` reads); errors name the field."""
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
            return cls(builtins=data.get("builtins", True), disable=data.get("disable") or (), patterns=patterns,
                       attributes=_names(data.get("attributes") or (), "attributes"),
                       functions=[_import_function(spec) for spec in _names(data.get("functions") or (), "functions")],
                       placeholder=data.get("placeholder", PLACEHOLDER))
        except RedactionConfigError as exc:
            raise RedactionConfigError(f"{source}: {exc}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> Redactor:
        """A redactor from a YAML or JSON rules file (built-ins stay on unless it says otherwise).

        Example::

            disable: [email]
            patterns: {customer_id: "CUST-[0-9]{8}"}
            attributes: [enduser.id, "app.user.*"]
            functions: ["myproj.privacy:scrub"]
        """
        path = Path(path)
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
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise RedactionConfigError(f"{path}: not valid YAML: {exc}") from None
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise RedactionConfigError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
                                           f"{exc.msg}); YAML files need a .yaml suffix") from None
        return cls.from_config(data or {}, str(path))

    # -- redaction --------------------------------------------------------------------------------
    def text(self, text: str) -> tuple[str, frozenset[str]]:
        """The text with every finding replaced, and the names of the rules that fired."""
        if len(text) < self._min_length:
            return text, NONE
        hits = find(text, self._scans, self._cards)
        if hits:
            hits = [h for h in hits if h[2] in self._enabled]
        for name, regex, group in self._patterns:
            for m in regex.finditer(text):
                start, end = m.span(group)
                if end > start:
                    hits.append((start, end, name))
        out, names = (self._replace(text, hits), frozenset(h[2] for h in hits)) if hits else (text, NONE)
        for fn in self._functions:
            changed = fn(out)
            if not isinstance(changed, str):
                raise TypeError(f"redaction function {_fn_name(fn)} returned {type(changed).__name__}, not str")
            if changed != out:
                out, names = changed, names | {_fn_name(fn)}
        return out, names

    def _replace(self, text: str, hits: list[Hit]) -> str:
        hits.sort(key=lambda h: (h[0], -h[1]))
        pieces, at = [], 0
        for start, end, name in hits:
            if end <= at:
                continue
            if start < at:  # overlaps the previous finding: its placeholder covers both
                at = end
                continue
            pieces.append(text[at:start])
            pieces.append(self.placeholder.format(name=name))
            at = end
        pieces.append(text[at:])
        return "".join(pieces)

    def field(self, key: str) -> str | None:
        """The rule that redacts the whole value of an attribute or JSON field of this name, if any."""
        cached = self._field_cache.get(key, False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        lower = key.lower()
        name = None
        if lower in self._exact or (self._globs is not None and self._globs.match(lower)):
            name = "attribute"
        elif "sensitive_field" in self._enabled and SENSITIVE_NAME.search(lower):
            name = "sensitive_field"
        if len(self._field_cache) >= _MEMO_MAX:
            self._field_cache.clear()
        self._field_cache[key] = name
        return name

    def value(self, value: Any) -> tuple[Any, frozenset[str]]:
        """A JSON value (str, list, dict, scalar) redacted; the very same object when nothing changed."""
        cls = value.__class__
        if cls is str:
            return self.text(value)
        if cls is dict:
            return self._dict(value)
        if cls is list or cls is tuple:
            return self._list(value)
        if isinstance(value, str):
            return self.text(str(value))
        if isinstance(value, Mapping):
            return self._dict(dict(value))
        if isinstance(value, (list, tuple)):
            return self._list(list(value))
        return value, NONE

    def _dict(self, value: dict[Any, Any]) -> tuple[dict[Any, Any], frozenset[str]]:
        out: dict[Any, Any] | None = None
        names: frozenset[str] = NONE
        fields = self._fields
        for k, v in value.items():
            rule = self.field(k) if fields and k.__class__ is str else None
            if rule is not None and v is not None:
                new, found = self.placeholder.format(name=rule), frozenset({rule})
            elif v.__class__ is str and (k in _PROTOCOL_KEYS or len(v) < self._min_length):
                continue  # "role": "user", "type": "text": the message format, never content
            else:
                new, found = self.value(v)
            if new is not v:
                if out is None:
                    out = dict(value)
                out[k] = new
            if found:
                names = names | found
        return (value if out is None else out), names

    def _list(self, value: list[Any] | tuple[Any, ...]) -> tuple[Any, frozenset[str]]:
        items: list[Any] | None = None
        names: frozenset[str] = NONE
        for i, v in enumerate(value):
            new, found = self.value(v)
            if new is not v:
                if items is None:
                    items = list(value)
                items[i] = new
            if found:
                names = names | found
        return (value if items is None else items), names

    def messages(self, messages: list[Any]) -> tuple[list[Any], frozenset[str]]:
        """Canonical messages redacted, each distinct message object once (an agent loop resends them)."""
        out: list[Any] | None = None
        names: frozenset[str] = NONE
        memo = self._memo
        for i, message in enumerate(messages):
            seen = memo.get(id(message))
            if seen is not None and seen[0] is message:
                new, found = seen[1], seen[2]
            else:
                new, found = self.value(message)
                size = _rough_size(message)
                if len(memo) >= _MEMO_MAX or self._memo_bytes + size > _MEMO_MAX_BYTES:
                    memo.clear()
                    self._memo_bytes = 0
                memo[id(message)] = (message, new, found)
                self._memo_bytes += size
            if new is not message and out is None:
                out = list(messages[:i])
            if out is not None:
                out.append(new)
            names = names | found if found else names
        return (messages if out is None else out), names

    def attributes(self, attrs: Mapping[str, Any]) -> tuple[Mapping[str, Any], frozenset[str]]:
        """Span, event or resource attributes redacted (names first, then values)."""
        return self.value(attrs if isinstance(attrs, dict) else dict(attrs))


def _fn_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _names(value: Any, field: str) -> list[str]:
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


def _compile_pattern(name: Any, regex: Any) -> tuple[str, re.Pattern[str], int | str]:
    if not isinstance(name, str) or not name or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise RedactionConfigError(f"patterns: rule name {name!r} must be letters, digits, '_', '-' or '.'")
    try:
        compiled = regex if isinstance(regex, re.Pattern) else re.compile(regex)
    except (re.error, TypeError) as exc:
        raise RedactionConfigError(f"patterns.{name}: invalid regex {regex!r}: {exc}") from None
    if compiled.match(""):
        raise RedactionConfigError(f"patterns.{name}: the regex {compiled.pattern!r} matches the empty string")
    return name, compiled, ("secret" if "secret" in compiled.groupindex else 0)


def _attribute_rules(attributes: Iterable[str]) -> tuple[frozenset[str], re.Pattern[str] | None]:
    names = _names(attributes, "attributes")
    exact = frozenset(n.lower() for n in names if not any(c in n for c in "*?["))
    globs = [fnmatch.translate(n.lower()) for n in names if any(c in n for c in "*?[")]
    return exact, (re.compile("|".join(globs)) if globs else None)


def _import_function(spec: str) -> Callable[[str], str]:
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


# -- what a span may store ------------------------------------------------------------------------
def payload_switches(capture_payloads: bool | Mapping[str, bool]) -> dict[str, bool]:
    """`capture_payloads` as kind -> bool; kinds a mapping does not name keep their payloads."""
    if isinstance(capture_payloads, bool):
        return dict.fromkeys(STEP_KINDS, capture_payloads)
    if not isinstance(capture_payloads, Mapping):
        raise ValueError(f"capture_payloads must be True, False or a mapping of step kind to bool, "
                         f"got {capture_payloads!r}")
    unknown = set(capture_payloads) - set(STEP_KINDS)
    if unknown:
        raise ValueError(f"capture_payloads: unknown step kind(s) {', '.join(map(str, sorted(unknown, key=str)))}; "
                         f"the kinds are {', '.join(STEP_KINDS)}")
    bad = [k for k, v in capture_payloads.items() if not isinstance(v, bool)]
    if bad:
        raise ValueError(f"capture_payloads: the value for {bad[0]!r} must be True or False")
    return {kind: capture_payloads.get(kind, True) for kind in STEP_KINDS}


def _is_payload_key(key: str) -> bool:
    return any(adapter.is_payload_key(key) for adapter in ADAPTERS)


def _content_event(event: SpanEvent) -> bool:
    return event.name in CONTENT_EVENTS or event.name.startswith("gen_ai.content.")


class Privacy:
    """What of a normalized span may be stored: per-kind payload switches, then redaction.

    A callable `NormalizedSpan -> NormalizedSpan` (what `ingest` and the capture writer take).
    It never raises: if a rule fails on a span, that span's payloads and attributes are dropped
    (fail closed) and a problem is added to the span.

    :param redact: a `Redactor`, True (the built-in detectors) or False/None (no redaction).
    :param capture_payloads: True, False (no payload is stored: every step is observation-only),
        or a mapping such as ``{"llm": True, "tool": False}``; kinds not named keep their payloads.
    """

    def __init__(self, redact: Redactor | bool | None = True,
                 capture_payloads: bool | Mapping[str, bool] = True) -> None:
        if redact is True:
            redact = Redactor()
        elif redact is False:
            redact = None
        if redact is not None and not isinstance(redact, Redactor):
            raise ValueError(f"redact must be a Redactor, True or False, got {redact!r}")
        self.redactor: Redactor | None = redact
        self.payloads = payload_switches(capture_payloads)
        self._all_payloads = all(self.payloads.values())
        self._any_payloads = any(self.payloads.values())
        self._resource: tuple[Any, Any] | None = None

    def __repr__(self) -> str:
        off = [k for k, on in self.payloads.items() if not on]
        return f"Privacy(redact={self.redactor!r}, payloads off for {off or 'no kind'})"

    def __call__(self, item: NormalizedSpan) -> NormalizedSpan:
        try:
            return self._apply(item)
        except Exception as exc:  # noqa: BLE001 - a failing rule must not let a secret through
            return _fail_closed(item, exc)

    def _apply(self, item: NormalizedSpan) -> NormalizedSpan:
        step = item.step
        keep = self.payloads.get(step.kind, True) if step is not None else self._any_payloads
        span = item.span
        if not keep:
            if step is not None:
                step.content = StepContent()
            item.attributes = {k: v for k, v in item.attributes.items() if not _is_payload_key(k)}
            if any(_content_event(e) for e in span.events):
                span = dataclasses.replace(span, events=[SpanEvent(e.name, e.time_ns, {}) if _content_event(e) else e
                                                         for e in span.events])
        r = self.redactor
        if r is None:
            item.span = span
            return item
        found: set[str] = set()

        def note(part: str, names: frozenset[str]) -> None:
            found.update(f"{part}:{n}" for n in names)

        if step is not None:
            content = step.content
            content.inputs, names = r.messages(content.inputs)
            note("input", names)
            content.outputs, names = r.messages(content.outputs)
            note("output", names)
            if content.system:
                content.system, names = r.messages(content.system)
                note("system", names)
            if content.tools:
                content.tools, names = r.messages(content.tools)
                note("tools", names)
            if step.error_message:
                step.error_message, names = r.text(step.error_message)
                note("error", names)
        item.attributes, names = r.attributes(item.attributes)
        note("attributes", names)
        span, names = self._span(span)
        note("attributes", names)
        if step is not None:
            step.redacted = sorted(found)
        item.span = span
        return item

    def _span(self, span: SpanRecord) -> tuple[SpanRecord, frozenset[str]]:
        """Status message, event and link attributes and the resource of a span, redacted."""
        r = self.redactor
        assert r is not None
        changes: dict[str, Any] = {}
        names: frozenset[str] = NONE
        if span.status_message:
            text, found = r.text(span.status_message)
            if found:
                changes["status_message"], names = text, names | found
        if span.events:
            events, changed = [], False
            for e in span.events:
                attrs, found = r.attributes(e.attributes) if e.attributes else (e.attributes, NONE)
                changed |= attrs is not e.attributes and bool(found)
                events.append(SpanEvent(e.name, e.time_ns, attrs) if found else e)
                names = names | found if found else names
            if changed:
                changes["events"] = events
        if span.links and any(link.get("attributes") for link in span.links):
            links, found = r.value(span.links)
            if found:
                changes["links"], names = links, names | found
        if span.resource:
            cached = self._resource
            if cached is None or cached[0] is not span.resource:
                cached = self._resource = (span.resource, r.attributes(span.resource))
            resource, found = cached[1]
            if found:
                changes["resource"], names = resource, names | found
        return (dataclasses.replace(span, **changes) if changes else span), names


def _fail_closed(item: NormalizedSpan, exc: Exception) -> NormalizedSpan:
    """Drop everything a failed redaction may have left: payloads, attributes, messages."""
    step = item.step
    if step is not None:
        step.content = StepContent()
        step.error_message = None
        step.redacted = ["all:redaction-failed"]
    item.attributes = {}
    item.span = dataclasses.replace(item.span, status_message=None, resource={}, links=[],
                                    events=[SpanEvent(e.name, e.time_ns, {}) for e in item.span.events])
    item.problems.append(f"redaction failed: {type(exc).__name__}: {exc}"[:200] + "; payloads and attributes dropped")
    return item


DEFAULT_PRIVACY = Privacy()
"""Built-in detectors on, every payload kept: what capture, import and collect use unless told otherwise."""
