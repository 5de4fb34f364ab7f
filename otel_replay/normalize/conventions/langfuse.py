"""Langfuse SDK v3+ spans (`langfuse.observation.*` attributes, scope `langfuse-sdk`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from otel_replay.normalize.conventions.base import as_int, as_str, base_step, step_name
from otel_replay.normalize.conventions.genai import tool_content
from otel_replay.normalize.message_types import Message
from otel_replay.normalize.messages import canonical_message, from_openai_message, parse_json
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.step import NormalizedStep, StepContent

TYPE = "langfuse.observation.type"
KINDS = {"generation": "llm", "tool": "tool", "agent": "agent", "retriever": "retrieval", "embedding": "embedding"}
OPERATIONS = {"llm": "chat", "tool": "execute_tool", "agent": "invoke_agent", "retrieval": "retrieval",
              "embedding": "embeddings"}
PAYLOAD_KEYS = frozenset({"langfuse.observation.input", "langfuse.observation.output"})


def _metadata(attrs: Mapping[str, Any], key: str) -> Any:
    return parse_json(attrs.get(f"langfuse.observation.metadata.{key}"))


def _messages(value: Any) -> list[Message]:
    if isinstance(value, Mapping) and isinstance(value.get("messages"), list):
        value = value["messages"]
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list):
        return [] if value is None else [{"role": "user", "parts": [{"type": "text", "content": str(value)}]}]
    return [canonical_message(m) if isinstance(m, Mapping) and "parts" in m else from_openai_message(m)
            for m in value if isinstance(m, Mapping)]


def tool_result(output: Any) -> Any:
    """A LangChain ToolMessage's content, else the raw return value."""
    if isinstance(output, Mapping) and output.get("type") == "tool" and "content" in output:
        return output["content"]
    return output


class Langfuse:
    name = "langfuse"
    marker_keys = frozenset({TYPE})
    marker_scope = None
    payload_keys = PAYLOAD_KEYS

    def matches(self, span: SpanRecord) -> bool:
        return TYPE in span.attributes

    def is_payload_key(self, key: str) -> bool:
        return key in PAYLOAD_KEYS

    def normalize(self, span: SpanRecord, logs: Sequence[LogEvent]) -> NormalizedStep | None:
        attrs = span.attributes
        kind = KINDS.get(str(attrs.get(TYPE, "")).lower())
        if kind is None:
            return None
        operation = OPERATIONS[kind]
        model = as_str(_metadata(attrs, "ls_model_name") or attrs.get("langfuse.observation.model.name"))
        step = base_step(span, convention=self.name, kind=kind, operation=operation,
                         name=step_name(kind, operation, model, span.name))
        if attrs.get("langfuse.observation.level") == "ERROR":
            step.status = "error"
            step.error_message = step.error_message or as_str(attrs.get("langfuse.observation.status_message"))
            step.error_type = step.error_type or "error"
        raw_in = attrs.get("langfuse.observation.input")
        raw_out = attrs.get("langfuse.observation.output")
        if kind == "tool":
            step.tool_name = span.name
            output = parse_json(raw_out)
            step.tool_call_id = as_str(_metadata(attrs, "tool_call_id") or
                                       (output.get("tool_call_id") if isinstance(output, Mapping) else None))
            result = tool_result(output) if isinstance(output, Mapping) else raw_out
            step.content = tool_content(step.tool_call_id, span.name, raw_in, result)
            return step
        step.request_model = model
        step.response_model = as_str(attrs.get("langfuse.observation.model.name"))
        params = parse_json(attrs.get("langfuse.observation.model.parameters"))
        step.request_params = dict(params) if isinstance(params, Mapping) else {}
        usage = parse_json(attrs.get("langfuse.observation.usage_details"))
        if isinstance(usage, Mapping):
            step.input_tokens = as_int(usage.get("input"))
            step.output_tokens = as_int(usage.get("output"))
        if kind == "llm":
            step.content = StepContent(inputs=_messages(parse_json(raw_in)), outputs=_messages(parse_json(raw_out)))
        return step
