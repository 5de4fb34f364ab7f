"""One-line previews of a step's inputs and output for terminal tables."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from otel_replay.trajectory import Step


def shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _part(part: dict[str, Any]) -> str:
    kind = part.get("type")
    if kind == "text":
        return str(part.get("content", ""))
    if kind == "tool_call":
        args = part.get("arguments")
        return f"{part.get('name')}({json.dumps(args, ensure_ascii=False) if not isinstance(args, str) else args})"
    if kind == "tool_call_response":
        response = part.get("response")
        return response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)
    return f"[{kind}]"


def message_preview(message: Mapping[str, Any]) -> str:
    return " ".join(_part(p) for p in message.get("parts", []))


def step_preview(step: Step, width: int = 90) -> str:
    """`last input -> output`, or a note when the step was observation-only."""
    if step.observation_only:
        return "(content not captured: observation-only)"
    source = step.inputs[-1:] if step.kind == "llm" else step.inputs
    left = " ".join(message_preview(m) for m in source)
    right = " ".join(message_preview(m) for m in step.outputs)
    if step.status == "error" and not right:
        right = f"✗ {step.error_type or 'error'}: {step.error_message or ''}"
    half = max(width // 2 - 2, 10)
    return f"{shorten(left, half)} → {shorten(right, half)}"
