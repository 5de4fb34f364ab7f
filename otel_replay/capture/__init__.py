"""Capture layer: span and log processors that feed the store without slowing the service.

Names load on first use, so importing the package costs a service (almost) nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_replay.capture.logs import ReplayLogProcessor
    from otel_replay.capture.processor import ReplayProcessor

_WHERE = {"ReplayProcessor": "otel_replay.capture.processor", "ReplayLogProcessor": "otel_replay.capture.logs"}
__all__ = ["ReplayLogProcessor", "ReplayProcessor"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
