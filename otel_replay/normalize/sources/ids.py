"""Trace and span ids in the one form the store uses: lowercase hex of fixed width."""

from __future__ import annotations

import base64
import binascii
import re

HEX = frozenset("0123456789abcdef")
_HEX_ID = {width: re.compile(f"[0-9a-f]{{{width}}}") for width in (16, 32)}


class BadId(ValueError):
    """An id that is neither hex nor base64 of the expected width."""


def hex_id(value: object, width: int, field: str) -> str:
    """Normalize a hex, base64 or bytes id to `width` lowercase hex characters."""
    if isinstance(value, (bytes, bytearray)):
        text = bytes(value).hex()
    elif isinstance(value, int) and not isinstance(value, bool):
        text = format(value, f"0{width}x")
    elif isinstance(value, str):
        if _HEX_ID[width].fullmatch(value) and value != "0" * width:
            return value  # the common case: already lowercase hex of the right width
        text = value.strip().lower()
        if len(text) != width or not set(text) <= HEX:
            try:
                raw = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise BadId(f"{field}: {value!r} is not a {width}-hex-digit id") from None
            text = raw.hex()
    else:
        raise BadId(f"{field}: expected a string id, got {type(value).__name__}")
    if len(text) != width or not set(text) <= HEX:
        raise BadId(f"{field}: {value!r} is not a {width}-hex-digit id")
    if set(text) == {"0"}:
        raise BadId(f"{field}: the all-zero id is invalid")
    return text


def optional_hex_id(value: object, width: int, field: str) -> str | None:
    if value in (None, "", b""):
        return None
    try:
        return hex_id(value, width, field)
    except BadId:
        if isinstance(value, str) and set(value) <= {"0"}:
            return None
        raise
