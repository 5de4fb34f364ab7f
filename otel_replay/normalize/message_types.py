"""The canonical GenAI message model: one `TypedDict` per part kind, `MessagePart`, `Message`.

Part kinds and field names follow the GenAI semantic conventions' message JSON schema, the
schema `opentelemetry.util.genai.types` models too (`text`, `tool_call`, `tool_call_response`,
`reasoning`, `blob`, `file`, `uri`, ...); a part of any other `type` is a `GenericPart` and
keeps whatever keys its producer gave it.

Why `TypedDict`s and not dataclasses: a message is stored, hashed and deduplicated as its
canonical JSON object (`normalize.messages.canonical_bytes`), and every layer above hands it
around as that dict (cassettes compare it, the replay engine carries it into later histories,
reports embed it). TypedDicts type exactly that dict: they cost nothing at run time, need no
conversion between the store and the hot path, and change neither the stored bytes nor a hash.
The price is that nothing is checked at run time; `check_message` does that on demand.

Canonical form (see `normalize.messages`): no null values, so a key whose value would be null is
absent (hence the `NotRequired` keys); `finish_reason` lives on the step, not the message; a part
may carry keys beyond those listed here (its producer's), which are kept and hashed as they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypeAlias, TypedDict, TypeGuard, cast

from otel_replay.errors import OtelReplayError

if TYPE_CHECKING:
    from opentelemetry.util.genai import types as genai

Modality: TypeAlias = Literal["image", "video", "audio", "document"]
"""The modalities semconv names for `blob`, `file` and `uri` parts (others are allowed)."""


class TextPart(TypedDict):
    """Text sent to or received from the model."""

    type: Literal["text"]
    content: str


class ReasoningPart(TypedDict):
    """Reasoning (thinking) content the model returned."""

    type: Literal["reasoning"]
    content: str


class ToolCallRequestPart(TypedDict):
    """A tool call the model requested; `arguments` is parsed from JSON when it was JSON text."""

    type: Literal["tool_call"]
    name: str
    id: NotRequired[str]
    arguments: NotRequired[Any]


class ToolCallResponsePart(TypedDict):
    """A tool's result sent back to the model (`id`: the call it answers)."""

    type: Literal["tool_call_response"]
    id: NotRequired[str]
    response: NotRequired[Any]


class ServerToolCallPart(TypedDict):
    """A tool call the provider ran on its side (code interpreter, web search, ...)."""

    type: Literal["server_tool_call"]
    name: str
    id: NotRequired[str]
    server_tool_call: NotRequired[Any]


class ServerToolCallResponsePart(TypedDict):
    """The outcome of a server-side tool call."""

    type: Literal["server_tool_call_response"]
    id: NotRequired[str]
    server_tool_call_response: NotRequired[Any]


class BlobPart(TypedDict):
    """Binary data sent inline; `content` is base64 text, as the JSON form holds it."""

    type: Literal["blob"]
    modality: Modality | str
    content: str
    mime_type: NotRequired[str]


class FilePart(TypedDict):
    """A file sent by the provider's file id."""

    type: Literal["file"]
    modality: Modality | str
    file_id: str
    mime_type: NotRequired[str]


class UriPart(TypedDict):
    """A file sent by URI."""

    type: Literal["uri"]
    modality: Modality | str
    uri: str
    mime_type: NotRequired[str]


class CompactionPart(TypedDict):
    """The provider compacted the conversation (a summary in `content`, when it returned one)."""

    type: Literal["compaction"]
    id: NotRequired[str]
    content: NotRequired[str]


class GenericPart(TypedDict):
    """A part of any other `type` (a provider's own block, an OpenAI `image_url`, ...).

    Its other keys are its producer's and are kept as they are; `type` is never one of the kinds
    above (a part that says `"text"` is a `TextPart` and is checked as one).
    """

    type: str


MessagePart: TypeAlias = (
    TextPart
    | ToolCallRequestPart
    | ToolCallResponsePart
    | ReasoningPart
    | BlobPart
    | FilePart
    | UriPart
    | ServerToolCallPart
    | ServerToolCallResponsePart
    | CompactionPart
    | GenericPart
)
"""Any part of a message; tell the kinds apart with `part["type"]` or the `is_*` guards."""


class Message(TypedDict):
    """A canonical message: a role, its parts, and the participant's `name` when one was recorded."""

    role: str
    parts: list[MessagePart]
    name: NotRequired[str]


# --- narrowing ------------------------------------------------------------------------------------
# `GenericPart.type` is any string, so mypy cannot narrow the union on `part["type"] == "text"`;
# these guards can, because a part whose type names a kind is that kind (`check_message`).


def is_text(part: Mapping[str, Any]) -> TypeGuard[TextPart]:
    """Whether `part` is a text part."""
    return part.get("type") == "text"


