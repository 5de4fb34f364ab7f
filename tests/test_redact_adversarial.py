"""Adversarial probes of the redaction gates: inputs built to slip a secret past a byte-level gate
(JSON escapes next to a secret's anchor, Unicode that case-folds to a key word's letters, secrets
at string edges and length thresholds, JSON inside a string), and the memos across spans.

Each holds the gated path (`Redactor()`, `Privacy(Redactor())`) to the exact one
(`Redactor(gates=False)`), or, for the memos, to a fresh redactor that has seen nothing before.
"""

from __future__ import annotations

import itertools
import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_replay.normalize import messages as canonical
from otel_replay.normalize.detectors import ANCHOR_BIT, CARD_BIT, CARD_SCANS, SCANS, find, gate
from otel_replay.normalize.pipeline import normalize_span
from otel_replay.normalize.privacy import Privacy
from otel_replay.normalize.records import SpanEvent, SpanRecord
from otel_replay.normalize.redact import Redactor
from tests.test_redact_fast import NOISE, SECRETS, TEXTS, luhn_complete, planted, same

FAST, EXACT = Redactor(), Redactor(gates=False)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# what JSON escapes (controls, quote, backslash) and what it leaves alone but a gate could misread
EDGE_CHARS = [chr(i) for i in range(32)] + ['"', "\\", "'", "/", "\x7f", "\xa0", "\u2028", "\u3000", "\uff20", "\u0301",
                                            "\u212a", "\u017f", "\u0130", "\u0131", "\U0001f600"]
EDGES = st.text(st.sampled_from(EDGE_CHARS), max_size=3)


@st.composite
def edged(draw: st.DrawFn) -> str:
    """A secret with escapable or case-folding characters right against both ends, maybe past `_SHORT`."""
    text = draw(EDGES) + draw(SECRETS) + draw(EDGES) + draw(st.one_of(st.just(""), SECRETS)) + draw(EDGES)
    return text + " " * draw(st.sampled_from([0, 0, 90, 1100, 2100]))


def needed_bits(text: str) -> int:
    """The gate bits of the scans that find something in `text` (each scan run alone)."""
    bits = 0
    for scan in SCANS:
        if find(text, (scan,), False):
            bits |= ANCHOR_BIT[scan.anchor]
    return bits | (CARD_BIT if find(text, (), True) else 0)


@SETTINGS
@given(st.one_of(edged(), TEXTS), EDGES)
def test_a_gate_over_json_keeps_every_bit_a_string_inside_needs(text, neighbour):
    """JSON rewrites a string's escapable characters (and a neighbour's: '\\u0011' ends in digits): the
    gate of any JSON holding the string still has the bit of every scan that finds something in it."""
    need = needed_bits(text)
    for holder in (text, [text], {"k": text}, [neighbour, text, neighbour], {"a": neighbour + "4", "b": [text]}):
        data = orjson.dumps(holder)
        assert gate(data) & need == need
        assert bool(gate(data, stop=True)) == bool(gate(data)) or not need
    assert gate(text.encode("utf-8", "surrogatepass")) & need == need


@SETTINGS
@given(st.one_of(edged(), TEXTS))
def test_edged_secrets_redact_as_the_exact_path(text):
    assert FAST.text(text) == EXACT.text(text)
    message = {"role": "user", "parts": [{"type": "text", "content": text},
                                         {"type": "tool_call", "id": "c", "name": "f", "arguments": {"q": text}}]}
    same(FAST.value(message), EXACT.value(message), message)


# -- keys named like secrets: every case and Unicode variant the rules fold ----------------------------
def _variants(word: str) -> list[str]:
    options = []
    for c in word:
        o = {c, c.upper()} | ({"\u212a"} if c == "k" else set()) | ({"\u017f"} if c == "s" else set()) \
            | ({"\u0130", "\u0131"} if c == "i" else set())
        options.append(sorted(o))
    return ["".join(p) for p in itertools.product(*options)]


@pytest.mark.parametrize("word", ["cookie", "pwd", "passwd", "api.key", "secret", "id_token", "authtoken", "token",
                                  "pass", "pin", "secretvalue", "secret_value", "passphrase"])
def test_every_variant_of_a_sensitive_key_reaches_the_walk(word):
    """`SENSITIVE_NAME` reads `key.lower()` (K U+212A lowers to k; İ to 'i' + a combining dot): the
    gate must pass every key it matches, after any prefix (`http.request.header.`), in any JSON."""
    for key in _variants(word):
        for name in (key, "http.request.header." + key, "X-" + key):
            for value in ({name: "v"}, [{"a": {name: 1}}], {"x": [{name: ["v"]}]}):
                if FAST.field(name) is not None:
                    assert gate(orjson.dumps(value)) != 0, name
                same(FAST.value(value), EXACT.value(value), value)


