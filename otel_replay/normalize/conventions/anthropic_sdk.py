"""The Anthropic Python SDK's own spans (`anthropic.messages.create`, scope `com.anthropic.sdk.python`).

GenAI attributes in the parts shape, but the finish reason lives in `anthropic.message.stop_reason`.
"""

from __future__ import annotations

from collections.abc import Sequence

from otel_replay.normalize.conventions.genai import GenAI
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.step import NormalizedStep

SCOPE = "com.anthropic.sdk.python"


class AnthropicSdk(GenAI):
    name = "anthropic-sdk"
    marker_keys = frozenset({"anthropic.message.stop_reason"})
    marker_scope = SCOPE

    def matches(self, span: SpanRecord) -> bool:
        return span.scope_name == SCOPE or "anthropic.message.stop_reason" in span.attributes

    def normalize(self, span: SpanRecord, logs: Sequence[LogEvent]) -> NormalizedStep | None:
        step = super().normalize(span, logs)
        stop = span.attributes.get("anthropic.message.stop_reason")
        if step is not None and stop is not None and not step.finish_reasons:
            step.finish_reasons = [str(stop)]
        return step
