"""`Privacy`: what of a normalized span may be stored, applied after normalization and before rows.

Per-kind payload switches (`capture_payloads`) first, then a `Redactor` over the step's messages,
the span's attributes, events and resource. A redaction that raises drops the span's payloads and
attributes rather than store them unredacted (fail closed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from otel_replay.normalize.content import CONTENT_EVENTS
from otel_replay.normalize.conventions import ADAPTERS
from otel_replay.normalize.pipeline import NormalizedSpan
from otel_replay.normalize.records import SpanEvent, SpanRecord
from otel_replay.normalize.redact import NONE, Redactor, payload_switches
from otel_replay.normalize.step import StepContent


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
        bits, message_bits = self._bits(r, item, span)
        if bits == 0 == message_bits and not (span.resource and self._redacted_resource(r, span.resource)[1]):
            if step is not None:
                step.redacted = []
            item.span = span  # nothing to redact: the same objects, nothing walked
            return item
        bound = bits if bits >= 0 else None  # the scans that can find anything: strings are not gated again
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
                content.system, names = r.messages(content.system, message_bits)
                note("system", names)
            if content.tools:
                content.tools, names = r.messages(content.tools, message_bits)
                note("tools", names)
            if step.error_message:
                step.error_message, names = r._text(step.error_message, bound)
                note("error", names)
            if step.error_type:  # taken from error text by some sources: scanned like it
                step.error_type, names = r._text(step.error_type, bound)
                note("error", names)
        item.attributes, names = r.attributes(item.attributes, bound)
        note("attributes", names)
        span, names = self._span(span, bound)
        note("attributes", names)
        if step is not None:
            step.redacted = sorted(found)
        item.span = span
        return item

    def _bits(self, r: Redactor, item: NormalizedSpan, span: SpanRecord) -> tuple[int, int]:
        """The gate bits of the span's attributes, status, events, links and error, and of its
        messages (`Redactor._span_bits`). A message proven clean before is not read again: an agent
        loop resends its history."""
        values: Any = item.attributes
        if values.__class__ is not dict:
            return -1, -1
        step = item.step
        if span.status_message or span.events or span.links or step is None or step.error_message or step.error_type:
            values = [values, span.status_message, [e.attributes for e in span.events], span.links,
                      step and step.error_message, step and step.error_type]
        if step is None:
            return r._span_bits(values)
        content = step.content
        return r._span_bits(values, (content.inputs, content.system, content.tools), content.outputs)

    def _redacted_resource(self, r: Redactor, resource: Any) -> tuple[Any, frozenset[str]]:
        """A span's resource redacted, once per resource object (a process has one)."""
        cached = self._resource
        if cached is None or cached[0] is not resource:
            cached = self._resource = (resource, r.attributes(resource))
        return cached[1]

    def _span(self, span: SpanRecord, bound: int | None) -> tuple[SpanRecord, frozenset[str]]:
        """Status message, event and link attributes and the resource of a span, redacted."""
        r = self.redactor
        assert r is not None
        changes: dict[str, Any] = {}
        names: frozenset[str] = NONE
        if span.status_message:
            text, found = r._text(span.status_message, bound)
            if found:
                changes["status_message"], names = text, names | found
        if span.events:
            events, changed = [], False
            for e in span.events:
                attrs, found = r.attributes(e.attributes, bound) if e.attributes else (e.attributes, NONE)
                changed |= attrs is not e.attributes and bool(found)
                events.append(SpanEvent(e.name, e.time_ns, attrs) if found else e)
                names = names | found if found else names
            if changed:
                changes["events"] = events
        if span.links and any(link.get("attributes") for link in span.links):
            links, found = r.value(span.links) if bound is None else r._value(span.links, bound)
            if found:
                changes["links"], names = links, names | found
        if span.resource:
            resource, found = self._redacted_resource(r, span.resource)
            if found:
                changes["resource"], names = resource, names | found
        return (dataclasses.replace(span, **changes) if changes else span), names


def _fail_closed(item: NormalizedSpan, exc: Exception) -> NormalizedSpan:
    """Drop everything a failed redaction may have left: payloads, attributes, messages."""
    step = item.step
    if step is not None:
        step.content = StepContent()
        step.error_message = None
        step.error_type = "error" if step.error_type else None
        step.redacted = ["all:redaction-failed"]
    item.attributes = {}
    item.span = dataclasses.replace(item.span, status_message=None, resource={}, links=[],
                                    events=[SpanEvent(e.name, e.time_ns, {}) for e in item.span.events])
    item.problems.append(f"redaction failed: {type(exc).__name__}: {exc}"[:200] + "; payloads and attributes dropped")
    return item


DEFAULT_PRIVACY = Privacy()
"""Built-in detectors on, every payload kept: what capture, import and collect use unless told otherwise."""
