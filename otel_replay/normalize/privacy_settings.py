"""What a `Privacy` is made from, checked where it is given and built where it is used.

`ReplayProcessor(redact=..., capture_payloads=...)` must reject a bad setting in the service's
call, but the `Privacy` itself (the redaction detectors, the convention adapters) loads on the
capture writer's thread, so a service's start-up does not pay for it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from otel_replay.normalize.step import payload_switches

if TYPE_CHECKING:
    from otel_replay.normalize.privacy import Privacy


def check_redact(redact: Any) -> None:
    """Raise ValueError unless `redact` is a `Redactor`, True, False or None."""
    if redact is None or isinstance(redact, bool):
        return
    loaded = sys.modules.get("otel_replay.normalize.redact")  # an object made by a Redactor loaded it
    if loaded is None or not isinstance(redact, loaded.Redactor):
        raise ValueError(f"redact must be a Redactor, True or False, got {redact!r}")


@dataclass(frozen=True, slots=True)
class PrivacySettings:
    """A `Privacy`'s arguments, checked now; `build` makes it (on the thread that will use it)."""

    redact: Any = True  # a Redactor, True (the built-in detectors) or False/None
    capture_payloads: bool | Mapping[str, bool] = True

    def __post_init__(self) -> None:
        check_redact(self.redact)
        payload_switches(self.capture_payloads)

    def build(self) -> Privacy:
        from otel_replay.normalize.privacy import Privacy

        return Privacy(self.redact, self.capture_payloads)
