"""Normalize layer: every source and convention into one canonical step row."""

from otel_replay.normalize.pipeline import NormalizedSpan, normalize_span, normalize_spans
from otel_replay.normalize.records import LogEvent, SpanEvent, SpanRecord
from otel_replay.normalize.step import NormalizedStep, StepContent

__all__ = [
    "LogEvent",
    "NormalizedSpan",
    "NormalizedStep",
    "SpanEvent",
    "SpanRecord",
    "StepContent",
    "normalize_span",
    "normalize_spans",
]
