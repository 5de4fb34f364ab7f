"""OpenTelemetry GenAI semantic conventions (latest experimental, and the 1.30 event path).

Also the shape Traceloop 0.62+ writes in attribute mode. Content comes from the span's
`gen_ai.*` JSON attributes, else from the log events joined to the span.
"""

from __future__ import annotations

from collections.abc import Sequence

from otel_replay.normalize import content as carriers
from otel_replay.normalize.conventions.base import as_str, base_step, first, step_name
from otel_replay.normalize.message_types import ToolCallRequestPart, ToolCallResponsePart
from otel_replay.normalize.messages import parse_json
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.step import NormalizedStep, StepContent, kind_of_operation

LEGACY_REQUEST_TYPES = {"chat": "chat", "completion": "text_completion", "embedding": "embeddings"}


def operation_of(span: SpanRecord) -> str | None:
    attrs = span.attributes
    operation = attrs.get("gen_ai.operation.name")
    if operation.__class__ is str:  # the common case
        return operation
    operation = as_str(operation)
    if operation is None:
        operation = LEGACY_REQUEST_TYPES.get(as_str(attrs.get("llm.request.type")) or "")
    return operation


class GenAI:
    name = "genai"
    marker_keys: frozenset[str] | None = None
    marker_scope: str | None = None
    payload_keys: frozenset[str] | None = carriers.PAYLOAD_ATTRIBUTES

    def matches(self, span: SpanRecord) -> bool:
        return kind_of_operation(operation_of(span)) is not None

    def is_payload_key(self, key: str) -> bool:
        return key in carriers.PAYLOAD_ATTRIBUTES

    def normalize(self, span: SpanRecord, logs: Sequence[LogEvent]) -> NormalizedStep | None:
        operation = operation_of(span)
        kind = kind_of_operation(operation)
        if kind is None:
            return None
        attrs = span.attributes
        if kind == "tool":
            return self._tool_step(span, operation)
        if kind == "agent":
            name = as_str(first(attrs, "gen_ai.agent.name")) or span.name
            return base_step(span, convention=self.name, kind=kind, operation=operation, name=name,
                             content=carriers.from_semconv_attributes(attrs)[0])
        model = as_str(first(attrs, "gen_ai.request.model", "gen_ai.response.model"))
        content, finish = carriers.from_semconv_attributes(attrs)
        step = base_step(
            span, convention=self.name, kind=kind, operation=operation,
            name=step_name(kind, operation, model, span.name), content=content,
        )
        from_logs = carriers.content_from_logs(span, logs) if logs or span.events else None
        if from_logs is not None:
            step.content = carriers.merge(step.content, from_logs[0])
            finish = finish or from_logs[1]
        step.finish_reasons = finish or [str(r) for r in attrs.get("gen_ai.response.finish_reasons") or []]
        if kind == "embedding":  # some producers log the vector as a `gen_ai.choice`; it is not a message
            step.content.outputs, step.finish_reasons = [], []
        return step

    def _tool_step(self, span: SpanRecord, operation: str | None) -> NormalizedStep:
        attrs = span.attributes
        tool = as_str(attrs.get("gen_ai.tool.name")) or span.name.removeprefix("execute_tool ").strip()
        call_id = as_str(attrs.get("gen_ai.tool.call.id"))
        step = base_step(span, convention=self.name, kind="tool", operation=operation, name=tool, content=tool_content(
            call_id, tool, attrs.get("gen_ai.tool.call.arguments"), attrs.get("gen_ai.tool.call.result")
        ))
        step.tool_name, step.tool_call_id = tool, call_id
        return step


def tool_content(call_id: str | None, tool: str, arguments: object, result: object) -> StepContent:
    """A tool step's input (the call, as the model made it) and output (the tool message)."""
    content = StepContent()
    if arguments is not None:
        call: ToolCallRequestPart = {"type": "tool_call", "name": tool, "arguments": parse_json(arguments)}
        if call_id is not None:
            call["id"] = call_id
        content.inputs = [{"role": "assistant", "parts": [call]}]
    if result is not None:
        response: ToolCallResponsePart = {"type": "tool_call_response", "response": result}
        if call_id is not None:
            response["id"] = call_id
        content.outputs = [{"role": "tool", "parts": [response]}]
    return content
