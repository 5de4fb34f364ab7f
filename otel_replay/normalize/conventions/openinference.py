"""OpenInference (Arize): `openinference.span.kind` with `llm.input_messages.{i}.message.*`.

With `OPENINFERENCE_ENABLE_GENAI_SEMCONV=true` the span also carries the GenAI JSON attributes;
those are preferred, the indexed ones fill in otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from otel_replay.normalize import content as carriers
from otel_replay.normalize.conventions.base import as_str, base_step, first, step_name
from otel_replay.normalize.conventions.genai import tool_content
from otel_replay.normalize.conventions.indexed import unflatten
from otel_replay.normalize.message_types import Message, ToolCallResponsePart
from otel_replay.normalize.messages import (
    canonical_tool_definitions,
    from_openai_message,
    parse_json,
)
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.step import NormalizedStep, StepContent

KINDS = {"LLM": "llm", "TOOL": "tool", "RETRIEVER": "retrieval", "EMBEDDING": "embedding", "AGENT": "agent"}
PAYLOAD_PREFIXES = (
    "llm.input_messages.", "llm.output_messages.", "llm.tools.", "llm.prompts.",
    "retrieval.documents.", "embedding.embeddings.",
)
PAYLOAD_KEYS = frozenset({"input.value", "output.value", "llm.invocation_parameters"}) | carriers.PAYLOAD_ATTRIBUTES
PARAMS = ("temperature", "max_tokens", "max_completion_tokens", "top_p", "seed", "frequency_penalty", "presence_penalty", "stop", "n")


def _wire(entry: Any) -> dict[str, Any]:
    """`{"message": {role, content, contents, tool_calls: [{tool_call: {...}}]}}` as an OpenAI message."""
    message = dict(entry.get("message") or {}) if isinstance(entry, Mapping) else {}
    calls = message.pop("tool_calls", None) or []
    message["tool_calls"] = [c.get("tool_call") or c for c in calls if isinstance(c, Mapping)]
    contents = message.pop("contents", None)
    if message.get("content") is None and contents:
        message["content"] = [
            {"type": "text", "text": (c.get("message_content") or {}).get("text", "")}
            for c in contents
            if isinstance(c, Mapping)
        ]
    return message


def _exact_tool_results(messages: list[Message], wire: list[Message]) -> None:
    """Put back the tool result string that was sent where the GenAI attributes hold it parsed.

    With `OPENINFERENCE_ENABLE_GENAI_SEMCONV=true`, `gen_ai.input.messages` carries a JSON tool
    result as an object, while `llm.input_messages.{i}.message.content` keeps the exact string,
    which is what every other convention stores. A message is replaced, never changed: the
    canonical ones are memoized and shared across spans (a change would reach a message that
    redaction already proved clean in another span, and store a secret unredacted).
    """
    def responses(msgs: list[Message]) -> list[Mapping[str, Any]]:
        return [p for m in msgs for p in m.get("parts", []) if p.get("type") == "tool_call_response"]

    def parsed(part: Mapping[str, Any]) -> TypeGuard[ToolCallResponsePart]:
        return part.get("type") == "tool_call_response" and not isinstance(part.get("response"), str) \
            and part.get("id") in sent

    sent = {p["id"]: p["response"] for p in responses(wire)
            if p.get("id") is not None and isinstance(p.get("response"), str)}
    for i, message in enumerate(messages):
        parts = message.get("parts", [])
        if any(parsed(p) for p in parts):
            messages[i] = {**message, "parts": [{**p, "response": sent[p["id"]]} if parsed(p) else p for p in parts]}


class OpenInference:
    name = "openinference"
    marker_keys = frozenset({"openinference.span.kind"})
    marker_scope = None
    payload_keys = None  # prefixes too

    def matches(self, span: SpanRecord) -> bool:
        return "openinference.span.kind" in span.attributes

    def is_payload_key(self, key: str) -> bool:
        return key in PAYLOAD_KEYS or key.startswith(PAYLOAD_PREFIXES)

    def normalize(self, span: SpanRecord, logs: Sequence[LogEvent]) -> NormalizedStep | None:
        attrs = span.attributes
        kind = KINDS.get(str(attrs.get("openinference.span.kind", "")).upper())
        if kind is None:
            return None
        if kind == "tool":
            return self._tool(span)
        invocation = parse_json(attrs.get("llm.invocation_parameters"))
        invocation = invocation if isinstance(invocation, Mapping) else {}
        request = parse_json(attrs.get("input.value"))
        request = request if isinstance(request, Mapping) else {}
        operation = {"llm": "text_completion" if "prompt" in request else "chat", "embedding": "embeddings",
                     "retrieval": "retrieval", "agent": "invoke_agent"}[kind]
        model = as_str(first(invocation, "model") or request.get("model") or attrs.get("llm.model_name"))
        name = step_name(kind, operation, model, as_str(attrs.get("gen_ai.agent.name")) or span.name)
        step = base_step(span, convention=self.name, kind=kind, operation=operation, name=name)
        step.request_model = model
        step.request_params = {k: invocation[k] for k in PARAMS if invocation.get(k) is not None}
        if kind == "llm":
            self._llm_content(step, attrs)
        elif kind == "embedding":
            texts = [e.get("embedding", {}).get("text") for e in unflatten(attrs, "embedding.embeddings")
                     if isinstance(e, Mapping)]
            step.content = StepContent(inputs=[{"role": "user", "parts": [{"type": "text", "content": t}]}
                                               for t in texts if t is not None])
        elif kind == "retrieval":
            self._retrieval_content(step, attrs)
        return step

    def _llm_content(self, step: NormalizedStep, attrs: Mapping[str, Any]) -> None:
        semconv, finish = carriers.from_semconv_attributes(attrs)
        indexed = StepContent(
            inputs=[from_openai_message(_wire(m)) for m in unflatten(attrs, "llm.input_messages")],
            outputs=[from_openai_message({"role": "assistant", **_wire(m)}) for m in unflatten(attrs, "llm.output_messages")],
            tools=canonical_tool_definitions(
                [parse_json((t.get("tool") or {}).get("json_schema")) for t in unflatten(attrs, "llm.tools")
                 if isinstance(t, Mapping)]
            ),
        )
        _exact_tool_results(semconv.inputs, indexed.inputs)
        step.content = carriers.merge(semconv, indexed)
        reason = attrs.get("llm.finish_reason")
        step.finish_reasons = finish or ([str(reason)] if reason is not None else [])

    def _retrieval_content(self, step: NormalizedStep, attrs: Mapping[str, Any]) -> None:
        query = attrs.get("input.value")
        docs = [d.get("document") or {} for d in unflatten(attrs, "retrieval.documents") if isinstance(d, Mapping)]
        step.content = StepContent(
            inputs=[{"role": "user", "parts": [{"type": "text", "content": str(query)}]}] if query is not None else [],
            outputs=[{"role": "tool", "parts": [{"type": "text", "content": str(d.get("content", ""))} for d in docs]}]
            if docs else [],
        )

    def _tool(self, span: SpanRecord) -> NormalizedStep:
        attrs = span.attributes
        tool = as_str(first(attrs, "tool.name", "gen_ai.tool.name")) or span.name
        step = base_step(span, convention=self.name, kind="tool", operation="execute_tool", name=tool)
        step.tool_name = tool
        step.tool_call_id = as_str(first(attrs, "tool_call.id", "tool.id", "gen_ai.tool.call.id"))
        step.content = tool_content(
            step.tool_call_id, tool, first(attrs, "tool.parameters", "input.value"), attrs.get("output.value")
        )
        return step
