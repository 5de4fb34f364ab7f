"""OpenLLMetry / Traceloop's older indexed attributes (`gen_ai.prompt.{i}.*`, `gen_ai.completion.{i}.*`)."""

from __future__ import annotations

from collections.abc import Sequence

from otel_replay.normalize import content as carriers
from otel_replay.normalize.conventions.base import base_step, step_name
from otel_replay.normalize.conventions.genai import operation_of
from otel_replay.normalize.conventions.indexed import unflatten
from otel_replay.normalize.messages import canonical_tool_definitions, from_openai_message
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.step import NormalizedStep, StepContent, kind_of_operation

PAYLOAD_PREFIXES = ("gen_ai.prompt.", "gen_ai.completion.", "llm.request.functions.")


def _wire(message: dict) -> dict:
    """An indexed message (tool calls flattened to id/name/arguments) in the OpenAI wire shape."""
    wire = dict(message)
    calls = wire.pop("tool_calls", None) or []
    if calls:
        wire["tool_calls"] = [
            {"id": c.get("id"), "type": "function", "function": {"name": c.get("name"), "arguments": c.get("arguments")}}
            for c in calls
            if isinstance(c, dict)
        ]
    return wire


class OpenLLMetryIndexed:
    name = "openllmetry-indexed"
    marker_keys = frozenset({"gen_ai.prompt.0.role", "gen_ai.completion.0.role", "llm.request.type"})
    marker_scope = None
    payload_keys = None  # prefixes too

    def matches(self, span: SpanRecord) -> bool:
        attrs = span.attributes
        return "gen_ai.input.messages" not in attrs and (
            "gen_ai.prompt.0.role" in attrs or "gen_ai.completion.0.role" in attrs
            or ("llm.request.type" in attrs and "gen_ai.operation.name" not in attrs)
        )

    def is_payload_key(self, key: str) -> bool:
        return key.startswith(PAYLOAD_PREFIXES) or key in carriers.PAYLOAD_ATTRIBUTES

    def normalize(self, span: SpanRecord, logs: Sequence[LogEvent]) -> NormalizedStep | None:
        attrs = span.attributes
        operation = operation_of(span) or "chat"
        kind = kind_of_operation(operation) or "llm"
        model = attrs.get("gen_ai.request.model")
        step = base_step(
            span, convention=self.name, kind=kind, operation=operation,
            name=step_name(kind, operation, model, span.name),
        )
        prompts = [m for m in unflatten(attrs, "gen_ai.prompt") if isinstance(m, dict)]
        completions = [m for m in unflatten(attrs, "gen_ai.completion") if isinstance(m, dict)]
        step.content = StepContent(
            inputs=[from_openai_message(_wire(m)) for m in prompts],
            outputs=[from_openai_message(_wire({"role": "assistant", **m})) for m in completions],
            tools=canonical_tool_definitions(unflatten(attrs, "llm.request.functions")),
        )
        step.finish_reasons = [str(m["finish_reason"]) for m in completions if m.get("finish_reason")]
        if step.content.is_empty():
            from_logs = carriers.content_from_logs(span, logs)
            if from_logs is not None:
                step.content, step.finish_reasons = from_logs
        return step
