"""A simulated chat model for tests, examples and benchmarks: an OpenAI-compatible server on
127.0.0.1 whose answers are a seeded, scriptable function of the request."""

from otel_replay.testing.model import ChatRequest, SimulatedModel, ToolCall
from otel_replay.testing.server import SimulatedModelServer

__all__ = ["ChatRequest", "SimulatedModel", "SimulatedModelServer", "ToolCall"]
