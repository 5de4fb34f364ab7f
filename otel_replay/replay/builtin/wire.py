"""Canonical GenAI messages back to each provider's wire shape, and replies back to canonical."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from otel_replay.normalize.message_types import (
    Message,
    MessagePart,
    ToolCallRequestPart,
    is_text,
    is_tool_call,
    is_tool_call_response,
)
from otel_replay.normalize.messages import from_openai_message, message_text


def _text(parts: Iterable[Mapping[str, Any]]) -> str:
    return "".join(str(p.get("content", "")) for p in parts if p.get("type") == "text")


def _response_text(response: Any) -> str:
    return response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)


def to_openai(messages: list[Message], system: list[MessagePart] | None = None) -> list[dict[str, Any]]:
    """The chat-completions `messages` for a canonical history (and system instructions)."""
    wire: list[dict[str, Any]] = []
    if system:
        wire.append({"role": "system", "content": _text(system)})
    for message in messages:
        parts = message.get("parts", [])
        responses = [p for p in parts if is_tool_call_response(p)]
        if responses:  # one OpenAI tool message per result (Anthropic puts several in one user turn)
            wire += [{"role": "tool", "tool_call_id": p.get("id"), "content": _response_text(p.get("response"))}
                     for p in responses]
            continue
        item: dict[str, Any] = {"role": message.get("role", "user"), "content": _text(parts) or None}
        calls = [p for p in parts if is_tool_call(p)]
        if calls:
            item["tool_calls"] = [{"id": c.get("id"), "type": "function", "function": {
                "name": c.get("name"), "arguments": c["arguments"] if isinstance(c.get("arguments"), str)
                else json.dumps(c.get("arguments"))}} for c in calls]
        elif item["content"] is None:
            item["content"] = ""
        if message.get("name") and item["role"] in ("user", "assistant", "system"):
            item["name"] = str(message["name"])[:64]
        wire.append(item)
    return wire


def openai_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {k: v for k, v in (("name", t.get("name")),
             ("description", t.get("description")), ("parameters", t.get("parameters"))) if v is not None}}
            for t in tools if t.get("name")]


def from_openai_choice(message: dict[str, Any]) -> list[Message]:
    return [from_openai_message(message)]


def to_anthropic(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """(system text, messages) for the Messages API; tool results go in user turns."""
    system = [_text(m.get("parts", [])) for m in messages if m.get("role") == "system"]
    wire: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "system":
            continue
        blocks: list[dict[str, Any]] = []
        for part in message.get("parts", []):
            if is_text(part) and part.get("content"):
                blocks.append({"type": "text", "text": part["content"]})
            elif is_tool_call(part):
                blocks.append({"type": "tool_use", "id": part.get("id"), "name": part.get("name"),
                               "input": part.get("arguments") if isinstance(part.get("arguments"), dict) else {}})
            elif is_tool_call_response(part):
                blocks.append({"type": "tool_result", "tool_use_id": part.get("id"),
                               "content": _response_text(part.get("response"))})
        wire_role = "assistant" if role == "assistant" else "user"
        if wire and wire[-1]["role"] == wire_role:
            wire[-1]["content"] += blocks  # the API wants alternating roles
        else:
            wire.append({"role": wire_role, "content": blocks})
    return "\n".join(s for s in system if s), wire


def anthropic_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": t["name"], "description": t.get("description", ""),
             "input_schema": t.get("parameters") or {"type": "object", "properties": {}}} for t in tools if t.get("name")]


def from_anthropic_content(blocks: list[dict[str, Any]]) -> list[Message]:
    """A Messages API reply's content blocks as one canonical assistant message."""
    parts: list[MessagePart] = []
    for block in blocks:
        if block.get("type") == "text":
            parts.append({"type": "text", "content": block.get("text", "")})
        elif block.get("type") == "tool_use":
            call: ToolCallRequestPart = {"type": "tool_call", "name": str(block.get("name") or ""),
                                         "arguments": block.get("input") or {}}
            if block.get("id") is not None:
                call["id"] = block["id"]
            parts.append(call)
    return [{"role": "assistant", "parts": parts}]


__all__ = ["anthropic_tools", "from_anthropic_content", "from_openai_choice", "message_text", "openai_tools",
           "to_anthropic", "to_openai"]
