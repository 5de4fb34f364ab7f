"""Spans and log events in, canonical steps out: adapter choice, log joining, payload stripping."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_replay.normalize.content import CONTENT_EVENTS
from otel_replay.normalize.content_settings import payload_problem
from otel_replay.normalize.conventions import ADAPTERS, Convention
from otel_replay.normalize.conventions.base import base_step, finish_reasons
from otel_replay.normalize.conventions.genai import operation_of
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.step import NormalizedStep, kind_of_operation


@dataclass(slots=True)
class NormalizedSpan:
    """A span ready for storage: its step (if it is one) and its attributes minus payloads."""

    span: SpanRecord
    step: NormalizedStep | None
    attributes: dict[str, Any]
    problems: list[str] = field(default_factory=list)


def _marked_lead(adapters: tuple[Convention, ...]) -> tuple[frozenset[str], frozenset[str], tuple[Convention, ...]]:
    """The marker keys and scopes of the leading adapters that declare them, and the rest."""
    lead = 0
    while lead < len(adapters) and adapters[lead].marker_keys is not None:
        lead += 1
    keys = frozenset().union(*(a.marker_keys or () for a in adapters[:lead]))
    scopes = frozenset(a.marker_scope for a in adapters[:lead] if a.marker_scope is not None)
    return keys, scopes, adapters[lead:]


_LEAD_KEYS, _LEAD_SCOPES, _AFTER_LEAD = _marked_lead(ADAPTERS)


def adapter_for(span: SpanRecord) -> Convention | None:
    """The first of `ADAPTERS` that matches; a span with no adapter's marker goes straight to
    those without markers (in practice: GenAI, the one most spans are)."""
    adapters = ADAPTERS
    if span.scope_name not in _LEAD_SCOPES and _LEAD_KEYS.isdisjoint(span.attributes):
        adapters = _AFTER_LEAD
    for adapter in adapters:
        if adapter.matches(span):
            return adapter
    return None


def _without_payloads(attrs: Mapping[str, Any], adapter: Convention) -> dict[str, Any]:
    """The span's attributes minus those whose content the step row carries."""
    keys = adapter.payload_keys
    if keys is None:
        return {k: v for k, v in attrs.items() if not adapter.is_payload_key(k)}
    out = dict(attrs)  # a copy, then the few payload keys out: about twice as fast as a filter
    for key in keys.intersection(attrs):
        del out[key]
    return out


def _fallback_step(span: SpanRecord, adapter: Convention) -> NormalizedStep:
    """A metadata-only step for a span whose payload could not be read."""
    operation = operation_of(span) or "chat"
    kind = kind_of_operation(operation) or "llm"
    return base_step(span, convention=adapter.name, kind=kind, operation=operation, name=span.name)


def normalize_span(span: SpanRecord, logs: Sequence[LogEvent] = ()) -> NormalizedSpan:
    adapter = adapter_for(span)
    if adapter is None:
        return NormalizedSpan(span, None, dict(span.attributes))
    problems: list[str] = []
    try:
        step = adapter.normalize(span, logs)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        problems.append(payload_problem(span.attributes, adapter.is_payload_key, adapter.name, span.scope_name, exc))
        step = _fallback_step(span, adapter)
    if step is not None:
        step.finish_reasons = finish_reasons(step.finish_reasons)
    return NormalizedSpan(span, step, _without_payloads(span.attributes, adapter), problems)


def _step_window(span: SpanRecord) -> tuple[int, int]:
    return span.start_ns or 0, span.end_ns or span.start_ns or 0


def join_logs(spans: Sequence[SpanRecord], logs: Iterable[LogEvent]) -> tuple[dict[str, list[LogEvent]], list[LogEvent]]:
    """Logs grouped by the span they describe; also the logs that matched no span.

    Content events that name a span which is not a model call (seen with Traceloop streaming,
    where the `gen_ai.choice` event lands on the agent span) go to the model-call span of the
    same trace whose time window contains the event.
    """
    logs = list(logs)
    if not logs:
        return {}, []
    by_id = {s.span_id: s for s in spans}
    model_calls: dict[str, list[SpanRecord]] = defaultdict(list)
    for s in spans:
        if kind_of_operation(operation_of(s)) in ("llm", "embedding") or adapter_for(s) is not None and s.kind == "CLIENT":
            model_calls[s.trace_id].append(s)
    grouped: dict[str, list[LogEvent]] = defaultdict(list)
    unmatched: list[LogEvent] = []
    for log in logs:
        target = by_id.get(log.span_id or "")
        if target is not None and target in model_calls.get(target.trace_id, ()):
            grouped[target.span_id].append(log)
            continue
        if log.event_name in CONTENT_EVENTS and log.time_ns is not None:
            inside = [s for s in model_calls.get(log.trace_id or "", ())
                      if _step_window(s)[0] <= log.time_ns <= _step_window(s)[1]]
            if inside:
                grouped[max(inside, key=lambda s: s.start_ns or 0).span_id].append(log)
                continue
        if target is not None:
            grouped[target.span_id].append(log)
        else:
            unmatched.append(log)
    return grouped, unmatched


def normalize_spans(spans: Sequence[SpanRecord], logs: Iterable[LogEvent] = ()) -> tuple[list[NormalizedSpan], list[LogEvent]]:
    """Normalize a batch; returns the normalized spans and the logs that matched none of them."""
    grouped, unmatched = join_logs(spans, logs)
    return [normalize_span(s, grouped.get(s.span_id, ())) for s in spans], unmatched
