"""otel-replay: which step made this agent run fail, and what would have fixed it."""

from otel_replay._version import __version__
from otel_replay.capture import ReplayLogProcessor, ReplayProcessor
from otel_replay.trajectory import Step, Store, Trajectory

__all__ = [
    "ReplayLogProcessor",
    "ReplayProcessor",
    "Step",
    "Store",
    "Trajectory",
    "__version__",
]
