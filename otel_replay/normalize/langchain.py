"""LangChain messages (as LangSmith and Langfuse record them) in canonical form.

Three shapes arrive: lc-constructor objects (`{"lc": 1, "id": [..., "AIMessage"], "kwargs": {...}}`),
plain dicts with a LangChain `type` (`human`, `ai`, `tool`, `system`), and OpenAI-style role dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_replay.normalize.messages import Message, canonical_message, from_openai_message

ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "tool",
         "chat": "user", "developer": "system",
         "HumanMessage": "user", "AIMessage": "assistant", "SystemMessage": "system", "ToolMessage": "tool",
         "HumanMessageChunk": "user", "AIMessageChunk": "assistant", "FunctionMessage": "tool"}


def _text(content: Any) -> Any:
    """LangChain content blocks (`{"type": "text", "text": ...}`) as OpenAI content parts."""
    if isinstance(content, list):
        return [{"type": "text", "text": b.get("text", "")} if isinstance(b, Mapping) and b.get("type") == "text"
                else b for b in content]
    return content


def from_langchain_message(message: Any) -> Message:
    if not isinstance(message, Mapping):
        return {"role": "user", "parts": [{"type": "text", "content": "" if message is None else str(message)}]}
    cls = ""
    if message.get("lc") == 1 and isinstance(message.get("kwargs"), Mapping):
        cls = str((message.get("id") or [""])[-1])
        message = message["kwargs"]
    if "parts" in message:
        return canonical_message(message)
    if "role" in message and "type" not in message:
        return from_openai_message(message)
    role = ROLES.get(str(message.get("type") or cls), "user")
    calls = message.get("tool_calls") or (message.get("additional_kwargs") or {}).get("tool_calls") or []
    wire = {
        "role": role,
        "content": _text(message.get("content")),
        "tool_calls": [
            {"id": c.get("id"), "function": {"name": c.get("name"), "arguments": c.get("args")}} if "args" in c else c
            for c in calls if isinstance(c, Mapping)
        ],
        "tool_call_id": message.get("tool_call_id"),
    }
    return from_openai_message(wire)


def from_langchain_messages(value: Any) -> list[Message]:
    """A message list, a batch of lists (LangSmith llm inputs) or a `{"messages": [...]}` state."""
    if isinstance(value, Mapping) and "messages" in value:
        value = value["messages"]
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        value = value[0]  # one inner list per batch prompt; runs of agents have one
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list):
        return []
    return [from_langchain_message(m) for m in value]
