"""Redaction: secrets and personal data out of payloads and attributes before anything is stored.

`Redactor` finds API keys, bearer tokens, emails, card numbers (Luhn-checked) and the user's own
rules (regexes, attribute or JSON field names, callables) in text and JSON values, and replaces
each finding with a placeholder such as `[REDACTED:email]`. `Privacy` applies a redactor, and the
per-kind payload switches (`capture_payloads`), to a normalized span (`normalize.privacy`): the capture writer, `ingest`
(imports) and the OTLP receiver call it after normalization and before rows are built, so secrets
never reach a message body, a content address or an attribute column. Built-in detectors are on
by default.

Placeholders are deterministic (the same text redacts to the same bytes every time), so a held
step's live inputs still hash equal to its recorded inputs and replay binds as before. A step
whose inputs contained a redaction is flagged (`step_rows.redacted`): a policy that re-runs it sees
the placeholder, not the secret, and replay reports that as a caveat.

The detectors and their speed: `otel_replay.normalize.detectors`. With the built-in rules alone
(the default) what a span would store is serialized once (orjson) and that JSON gated
(`detectors.gate`): a clean span is stored as it came, nothing walked or scanned; otherwise only
the scans whose gates passed run on its strings, and three or more messages are gated one by one so
the clean ones are not walked. With user rules every string is gated before its scans run.
Messages repeated across an agent loop's turns are the same objects (normalize memoizes them), so
each is redacted once; messages proven clean are remembered too. A message's text parts are scanned
joined as well as one by one (`Redactor.across_parts`): a secret split between two parts is found.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from otel_replay.normalize.detectors import (
    BUILTINS,
    CARD_BIT,
    MIN_BUILTIN_LENGTH,
    PERCENT_BIT,
    SCANS,
    SENSITIVE_NAME,
    Hit,
    chosen,
    find,
    find_gated,
    gate,
)
from otel_replay.normalize.detectors_web import PERCENT_DEPTH, percent_hits
from otel_replay.normalize.messages import is_shared
from otel_replay.normalize.redact_rules import (
    PLACEHOLDER,
    RedactionConfigError,
    attribute_rules,
    compile_pattern,
    read_rules,
    redactor_options,
    rule_names,
)

__all__ = ["BUILTINS", "NONE", "PLACEHOLDER", "RedactionConfigError", "Redactor"]

NONE: frozenset[str] = frozenset()
_MISS = (None,)
# The message format's own words, under "role" and "type" keys: never content, never redacted (a user's
# broad pattern must not turn "assistant" into a placeholder). Any other value under those keys, at any
# depth (a tool call's arguments are the caller's JSON), is scanned like every string.
_PROTOCOL_WORDS = frozenset({
    "system", "user", "assistant", "tool", "developer", "function", "model", "human", "ai", "chat",
    "text", "tool_call", "tool_call_response", "reasoning", "thinking", "image", "image_url", "blob", "uri",
    "file", "audio", "video", "document", "refusal", "object", "array", "string", "number", "integer",
    "boolean", "null", "json_schema", "json_object",
})
_PROTOCOL_KEYS = frozenset({"role", "type"})
_MEMO_MAX = 50_000
_MEMO_MAX_BYTES = 16 * 1024 * 1024  # payload text the memos keep alive, all three (capture's memory stays bounded)
_CONTAINERS = frozenset({dict, list, tuple})
_VERDICT_BYTES = 2048  # a JSON up to this long keeps its gate's verdict (attributes, tool names, short texts)
_VERDICTS_MAX = 1024
# exact dict/list/str only: a subclass, dataclass or datetime raises, so the walk (which copies or skips them) runs
_AS_JSON = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def _rough_size(message: Any) -> int:
    """The text a canonical message holds (its parts' string fields), cheaply."""
    parts = message.get("parts") if isinstance(message, dict) else None
    if not isinstance(parts, list):
        return 256
    return 256 + sum(len(v) for p in parts if isinstance(p, dict) for v in p.values() if isinstance(v, str))


# -- the redactor ---------------------------------------------------------------------------------
class Redactor:
    """Replaces secrets in text, JSON values and attributes with `[REDACTED:<name>]`.

    :param builtins: True (every built-in detector, the default), False (none), or the names of
        the built-ins to use (see `BUILTINS`).
    :param disable: built-in names to turn off (e.g. ``{"email"}``).
    :param patterns: your own rules, name -> regex; the whole match is replaced, or only the
        group named ``secret`` when the regex has one.
    :param attributes: attribute names (or globs, ``app.user.*``), matched case-insensitively,
        whose whole value is replaced; they are matched against the keys of JSON objects inside
        payloads (tool-call arguments, structured results) too.
    :param functions: callables ``text -> text`` applied to every string after the rules above;
        a changed string counts as a redaction named after the function.
    :param placeholder: the replacement, with ``{name}`` for the rule's name.
    :param gates: False walks every string and runs every scan, as before the gates (the reference
        they are tested against; the same findings, slower).
    """

    def __init__(self, *, builtins: bool | Iterable[str] = True, disable: Iterable[str] = (),
                 patterns: Mapping[str, str | re.Pattern[str]] | None = None, attributes: Iterable[str] = (),
                 functions: Iterable[Callable[[str], str]] = (), placeholder: str = PLACEHOLDER,
                 gates: bool = True) -> None:
        names = set(BUILTINS) if builtins is True else set() if builtins is False else set(rule_names(builtins, "builtins"))
        names -= set(rule_names(disable, "disable"))
        self.builtins = tuple(n for n in BUILTINS if n in names)
        self._enabled = frozenset(self.builtins)
        self._scans = tuple(s for s in SCANS if s.names & self._enabled)
        self._cards = "credit_card" in self._enabled
        self._patterns = tuple(compile_pattern(name, regex) for name, regex in (patterns or {}).items())
        self._exact, self._globs = attribute_rules(attributes)
        self._functions = tuple(functions)
        for fn in self._functions:
            if not callable(fn):
                raise RedactionConfigError(f"functions: {fn!r} is not callable")
        if "{name}" not in placeholder:
            raise RedactionConfigError(f"placeholder {placeholder!r} must contain {{name}}")
        self.placeholder = placeholder
        self.attribute_rules = bool(self._exact) or self._globs is not None  # names whose whole value goes
        self._fields = "sensitive_field" in self._enabled or self.attribute_rules
        self._min_length = MIN_BUILTIN_LENGTH if not (self._patterns or self._functions) else 1
        self._field_cache: dict[str, str | None] = {}
        self._memo: dict[int, tuple[Any, Any, frozenset[str]]] = {}
        self._memo_bytes = 0
        self._clean: dict[int, Any] = {}  # id -> a message proven clean (held, so its id is not reused)
        # only the built-ins: a value whose JSON passes the gate is left as it is (a user rule may match anything)
        self._gated = gates and not (self._patterns or self._functions or self._exact or self._globs is not None)
        self._find = find_gated if gates else _find_all
        self._subsets: dict[int, tuple[Any, ...]] = {}
        self._verdicts: dict[bytes, int] = {}

    def __repr__(self) -> str:
        extra = [f"{len(self._patterns)} patterns"] if self._patterns else []
        rules = len(self._exact) + (self._globs is not None)
        extra += [f"{rules} attribute rules"] if rules else []
        extra += [f"{len(self._functions)} functions"] if self._functions else []
        return f"Redactor(builtins={list(self.builtins)}{', ' if extra else ''}{', '.join(extra)})"

    # -- configuration from a file ----------------------------------------------------------------
    @classmethod
    def from_config(cls, data: Any, source: str = "redaction rules") -> Redactor:
        """A redactor from a rules document (the shape `from_file` reads); errors name the field."""
        options = redactor_options(data, source)
        try:
            return cls(**options)
        except RedactionConfigError as exc:
            raise RedactionConfigError(f"{source}: {exc}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> Redactor:
        """A redactor from a YAML or JSON rules file (built-ins stay on unless it says otherwise).

        Example::

            disable: [email]
            patterns: {customer_id: "CUST-[0-9]{8}"}
            attributes: [enduser.id, "app.user.*"]
            functions: ["myproj.privacy:scrub"]
        """
        return cls.from_config(read_rules(Path(path)) or {}, str(path))

    # -- redaction --------------------------------------------------------------------------------
    def text(self, text: str) -> tuple[str, frozenset[str]]:
        """The text with every finding replaced, and the names of the rules that fired."""
        return self._text(text, None)

    def _builtin_hits(self, text: str, bound: int | None, depth: int = 0) -> list[Hit]:
        """The built-in detectors' findings, in `text` and in its percent-decoded runs (`depth`: decodes so far)."""
        if bound is None:
            hits = self._find(text, self._scans, self._cards, self._subsets)
        else:
            hits = find(text, chosen(self._scans, bound, self._subsets), self._cards and bool(bound & CARD_BIT))
        if (bound is None or bound & PERCENT_BIT) and depth < PERCENT_DEPTH and "%" in text:
            hits += percent_hits(text, lambda decoded: self._builtin_hits(decoded, None, depth + 1))
        return [h for h in hits if h[2] in self._enabled] if hits else hits

    def _key(self, key: str, bound: int | None) -> tuple[str, frozenset[str]]:
        """A JSON object key with the built-in detectors' findings replaced (an email or a token used as a
        key); a user's patterns and functions are not applied to keys, which hold the value's structure."""
        if len(key) < MIN_BUILTIN_LENGTH or bound == 0:
            return key, NONE
        hits = self._builtin_hits(key, bound)
        return (self._replace(key, hits), frozenset(h[2] for h in hits)) if hits else (key, NONE)

    def _hits(self, text: str, bound: int | None) -> list[Hit]:
        """What the built-ins and the user's patterns find in `text` (`bound` as in `_text`)."""
        if len(text) < self._min_length or bound == 0:
            return []
        hits = self._builtin_hits(text, bound)
        for name, regex, group in self._patterns:
            for m in regex.finditer(text):
                start, end = m.span(group)
                if end > start:
                    hits.append((start, end, name))
        return hits

    def _text(self, text: str, bound: int | None, extra: Sequence[Hit] = ()) -> tuple[str, frozenset[str]]:
        """`text`; `bound`: the gate bits of JSON that held it (only those scans can find anything);
        `extra`: findings made elsewhere that reach into it (a secret split across a message's parts)."""
        if not extra and (len(text) < self._min_length or bound == 0):
            return text, NONE
        hits = self._hits(text, bound)
        hits += extra
        out, names = (self._replace(text, hits), frozenset(h[2] for h in hits)) if hits else (text, NONE)
        for fn in self._functions:
            changed = fn(out)
            if not isinstance(changed, str):
                raise TypeError(f"redaction function {_fn_name(fn)} returned {type(changed).__name__}, not str")
            if changed != out:
                out, names = changed, names | {_fn_name(fn)}
        return out, names

    def _replace(self, text: str, hits: list[Hit]) -> str:
        hits.sort(key=lambda h: (h[0], -h[1]))
        pieces, at = [], 0
        for start, end, name in hits:
            if end <= at:
                continue
            if start < at:  # overlaps the previous finding: its placeholder covers both
                at = end
                continue
            pieces.append(text[at:start])
            pieces.append(self.placeholder.format(name=name))
            at = end
        pieces.append(text[at:])
        return "".join(pieces)

    def field(self, key: str) -> str | None:
        """The rule that redacts the whole value of an attribute or JSON field of this name, if any."""
        cached = self._field_cache.get(key, False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        lower = key.lower()
        name = None
        if lower in self._exact or (self._globs is not None and self._globs.match(lower)):
            name = "attribute"
        elif "sensitive_field" in self._enabled and SENSITIVE_NAME.search(lower):
            name = "sensitive_field"
        if len(self._field_cache) >= _MEMO_MAX:
            self._field_cache.clear()
        self._field_cache[key] = name
        return name

    def value(self, value: Any) -> tuple[Any, frozenset[str]]:
        """A JSON value (str, list, dict, scalar) redacted; the very same object when nothing changed."""
        if self._gated and value.__class__ in _CONTAINERS:
            bits = self._json_bits(value)
            return (value, NONE) if bits == 0 else self._value(value, bits if bits > 0 else None)
        return self._value(value, None)

    def _json_bits(self, value: Any, stop: bool = False) -> int:
        """The gate bits of `value`'s JSON (0: no built-in rule can fire anywhere in it), or -1 when it
        is not plain JSON. A short JSON's bits are kept: a span's attributes repeat span after span.
        `stop`: any nonzero answer will do (`gate`)."""
        try:
            data = orjson.dumps(value, option=_AS_JSON)
        except TypeError:  # a subclass, bytes, a huge int, a lone surrogate...: its strings are gated one by one
            return -1
        if len(data) > _VERDICT_BYTES:
            return gate(data, stop)
        bits = self._verdicts.get(data)
        if bits is None:
            bits = gate(data)
            if len(self._verdicts) < _VERDICTS_MAX:
                self._hold(128 + len(data))
                self._verdicts[data] = bits
        return bits

    def _span_bits(self, values: Any, resent: Iterable[Sequence[Any]] = (),
                   fresh: Sequence[Any] = ()) -> tuple[int, int]:
        """The gate bits of `values`, and of these messages, from their JSON: 0 when redaction would
        change nothing, -1 when that cannot be told (for the messages: gate each on its own).

        Messages of `resent` lists (a history an agent loop sends again) answer from a memo once
        proven clean; `fresh` ones (answers) are gated each time. Three or more are gated as one JSON
        that only says whether they are all clean: a message with a secret among them is then found
        by gating each, so the clean ones are not walked.
        """
        if not self._gated:
            return -1, -1
        bits = self._json_bits(values)
        seen = self._clean.get
        unseen = []
        for messages in resent:
            for message in messages:
                if seen(id(message)) is not message:
                    unseen.append(message)
        return bits, self._message_bits(unseen, fresh)

    def _message_bits(self, unseen: list[Any], fresh: Sequence[Any] = ()) -> int:
        """`_span_bits` of messages not seen before (`unseen` are remembered once proven clean)."""
        if not (unseen or fresh):
            return 0
        several = len(unseen) + len(fresh) > 2  # else their bits are bound enough, and gating each costs more
        held: Any = (unseen, fresh) if fresh else unseen
        joined = [j for m in (*unseen, *fresh) if m.__class__ is dict and (p := m.get("parts")).__class__ is list
                  and len(p) > 1 and (j := joined_text(m)) is not None]
        bits = self._json_bits((held, joined) if joined else held, stop=several)
        if not bits and unseen:
            shared = [message for message in unseen if is_shared(message)]  # no other object comes back
            if shared:
                self._hold(sum(map(_rough_size, shared)), len(shared))  # they stay alive: count their text
                self._clean.update({id(message): message for message in shared})
        return -1 if bits and several else bits

    def _remember(self, message: Any, new: Any, found: frozenset[str], size: int) -> None:
        self._hold(size)
        self._memo[id(message)] = (message, new, found)

    def _hold(self, size: int, entries: int = 1) -> None:
        """Count what the memos will hold next; past their byte or entry cap all three are emptied first
        (`_MEMO_MAX_BYTES` is what the capture budget reserves for them)."""
        if self._memo_bytes + size > _MEMO_MAX_BYTES or len(self._memo) + len(self._clean) + entries > _MEMO_MAX:
            self._memo.clear()
            self._clean.clear()
            self._verdicts.clear()
            self._memo_bytes = 0
        self._memo_bytes += size

    def _value(self, value: Any, bound: int | None) -> tuple[Any, frozenset[str]]:
        if bound == 0:  # its JSON passed every gate: no string holds a finding, no key is named like a secret
            return value, NONE
        cls = value.__class__
        if cls is str:
            return self._text(value, bound)
        if cls is dict:
            return self._dict(value, bound)
        if cls is list or cls is tuple:
            return self._list(value, bound)
        if isinstance(value, str):
            return self._text(str(value), bound)
        if isinstance(value, Mapping):
            return self._dict(dict(value), bound)
        if isinstance(value, (list, tuple)):
            return self._list(list(value), bound)
        return value, NONE

    def _dict(self, value: dict[Any, Any], bound: int | None) -> tuple[dict[Any, Any], frozenset[str]]:
        out: dict[Any, Any] | None = None
        names: frozenset[str] = NONE
        fields = self._fields
        renamed: dict[Any, Any] = {}
        for k, v in value.items():
            rule = self.field(k) if fields and k.__class__ is str else None
            if rule is not None and v is not None:
                new, found = self.placeholder.format(name=rule), frozenset({rule})
            elif v.__class__ is str and (len(v) < self._min_length or k in _PROTOCOL_KEYS and v in _PROTOCOL_WORDS):
                new, found = v, NONE  # "role": "user", "type": "text": the message format, never content
            else:
                new, found = self._value(v, bound)
            if new is not v:
                if out is None:
                    out = dict(value)
                out[k] = new
            if found:
                names = names | found
            if k.__class__ is str:  # a key is text too: an email or a token used as a key
                key, in_key = self._key(k, bound)
                if in_key:
                    renamed[k] = key
                    names = names | in_key
        if renamed:  # rebuilt in order, a redacted key in its place (two keys that redact alike keep the last value)
            out = {renamed.get(k, k): v for k, v in (value if out is None else out).items()}
        return (value if out is None else out), names

    def _list(self, value: list[Any] | tuple[Any, ...], bound: int | None) -> tuple[Any, frozenset[str]]:
        items: list[Any] | None = None
        names: frozenset[str] = NONE
        for i, v in enumerate(value):
            new, found = self._value(v, bound)
            if new is not v:
                if items is None:
                    items = list(value)
                items[i] = new
            if found:
                names = names | found
        return (value if items is None else items), names

    def messages(self, messages: list[Any], bound: int | None = None) -> tuple[list[Any], frozenset[str]]:
        """Canonical messages redacted, each distinct message object once (an agent loop resends them).

        `bound`: the gate bits of JSON that held them all (`_span_bits`), or -1: gate each message.
        """
        out: list[Any] | None = None
        names: frozenset[str] = NONE
        memo, clean = self._memo, self._clean
        if bound is None:  # the new ones at once: if clean, all are memo hits below
            bound = self._message_bits([m for m in messages if clean.get(id(m)) is not m
                                        and memo.get(id(m), _MISS)[0] is not m]) if self._gated else -1
        for i, message in enumerate(messages):
            seen = (message, message, NONE) if clean.get(id(message)) is message else memo.get(id(message))
            if seen is not None and seen[0] is message:
                new, found = seen[1], seen[2]
            elif message.__class__ is dict and (parts := message.get("parts")).__class__ is list and len(parts) > 1:
                new, found = self._message(message, bound)  # its text parts, joined too
            else:
                new, found = self.value(message) if bound < 0 else self._value(message, bound)
                if is_shared(message):
                    self._remember(message, new, found, _rough_size(message))
            if new is not message and out is None:
                out = list(messages[:i])
            if out is not None:
                out.append(new)
            names = names | found if found else names
        return (messages if out is None else out), names

    def _message(self, message: dict[str, Any], bound: int) -> tuple[Any, frozenset[str]]:
        """A message of several parts redacted (`bound` as in `messages`), its text parts joined as well as apart."""
        parts = message["parts"]
        texts = text_parts(parts)
        if texts is None:
            return self.value(message) if bound < 0 else self._value(message, bound)
        joined = "".join(parts[i]["content"] for i in texts)
        if bound < 0:
            bits = self._json_bits([message, joined]) if self._gated else -1
            if bits == 0:
                return message, NONE
            bound = bits if bits > 0 else None  # type: ignore[assignment]
        new, found = self._value(message, bound)
        redone, more = self.across_parts(parts, new["parts"], bound)
        if more:
            new = {**new, "parts": redone}
        return new, found | more

    def across_parts(self, parts: list[Any], redacted: list[Any],
                     bound: int | None) -> tuple[list[Any], frozenset[str]]:
        """A message's parts (`redacted`: each already redacted alone), with what a scan of their
        text parts joined finds (a secret split across two parts) redacted in each part it reaches;
        `parts`: the same parts before redaction."""
        texts = text_parts(parts)
        if (texts is None or bound == 0 or redacted.__class__ is not list or len(redacted) != len(parts)
                or self._fields and self.field("content") is not None):  # a rule replaced every content whole
            return redacted, NONE
        joined = "".join(parts[i]["content"] for i in texts)
        hits = self._hits(joined, bound)
        if not hits:
            return redacted, NONE
        reach: dict[int, list[Hit]] = {}
        at = 0
        for i in texts:  # each text part's share of every finding that reaches into it
            end = at + len(parts[i]["content"])
            for start, stop, name in hits:
                if start < end and stop > at:
                    reach.setdefault(i, []).append((max(start, at) - at, min(stop, end) - at, name))
            at = end
        out = list(redacted)
        names: frozenset[str] = NONE
        for i, extra in reach.items():
            text, found = self._text(parts[i]["content"], bound, extra)
            out[i] = {**redacted[i], "content": text}
            names = names | found
        return out, names

    def attributes(self, attrs: Mapping[str, Any],
                   bound: int | None = None) -> tuple[Mapping[str, Any], frozenset[str]]:
        """Span, event or resource attributes redacted (names first, then values); `bound` as in `messages`."""
        value = attrs if isinstance(attrs, dict) else dict(attrs)
        return self.value(value) if bound is None else self._value(value, bound)


def text_parts(parts: Any) -> list[int] | None:
    """The indexes of a message's text parts (canonical: type "text", a string `content`), if two or more."""
    if parts.__class__ is not list or len(parts) < 2:
        return None
    texts = [i for i, p in enumerate(parts)
             if p.__class__ is dict and p.get("type") == "text" and p.get("content").__class__ is str]
    return texts if len(texts) > 1 else None


def joined_text(message: Any) -> str | None:
    """A message's text parts joined, when it has two or more (a secret may be split between them)."""
    texts = text_parts(message.get("parts")) if message.__class__ is dict else None
    return None if texts is None else "".join(message["parts"][i]["content"] for i in texts)


def _find_all(text: str, scans: tuple[Any, ...], cards: bool, subsets: Any) -> list[Hit]:
    return find(text, scans, cards)


def _fn_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__
