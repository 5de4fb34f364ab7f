"""What a convention adapter is, and the fields every convention shares (ids, times, errors)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.step import NormalizedStep, StepContent

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

    # Read-only properties, so an adapter's class attributes may be narrower (a frozenset, not None).
    @property
    def name(self) -> str: ...

    # `matches` is False for a span that carries none of `marker_keys` and whose scope is not
    # `marker_scope`, so `pipeline.adapter_for` rules such spans out without a call
    # (`marker_keys` None: no such promise).
    @property
    def marker_keys(self) -> frozenset[str] | None: ...

    @property
    def marker_scope(self) -> str | None: ...

    # When `is_payload_key(key)` is exactly `key in payload_keys`, those keys (else None).
    @property
    def payload_keys(self) -> frozenset[str] | None: ...

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


_REQUEST_PARAM_KEYS = frozenset(REQUEST_PARAM_KEYS)


def request_params(attrs: Mapping[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if _REQUEST_PARAM_KEYS.isdisjoint(attrs):  # most spans set none: one pass over their keys
        return params
    for key, name in REQUEST_PARAM_KEYS.items():
        value = attrs.get(key)
        if value is not None:
            params[name] = list(value) if isinstance(value, tuple) else value
    return params


def _text(value: Any) -> str | None:
    """`as_str` with the common case (already text, or absent) inline."""
    return value if value is None or value.__class__ is str else as_str(value)


def base_step(
    span: SpanRecord, *, convention: str, kind: str, operation: str | None, name: str,
    content: StepContent | None = None,
) -> NormalizedStep:
    """A step with the fields every convention fills the same way (and `content`, if given).

    Each field reads the first of its attribute names that is set (`first`), spelled out inline:
    this runs once per span on the import and capture paths.
    """
    attrs = span.attributes
    get = attrs.get
    status = span.status_code
    if span.events or status == "error":
        error_type, error_message = error_of(span)
    else:  # error_of without exception events or an error status
        error_type, error_message = clean_error_type(_text(get("error.type"))), None
    if error_type is not None and status == "unset":
        status = "error"
    provider = get("gen_ai.provider.name")
    if provider is None:
        provider = get("gen_ai.system")
        if provider is None:
            provider = get("llm.provider")
            if provider is None:
                provider = get("llm.system")
    llm_model = get("llm.model_name")
    request_model = get("gen_ai.request.model")
    if request_model is None:
        request_model = llm_model
    response_model = get("gen_ai.response.model")
    if response_model is None:
        response_model = llm_model
    input_tokens = get("gen_ai.usage.input_tokens")
    if input_tokens is None:
        input_tokens = get("gen_ai.usage.prompt_tokens")
        if input_tokens is None:
            input_tokens = get("llm.token_count.prompt")
    output_tokens = get("gen_ai.usage.output_tokens")
    if output_tokens is None:
        output_tokens = get("gen_ai.usage.completion_tokens")
        if output_tokens is None:
            output_tokens = get("llm.token_count.completion")
    conversation_id = get("gen_ai.conversation.id")
    if conversation_id is None:
        conversation_id = get("session.id")
    agent_name = get("gen_ai.agent.name")
    # positional, in `_STEP_FIELDS` order: half the cost of 21 keyword arguments
    return NormalizedStep(
        span.trace_id, span.span_id, span.parent_span_id, kind, operation, name, convention,
        span.start_ns, span.end_ns, status, error_type, error_message,
        provider if provider is None or provider.__class__ is str else as_str(provider),
        request_model if request_model is None or request_model.__class__ is str else as_str(request_model),
        response_model if response_model is None or response_model.__class__ is str else as_str(response_model),
        None if input_tokens is None else as_int(input_tokens),
        None if output_tokens is None else as_int(output_tokens),
        agent_name if agent_name is None or agent_name.__class__ is str else as_str(agent_name),
        conversation_id if conversation_id is None or conversation_id.__class__ is str else as_str(conversation_id),
        None, None, request_params(attrs), [], StepContent() if content is None else content, span.service_name, [],
    )


_STEP_FIELDS = (
    "trace_id", "span_id", "parent_span_id", "kind", "operation", "name", "convention", "start_ns", "end_ns",
    "status", "error_type", "error_message", "provider", "request_model", "response_model", "input_tokens",
    "output_tokens", "agent_name", "conversation_id", "tool_name", "tool_call_id", "request_params",
    "finish_reasons", "content", "service_name", "redacted",
)
if tuple(f.name for f in dataclasses.fields(NormalizedStep)) != _STEP_FIELDS:  # base_step passes them by position
    raise RuntimeError("NormalizedStep's fields changed: update base_step and _STEP_FIELDS")


def step_name(kind: str, operation: str | None, model: str | None, fallback: str) -> str:
    """A convention-independent step name: `<operation> <model>` for model calls."""
    if kind in ("llm", "embedding") and operation:
        return f"{operation} {model}" if model else operation
    return fallback
