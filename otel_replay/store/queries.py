"""Named SQL statements, loaded from `store/sql/*.sql` (`-- name: <name>` starts each one)."""

from __future__ import annotations

import functools
import re
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def parse_named(text: str) -> dict[str, str]:
    parts = _NAME.split(text)
    named: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=False):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        named[name] = "\n".join(lines).strip().rstrip(";")
    return named


@functools.cache
def load(file: str) -> dict[str, str]:
    text = resources.files("otel_replay").joinpath(f"store/sql/{file}").read_text(encoding="utf-8")
    return parse_named(text)


def views() -> dict[str, str]:
    return load("views.sql")


def query(name: str) -> str:
    return load("queries.sql")[name]