@pytest.mark.parametrize("text", [
    "mail jane\\u0040example.com or jane\uff20example.com",  # an escaped or full-width '@': neither path finds one
    "Bearer\xa0abcdefghijkl Bearer\nabcdefghijkl Bearer \tabcdefghijkl",  # NBSP/newline: no token; tab: one
    "4111 1111 1111 1111", "x4111-1111-1111-1111", "4111.1111.1111.1111", "\x114111111111111111\x11",
    'password\t: hunter22 password" :hunter22 "password"\t:"hunter22"',
    "sk-" + "a" * 19 + "\u212a" + " sk_live_" + "A" * 15 + "\u017f",
    "to\u212aen=abcdefgh pa\u017fswd=abcdefgh ap\u0131_key=abcdefgh",
    "-----BEGIN PRIVATE KEY-----\x00\nabc", "eyJ" + "a" * 10 + ".\u0301" + "b" * 10 + "." + "c" * 10,
])
@pytest.mark.parametrize("pad", [0, 97, 1100, 2049])
def test_anchor_lookalikes_at_every_length_threshold(text, pad):
    """Past `_SHORT` (96) strings are gated; past `_VERDICT_BYTES` (2048) a span's JSON is gated afresh."""
    for padded in (text + " " * pad, " " * pad + text):
        assert FAST.text(padded) == EXACT.text(padded)
        value = {"http.request.header.authorization": "x", "note": padded, "list": [padded, 1]}
        same(FAST.value(value), EXACT.value(value), value)


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("where", [0, 600, 5000])
def test_json_inside_a_string_past_the_dense_sample(depth, where):
    """A string holding JSON (a backslash every few bytes) skips the folded gates only when the first
    1 KB is that dense: a secret after a sparse first KB, or deep in escapes, is still found."""
    inner = {"user": {"password": "hunter2hunter2", "card": "4111 1111 1111 1111", "auth": "Bearer abcdefghijk"}}
    doc = json.dumps(inner)
    for _ in range(depth - 1):
        doc = json.dumps({"payload": doc})
    text = "x" * where + doc
    assert FAST.text(text) == EXACT.text(text)
    assert "credit_card" in FAST.text(text)[1] and "bearer_token" in FAST.text(text)[1]
    value = {"tool": {"result": text}}
    same(FAST.value(value), EXACT.value(value), value)


# -- spans: secrets split across parts and attributes, other conventions, switches, memos -------------
def _record(i: int, attributes: dict, events: list[SpanEvent] = (), status: str | None = None,
            resource: dict | None = None) -> SpanRecord:
    return SpanRecord(f"{i:032x}", f"{i + 1:016x}", None, "chat m", start_ns=10**18 + i, end_ns=10**18 + i + 1000,
                      status_message=status, events=list(events), resource=resource or {"service.name": "svc"},
                      attributes=attributes)


def _same_items(a, b) -> None:
    assert a.attributes == b.attributes and a.span == b.span and a.problems == b.problems
    assert (a.step is None) == (b.step is None)
    if a.step is not None:
        assert a.step.content == b.step.content and a.step.redacted == b.step.redacted
        assert a.step.error_message == b.step.error_message


@st.composite
def spans(draw: st.DrawFn, i: int) -> SpanRecord:
    """A span of a convention the normalizers accept, its payload texts drawn from `planted`/`edged`."""
    text = st.one_of(planted(), edged(), NOISE)
    shape = draw(st.sampled_from(["genai", "tool", "openllmetry", "openinference"]))
    if shape == "genai":
        parts = [{"type": "text", "content": t} for t in draw(st.lists(text, min_size=1, max_size=3))]
        attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                 "gen_ai.input.messages": json.dumps([{"role": "user", "parts": parts},
                                                      {"role": "assistant", "content": draw(text)}]),
                 "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                     {"type": "tool_call", "id": "c", "name": "f", "arguments": {draw(text): draw(text)}}]}])}
    elif shape == "tool":
        attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "f", "gen_ai.tool.call.id": "c",
                 "gen_ai.tool.call.arguments": draw(text), "gen_ai.tool.call.result": draw(text)}
    elif shape == "openllmetry":
        attrs = {"gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": draw(text),
                 "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": draw(text)}
    else:
        attrs = {"openinference.span.kind": "LLM", "llm.input_messages.0.message.role": "user",
                 "llm.input_messages.0.message.content": draw(text), "input.value": draw(text),
                 "llm.output_messages.0.message.role": "assistant", "llm.output_messages.0.message.content": draw(text)}
    key = st.one_of(st.sampled_from(["http.request.header.authorization", "app.api_key", "user.note", "db.query"]), NOISE)
    attrs.update(draw(st.dictionaries(key, st.one_of(text, st.lists(text, max_size=2)), max_size=2)))
    events = [SpanEvent(draw(st.sampled_from(["note", "gen_ai.content.prompt", "exception"])), 1,
                        draw(st.dictionaries(key, text, max_size=2))) for _ in range(draw(st.integers(0, 2)))]
    resource = draw(st.sampled_from([None, {"service.name": "svc", "api_key": "k"}]))
    return _record(i, attrs, events, draw(st.one_of(st.none(), text)), resource)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from([True, False, {"llm": False}, {"tool": False}]))
