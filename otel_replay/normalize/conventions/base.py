"""What a convention adapter is, and the fields every convention shares (ids, times, errors)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.step import NormalizedStep

REQUEST_PARAM_KEYS = {
    "gen_ai.request.temperature": "temperature",
    "gen_ai.request.max_tokens": "max_tokens",
    "gen_ai.request.top_p": "top_p",
    "gen_ai.request.top_k": "top_k",
    "gen_ai.request.seed": "seed",
    "gen_ai.request.frequency_penalty": "frequency_penalty",
    "gen_ai.request.presence_penalty": "presence_penalty",
    "gen_ai.request.stop_sequences": "stop_sequences",
    "gen_ai.request.choice.count": "n",
    "gen_ai.request.stream": "stream",
}


class Convention(Protocol):
    """Turns one span (and the log events joined to it) into a canonical step."""

    name: str

    def matches(self, span: SpanRecord) -> bool: ...

    def normalize(self, span: SpanRecord, logs: Sequence[LogEvent]) -> NormalizedStep | None: ...

    def is_payload_key(self, key: str) -> bool:
        """Whether an attribute holds content that the step row already carries."""
        ...


def first(attrs: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = attrs.get(key)
        if value is not None:
            return value
    return None


def as_int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: float('inf')
        return None
    return number if -(2**63) <= number < 2**63 else None  # the store's BIGINT


def as_str(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


FINISH_REASONS = {
    "tool_calls": "tool_call", "tool_use": "tool_call", "function_call": "tool_call",
    "end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
}


def finish_reasons(values: Any) -> list[str]:
    """Finish reasons in the semconv's normalized vocabulary (`tool_calls`, `end_turn` -> ...)."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [FINISH_REASONS.get(str(v), str(v)) for v in values]


def clean_error_type(value: str | None) -> str | None:
    """`<class 'openai.RateLimitError'>` -> `openai.RateLimitError`."""
    if value and value.startswith("<class '") and value.endswith("'>"):
        return value[8:-2]
    return value


def error_of(span: SpanRecord) -> tuple[str | None, str | None]:
    """(error type, message) from `error.type`, exception events and the span status."""
    error_type = as_str(span.attributes.get("error.type"))
    message = span.status_message if span.status_code == "error" else None
    for event in span.events:
        if event.name == "exception":
            error_type = error_type or as_str(event.attributes.get("exception.type"))
            message = message or as_str(event.attributes.get("exception.message"))
    if span.status_code == "error" and error_type is None:
        error_type = "error"
    return clean_error_type(error_type), message


def request_params(attrs: Mapping[str, Any]) -> dict[str, Any]:
    params = {}
    for key, name in REQUEST_PARAM_KEYS.items():
        value = attrs.get(key)
        if value is not None:
            params[name] = list(value) if isinstance(value, tuple) else value
    return params


def base_step(
    span: SpanRecord, *, convention: str, kind: str, operation: str | None, name: str
) -> NormalizedStep:
    """A step with the fields every convention fills the same way."""
    attrs = span.attributes
    error_type, error_message = error_of(span)
    status = span.status_code
    if error_type is not None and status == "unset":
        status = "error"
    return NormalizedStep(
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_span_id=span.parent_span_id,
        kind=kind,
        operation=operation,
        name=name,
        convention=convention,
        start_ns=span.start_ns,
        end_ns=span.end_ns,
        status=status,
        error_type=error_type,
        error_message=error_message,
        provider=as_str(first(attrs, "gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system")),
        request_model=as_str(first(attrs, "gen_ai.request.model", "llm.model_name")),
        response_model=as_str(first(attrs, "gen_ai.response.model", "llm.model_name")),
        input_tokens=as_int(
            first(attrs, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
        ),
        output_tokens=as_int(
            first(
                attrs,
                "gen_ai.usage.output_tokens",
                "gen_ai.usage.completion_tokens",
                "llm.token_count.completion",
            )
        ),
        agent_name=as_str(attrs.get("gen_ai.agent.name")),
        conversation_id=as_str(first(attrs, "gen_ai.conversation.id", "session.id")),
        request_params=request_params(attrs),
        service_name=span.service_name,
    )


def step_name(kind: str, operation: str | None, model: str | None, fallback: str) -> str:
    """A convention-independent step name: `<operation> <model>` for model calls."""
    if kind in ("llm", "embedding") and operation:
        return f"{operation} {model}" if model else operation
    return fallback
