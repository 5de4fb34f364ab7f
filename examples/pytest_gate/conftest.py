"""The agent's test fixtures: the (simulated) model, and the OpenAI SDK instrumented as a service
would be, on the global tracer provider (which the otel-replay gate captures)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from otel_replay.testing.recording import enable_content_capture

enable_content_capture()  # message content on the spans (set before the instrumentation loads)

from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor  # noqa: E402

from otel_replay.testing import SimulatedModelServer  # noqa: E402
from otel_replay.testing.support_agent import support_model  # noqa: E402


@pytest.fixture(scope="session")
def model() -> Iterator[SimulatedModelServer]:
    with SimulatedModelServer(support_model()) as server:
        yield server


@pytest.fixture(scope="session")
def client(model: SimulatedModelServer) -> Iterator[object]:
    import openai

    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument()  # the global tracer provider, as in a service
    yield openai.OpenAI(base_url=model.base_url, api_key="sim", max_retries=0)
    instrumentor.uninstrument()