def test_privacy_over_conventions_and_switches_stores_what_the_exact_path_stores(data, payloads):
    fast, exact = Privacy(Redactor(), payloads), Privacy(Redactor(gates=False), payloads)
    for turn in range(data.draw(st.integers(1, 3))):
        record = data.draw(spans(turn))
        _same_items(fast(normalize_span(record)), exact(normalize_span(record)))


@pytest.mark.parametrize("gates", [True, False])
def test_a_message_proven_clean_is_not_changed_by_a_later_span(gates):
    """Normalization memoizes canonical messages across spans, and the redactor remembers the ones it
    proved clean. OpenInference puts back a tool result's exact string where `gen_ai.input.messages`
    holds it parsed: it used to write that into the shared message, so a message remembered clean
    (its card number a JSON number, which is not text) came back from the memo holding the card as text."""
    canonical._MEMO.clear()
    history = [{"role": "user", "parts": [{"type": "text", "content": "pay"}]},
               {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": {"n": 4111111111111111}}]}]
    genai = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.input.messages": json.dumps(history)}
    openinference = {"openinference.span.kind": "LLM", "gen_ai.input.messages": json.dumps(history),
                     "llm.input_messages.0.message.role": "user", "llm.input_messages.0.message.content": "pay",
                     "llm.input_messages.1.message.role": "tool", "llm.input_messages.1.message.tool_call_id": "c1",
                     "llm.input_messages.1.message.content": '{"n": 4111111111111111}'}
    privacy = Privacy(Redactor(gates=gates))
    normalize_span(_record(0, genai))  # seen once: from here on, the memo hands out the same objects
    first = privacy(normalize_span(_record(1, genai)))
    assert canonical.is_shared(first.step.content.inputs[1])
    assert first.step.content.inputs[1]["parts"][0]["response"] == {"n": 4111111111111111}
    second = privacy(normalize_span(_record(2, openinference)))
    assert second.step.content.inputs[1]["parts"][0]["response"] == '{"n": [REDACTED:credit_card]}'
    assert second.step.redacted == ["input:credit_card"]
    assert first.step.content.inputs[1]["parts"][0]["response"] == {"n": 4111111111111111}  # not changed after the fact


def test_the_same_text_in_another_position_is_redacted_there_too():
    """A message remembered clean says nothing of the same text elsewhere: as a tool argument (or
    under a key named like a secret) it is its own object and walked on its own."""
    fast, exact = Privacy(Redactor()), Privacy(Redactor(gates=False))
    text = "deploy with hunter2hunter2"
    for turn, extra in enumerate([{}, {"app.password": text}, {"note": text}]):
        inputs = [{"role": "user", "parts": [{"type": "text", "content": text}]},
                  {"role": "assistant", "parts": [{"type": "tool_call", "id": "c", "name": "f",
                                                   "arguments": {"pwd": text, "q": text}}]}]
        record = _record(turn, {"gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(inputs), **extra})
        a, b = fast(normalize_span(record)), exact(normalize_span(record))
        _same_items(a, b)
        assert a.step.content.inputs[1]["parts"][0]["arguments"]["pwd"] == "[REDACTED:sensitive_field]"


@pytest.mark.parametrize("rules", [
    {"patterns": {"order": r"ORD-[0-9]{4}"}}, {"attributes": ["app.user.*", "note"]},
    {"functions": [lambda t: t.replace("zz", "[gone]")]}, {"disable": ["email", "sensitive_field"]},
    {"builtins": ["credit_card", "bearer_token"]},
])
def test_user_rules_with_builtins(rules):
    """With a user rule every string is gated on its own (a rule may match anything): the same output."""
    record = _record(3, {"gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps([
        {"role": "user", "parts": [{"type": "text", "content": "ORD-1234 zz jane@example.com 4111 1111 1111 1111 " * 4}]}]),
        "app.user.id": "u1", "note": "Bearer abcdefghijk", "password": "x"},
        [SpanEvent("e", 1, {"note": "zz ORD-9999"})], "failed for jane@example.com", {"service.name": "s", "note": "n"})
    a = Privacy(Redactor(**rules))(normalize_span(record))
    b = Privacy(Redactor(gates=False, **rules))(normalize_span(record))
    _same_items(a, b)


def test_every_card_scan_is_gated_by_the_card_bit():
    """The card gate reads digits as zeros: a number of each issuer's first digit, every separator."""
    for scan in CARD_SCANS:
        number = luhn_complete(scan.anchor + "0" * 14)
        for text in (number, "-".join([number[:4], number[4:8], number[8:12], number[12:]]), f"\x1f{number}\x10"):
            if find(text, (), True):
                assert gate(text.encode()) & CARD_BIT and gate(orjson.dumps([text])) & CARD_BIT
