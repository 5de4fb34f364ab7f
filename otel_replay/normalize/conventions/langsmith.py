"""LangSmith runs (imported as spans carrying `langsmith.*` attributes) as canonical steps."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from otel_replay.normalize.conventions.base import as_int, as_str, base_step, first, step_name
from otel_replay.normalize.conventions.genai import tool_content
from otel_replay.normalize.conventions.langfuse import tool_result
from otel_replay.normalize.langchain import from_langchain_message, from_langchain_messages
from otel_replay.normalize.messages import canonical_tool_definitions, parse_json
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.step import NormalizedStep, StepContent

RUN_TYPE = "langsmith.run_type"
KINDS = {"llm": "llm", "tool": "tool", "retriever": "retrieval", "embedding": "embedding"}
OPERATIONS = {"llm": "chat", "tool": "execute_tool", "retrieval": "retrieval", "embedding": "embeddings",
              "agent": "invoke_agent"}
PAYLOAD_KEYS = frozenset({"langsmith.inputs", "langsmith.outputs"})
PARAMS = ("temperature", "max_tokens", "top_p", "seed", "stop", "n", "frequency_penalty", "presence_penalty")


def _mapping(value: Any) -> Mapping[str, Any]:
    value = parse_json(value)
    return value if isinstance(value, Mapping) else {}


def _is_agent(span: SpanRecord, metadata: Mapping[str, Any]) -> bool:
    """The graph root, or a chain named like an agent."""
    return span.parent_span_id is None or "agent" in span.name.lower() and metadata.get("langgraph_node") is None


class LangSmith:
    name = "langsmith"
    marker_keys = frozenset({RUN_TYPE})
    marker_scope = None
    payload_keys = PAYLOAD_KEYS

    def matches(self, span: SpanRecord) -> bool:
        return RUN_TYPE in span.attributes

    def is_payload_key(self, key: str) -> bool:
        return key in PAYLOAD_KEYS

    def normalize(self, span: SpanRecord, logs: Sequence[LogEvent]) -> NormalizedStep | None:
        attrs = span.attributes
        run_type = str(attrs.get(RUN_TYPE))
        extra = _mapping(attrs.get("langsmith.extra"))
        metadata = _mapping(attrs.get("langsmith.metadata")) or _mapping(extra.get("metadata"))
        kind = KINDS.get(run_type) or ("agent" if run_type == "chain" and _is_agent(span, metadata) else None)
        if kind is None:
            return None
        inputs = parse_json(attrs.get("langsmith.inputs"))
        outputs = parse_json(attrs.get("langsmith.outputs"))
        invocation = _mapping(extra.get("invocation_params"))
        model = as_str(first(metadata, "ls_model_name") or first(invocation, "model", "model_name"))
        operation = OPERATIONS[kind]
        step = base_step(span, convention=self.name, kind=kind, operation=operation,
                         name=step_name(kind, operation, model, span.name))
        step.provider = as_str(metadata.get("ls_provider"))
        step.request_model = model
        step.error_type = step.error_type if step.status != "error" else _error_type(attrs.get("langsmith.error"))
        if kind == "tool":
            return self._tool(step, span, extra, inputs, outputs)
        if kind == "agent":
            return step
        if kind == "llm":
            self._llm(step, attrs, metadata, invocation, inputs, outputs)
        elif kind == "retrieval":
            step.content = StepContent(
                inputs=[{"role": "user", "parts": [{"type": "text", "content": str((inputs or {}).get("query", inputs))}]}],
                outputs=[{"role": "tool", "parts": [{"type": "text", "content": str(d.get("page_content", d))}
                                                    for d in (outputs or {}).get("documents", []) if isinstance(d, Mapping)]}]
                if isinstance(outputs, Mapping) and outputs.get("documents") else [],
            )
        return step

    def _llm(self, step: NormalizedStep, attrs: Mapping[str, Any], metadata: Mapping[str, Any],
             invocation: Mapping[str, Any], inputs: Any, outputs: Any) -> None:
        generations = (outputs or {}).get("generations") if isinstance(outputs, Mapping) else None
        first_gen = generations[0][0] if generations and generations[0] else {}
        message = first_gen.get("message") if isinstance(first_gen, Mapping) else None
        if message is None and isinstance(first_gen, Mapping) and "text" in first_gen:
            message = {"type": "ai", "content": first_gen["text"]}
        prompts = inputs.get("prompts") if isinstance(inputs, Mapping) else None
        step.content = StepContent(
            inputs=from_langchain_messages(inputs) if not prompts else
            [{"role": "user", "parts": [{"type": "text", "content": str(p)}]} for p in prompts[:1]],
            outputs=[from_langchain_message(message)] if message is not None else [],
            tools=canonical_tool_definitions(invocation.get("tools")),
        )
        reason = (first_gen.get("generation_info") or {}).get("finish_reason") if isinstance(first_gen, Mapping) else None
        step.finish_reasons = [str(reason)] if reason else []
        usage = _mapping(metadata.get("usage_metadata"))
        step.input_tokens = as_int(first(usage, "input_tokens")) or as_int(attrs.get("langsmith.prompt_tokens"))
        step.output_tokens = as_int(first(usage, "output_tokens")) or as_int(attrs.get("langsmith.completion_tokens"))
        llm_output = (outputs or {}).get("llm_output") if isinstance(outputs, Mapping) else None
        step.response_model = as_str((llm_output or {}).get("model_name"))
        step.request_params = {k: invocation[k] for k in PARAMS if invocation.get(k) is not None}

    def _tool(self, step: NormalizedStep, span: SpanRecord, extra: Mapping[str, Any], inputs: Any,
              outputs: Any) -> NormalizedStep:
        result = outputs.get("output", outputs) if isinstance(outputs, Mapping) else outputs
        step.tool_name = span.name
        step.tool_call_id = as_str(extra.get("tool_call_id") or (result.get("tool_call_id") if isinstance(result, Mapping) else None))
        if isinstance(inputs, Mapping) and set(inputs) == {"input"}:
            inputs = parse_json(inputs["input"])
        step.content = tool_content(step.tool_call_id, span.name, inputs,
                                    None if not outputs else tool_result(result))  # errored runs: no output
        return step


def _error_type(error: Any) -> str:
    """`ValueError("...")Traceback...` -> `ValueError`; `openai.AuthenticationError: ...` keeps its module.
    Anything else before the first parenthesis, colon or line end (a message, which may hold a
    secret) gives "error"."""
    text = str(error or "error")
    head = re.split(r"[(:\n]", text, maxsplit=1)[0].strip()
    return head if head and all(part.isidentifier() for part in head.split(".")) else "error"
