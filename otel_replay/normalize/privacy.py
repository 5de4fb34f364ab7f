"""`Privacy`: what of a normalized span may be stored, applied after normalization and before rows.

Per-kind payload switches (`capture_payloads`) first, then a `Redactor` over everything of a span
that is stored as text: the step's messages, the span's attributes (keys and values), events
(names and attributes), links, resource, status and kind, the names and versions it carries (span,
scope, step, tool, agent, model, provider, operation), its conversation and tool-call ids, finish
reasons and request parameters. Stored as they are: trace and span ids (checked to be hex by every
source), times and counts, and what the pipeline writes itself (step kind, convention, source). A
redaction that raises drops the span's payloads and attributes rather than store them unredacted
(fail closed), and its names and ids keep only what the built-in detectors leave.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from otel_replay.normalize.content import CONTENT_EVENTS
from otel_replay.normalize.conventions import ADAPTERS
from otel_replay.normalize.pipeline import NormalizedSpan
from otel_replay.normalize.privacy_settings import check_redact
from otel_replay.normalize.records import SpanEvent, SpanRecord
from otel_replay.normalize.redact import NONE, Redactor, joined_text
from otel_replay.normalize.step import NormalizedStep, StepContent, payload_switches


def _is_payload_key(key: str) -> bool:
    return any(adapter.is_payload_key(key) for adapter in ADAPTERS)


def _content_event(event: SpanEvent) -> bool:
    return event.name in CONTENT_EVENTS or event.name.startswith("gen_ai.content.")


# Step columns that hold text from the span, and the attributes each is read from: scanned like those
# attributes' values, and replaced whole when a rule names one of them (`Redactor(attributes=...)`).
# The tool's name and call id are in the messages too (a tool-call part's name and id), where a rule on
# the attribute does not reach: they are scanned alike in both places, so that a redacted id still
# equals the id in the parts (placeholders are deterministic) and replay binds each result to its call.
STEP_TEXT: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("name", ()), ("status", ()), ("operation", ("gen_ai.operation.name",)),
    ("provider", ("gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system")),
    ("request_model", ("gen_ai.request.model", "llm.model_name")),
    ("response_model", ("gen_ai.response.model", "llm.model_name")), ("agent_name", ("gen_ai.agent.name",)),
    ("conversation_id", ("gen_ai.conversation.id", "session.id")), ("tool_name", ()), ("tool_call_id", ()),
)


def _step_text(step: NormalizedStep) -> list[Any]:
    """What of a step's own fields is text to scan (its gate reads these): `STEP_TEXT`, and more."""
    return [step.name, step.status, step.operation, step.provider, step.request_model, step.response_model, step.agent_name,
            step.conversation_id, step.tool_name, step.tool_call_id, step.finish_reasons, step.request_params]


_SPAN_TEXT = ("name", "kind", "status_code", "scope_name", "scope_version")  # (kind and status: free text in flat JSON)


