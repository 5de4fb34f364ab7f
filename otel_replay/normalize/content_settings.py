"""Why a GenAI span's content is missing or unreadable, and the setting that fixes it (for the
warnings capture says once per cause and instrumentation)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

LENGTH_LIMITS = ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")

_HINTS: tuple[tuple[str, str], ...] = (
    ("opentelemetry.instrumentation.openai_v2",
     "set OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_and_event and "
     "OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental"),
    ("opentelemetry.util.genai",
     "set OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_and_event "
     "(or event_only, with ReplayLogProcessor on the LoggerProvider)"),
    ("opentelemetry.instrumentation.genai",
     "set OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_and_event"),
    ("opentelemetry.instrumentation.openai.v1", "set TRACELOOP_TRACE_CONTENT=true"),
    ("opentelemetry.instrumentation.anthropic", "set TRACELOOP_TRACE_CONTENT=true"),
    ("openinference", "unset OPENINFERENCE_HIDE_INPUTS / OPENINFERENCE_HIDE_OUTPUTS (and their *_MESSAGES variants)"),
    ("com.anthropic.sdk.python", "set ANTHROPIC_OPEN_TELEMETRY_TRACES_CONTENT_MODE=content"),
    ("langfuse", "turn off input/output masking in the Langfuse client"),
)

GENERIC = (
    "turn on message content capture in the instrumentation (for OpenTelemetry GenAI packages: "
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_and_event); content sent as log events "
    "also needs ReplayLogProcessor on the LoggerProvider, or the logs sent to `otel-replay collect` (/v1/logs)"
)


def content_setting_hint(scope_name: str | None) -> str:
    for prefix, hint in _HINTS:
        if scope_name and scope_name.startswith(prefix):
            return hint
    return GENERIC


def _limit() -> tuple[str, int] | None:
    """The attribute length limit this process's SDK applies, if one is set in the environment."""
    for name in LENGTH_LIMITS:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return name, int(value)
    return None


def _json_error(text: str) -> json.JSONDecodeError | None:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return exc
    except (ValueError, RecursionError):
        return None
    return None


def payload_problem(attributes: Mapping[str, Any], is_payload_key: Callable[[str], bool], convention: str,
                    scope_name: str | None, error: BaseException) -> str:
    """Why an adapter could not read a span's payload: a value cut off by an attribute length limit,
    malformed JSON, or another shape. The text before the first colon is the kind counted in the store
    (no span text in it: a scope name could carry anything); up to the second, the warning's key."""
    scope = scope_name or "an instrumentation"
    for key, value in attributes.items():
        if not isinstance(value, str) or not is_payload_key(key):
            continue
        bad = _json_error(value)
        if bad is None:
            continue
        limit = _limit()
        if limit is not None and len(value) == limit[1]:
            return (f"payload truncated ({convention}): from {scope}: {key} is cut at {limit[1]} characters, the "
                    f"attribute length limit {limit[0]}={limit[1]}; raise or unset it (or SpanLimits("
                    f"max_attribute_length=...)) so whole messages are recorded")
        if bad.pos >= len(value.rstrip()) - 1 or bad.msg.startswith("Unterminated string"):
            return (f"payload truncated ({convention}): from {scope}: {key} ends mid-JSON after {len(value)} characters, "
                    f"as an attribute length limit cuts it (OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT, "
                    f"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT or SpanLimits(max_attribute_length) in the service, or a "
                    f"collector's transform); raise or remove the limit")
        return (f"payload malformed ({convention}): from {scope}: {key} is not valid JSON ({bad.msg} at character "
                f"{bad.pos}); content capture is on, but what the instrumentation (or a processor rewriting "
                f"attributes) wrote cannot be read: check its version")
    return f"unreadable payload ({convention}): from {scope}: {type(error).__name__}: {error}"[:300]
