"""otel-replay: which step made this agent run fail, and what would have fixed it."""

from otel_replay._version import __version__
from otel_replay.capture import ReplayLogProcessor, ReplayProcessor
from otel_replay.replay import LLMInputs, ReplayPlan, ReplayRun, policies, replay, replay_async
from otel_replay.trajectory import Step, Store, Trajectory

__all__ = [
    "LLMInputs",
    "ReplayLogProcessor",
    "ReplayPlan",
    "ReplayRun",
    "ReplayProcessor",
    "Step",
    "Store",
    "Trajectory",
    "__version__",
    "policies",
    "replay",
    "replay_async",
]