def is_tool_call(part: Mapping[str, Any]) -> TypeGuard[ToolCallRequestPart]:
    """Whether `part` is a tool call request."""
    return part.get("type") == "tool_call"


def is_tool_call_response(part: Mapping[str, Any]) -> TypeGuard[ToolCallResponsePart]:
    """Whether `part` is a tool call response."""
    return part.get("type") == "tool_call_response"


# --- the run-time check ---------------------------------------------------------------------------


class InvalidMessage(OtelReplayError, ValueError):
    """A value that is not a canonical message; `path` names the bad field (`parts[2].arguments`)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path or 'message'}: {problem}")
        self.path = path
        self.problem = problem


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _json_problem(value: object, path: str) -> tuple[str, str] | None:
    """(path, problem) of the first value inside `value` that JSON cannot hold, else None.

    Iterative: tool arguments and results may nest as deep as the JSON they were parsed from.
    """
    stack: list[tuple[object, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if item is None or isinstance(item, (str, bool, int)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return where, f"{item} is not a JSON number"
            continue
        if isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    return where, f"key {key!r} is not a string"
                stack.append((inner, f"{where}.{key}"))
            continue
        if isinstance(item, (list, tuple)):
            stack.extend((inner, f"{where}[{i}]") for i, inner in enumerate(item))
            continue
        return where, f"a {type(item).__name__} is not a JSON value"
    return None


# Per kind: field -> (required, what it must be, the check); `type` is checked before these.
_Field = tuple[bool, str, Callable[[object], bool]]
_JSON: _Field = (False, "a JSON value", lambda v: True)  # the value itself is walked by _json_problem
_STR: _Field = (True, "a string", _is_str)
_OPT_STR: _Field = (False, "a string", _is_str)
_FIELDS: dict[str, dict[str, _Field]] = {
    "text": {"content": _STR},
    "reasoning": {"content": _STR},
    "tool_call": {"name": _STR, "id": _OPT_STR, "arguments": _JSON},
    "tool_call_response": {"id": _OPT_STR, "response": _JSON},
    "server_tool_call": {"name": _STR, "id": _OPT_STR, "server_tool_call": _JSON},
    "server_tool_call_response": {"id": _OPT_STR, "server_tool_call_response": _JSON},
    "blob": {"modality": _STR, "content": _STR, "mime_type": _OPT_STR},
    "file": {"modality": _STR, "file_id": _STR, "mime_type": _OPT_STR},
    "uri": {"modality": _STR, "uri": _STR, "mime_type": _OPT_STR},
    "compaction": {"id": _OPT_STR, "content": _OPT_STR},
}
PART_KINDS = frozenset(_FIELDS)
"""The `type`s with a part model of their own; any other type is a `GenericPart`."""

_MESSAGE_KEYS = frozenset({"role", "parts", "name"})


def _check_part(part: object, path: str) -> None:
    if not isinstance(part, Mapping):
        raise InvalidMessage(path, f"a part must be an object, got {type(part).__name__}")
    kind = part.get("type")
    if not isinstance(kind, str) or not kind:
        problem = f"must be a non-empty string, got {kind!r}" if "type" in part else "missing"
        raise InvalidMessage(f"{path}.type", problem)
    for key, value in part.items():
        if not isinstance(key, str):
            raise InvalidMessage(path, f"key {key!r} is not a string")
        if value is None:
            raise InvalidMessage(f"{path}.{key}", "is null (canonical parts leave such keys out)")
    fields = _FIELDS.get(kind, {})
    for key, (required, expected, ok) in fields.items():
        if key not in part:
            if required:
                raise InvalidMessage(f"{path}.{key}", f"missing (a {kind} part must have it)")
            continue
        if not ok(part[key]):
            raise InvalidMessage(f"{path}.{key}", f"must be {expected}, got {type(part[key]).__name__}")
    for key, value in part.items():
        if key != "type":
            bad = _json_problem(value, f"{path}.{key}")
            if bad is not None:
                raise InvalidMessage(*bad)


def check_message(obj: object, path: str = "") -> Message:
    """`obj` itself, typed as a `Message`, once it is checked to be one; else `InvalidMessage`.

    Checks the message keys (`role`, `parts`, optional `name`; nothing else), each part's `type`,
    the fields its kind requires and their types, that no value is null and that every value is
    JSON. The error names the bad field from the message down, after `path` when given
    (`[3].parts[0].name`).
    """
    if not isinstance(obj, Mapping):
        raise InvalidMessage(path, f"a message must be an object, got {type(obj).__name__}")
    for key in obj:
        if key not in _MESSAGE_KEYS:
            raise InvalidMessage(_join(path, str(key)), "not a message key (role, parts, name)")
    role = obj.get("role")
    if not isinstance(role, str) or not role:
        problem = f"must be a non-empty string, got {role!r}" if "role" in obj else "missing"
        raise InvalidMessage(_join(path, "role"), problem)
    if "name" in obj and not isinstance(obj["name"], str):
        raise InvalidMessage(_join(path, "name"), f"must be a string, got {type(obj['name']).__name__}")
    parts = obj.get("parts")
    if not isinstance(parts, list):
        problem = f"must be a list, got {type(parts).__name__}" if "parts" in obj else "missing"
        raise InvalidMessage(_join(path, "parts"), problem)
    for i, part in enumerate(parts):
        _check_part(part, f"{_join(path, 'parts')}[{i}]")
    return cast(Message, obj)


def check_messages(objs: Sequence[object]) -> list[Message]:
    """Every item checked with `check_message`; errors name the item (`[3].parts[0].type`)."""
    return [check_message(m, f"[{i}]") for i, m in enumerate(objs)]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# --- opentelemetry.util.genai.types ----------------------------------------------------------------
# For callers who build or read messages with that package; it is imported only when these run.


def to_genai_part(part: MessagePart) -> genai.MessagePart:
    """A canonical part as the `opentelemetry.util.genai.types` object of its kind."""
    import base64

    from opentelemetry.util.genai import types as g

    p: Mapping[str, Any] = part
    kind = p["type"]
    if kind in ("text", "reasoning"):
        return (g.Text if kind == "text" else g.Reasoning)(content=p["content"])
    if kind == "tool_call":
        return g.ToolCallRequest(arguments=p.get("arguments"), name=p["name"], id=p.get("id"))
    if kind == "tool_call_response":
        return g.ToolCallResponse(response=p.get("response"), id=p.get("id"))
    if kind == "server_tool_call":
        return g.ServerToolCall(name=p["name"], server_tool_call=p.get("server_tool_call"), id=p.get("id"))
    if kind == "server_tool_call_response":
        return g.ServerToolCallResponse(server_tool_call_response=p.get("server_tool_call_response"), id=p.get("id"))
    if kind == "blob":
        return g.Blob(mime_type=p.get("mime_type"), modality=p["modality"], content=base64.b64decode(p["content"]))
    if kind == "file":
        return g.File(mime_type=p.get("mime_type"), modality=p["modality"], file_id=p["file_id"])
    if kind == "uri":
        return g.Uri(mime_type=p.get("mime_type"), modality=p["modality"], uri=p["uri"])
    if kind == "compaction":
        return g.CompactionPart(id=p.get("id"), content=p.get("content"))
    return g.GenericPart(type=kind, value={k: v for k, v in p.items() if k != "type"})


def to_genai(message: Message, finish_reason: str | None = None) -> genai.InputMessage | genai.OutputMessage:
    """A canonical message as a util.genai `InputMessage`, or an `OutputMessage` when a
    `finish_reason` is given (canonical messages keep it on the step). `name` has no field there
    and is left out."""
    from opentelemetry.util.genai import types as g

    parts = [to_genai_part(p) for p in message["parts"]]
    if finish_reason is not None:
        return g.OutputMessage(role=message["role"], parts=parts, finish_reason=finish_reason)
    return g.InputMessage(role=message["role"], parts=parts)


def from_genai_part(part: genai.MessagePart) -> MessagePart:
    """A util.genai part object in canonical form (nulls left out, as stored)."""
    import base64
    import dataclasses

    from opentelemetry.util.genai import types as g

    if isinstance(part, g.GenericPart):
        value = part.value if isinstance(part.value, Mapping) else {"value": part.value}
        out: dict[str, Any] = {**value, "type": part.type}
    else:
        out = {f.name: getattr(part, f.name) for f in dataclasses.fields(part)}
        if isinstance(part, g.Blob):
            out["content"] = base64.b64encode(part.content).decode("ascii")
    return cast(MessagePart, {k: v for k, v in out.items() if v is not None})


def from_genai(message: genai.InputMessage | genai.OutputMessage) -> Message:
    """A util.genai message in canonical form; an `OutputMessage`'s `finish_reason` is dropped
    (it belongs on the step)."""
    return {"role": message.role, "parts": [from_genai_part(p) for p in message.parts]}


__all__ = [
    "PART_KINDS",
    "BlobPart",
    "CompactionPart",
    "FilePart",
    "GenericPart",
    "InvalidMessage",
    "Message",
    "MessagePart",
    "Modality",
    "ReasoningPart",
    "ServerToolCallPart",
    "ServerToolCallResponsePart",
    "TextPart",
    "ToolCallRequestPart",
    "ToolCallResponsePart",
    "UriPart",
    "check_message",
    "check_messages",
    "from_genai",
    "from_genai_part",
    "is_text",
    "is_tool_call",
    "is_tool_call_response",
    "to_genai",
    "to_genai_part",
]
