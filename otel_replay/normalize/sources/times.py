"""Timestamps from exports: nanosecond integers (OTLP), ISO-8601 strings, epoch s/ms/µs/ns numbers.

Every time a reader returns is an int of epoch nanoseconds in `1 .. MAX_NS` (1970-01-01 to
2262-04-11, the range of the store's BIGINT nanoseconds), or None for "not set" (absent, empty,
or 0 as OTLP writes it). Anything else (negative, past 2262, NaN, a float with a fraction of a
nanosecond, a string that is not a number, a bool) is a `BadTime` naming the field.
"""

from __future__ import annotations

import datetime as dt
import math

from otel_replay.normalize.sources.errors import SourceError, shown

MAX_NS = 2**63 - 1  # 2262-04-11T23:47:16.854775807Z
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MAX_DIGITS = 24  # longer digit strings are out of range anyway (and int() of huge strings is slow)


class BadTime(SourceError):
    """A timestamp that cannot be read or lies outside 1970-01-01 .. 2262-04-11."""


def in_range(ns: int, field: str, value: object = None) -> int:
    """`ns` itself if it is a valid stored time; BadTime otherwise."""
    if ns < 0:
        raise BadTime(f"{shown(value if value is not None else ns)} is before 1970-01-01", field=field)
    if ns > MAX_NS:
        raise BadTime(f"{shown(value if value is not None else ns)} is after 2262-04-11 "
                      "(the range of nanosecond timestamps)", field=field)
    return ns


def unix_ns(value: object, field: str) -> int | None:
    """An OTLP-style nanosecond time (int, decimal string, integral float) or None when unset."""
    if value is None or value == "" or value == 0 or value == "0":
        return None
    if isinstance(value, bool):
        raise BadTime(f"expected nanoseconds since 1970, got a bool {value!r}", field=field)
    if isinstance(value, int):
        return in_range(value, field) or None
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise BadTime(f"{value!r} is not a whole number of nanoseconds", field=field)
        return in_range(int(value), field, value) or None
    if isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text[:1] in "+-" else text
        if not (digits.isascii() and digits.isdigit()) or len(digits) > _MAX_DIGITS:
            raise BadTime(f"{shown(value)} is not a number of nanoseconds", field=field)
        return in_range(int(text), field, value) or None
    raise BadTime(f"expected nanoseconds since 1970, got {type(value).__name__}", field=field)


def scaled_ns(value: object, scale: int, field: str) -> int | None:
    """A number of units of `scale` ns each (Jaeger's microseconds: 1000) as nanoseconds, or None
    when unset. Not range-checked: a duration may be anything; see `in_range` for times."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() and len(value) <= _MAX_DIGITS:
        value = int(value.strip())
    if value is None or value == "" or value == 0:
        return None
    if isinstance(value, float) and math.isfinite(value) and abs(value) < 1e30:
        return round(value * scale)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadTime(f"{shown(value)} is not a number", field=field)
    return value * scale


def iso_to_ns(value: object, field: str) -> int | None:
    """ISO-8601 (naive means UTC) to epoch nanoseconds, keeping microseconds exactly."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return epoch_to_ns(value, field)
    if not isinstance(value, str):
        raise BadTime(f"expected an ISO-8601 time, got {type(value).__name__}", field=field)
    if len(value) > 64:
        raise BadTime(f"{shown(value)} is not an ISO-8601 time", field=field)
    text = value.strip().replace("Z", "+00:00")
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise BadTime(f"{shown(value)} is not an ISO-8601 time", field=field) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    try:
        delta = when - _EPOCH
    except OverflowError:  # a year-1 time with a positive offset, or year 9999 with a negative one
        raise BadTime(f"{shown(value)} is out of range", field=field) from None
    return in_range((delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000, field, value)


def epoch_to_ns(value: float, field: str = "time") -> int:
    """Guess the unit of an epoch number by its size (s, ms, µs or ns)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise BadTime(f"{value!r} is not a time", field=field)
    magnitude = abs(value)
    if magnitude < 1e11:
        ns = int(value * 1e9)
    elif magnitude < 1e14:
        ns = int(value * 1e6)
    elif magnitude < 1e17:
        ns = int(value * 1e3)
    else:
        ns = int(value)
    return in_range(ns, field, value)
