"""Rebuild nested lists from flattened, indexed attribute keys (`prefix.{i}.a.{j}.b`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def unflatten(attrs: Mapping[str, Any], prefix: str) -> list[Any]:
    """`{prefix.0.role: r, prefix.0.tool_calls.1.id: x}` -> `[{"role": r, "tool_calls": [{}, {"id": x}]}]`."""
    root: dict[Any, Any] = {}
    dot = prefix + "."
    for key, value in attrs.items():
        if not key.startswith(dot):
            continue
        node = root
        segments = [int(s) if s.isdigit() else s for s in key[len(dot):].split(".")]
        for seg in segments[:-1]:
            child = node.get(seg)
            if not isinstance(child, dict):
                child = node[seg] = {}
            node = child
        node[segments[-1]] = value
    result = _listify(root)
    return result if isinstance(result, list) else []


def _listify(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    if node and all(isinstance(k, int) for k in node):
        return [_listify(node[k]) for k in sorted(node)]
    return {str(k): _listify(v) for k, v in node.items()}
