"""The `OTEL_REPLAY_*` variables that configure capture, read once and checked at start-up.

`configure()` and the zero-code `otel_replay` traces exporter take their defaults from here. Each
variable is named after the `ReplayProcessor` argument it sets. An empty variable counts as unset
(as OpenTelemetry's own variables do); a bad value raises `CaptureConfigError` with one line that
names the variable, what it holds and what it should hold, before any thread starts.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otel_replay.errors import OtelReplayError
from otel_replay.normalize.step import STEP_KINDS
from otel_replay.store.location import STORE_ENV, StoreLocation

if TYPE_CHECKING:
    from otel_replay.normalize.redact import Redactor

STORE = STORE_ENV
"""Store directory or URL (`s3://bucket/prefix`, ...). Default: ./otel-replay-store."""
MAX_QUEUE_SPANS = "OTEL_REPLAY_MAX_QUEUE_SPANS"
"""Spans waiting for the writer before new ones are dropped (and counted). Default: 50000."""
MAX_QUEUE_BYTES = "OTEL_REPLAY_MAX_QUEUE_BYTES"
"""The memory capture may hold, in bytes, or with a KiB, MiB or GiB suffix. Default: 256MiB."""
FLUSH_INTERVAL_S = "OTEL_REPLAY_FLUSH_INTERVAL_S"
"""Seconds between segment writes while spans arrive. Default: 2."""
FLUSH_ROWS = "OTEL_REPLAY_FLUSH_ROWS"
"""A segment is also written whenever this many spans wait. Default: 20000."""
REDACT = "OTEL_REPLAY_REDACT"
"""true or false: the built-in secret detectors before anything is stored. Default: true."""
REDACT_RULES = "OTEL_REPLAY_REDACT_RULES"
"""A YAML or JSON redaction rules file (see `Redactor.from_file`). Default: the built-ins only."""
CAPTURE_PAYLOADS = "OTEL_REPLAY_CAPTURE_PAYLOADS"
"""all, none, or the step kinds whose payloads are stored (llm,tool,...). Default: all."""
LOGS = "OTEL_REPLAY_LOGS"
"""true or false: add the log processor for GenAI content carried in log events. Default: true."""

VARIABLES = (STORE, MAX_QUEUE_SPANS, MAX_QUEUE_BYTES, FLUSH_INTERVAL_S, FLUSH_ROWS, REDACT, REDACT_RULES,
             CAPTURE_PAYLOADS, LOGS)

_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3}
_BYTES = re.compile(r"(\d+)\s*([a-z]*)", re.IGNORECASE)


class CaptureConfigError(OtelReplayError, ValueError):
    """An `OTEL_REPLAY_*` variable holds a value capture cannot use (the message is one line)."""

    def __init__(self, variable: str, value: str, expected: str) -> None:
        shown = value if len(value) <= 80 else value[:77] + "..."
        super().__init__(f"{variable}={shown!r}: {' '.join(expected.split())}")
        self.variable = variable


def options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The `ReplayProcessor` arguments (and `logs`) the set variables ask for; unset ones are absent.

    Every set variable is checked, even one an explicit argument will override: a typo in the
    service's environment fails the start, not a later run.
    """
    env = os.environ if environ is None else environ
    value = {name: env[name].strip() for name in VARIABLES if env.get(name, "").strip()}
    options: dict[str, Any] = {}
    if STORE in value:
        options["store"] = _store(value[STORE])
    if MAX_QUEUE_SPANS in value:
        options["max_queue_spans"] = _count(MAX_QUEUE_SPANS, value[MAX_QUEUE_SPANS])
    if MAX_QUEUE_BYTES in value:
        options["max_queue_bytes"] = _bytes(value[MAX_QUEUE_BYTES])
    if FLUSH_INTERVAL_S in value:
        options["flush_interval_s"] = _seconds(FLUSH_INTERVAL_S, value[FLUSH_INTERVAL_S])
    if FLUSH_ROWS in value:
        options["flush_rows"] = _count(FLUSH_ROWS, value[FLUSH_ROWS])
    redact = _boolean(REDACT, value[REDACT]) if REDACT in value else None
    if REDACT_RULES in value:
        if redact is False:
            raise CaptureConfigError(REDACT, value[REDACT], f"set {REDACT}=false or {REDACT_RULES}, not both")
        options["redact"] = _rules(value[REDACT_RULES])
    elif redact is not None:
        options["redact"] = redact
    if CAPTURE_PAYLOADS in value:
        options["capture_payloads"] = _payloads(value[CAPTURE_PAYLOADS])
    if LOGS in value:
        options["logs"] = _boolean(LOGS, value[LOGS])
    return options


def _count(name: str, text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number <= 0:
        raise CaptureConfigError(name, text, "expected a whole number above 0, such as 50000")
    return number


def _bytes(text: str) -> int:
    match = _BYTES.fullmatch(text)
    unit = match and _UNITS.get(match.group(2).lower())
    number = int(match.group(1)) * unit if match and unit else 0
    if number <= 0:
        raise CaptureConfigError(MAX_QUEUE_BYTES, text, "expected a number of bytes above 0, such as 268435456 "
                                                        "or 256MiB (suffixes: KiB, MiB, GiB)")
    return number


def _seconds(name: str, text: str) -> float:
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        raise CaptureConfigError(name, text, "expected a number of seconds above 0, such as 2 or 0.5")
    return number


def _boolean(name: str, text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise CaptureConfigError(name, text, "expected true or false")
    return text.lower() == "true"


def _payloads(text: str) -> bool | dict[str, bool]:
    if text.lower() in ("all", "none"):
        return text.lower() == "all"
    kinds = {k.strip() for k in text.split(",") if k.strip()}
    if not kinds or not kinds <= set(STEP_KINDS):
        raise CaptureConfigError(CAPTURE_PAYLOADS, text, f"expected all, none, or step kinds among "
                                                         f"{', '.join(STEP_KINDS)} (comma-separated)")
    return {kind: kind in kinds for kind in STEP_KINDS}


def _rules(text: str) -> Redactor:
    # the detectors load only where a rules file is given
    from otel_replay.normalize.redact import RedactionConfigError, Redactor

    try:
        return Redactor.from_file(text)
    except RedactionConfigError as exc:  # names the file and the field; YAML errors span lines
        raise CaptureConfigError(REDACT_RULES, text, str(exc)) from None


def _store(text: str) -> StoreLocation:
    """The store, with a local directory checked now: a path that can never be written fails the start."""
    try:
        location = StoreLocation(text)
    except ValueError as exc:
        raise CaptureConfigError(STORE, text, str(exc)) from None
    if location.local is not None:
        path = Path(location.local).absolute()
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            raise CaptureConfigError(STORE, text, f"{existing} is a file; expected a directory (or a path to create)")
        if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
            raise CaptureConfigError(STORE, text, f"{existing} is not writable by this process")
    return location
