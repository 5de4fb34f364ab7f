"""Where GenAI payloads travel besides a convention's own attributes: log events.

Two carriers, both read by several conventions: the current `gen_ai.client.inference.operation.details`
event (structured messages, the same names as the span attributes) and the semconv 1.30
per-message events (`gen_ai.user.message`, `gen_ai.choice`, ...), whose bodies use the OpenAI
wire shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from otel_replay.normalize.message_types import Message
from otel_replay.normalize.messages import (
    canonical_messages,
    canonical_system,
    canonical_tool_definitions,
    finish_reason_of,
    from_openai_message,
    messages_from_json,
    parse_json,
)
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.step import StepContent

DETAILS_EVENT = "gen_ai.client.inference.operation.details"
MESSAGE_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
CHOICE_EVENT = "gen_ai.choice"
CONTENT_EVENTS = frozenset({DETAILS_EVENT, CHOICE_EVENT, *MESSAGE_EVENTS})
PAYLOAD_ATTRIBUTES = frozenset(
    {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.definitions",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    }
)


_TEXT = (str, bytes)


def from_semconv_attributes(attrs: Mapping[str, Any]) -> tuple[StepContent, list[str]]:
    """Content from `gen_ai.input.messages` & co. (JSON strings on spans, structured in events)."""
    get = attrs.get
    raw_in, raw_out = get("gen_ai.input.messages"), get("gen_ai.output.messages")
    system, tools = get("gen_ai.system_instructions"), get("gen_ai.tool.definitions")
    # JSON text parsed here is this step's own: canonicalized in place, not copied
    inputs: list[Message]
    outputs: list[Message]
    if raw_in is None:
        inputs = []
    elif isinstance(raw_in, _TEXT):
        inputs = messages_from_json(raw_in)[0]
    else:
        inputs = canonical_messages(raw_in)
    if raw_out is None:
        outputs = []
    elif isinstance(raw_out, _TEXT):
        outputs, raw_out = messages_from_json(raw_out)
    else:
        outputs = canonical_messages(raw_out)
    content = StepContent(  # (an absent attribute reads as [] without the calls)
        inputs=inputs,
        outputs=outputs,
        system=canonical_system(parse_json(system)) if system is not None else [],
        tools=canonical_tool_definitions(parse_json(tools)) if tools is not None else [],
    )
    return content, finish_reason_of(raw_out) if raw_out is not None else []


def from_details_event(span: SpanRecord, logs: Sequence[LogEvent]) -> tuple[StepContent, list[str]] | None:
    """Content from the operation-details event, as a log record or as a span event."""
    for log in logs:
        if log.event_name == DETAILS_EVENT:
            return from_semconv_attributes(log.attributes)
    for event in span.events:
        if event.name == DETAILS_EVENT:
            return from_semconv_attributes(event.attributes)
    return None


def _choice_message(body: Mapping[str, Any]) -> dict[str, Any]:
    message = dict(body.get("message") or {})
    message.setdefault("role", "assistant")
    if "tool_calls" not in message and body.get("tool_calls"):
        message["tool_calls"] = body["tool_calls"]
    return message


def from_message_events(logs: Sequence[LogEvent]) -> tuple[StepContent, list[str]] | None:
    """Content from semconv 1.30 per-message events, in emission order."""
    inputs: list[Message] = []
    outputs: list[Message] = []
    finish: list[str] = []
    pending_call_ids: list[str | None] = []
    for log in logs:
        body = log.body if isinstance(log.body, Mapping) else {"content": log.body}
        role = MESSAGE_EVENTS.get(log.event_name or "")
        if role is not None:
            wire = dict(body)
            wire["role"] = role
            if role == "assistant":
                pending_call_ids = [c.get("id") for c in wire.get("tool_calls") or [] if isinstance(c, Mapping)]
            if role == "tool":
                call_id = wire.pop("id", None) or (pending_call_ids.pop(0) if pending_call_ids else None)
                wire["tool_call_id"] = call_id
            inputs.append(from_openai_message(wire))
        elif log.event_name == CHOICE_EVENT:
            outputs.append(from_openai_message(_choice_message(body)))
            if body.get("finish_reason") is not None:
                finish.append(str(body["finish_reason"]))
    if not inputs and not outputs:
        return None
    return StepContent(inputs=inputs, outputs=outputs), finish


def merge(primary: StepContent, fallback: StepContent) -> StepContent:
    """Fill the parts `primary` lacks from `fallback`."""
    return StepContent(
        inputs=primary.inputs or fallback.inputs,
        outputs=primary.outputs or fallback.outputs,
        system=primary.system or fallback.system,
        tools=primary.tools or fallback.tools,
    )


def content_from_logs(span: SpanRecord, logs: Sequence[LogEvent]) -> tuple[StepContent, list[str]] | None:
    return from_details_event(span, logs) or from_message_events(logs)
