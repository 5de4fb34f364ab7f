"""Outputs as the engine holds them: canonical messages, their hash and their tool calls, memoized.

An attribution calls the same policies in hundreds of rollouts, and most calls return what an
earlier one did (a prebuilt message, a cached model answer, the same tool result). Each distinct
output is canonicalized, serialized and hashed once, keyed by its raw bytes (or the string
itself); a repeat costs one `orjson.dumps` and a lookup. Entries are shared between rollouts and
treated as immutable, like every recorded payload.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NamedTuple

import orjson

from otel_replay.normalize.message_types import ToolCallRequestPart, ToolCallResponsePart
from otel_replay.normalize.messages import canonical_messages, message_text
from otel_replay.normalize.messages import tool_calls as tool_call_parts
from otel_replay.replay.run import Message, outputs_hash
from otel_replay.trajectory import Step

Calls = tuple[ToolCallRequestPart, ...]


class Output(NamedTuple):
    """An llm step's output, with what the engine reads of it."""

    messages: tuple[Message, ...]
    digest: str  # outputs_hash(messages)
    calls: Calls  # the tool-call parts, in order
    text: str  # the assistant text (what a verifier reads when this is the final answer)


EMPTY_HASH = outputs_hash([])
NO_OUTPUT = Output((), EMPTY_HASH, (), "")

_MEMO_MAX = 4096  # entries per memo
_MEMO_MAX_BYTES = 4 * 1024 * 1024  # per memo, of raw output bytes
_llm_memo: dict[Any, Output] = {}
_llm_bytes = 0
_tool_memo: dict[tuple[str | None, str], tuple[Message, str]] = {}
_tool_bytes = 0


def tool_calls(messages: Iterable[Message]) -> Calls:
    """The tool-call parts of `messages`, in order."""
    return tuple(tool_call_parts(messages))


def output_of(messages: tuple[Message, ...]) -> Output:
    """The `Output` of messages already in canonical form (recorded ones)."""
    return Output(messages, outputs_hash(list(messages)), tool_calls(messages),
                  "".join(message_text(m) for m in messages if m.get("role") == "assistant"))


def llm_output(value: Any, where: str, index: int | None = None) -> Output:
    """An llm policy's (or do()'s) value as an `Output`: a list of messages, one message, or a string."""
    global _llm_bytes
    if type(value) is str:
        key: Any = value
    else:
        if isinstance(value, dict):
            value = [value]
        if not _messages(value):
            if isinstance(value, str):  # a str subclass: as a string, not memoized
                return output_of(({"role": "assistant", "parts": [{"type": "text", "content": value}]},))
            where = where if index is None else f"{where} {index}"
            raise TypeError(f"{where} returned {type(value).__name__}; expected output messages "
                            "(a list of {{role, parts}}), one message, or a string")
        try:
            key = orjson.dumps(value)
        except (TypeError, orjson.JSONEncodeError):  # not plain JSON: canonicalized every time
            return output_of(tuple(canonical_messages(value)))
    hit = _llm_memo.get(key)
    if hit is not None:
        return hit
    if type(value) is str:
        out = output_of(({"role": "assistant", "parts": [{"type": "text", "content": value}]},))
    else:
        out = output_of(tuple(canonical_messages(value)))
    if len(_llm_memo) >= _MEMO_MAX or _llm_bytes + len(key) > _MEMO_MAX_BYTES:
        _llm_memo.clear()
        _llm_bytes = 0
    _llm_memo[key] = out
    _llm_bytes += len(key)
    return out


def _messages(value: Any) -> bool:
    if not isinstance(value, list):
        return False
    for m in value:  # noqa: SIM110 - a loop: all() over a generator costs 3x for a message or two
        if not isinstance(m, dict):
            return False
    return True


def tool_output(call_id: Any, result: Any) -> tuple[Message, str]:
    """The tool message carrying `result` for call `call_id`, and `outputs_hash([message])`."""
    global _tool_bytes
    if type(result) is not str or not (call_id is None or type(call_id) is str):
        message = tool_message(call_id, result)
        return message, outputs_hash([message])
    key = (call_id, result)
    hit = _tool_memo.get(key)
    if hit is not None:
        return hit
    message = tool_message(call_id, result)
    hit = message, outputs_hash([message])
    if len(_tool_memo) >= _MEMO_MAX or _tool_bytes + len(result) > _MEMO_MAX_BYTES:
        _tool_memo.clear()
        _tool_bytes = 0
    _tool_memo[key] = hit
    _tool_bytes += len(result)
    return hit


def tool_message(call_id: Any, result: Any) -> Message:
    response = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    part: ToolCallResponsePart = {"type": "tool_call_response", "response": response}
    if call_id is not None:
        part["id"] = call_id
    return {"role": "tool", "parts": [part]}


def recorded_result(step: Step) -> Any:
    for message in step.outputs:
        for part in message.get("parts", []):
            if part.get("type") == "tool_call_response":
                return part.get("response")
    return None


def recorded_arguments(step: Step) -> Any:
    calls = tool_calls(step.inputs)
    return calls[0].get("arguments") if calls else None
