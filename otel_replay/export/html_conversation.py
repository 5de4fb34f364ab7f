"""Messages as a conversation, and a word-level diff, for the HTML report.

Every string that came from a trace is escaped here: message text, tool names, arguments and
results are content the traced service (or an imported file) chose.
"""

from __future__ import annotations

import difflib
import html
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

FOLD_CHARS = 600  # text longer than this (or than FOLD_LINES lines) is folded into <details>
FOLD_LINES = 12
DIFF_TOKENS = 4000  # above this many words per side, diff lines instead of words
_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")


def escape(value: Any) -> str:
    """Text (or anything, as its str) safe inside an element or a quoted attribute."""
    return html.escape("" if value is None else str(value), quote=True)


def shorten(text: str, width: int) -> str:
    """One line of at most `width` characters (cut before escaping, so no entity is split)."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _json(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=indent is not None, default=str)


def _value(value: Any) -> str:
    """An argument's value as it would be written in a call: strings quoted, the rest as JSON."""
    return _json(value)


def call_text(part: Mapping[str, Any]) -> str:
    """A tool call as `name(arg=value, ...)`."""
    args = part.get("arguments")
    if isinstance(args, Mapping):
        inner = ", ".join(f"{k}={_value(v)}" for k, v in args.items())
    elif args is None:
        inner = ""
    else:
        inner = args if isinstance(args, str) else _json(args)
    return f"{part.get('name') or '?'}({inner})"


def response_text(response: Any) -> str:
    """A tool result as text: a string as sent, JSON (a JSON string pretty-printed) otherwise."""
    if isinstance(response, str):
        try:
            parsed = json.loads(response)
        except ValueError:
            return response
        return _json(parsed, indent=2) if isinstance(parsed, (dict, list)) else response
    return _json(response, indent=2)


def part_text(part: Any) -> str:
    """One message part as plain text (what the diff compares)."""
    if not isinstance(part, Mapping):
        return "" if part is None else str(part)
    kind = part.get("type")
    if kind in ("text", "reasoning", "thinking"):
        return str(part.get("content", ""))
    if kind == "tool_call":
        return call_text(part)
    if kind == "tool_call_response":
        return response_text(part.get("response"))
    return f"[{kind}]"


def messages_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """Messages as plain text, one part a line."""
    return "\n".join(part_text(p) for m in messages for p in (m.get("parts") or []))


def preview_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """The stored report's one-line form of an output (`step["output"]`): text, then `name({args!r})`."""
    out = []
    for message in messages or []:
        parts = message.get("parts") or []
        text = "".join(str(p.get("content", "")) for p in parts if isinstance(p, Mapping) and p.get("type") == "text")
        calls = [f"{p.get('name')}({p.get('arguments')})" for p in parts
                 if isinstance(p, Mapping) and p.get("type") == "tool_call"]
        out.append(" ".join(x for x in [text, *calls] if x))
    return " ".join(out)[:300]


def folded(text: str, cls: str = "text") -> str:
    """Escaped text in a block; long text folded behind a one-line summary."""
    body = f'<div class="{cls}">{escape(text)}</div>'
    if len(text) <= FOLD_CHARS and text.count("\n") < FOLD_LINES:
        return body
    return (f'<details class="long"><summary>{escape(shorten(text, 120))} '
            f'<span class="muted">({len(text):,} characters)</span></summary>{body}</details>')


def _part_html(part: Any) -> str:
    if not isinstance(part, Mapping):
        return folded(part_text(part))
    kind = part.get("type")
    if kind == "text":
        return folded(str(part.get("content", "")))
    if kind in ("reasoning", "thinking"):
        return f'<div class="muted">{escape(kind)}</div>' + folded(str(part.get("content", "")), "text thought")
    if kind == "tool_call":
        return f'<div class="call"><span class="muted">calls</span> {folded(call_text(part), "code")}</div>'
    if kind == "tool_call_response":
        return f'<div class="result"><span class="muted">returns</span> {folded(response_text(part.get("response")), "code")}</div>'
    return (f'<details class="long"><summary>[{escape(kind)}] part</summary>'
            f'<div class="code">{escape(_json(dict(part), indent=2))}</div></details>')


def message_html(message: Mapping[str, Any]) -> str:
    """One message: its role (and name), then each part."""
    role = str(message.get("role") or "?")
    cls = role if role in ("system", "user", "assistant", "tool") else "other"
    name = f' <span class="muted">{escape(message.get("name"))}</span>' if message.get("name") else ""
    parts = "".join(_part_html(p) for p in (message.get("parts") or [])) or '<div class="muted">(empty)</div>'
    return f'<div class="msg {cls}"><div class="role">{escape(role)}{name}</div><div class="body">{parts}</div></div>'


def conversation_html(messages: Iterable[Mapping[str, Any]]) -> str:
    return "".join(message_html(m) for m in messages)


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def diff_html(before: str, after: str) -> str:
    """`before` -> `after` with removed words in <del> and added ones in <ins> (lines when long)."""
    a, b = _tokens(before), _tokens(after)
    if max(len(a), len(b)) > DIFF_TOKENS:
        a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(escape("".join(a[i1:i2])))
            continue
        if i2 > i1:
            out.append(f"<del>{escape(''.join(a[i1:i2]))}</del>")
        if j2 > j1:
            out.append(f"<ins>{escape(''.join(b[j1:j2]))}</ins>")
    return f'<div class="code diff">{"".join(out)}</div>'
