"""Trace and span ids in the one form the store uses: lowercase hex of fixed width."""

from __future__ import annotations

import base64
import binascii
import re

from otel_replay.normalize.sources.errors import SourceError, shown

HEX = frozenset("0123456789abcdef")
_HEX_ID = {width: re.compile(f"[0-9a-f]{{{width}}}") for width in (16, 32)}


class BadId(SourceError):
    """An id that is neither hex nor base64 of the expected width, or is all zeros."""


def hex_id(value: object, width: int, field: str) -> str:
    """Normalize a hex, base64 or bytes id to `width` lowercase hex characters."""
    if isinstance(value, (bytes, bytearray)):
        text = bytes(value).hex() if len(value) == width // 2 else ""
    elif isinstance(value, int) and not isinstance(value, bool):
        text = format(value, f"0{width}x") if 0 < value < 16**width else ""
    elif isinstance(value, str):
        if _HEX_ID[width].fullmatch(value) and value != "0" * width:
            return value  # the common case: already lowercase hex of the right width
        text = value.strip().lower()
        if len(text) != width or not set(text) <= HEX:
            text = _base64(value, width)
    else:
        raise BadId(f"expected a string id, got {type(value).__name__}", field=field)
    if len(text) != width or not set(text) <= HEX:
        raise BadId(f"{shown(value)} is not a {width}-hex-digit id", field=field)
    if set(text) == {"0"}:
        raise BadId("the all-zero id is invalid", field=field)
    return text


def _base64(value: str, width: int) -> str:
    """The hex of a base64 id (as protobuf's JSON printer writes ids), or '' if it is not one."""
    if len(value) > width:  # base64 of width/2 bytes is shorter than `width` hex digits
        return ""
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return ""


def optional_hex_id(value: object, width: int, field: str) -> str | None:
    if value is None or value == "" or value == b"":
        return None
    try:
        return hex_id(value, width, field)
    except BadId:
        if isinstance(value, str) and set(value) <= {"0"}:
            return None
        if isinstance(value, (bytes, bytearray)) and not any(value):
            return None  # an all-zero parent id is "no parent" in protobuf too
        raise
