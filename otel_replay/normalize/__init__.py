"""Normalize layer: every source and convention into one canonical step row.

Names load on first use: a module of this package (`records`, `content_settings`) imports without
the convention adapters and the redaction detectors behind `normalize_span`, so the capture
processor's start-up pays for them on its writer thread, not on the service's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_replay.normalize.pipeline import NormalizedSpan, normalize_span, normalize_spans
    from otel_replay.normalize.records import LogEvent, SpanEvent, SpanRecord
    from otel_replay.normalize.step import NormalizedStep, StepContent

_WHERE = {
    "LogEvent": "otel_replay.normalize.records",
    "NormalizedSpan": "otel_replay.normalize.pipeline",
    "NormalizedStep": "otel_replay.normalize.step",
    "SpanEvent": "otel_replay.normalize.records",
    "SpanRecord": "otel_replay.normalize.records",
    "StepContent": "otel_replay.normalize.step",
    "normalize_span": "otel_replay.normalize.pipeline",
    "normalize_spans": "otel_replay.normalize.pipeline",
}
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


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'otel_replay.normalize' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
