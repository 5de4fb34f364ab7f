"""otel-replay: which step made this agent run fail, and what would have fixed it.

Names load on first use: `from otel_replay import ReplayProcessor` imports neither pyarrow nor
DuckDB (a service's start-up pays only for the processor).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from otel_replay._version import __version__

if TYPE_CHECKING:
    from otel_replay.capture import ReplayLogProcessor, ReplayProcessor
    from otel_replay.replay import LLMInputs, ReplayPlan, ReplayRun, policies, replay, replay_async
    from otel_replay.trajectory import Step, Store, Trajectory

_WHERE = {
    "AttributionBatch": "otel_replay.api",
    "AttributionResult": "otel_replay.attribution.result",
    "attribute": "otel_replay.api",
    "attribute_async": "otel_replay.api",
    "ReplayProcessor": "otel_replay.capture.processor",
    "ReplayLogProcessor": "otel_replay.capture.logs",
    "configure": "otel_replay.capture.configure",
    "LLMInputs": "otel_replay.replay",
    "ReplayPlan": "otel_replay.replay",
    "ReplayRun": "otel_replay.replay",
    "policies": "otel_replay.replay",
    "replay": "otel_replay.replay",
    "replay_async": "otel_replay.replay",
    "Step": "otel_replay.trajectory",
    "Store": "otel_replay.trajectory",
    "Trajectory": "otel_replay.trajectory",
    "OtelReplayError": "otel_replay.errors",
}
__all__ = [
    "AttributionBatch",
    "AttributionResult",
    "LLMInputs",
    "OtelReplayError",
    "ReplayLogProcessor",
    "ReplayPlan",
    "ReplayRun",
    "ReplayProcessor",
    "Step",
    "Store",
    "Trajectory",
    "__version__",
    "attribute",
    "attribute_async",
    "configure",
    "policies",
    "replay",
    "replay_async",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value  # once loaded, a plain attribute
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


class _Package(types.ModuleType):
    """`otel_replay.replay` is the function, as it was when this module imported it eagerly: the
    import system sets the subpackage of the same name here when it loads, and this keeps the name."""

    @property
    def replay(self) -> Any:
        return importlib.import_module("otel_replay.replay").replay

    @replay.setter
    def replay(self, value: Any) -> None:
        return None


sys.modules[__name__].__class__ = _Package