def _span_text(span: SpanRecord) -> list[Any]:
    """What of a span's own fields is text to scan: `_SPAN_TEXT` and its events' names."""
    own = [span.name, span.kind, span.status_code, span.scope_name, span.scope_version]
    return own + [e.name for e in span.events] if span.events else own


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
        check_redact(redact)
        self.redactor = redact if isinstance(redact, Redactor) else (Redactor() if redact is True else None)
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
        bits, message_bits, own_text = self._bits(r, item, span)
        if bits == 0 == message_bits and not (span.resource and self._redacted_resource(r, span.resource)[1]):
            if step is not None:
                step.redacted = []
            item.span = span  # nothing to redact: the same objects, nothing walked
            return item
        bound = bits if bits >= 0 else None  # the scans that can find anything: strings are not gated again
        own_bits = 0 if bits == 0 else r._span_bits(own_text)[0]  # the span's and the step's own names and ids
        own = own_bits if own_bits >= 0 else None
        found: set[str] = set()

        def note(part: str, names: frozenset[str]) -> None:
            found.update(f"{part}:{n}" for n in names)

        if step is not None:
            content = step.content
            content.inputs, names = r.messages(content.inputs, message_bits)
            note("input", names)
            content.outputs, names = r.messages(content.outputs, message_bits)
            note("output", names)
            if content.system:
                system = content.system
                content.system, names = r.messages(system, message_bits)
                note("system", names)
                content.system, names = r.across_parts(system, content.system, bound)  # a secret split across parts
                note("system", names)
            if content.tools:
                content.tools, names = r.messages(content.tools, message_bits)
                note("tools", names)
            if step.error_message:
                step.error_message, names = r._text(step.error_message, bound)
                note("error", names)
            if step.error_type:  # taken from error text by some sources: scanned like it
                step.error_type, names = self._column(step.error_type, ("error.type",), bound)
                note("error", names)
            if own != 0 or r.attribute_rules:
                note("step", self._step(step, own))
            if step.request_params:  # a policy that re-runs the step is given them: "input", as its messages
                step.request_params, names = r._value(step.request_params, bound)
                note("input", names)
        attributes, names = r.attributes(item.attributes, bound)
        item.attributes = attributes if isinstance(attributes, dict) else dict(attributes)
        note("attributes", names)
        span, names = self._span(span, bound, own)
        note("attributes", names)
        if step is not None:
            if step.service_name is not None:  # read from the resource at normalization: as it is stored now
                step.service_name = span.service_name
            step.redacted = sorted(found)
        item.span = span
        return item

    def _bits(self, r: Redactor, item: NormalizedSpan, span: SpanRecord) -> tuple[int, int, list[Any]]:
        """The gate bits of what the span stores besides its messages (attributes, status, events,
        links, error, its and its step's own names and ids), and of its messages
        (`Redactor._span_bits`); and those names and ids (gated again alone when the span is not
        clean, so that they are scanned only when they hold something). A message proven clean
        before is not read again: an agent loop resends its history."""
        step = item.step
        own = _span_text(span) if step is None else _span_text(span) + _step_text(step)
        values: Any = item.attributes
        if values.__class__ is not dict:
            return -1, -1, own
        values = [values, span.status_message, [e.attributes for e in span.events], span.links, own]
        if step is None:
            return *r._span_bits(values), own
        content = step.content
        values += [step.error_message, step.error_type, joined_text({"parts": content.system})]
        return *r._span_bits(values, (content.inputs, content.system, content.tools), content.outputs), own

    def _column(self, text: str, attributes: tuple[str, ...], bound: int | None) -> tuple[str, frozenset[str]]:
        """A step column read from `attributes`: replaced whole when a rule names one of them, else scanned."""
        r = self.redactor
        assert r is not None
        for attribute in attributes:
            rule = r.field(attribute)
            if rule is not None:
                return r.placeholder.format(name=rule), frozenset({rule})
        return r._text(text, bound)

    def _step(self, step: NormalizedStep, bound: int | None) -> frozenset[str]:
        """The step's own text columns redacted in place (names, models, ids, finish reasons)."""
        r = self.redactor
        assert r is not None
        names: frozenset[str] = NONE
        for column, attributes in STEP_TEXT:
            text = getattr(step, column)
            if text:
                new, found = self._column(text, attributes, bound)
                if found:
                    setattr(step, column, new)
                    names = names | found
        if step.finish_reasons:
            reasons, found = r._value(step.finish_reasons, bound)
            if found:
                step.finish_reasons, names = reasons, names | found
        return names

    def _redacted_resource(self, r: Redactor, resource: Any) -> tuple[Any, frozenset[str]]:
        """A span's resource redacted, once per resource object (a process has one)."""
        cached = self._resource
        if cached is None or cached[0] is not resource:
            cached = self._resource = (resource, r.attributes(resource))
        return cached[1]

    def _span(self, span: SpanRecord, bound: int | None, own: int | None) -> tuple[SpanRecord, frozenset[str]]:
        """Status message, event and link attributes and the resource of a span, redacted; and its
        names (span, scope, events: `own` bounds their scans)."""
        r = self.redactor
        assert r is not None
        changes: dict[str, Any] = {}
        names: frozenset[str] = NONE
        if span.status_message:
            text, found = r._text(span.status_message, bound)
            if found:
                changes["status_message"], names = text, names | found
        for field in _SPAN_TEXT if own != 0 else ():
            value = getattr(span, field)
            if value:
                text, found = r._text(value, own)
                if found:
                    changes[field], names = text, names | found
        if span.events:
            events, changed = [], False
            for e in span.events:
                attrs, found = r.attributes(e.attributes, bound) if e.attributes else (e.attributes, NONE)
                name, in_name = r._text(e.name, own)
                found = found | in_name
                changed |= bool(found)
                events.append(SpanEvent(name, e.time_ns, attrs) if found else e)
                names = names | found if found else names
            if changed:
                changes["events"] = events
        if span.links:  # a link's attributes, and whatever else a source kept in it
            links, found = r.value(span.links) if bound is None else r._value(span.links, bound)
            if found:
                changes["links"], names = links, names | found
        if span.resource:
            resource, found = self._redacted_resource(r, span.resource)
            if found:
                changes["resource"], names = resource, names | found
        return (dataclasses.replace(span, **changes) if changes else span), names


_FALLBACK = Redactor(gates=False)  # the built-ins alone (no user rule, no memo): what a failed span's names get


def _closed(text: str | None) -> str | None:
    """A name of a span whose redaction failed, through the built-in detectors (or wholly replaced)."""
    if not text:
        return text
    try:
        return _FALLBACK.text(text)[0]
    except Exception:  # noqa: BLE001 - never let it through
        return "[REDACTED:redaction-failed]"


def _fail_closed(item: NormalizedSpan, exc: Exception) -> NormalizedSpan:
    """Drop everything a failed redaction may have left: payloads, attributes, messages, request
    parameters; the names and ids that stay go through the built-in detectors alone."""
    step = item.step
    if step is not None:
        step.content = StepContent()
        step.error_message = None
        step.error_type = "error" if step.error_type else None
        for column, _ in STEP_TEXT:
            setattr(step, column, _closed(getattr(step, column)))
        step.finish_reasons = [_closed(r) or "" for r in step.finish_reasons]
        step.request_params = {}
        step.service_name = None
        step.redacted = ["all:redaction-failed"]
    item.attributes = {}
    span = item.span
    closed: dict[str, Any] = {field: _closed(getattr(span, field)) for field in _SPAN_TEXT}
    item.span = dataclasses.replace(span, status_message=None, resource={}, links=[], **closed,
                                    events=[SpanEvent(_closed(e.name) or "", e.time_ns, {}) for e in span.events])
    item.problems.append(f"redaction failed: {type(exc).__name__}: {exc}"[:200] + "; payloads and attributes dropped")
    return item


DEFAULT_PRIVACY = Privacy()
"""Built-in detectors on, every payload kept: what capture, import and collect use unless told otherwise."""
