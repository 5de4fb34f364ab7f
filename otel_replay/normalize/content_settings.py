"""Which setting turns content capture on, per instrumentation (for the one-time warning)."""

from __future__ import annotations

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
