"""One adapter per span convention; `ADAPTERS` is tried in order and the first match wins."""

from __future__ import annotations

from otel_replay.normalize.conventions.anthropic_sdk import AnthropicSdk
from otel_replay.normalize.conventions.base import Convention
from otel_replay.normalize.conventions.genai import GenAI
from otel_replay.normalize.conventions.langfuse import Langfuse
from otel_replay.normalize.conventions.langsmith import LangSmith
from otel_replay.normalize.conventions.openinference import OpenInference
from otel_replay.normalize.conventions.openllmetry import OpenLLMetryIndexed

ADAPTERS: tuple[Convention, ...] = (
    LangSmith(),
    Langfuse(),
    OpenInference(),
    AnthropicSdk(),
    OpenLLMetryIndexed(),
    GenAI(),
)

__all__ = ["ADAPTERS", "Convention"]
