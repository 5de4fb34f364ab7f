"""Canonical GenAI messages (semconv role + parts), their canonical bytes and content address.

Every convention converts to this one shape so a history, a tool result or an answer hashes the
same whichever instrumentation recorded it. Canonical form: keys sorted, no null values,
`finish_reason` kept on the step rather than the message (so an answer and the same message
resent in a later history share one hash), tool-call arguments parsed from JSON when they are
JSON, empty text parts beside other parts dropped, and a tool result recorded as one text block
stored as that block's text (the string that was sent). The shape is typed once, in
`normalize.message_types` (`Message`, `MessagePart`); `check_message` checks a value against it.
Parts of a kind the model does not know, and fields a producer added, pass through unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
import xxhash

from otel_replay.normalize.message_types import Message, MessagePart, ToolCallRequestPart

Part = MessagePart  # the name this module's callers used before the typed model


def canonical_bytes(value: Any) -> bytes:
    """The bytes that are stored and hashed for a JSON value: compact, keys sorted, UTF-8.

    orjson does this ~18x faster than `json`; values it refuses (lone surrogates, integers
    beyond 64 bits, non-string keys) go through `json` with invalid UTF-8 replaced. A value
    nested past `MAX_DEPTH` levels (only hostile input is) is stored cut at that depth.
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        try:
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
        except RecursionError:  # payload JSON parses up to 1024 levels; json cannot write that many back
            text = json.dumps(_cut(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
        return text.encode("utf-8", "replace")


MAX_DEPTH = 128


def _cut(value: Any, depth: int = 0) -> Any:
    """`value` with whatever lies deeper than `MAX_DEPTH` levels replaced by a marker string."""
    if depth >= MAX_DEPTH and isinstance(value, (dict, list, tuple)):
        return "<nested too deeply>"
    if isinstance(value, dict):
        return {str(k): _cut(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_cut(v, depth + 1) for v in value]
    return value


def content_hash(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def parse_json(value: Any) -> Any:
    """Parse a JSON string; anything else (or invalid JSON) is returned unchanged."""
    if isinstance(value, (str, bytes)):
        try:
            parsed = orjson.loads(value)
            # orjson reads an integer past 64 bits as a float, losing digits: the json module keeps it
            return json.loads(value) if _holds_huge_float(parsed) else parsed
        except orjson.JSONDecodeError:
            try:  # orjson rejects lone surrogates and NaN, which the json module reads
                return json.loads(value)
            except (ValueError, RecursionError):
                return value
    return value


_HUGE = float(2**63)


def _holds_huge_float(value: Any) -> bool:
    """Whether a parsed JSON value holds a float of magnitude 2**63 or more anywhere (the form orjson
    gives an integer it cannot hold in 64 bits). Iterative: no recursion limit to hit."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = item.__class__
        if kind is dict:
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is float and not -_HUGE < item < _HUGE:
            return True
    return False


def _drop_nulls(mapping: Mapping[str, Any]) -> Any:
    """A copy of `mapping` without its null values (typed `Any`: a part or a tool definition,
    as the caller built it)."""
    return {k: v for k, v in mapping.items() if v is not None}


def tool_response(response: Any) -> Any:
    """A tool result as the string that was sent, when it was recorded as one text block.

    The Anthropic SDK records a string `tool_result` content as `[{"type": "text", "text": s}]`;
    every other producer records `s`. Unwrapping it keeps the result's hash convention-independent.
    """
    if isinstance(response, list) and len(response) == 1 and isinstance(response[0], dict):
        block = response[0]
        text = block.get("text", block.get("content"))
        if block.get("type") == "text" and isinstance(text, str):
            return text
    return response


def canonical_part(part: Any, owned: bool = False) -> Part:
    """A part in canonical form; `owned`: `part` was parsed here from JSON (nothing else holds it),
    so it is changed in place instead of copied (the capture writer's common case)."""
    if not isinstance(part, dict):
        return {"type": "text", "content": "" if part is None else str(part)}
    out: Any = part if owned and None not in part.values() else _drop_nulls(part)
    ptype = out.get("type")
    if ptype == "text":
        if "content" not in out and "text" in out:
            out["content"] = out.pop("text")
    elif ptype == "tool_call":
        if isinstance(out.get("arguments"), str):
            out["arguments"] = parse_json(out["arguments"])
    elif ptype == "tool_call_response" and "response" in out:
        out["response"] = tool_response(out["response"])
    return out


def canonical_message(message: Any, owned: bool = False) -> Message:
    """Canonicalize a message already in (or close to) the semconv parts shape (`owned`: as in
    `canonical_part`)."""
    if not isinstance(message, dict):
        return {"role": "user", "parts": [canonical_part(message)]}
    raw_parts = message.get("parts", _ABSENT)
    if raw_parts is _ABSENT:
        return from_openai_message(message)
    if not raw_parts:
        raw_parts = []
    elif not isinstance(raw_parts, list):
        raise ValueError(f"message parts must be a list, got {type(raw_parts).__name__}")
    parts = [canonical_part(p, owned) for p in raw_parts]
    if len(parts) > 1:
        parts = [p for p in parts if not (p.get("type") == "text" and p.get("content") == "")]
    role = message.get("role")
    out: Message = {"role": role if role.__class__ is str and role else str(role or "user"), "parts": parts}
    name = message.get("name")
    if name is not None:
        out["name"] = name
    return out


_ABSENT = object()
_MEMO: dict[int, tuple[bytes, Message]] = {}  # xxh3-64 of the raw bytes -> (those bytes, the canonical message)
_SHARED: dict[int, Message] = {}  # the same messages by id: `is_shared`
_MEMO_MAX = 50_000
# What the memo holds, counted per entry as its key's bytes twice (the key, and the canonical copy's
# text) plus _ENTRY_BYTES (measured with tracemalloc: a one-line message's canonical dict, parts list
# and part, its key's header and its slots in _MEMO and _SHARED, ~640 bytes). Capture's byte cap
# reserves _MEMO_MAX_BYTES + SEEN_BYTES for them (capture/sizing.py: MESSAGE_MEMO_BYTES).
_MEMO_MAX_BYTES = 8 * 1024 * 1024
_ENTRY_BYTES = 640
_memo_bytes = 0
_SEEN: set[int] = set()  # hashes of raw messages seen once (ints: nothing for the garbage collector to walk)
_SEEN_MAX = 16_384
SEEN_BYTES = 2 * 1024 * 1024  # _SEEN at _SEEN_MAX (measured ~1.6 MB: an int and its slot, ~100 bytes)


def is_shared(message: Any) -> bool:
    """Whether `message` is a memoized canonical message, which later spans will hand out again.

    Caches keyed by object identity (redaction, content addresses) keep only these: any other
    message object is never seen again, and holding it would only feed the garbage collector.
    """
    return _SHARED.get(id(message)) is message


class _Inexact(Exception):
    """A message read by orjson alone holds a float of magnitude 2**63 or more (maybe an integer past
    64 bits, whose digits orjson lost): the JSON text must be read again by `parse_json`'s rules."""


def messages_from_json(text: str | bytes) -> tuple[list[Message], Any]:
    """`canonical_messages(parse_json(text), owned=True)`, and that parsed value; faster.

    `parse_json` walks every value orjson reads, looking for a float that was an integer past 64
    bits (~2 µs for 4 KB of messages). Here each message is checked on the bytes `canonical_messages`
    serializes it to anyway (its memo key): such a float is written with an exponent ('e+'), so only
    a message whose bytes hold a '+' is walked, and one holding such a float sends the whole text
    back through `parse_json`'s rules (the json module). The messages before it have then been seen
    once more by the memo (one may be memoized sooner): the same values either way.
    """
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        parsed = parse_json(text)
        return canonical_messages(parsed, True), parsed
    if parsed.__class__ is list or parsed.__class__ is dict:
        try:
            return canonical_messages(parsed, True, _huge_floats=True), parsed
        except _Inexact:
            pass
    elif not _holds_huge_float(parsed):
        return canonical_messages(parsed, True), parsed
    parsed = json.loads(text)
    return canonical_messages(parsed, True), parsed


def canonical_messages(messages: Any, owned: bool = False, _huge_floats: bool = False) -> list[Message]:
    """Canonicalize a message list (`owned`: parsed here from JSON, so its parts change in place).

    An agent loop resends its whole history on every call, so a raw message seen a second time is
    memoized by its bytes, and the same (treat as immutable) canonical dict is returned for every
    later repeat, which also lets redaction and the store handle it once. A message seen only once
    (a one-off prompt, an answer never sent back) is not kept: on a service most are, and each kept
    one would be walked by every full garbage collection until the memo is emptied.
    `_huge_floats` (`messages_from_json`): raise `_Inexact` at a message holding a float of 2**63 or more.
    """
    global _memo_bytes
    if messages is None:
        return []
    if isinstance(messages, dict):
        messages = [messages]
    if not isinstance(messages, list):
        raise ValueError(f"expected a list of messages, got {type(messages).__name__}")
    out = []
    for message in messages:
        try:
            key = orjson.dumps(message)
        except (TypeError, orjson.JSONEncodeError):
            if _huge_floats and _holds_huge_float(message):
                raise _Inexact from None
            out.append(canonical_message(message, owned))
            continue
        if _huge_floats and b"+" in key and _holds_huge_float(message):  # orjson writes 2**63 as 9.2...e+18
            raise _Inexact
        seen = xxhash.xxh3_64_intdigest(key)  # not hash(key): SipHash costs ~10x more on a message's bytes
        entry = _MEMO.get(seen)
        if entry is not None and entry[0] == key:
            canonical = entry[1]
        else:
            canonical = canonical_message(message, owned)
            if seen not in _SEEN:
                if len(_SEEN) >= _SEEN_MAX:
                    _SEEN.clear()
                _SEEN.add(seen)
            else:  # a repeat: memoize it
                size = 2 * len(key) + _ENTRY_BYTES
                if len(_MEMO) >= _MEMO_MAX or _memo_bytes + size > _MEMO_MAX_BYTES:  # bounded by bytes too:
                    _MEMO.clear()  # capture's memory must stay near its queue's byte cap with large payloads
                    _SHARED.clear()
                    _memo_bytes = 0
                _MEMO[seen] = (bytes(memoryview(key)), canonical)  # a tight copy: orjson's output can hold 16x its length
                _SHARED[id(canonical)] = canonical
                _memo_bytes += size
        out.append(canonical)
    return out


def finish_reason_of(messages: Any) -> list[str]:
    if not isinstance(messages, list):
        return []
    return [
        str(m["finish_reason"])
        for m in messages
        if isinstance(m, dict) and m.get("finish_reason") is not None
    ]


def _openai_content_parts(content: Any) -> list[Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    if isinstance(content, list):
        parts: list[Any] = []
        for item in content:
            if isinstance(item, dict) and item.get("type") == "text":
                parts.append({"type": "text", "content": item.get("text", "")})
            elif isinstance(item, str):
                parts.append({"type": "text", "content": item})
            elif isinstance(item, dict):
                parts.append(_drop_nulls(item))
        return parts
    return [{"type": "text", "content": str(content)}]


def openai_tool_call_part(call: Mapping[str, Any]) -> Part:
    function = call.get("function") or {}
    part = {
        "type": "tool_call",
        "id": call.get("id"),
        "name": function.get("name", call.get("name")),
        "arguments": parse_json(function.get("arguments", call.get("arguments", call.get("args")))),
    }
    return _drop_nulls(part)


def from_openai_message(message: Mapping[str, Any]) -> Message:
    """An OpenAI chat-completions wire message as a canonical message."""
    role = str(message.get("role") or "user")
    if role == "tool":
        part = {
            "type": "tool_call_response",
            "id": message.get("tool_call_id") or message.get("id"),
            "response": tool_response(message.get("content")),
        }
        return {"role": "tool", "parts": [_drop_nulls(part)]}
    parts = _openai_content_parts(message.get("content"))
    parts += [openai_tool_call_part(c) for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    if len(parts) > 1:
        parts = [p for p in parts if not (p.get("type") == "text" and p.get("content") == "")]
    out: Message = {"role": role, "parts": parts}
    if message.get("name") is not None:
        out["name"] = message["name"]
    return out


def canonical_tool_definitions(tools: Any) -> list[dict[str, Any]]:
    """Tool definitions flattened to {type, name, description, parameters}."""
    if tools is None:
        return []
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list):
        raise ValueError(f"expected a list of tool definitions, got {type(tools).__name__}")
    out = []
    for tool in tools:
        tool = parse_json(tool)
        if not isinstance(tool, dict):
            continue
        inner: dict[str, Any] = tool["function"] if isinstance(tool.get("function"), dict) else tool
        params = inner.get("parameters", inner.get("input_schema"))
        out.append(
            _drop_nulls(
                {
                    "type": tool.get("type") or "function",
                    "name": inner.get("name"),
                    "description": inner.get("description"),
                    "parameters": parse_json(params),
                }
            )
        )
    return out


def canonical_system(system: Any) -> list[Part]:
    """System instructions as a list of parts."""
    if system is None:
        return []
    if isinstance(system, str):
        return [{"type": "text", "content": system}]
    if isinstance(system, dict):
        system = [system]
    if not isinstance(system, list):
        return [{"type": "text", "content": str(system)}]
    return [canonical_part(p) for p in system]


def message_text(message: Mapping[str, Any]) -> str:
    """The text parts of a message, joined (what a verifier reads)."""
    return "".join(
        str(p.get("content", ""))
        for p in message.get("parts", [])
        if isinstance(p, dict) and p.get("type") == "text"
    )


def tool_calls(messages: Iterable[Mapping[str, Any]]) -> list[ToolCallRequestPart]:
    """The tool-call parts of `messages`, in order."""
    calls: list[Any] = [
        p
        for m in messages
        for p in m.get("parts", [])
        if isinstance(p, dict) and p.get("type") == "tool_call"
    ]
    return calls
