"""Timestamps from exports: ISO-8601 strings, epoch seconds, milliseconds or nanoseconds."""

from __future__ import annotations

import datetime as dt


class BadTime(ValueError):
    """A timestamp that cannot be read."""


def iso_to_ns(value: object, field: str) -> int | None:
    """ISO-8601 (naive means UTC) to epoch nanoseconds, keeping microseconds exactly."""
    if value in (None, ""):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return epoch_to_ns(value)
    if not isinstance(value, str):
        raise BadTime(f"{field}: expected an ISO-8601 time, got {type(value).__name__}")
    text = value.strip().replace("Z", "+00:00")
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise BadTime(f"{field}: {value!r} is not an ISO-8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def epoch_to_ns(value: float) -> int:
    """Guess the unit of an epoch number by its size (s, ms, µs or ns)."""
    magnitude = abs(value)
    if magnitude < 1e11:
        return int(value * 1e9)
    if magnitude < 1e14:
        return int(value * 1e6)
    if magnitude < 1e17:
        return int(value * 1e3)
    return int(value)
