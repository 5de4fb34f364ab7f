"""Reading fields of parsed JSON with errors that name the field: the shape checks every reader uses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_replay.normalize.sources.errors import BadRecord

_SCALAR_TEXT = (str, int, float, bool)


def mapping(value: Any, field: str) -> Mapping[str, Any]:
    """An object (None reads as empty); anything else is a BadRecord naming `field`."""
    if value.__class__ is dict:  # the common case, without an ABC check
        return value
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return value
    raise BadRecord(f"expected an object, got {type(value).__name__}", field=field)


def sequence(value: Any, field: str) -> list[Any]:
    """A list (None reads as empty); anything else is a BadRecord naming `field`."""
    if value.__class__ is list:
        return value
    if value is None:
        return []
    if isinstance(value, list):
        return value
    raise BadRecord(f"expected a list, got {type(value).__name__}", field=field)


def text(value: Any, field: str, default: str = "") -> str:
    """Text, or a number/bool written as text; None and '' read as `default`."""
    if value.__class__ is str and value:
        return value
    if value is None or value == "":
        return default
    if isinstance(value, str):
        return value
    if isinstance(value, _SCALAR_TEXT):
        return str(value)
    raise BadRecord(f"expected text, got {type(value).__name__}", field=field)


def optional_text(value: Any, field: str) -> str | None:
    return text(value, field) or None
