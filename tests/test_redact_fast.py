"""The gates that prove text clean before any scan change nothing: differential tests against the
exact path (`Redactor(gates=False)`: every string walked, every scan run, as before the gates).

Secrets of every built-in kind are generated (random bodies, case, separators, Luhn-valid cards of
each issuer) and planted in noise that holds what can break a gate: JSON's escapes (quotes,
backslashes, newlines, tabs), digits, dashes and colons, non-ASCII letters that case-fold to ASCII
(K U+212A, ſ U+017F, İ, ı) and lone surrogates (which orjson refuses).
"""

from __future__ import annotations

import base64
import enum
import json
import urllib.parse

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from otel_replay.normalize.detectors import ANCHOR_BIT, CARD_BIT, PERCENT_BIT, SCANS, find, gate
from otel_replay.normalize.detectors_web import PERCENT
from otel_replay.normalize.pipeline import normalize_span
from otel_replay.normalize.privacy import Privacy
from otel_replay.normalize.records import SpanEvent, SpanRecord
from otel_replay.normalize.redact import NONE, Redactor

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FAST, EXACT = Redactor(), Redactor(gates=False)

# -- secrets --------------------------------------------------------------------------------------
ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def chars(alphabet: str, lo: int, hi: int) -> st.SearchStrategy[str]:
    return st.text(st.sampled_from(alphabet), min_size=lo, max_size=hi)


def luhn_complete(body: str) -> str:
    """`body` plus the check digit that makes it pass the Luhn check."""
    for d in "0123456789":
        digits = body + d
        total = sum(int(c) for c in digits[-1::-2]) + sum(sum(divmod(2 * int(c), 10)) for c in digits[-2::-2])
        if total % 10 == 0:
            return digits
    raise AssertionError("unreachable")


ISSUERS = [("4", 13), ("4", 16), ("4", 19), ("51", 16), ("55", 16), ("2221", 16), ("2720", 16), ("34", 15),
           ("37", 15), ("36", 14), ("38", 19), ("300", 14), ("305", 16), ("6011", 16), ("62", 19), ("65", 16),
           ("644", 16), ("3528", 16), ("3589", 19)]


@st.composite
def cards(draw: st.DrawFn) -> str:
    prefix, length = draw(st.sampled_from(ISSUERS))
    number = luhn_complete(prefix + draw(chars("0123456789", length - len(prefix) - 1, length - len(prefix) - 1)))
    if draw(st.booleans()):
        number = number[:-1] + str((int(number[-1]) + 1) % 10)  # fails Luhn: must stay
    style = draw(st.sampled_from(["plain", "groups", "random", "amex"]))
    if style == "groups":
        sep = draw(st.sampled_from([" ", "-", ".", "\u00a0", "\u202f"]))
        return sep.join(number[i:i + 4] for i in range(0, len(number), 4))
    if style == "amex":  # 4-6-5, or any split, with dots
        return ".".join(number[a:b] for a, b in ((0, 4), (4, 10), (10, None)))
    if style == "random":
        return "".join(c + draw(st.sampled_from(["", "", " ", "-", ".", "\u00a0", "\u202f"])) for c in number[:-1]) + number[-1]
    return number


KEY_WORDS = ["api_key", "apikey", "API-KEY", "access.key", "secret_key", "private_key", "secret", "client_secret",
             "token", "access_token", "OPENAI_API_TOKEN", "password", "passwd", "pwd", "PASSWORD", "Pwd",
             "to\u212aen", "\u017fecret", "api_\u212aey", "pa\u017f\u017fword", "pas\u017fwd", "kEy", "sEcReT", "monkey",
             "tokens"]


@st.composite
def assignments(draw: st.DrawFn) -> str:
    word = draw(st.sampled_from(KEY_WORDS))
    gap = draw(st.sampled_from(["", "", '"', "'", " ", "\t", '" ']))
    sep = draw(st.sampled_from([":", "=", ": ", " = "]))
    quote = draw(st.sampled_from(["", '"', "'"]))
    value = draw(chars(ALNUM + "-_.!", 4, 16))
    return f"{word}{gap}{sep}{quote}{value}{quote}"


LOCAL = "abcdefghijklmnopqrstuvwxyzéøßçü用户名ИванΣ" + "._%+-0123456789"
DOMAIN = "abcdefghijklmnopqrstuvwxyzäöü例子测试пример-0123456789"


@st.composite
def web_secrets(draw: st.DrawFn) -> str:
    """Secrets as the web writes them: basic auth, cookie headers, URL credentials, IDN emails."""
    kind = draw(st.sampled_from(["basic", "cookie", "url", "idn"]))
    if kind == "basic":
        pair = draw(chars(ALNUM + ":", 1, 20)) + draw(st.sampled_from([":", ""])) + draw(chars(ALNUM, 0, 12))
        token = base64.b64encode(pair.encode()).decode()
        return draw(st.sampled_from(["Basic ", "BASIC\t", "Authorization: Basic ", "basic "])) + (
            token.rstrip("=") if draw(st.booleans()) else token)
    if kind == "cookie":
        name = draw(st.sampled_from(["Cookie", "Set-Cookie", "cookie", "set-cookie", "COOKIE", "Coo\u212aie", '"Cookie"']))
        value = draw(chars(ALNUM + "=;/ .-_", 0, 30))
        return f"{name}{draw(st.sampled_from([':', ': ', ':  ', ' :', '=']))}{value}"
    if kind == "url":
        scheme = draw(st.sampled_from(["postgresql", "mysql", "redis", "mongodb+srv", "amqp", "https", "x", ""]))
        user = draw(chars(ALNUM + ".-", 0, 8))
        password = draw(chars(ALNUM + "!$&*+,;=~.-:@%", 0, 12))
        host = draw(st.sampled_from(["host", "db.example.com", "localhost:5432", "h", "[::1]"]))
        path = draw(st.sampled_from(["", "/db", "/?x=1", "#f", " next"]))
        return f"{scheme}://{user}{draw(st.sampled_from([':', '']))}{password}@{host}{path}"
    local = draw(chars(LOCAL, 1, 10))
    labels = [draw(chars(DOMAIN, 1, 8)) for _ in range(draw(st.integers(1, 3)))]
    tld = draw(st.sampled_from(["de", "公司", "рф", "com", "x", "中国", "1a"]))
    return f"{local}@{'.'.join(labels)}.{tld}"


PLAIN_SECRETS = st.one_of(
    st.builds(lambda p, b: p + b, st.sampled_from(["sk-", "sk-proj-", "sk-ant-", "sk-ant-api03-", "task-"]),
              chars(ALNUM + "_-", 15, 40)),
    st.builds(lambda m, b: f"sk_{m}_{b}", st.sampled_from(["live", "test", "prod"]), chars(ALNUM, 12, 30)),
    st.builds(lambda k, b: f"gh{k}_{b}", st.sampled_from("pousrx"), chars(ALNUM, 30, 40)),
    st.builds(lambda b: f"github_pat_{b}", chars(ALNUM + "_", 18, 30)),
    st.builds(lambda p, b: p + b, st.sampled_from(["AKIA", "ASIA", "AKIB"]), chars("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 14, 18)),
    st.builds(lambda b: "AIza" + b, chars(ALNUM + "_-", 33, 37)),
    st.builds(lambda k, b: f"xox{k}-{b}", st.sampled_from("abposrz"), chars(ALNUM + "-", 8, 30)),
    st.builds(lambda k, b, end: f"-----BEGIN {k}PRIVATE KEY-----\n{b}\n" + ("-----END PRIVATE KEY-----" if end else ""),
              st.sampled_from(["", "RSA ", "EC ", "OPENSSH "]), chars(ALNUM + "+/=\n", 0, 40), st.booleans()),
    st.builds(lambda a, b, c: f"eyJ{a}.{b}.{c}", chars(ALNUM + "_-", 8, 30), chars(ALNUM + "_-", 8, 30),
              chars(ALNUM + "_-", 8, 30)),
    st.builds(lambda w, s, t: f"{w}{s}{t}", st.sampled_from(["Bearer", "BEARER", "bearer", "Basic"]),
              st.sampled_from([" ", "\t", "  ", ""]), chars(ALNUM + "._~+/-=", 6, 30)),
    assignments(),
    st.builds(lambda a, b, c: f"{a}@{b}.{c}", chars(ALNUM + "._%+-", 1, 12), chars(ALNUM + "-.", 1, 12),
              chars("abcdefghijklmnopqrstuvwxyz", 1, 4)),
    cards(),
    web_secrets(),
)
# any of them percent-encoded, whole (every character) or as a URL query encodes it, maybe twice
ENCODED = st.builds(lambda text, safe, twice: urllib.parse.quote(urllib.parse.quote(text, safe) if twice else text, safe),
                    PLAIN_SECRETS, st.sampled_from(["", "/", "-_.~"]), st.booleans())
SECRETS = st.one_of(PLAIN_SECRETS, ENCODED.map(lambda e: "https://example.org/q?v=" + e), ENCODED)

# -- noise ----------------------------------------------------------------------------------------
TRICKY = ' \n\t\r"\'\\:=-_@./,;{}[]()<>`0123456789ABJKSIaeknorstyzd\u212a\u017f\u0130\u0131\u00e9\u4e2d\U0001f600\x00\x7f'
NOISE = st.one_of(
    st.text(st.sampled_from(TRICKY), max_size=30),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=30),
    st.lists(st.sampled_from(["the", "key", "token", "order", "2025-01-01", "10:00:00", "id", "task", "sk", "x",
                              "4111", "1111", "-", ":", "=", "_", '"', "\\", "\n", " "]), max_size=12).map("".join),
)


@st.composite
def planted(draw: st.DrawFn) -> str:
    parts = [draw(NOISE)]
    for _ in range(draw(st.integers(0, 3))):
        parts += [draw(SECRETS), draw(NOISE)]
    return "".join(parts)


TEXTS = st.one_of(planted(), planted().map(lambda t: t * 4), NOISE)
LONG_TEXTS = st.builds(lambda a, b: a + " " * 100 + b, planted(), planted())  # past the short-string path


# -- the properties -------------------------------------------------------------------------------
@SETTINGS
@given(st.one_of(TEXTS, LONG_TEXTS))
@example('{"password": "hunter2hunter2"} and x\nsk-proj-abcdefghijklmnopqrstuvwx')
@example("Authorization: Bearer\tabc.def-ghi_jkl" + " " * 100)
@example("1111-4111-1111-1111-1111 and 2 3 5 6" + " " * 100)
@example("to\u212aen: s3cr3tvalue " * 10)
@example("\u017fecret=abcdefgh " * 10)
def test_text_redacts_exactly_as_the_exact_path(text):
    assert FAST.text(text) == EXACT.text(text)


@SETTINGS
@given(st.one_of(TEXTS, LONG_TEXTS))
def test_a_scan_whose_gate_failed_finds_nothing(text):
    data = text.encode("utf-8", "surrogatepass")
    bits = gate(data)
    for scan in SCANS:
        if not bits & ANCHOR_BIT[scan.anchor]:
            assert find(text, (scan,), False) == [], scan.names
    if not bits & CARD_BIT:
        assert find(text, (), True) == []
    if not bits & PERCENT_BIT:
        assert PERCENT.search(text) is None
    assert bool(gate(data, stop=True)) == bool(bits)


# the shortest secret of each kind, and one character short of it
SHORTEST = [("sk-", ALNUM, 20), ("sk-ant-", ALNUM, 16), ("sk_live_", ALNUM, 16), ("sk_test_", ALNUM, 16),
            ("ghp_", ALNUM, 36), ("ghs_", ALNUM, 36), ("github_pat_", ALNUM + "_", 22), ("xoxa-", ALNUM + "-", 10),
            ("xoxr-", ALNUM + "-", 10), ("AKIA", "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 16), ("AIza", ALNUM + "_-", 35),
            ("Bearer ", ALNUM + "._~+/-", 8), ("eyJ", ALNUM, 10), ("pwd=", ALNUM, 6), ("pas\u017fwd: ", ALNUM, 6),
            ('"API_\u212aEY": "', ALNUM, 6), ("a@b.", "abc", 2)]
CONTEXTS = ["{}", "x {} x", "x\n{}\n", '"{}"', "({})", "{}\t", "'{}'", "key: {}", "\\{}\\"]


@pytest.mark.parametrize(("prefix", "alphabet", "length"), SHORTEST)
@pytest.mark.parametrize("context", CONTEXTS)
def test_secrets_at_their_shortest(prefix, alphabet, length, context):
    for n in (length - 1, length, length + 1):
        body = (alphabet * 40)[:n] if prefix != "eyJ" else f"{ALNUM[:n]}.{ALNUM[:n]}.{ALNUM[:n]}"
        text = context.format(prefix + body)
        for padded in (text, text + " " * 100):  # the short-string path and the gated one
            assert FAST.text(padded) == EXACT.text(padded)
            message = {"role": "user", "parts": [{"type": "text", "content": padded}]}
            same(FAST.value(message), EXACT.value(message), message)


CARD_NUMBERS = [luhn_complete(prefix + "0" * (length - len(prefix) - 1)) for prefix, length in ISSUERS] + [
    luhn_complete(prefix + "1" * (length - len(prefix) - 1)) for prefix, length in ISSUERS]


@pytest.mark.parametrize("number", CARD_NUMBERS)
@pytest.mark.parametrize("style", ["plain", "groups", "dashes", "pairs", "in json"])
def test_cards_of_every_issuer_and_length(number, style):
    formatted = {"plain": number, "groups": " ".join(number[i:i + 4] for i in range(0, len(number), 4)),
                 "dashes": "-".join(number[i:i + 4] for i in range(0, len(number), 4)),
                 "pairs": " ".join(number[i:i + 2] for i in range(0, len(number), 2)),
                 "in json": json.dumps({"card": number})}[style]
    for text in (f"pay {formatted} now", f"pay {formatted} now" + " " * 100, f"x1x{formatted}"):
        assert FAST.text(text) == EXACT.text(text)
        message = {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c", "response": text}]}
        same(FAST.value(message), EXACT.value(message), message)
    assert "credit_card" in FAST.text(f"pay {number} now")[1]


SENSITIVE_KEYS = ["api_key", "Authorization", "cookie", "COOKIE", "coo\u212aie", "x-api-token", "client_secret",
                  "password", "PASSWD", "pwd", "session_token", "secret_key", "to\u212aen", "api_\u212aey", "tokens",
                  "key", "monkey", "authorization_header"]
@pytest.mark.parametrize("key", SENSITIVE_KEYS + ["AUTHORIZATION", "Proxy-Authorization", "set-cookie", "x_PWD", "Id_Token"])
def test_keys_named_like_secrets(key):
    for value in ({key: "v"}, {"role": "tool", "parts": [{"type": "tool_call", "arguments": {key: 1, "q": "x"}}]},
                  [{"a": {key: None}}], {key: {"nested": "v"}}):
        same(FAST.value(value), EXACT.value(value), value)
        same(FAST.attributes({"x": value}), EXACT.attributes({"x": value}), {"x": value})


KEYS = st.one_of(st.sampled_from(["role", "type", "content", "id", "name", "arguments", "response", "parts",
                                  "gen_ai.usage.input_tokens", "query", "description"] + SENSITIVE_KEYS), NOISE)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False),
                    st.sampled_from([4111111111111111, 378282246310005, 2**70]), TEXTS)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                                                       st.dictionaries(KEYS, inner, max_size=4)), max_leaves=12)


def same(fast, exact, value):
    """Equal results, and the very same object exactly when the exact path returned it."""
    assert fast == exact
    assert (fast[0] is value) == (exact[0] is value)


@SETTINGS
@given(VALUES)
@example({"role": "user", "parts": [{"type": "text", "content": 'say {"api_key": "abcdef123456"} now'}]})
@example({"coo\u212aie": "x", "n": 1})
@example({"q": "a\ud800b sk-proj-abcdefghijklmnopqrstuvwx"})  # a lone surrogate: not JSON, walked
# small JSON tool results (JSON in a string, gated as any text below 1 KB) with a secret of each kind
@example({"response": json.dumps({"api_key": "abcdef123456", "city": "Paris"})})
@example({"response": json.dumps({"card": "4111 1111 1111 1111", "n": 5})})
@example({"response": json.dumps({"auth": "Bearer abcdef.ghijkl", "to": "ann@example.org"})})
@example({"response": json.dumps({"k": "sk-proj-abcdefghijklmnopqrstuvwx", "x": "ghp_" + "a1" * 18})})
@example({"response": json.dumps({"password": "hunter2hunter2"}), "id": "call_1"})
def test_json_values_redact_exactly_as_the_exact_path(value):
    same(FAST.value(value), EXACT.value(value), value)
    if isinstance(value, dict):
        same(FAST.attributes(value), EXACT.attributes(value), value)


class Tag(str):
    pass


@pytest.mark.parametrize("value", [
    {"a": Tag("plain"), "b": "sk-proj-abcdefghijklmnopqrstuvwx"},  # a str subclass is copied, as before
    {"a": [Tag("x")]}, ({"k": "v"},), {"a": b"bytes"}, {1: "non-str key"}, {"a": 2**70},
    {"a": {"password": None}}, {"a": {"password": 0}},
])
def test_values_json_cannot_show_are_walked(value):
    same(FAST.value(value), EXACT.value(value), value)


def messages_json(texts: list[str]) -> str:
    return json.dumps([{"role": "user", "parts": [{"type": "text", "content": t}]} for t in texts])


def span(i: int, inputs: str, outputs: str, attrs: dict, events: list[SpanEvent] = (), status: str | None = None,
         resource: dict | None = None) -> SpanRecord:
    return SpanRecord(f"{i:032x}", f"{i + 1:016x}", None, "chat m", start_ns=1_767_225_600 * 10**9 + i,
                      end_ns=1_767_225_600 * 10**9 + i + 1000, status_message=status, events=list(events),
                      resource=resource or {"service.name": "svc"},
                      attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                                  "gen_ai.input.messages": inputs, "gen_ai.output.messages": outputs, **attrs})


ATTRIBUTES = st.dictionaries(st.one_of(st.sampled_from(SENSITIVE_KEYS + ["http.route", "user.note"]), NOISE),
                             st.one_of(TEXTS, st.integers(), st.lists(TEXTS, max_size=2)), max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(TEXTS, min_size=1, max_size=3), st.lists(TEXTS, max_size=2), ATTRIBUTES, st.one_of(st.none(), TEXTS),
       st.one_of(st.none(), ATTRIBUTES))
def test_privacy_stores_exactly_what_the_exact_path_stores(inputs, outputs, attrs, status, event):
    record = span(7, messages_json(inputs), messages_json(outputs), attrs,
                  [SpanEvent("note", 1, event)] if event is not None else [], status)
    fast, exact = Privacy(Redactor())(normalize_span(record)), Privacy(Redactor(gates=False))(normalize_span(record))
    assert fast.attributes == exact.attributes and fast.span == exact.span and fast.problems == exact.problems
    assert (fast.step is None) == (exact.step is None)
    if fast.step is not None:
        assert fast.step.content == exact.step.content and fast.step.redacted == exact.step.redacted


def test_an_agent_loop_resending_its_history_redacts_like_the_exact_path():
    fast, exact = Privacy(Redactor()), Privacy(Redactor(gates=False))
    history = ["system prompt " * 50, "find order 4111 1111 1111 1111 for jane@example.com", "ok"]
    for turn in range(6):
        record = span(turn, messages_json(history), messages_json([f"answer {turn} sk-proj-{'x' * 24}"]),
                      {"gen_ai.usage.input_tokens": 10 * turn}, resource={"service.name": "svc", "api_key": "k"})
        a, b = fast(normalize_span(record)), exact(normalize_span(record))
        assert a.step.content == b.step.content and a.step.redacted == b.step.redacted and a.span == b.span
        assert "input:credit_card" in a.step.redacted and "output:openai_key" in a.step.redacted
        history.append(f"turn {turn} clean text")


def test_clean_spans_and_values_come_back_as_the_same_objects():
    message = {"role": "user", "parts": [{"type": "text", "content": "nothing to hide here " * 40}]}
    assert FAST.value(message) == (message, NONE) and FAST.value(message)[0] is message
    record = span(1, messages_json(["hello " * 200]), messages_json(["hi"]), {"http.route": "/chat"})
    item = normalize_span(record)
    inputs, attributes, span_record = item.step.content.inputs, item.attributes, item.span
    out = Privacy(Redactor())(item)
    assert out.step.content.inputs is inputs and out.attributes is attributes and out.span is span_record
    assert out.step.redacted == []


class Color(str, enum.Enum):  # noqa: UP042 - a str Enum, as a user may pass one
    RED = "red"


def test_json_gate_sees_what_is_serialized_not_its_python_type():
    """A str-valued Enum member: the exact path redacts `str(member)`, the gate reads its value. Both
    are clean here; the only difference is that the exact path returns a copy holding 'Color.RED'."""
    value = {"c": Color.RED}
    assert orjson.dumps(value) == b'{"c":"red"}' and FAST.value(value)[1] == EXACT.value(value)[1] == NONE


@pytest.mark.parametrize(("entries", "size"), [(2, 10**9), (10**6, 600)])
def test_memos_emptied_mid_span_change_nothing(monkeypatch, entries, size):
    """The memos hold a few messages (or bytes) only, so they are emptied inside a span's redaction."""
    from otel_replay.normalize import redact

    monkeypatch.setattr(redact, "_MEMO_MAX", entries)
    monkeypatch.setattr(redact, "_MEMO_MAX_BYTES", size)
    fast, exact = Privacy(Redactor()), Privacy(Redactor(gates=False))
    history = ["system prompt " * 20, "hello", "mail jane@example.com", "clean " * 30, "and more"]
    for turn in range(5):
        record = span(turn, messages_json(history), messages_json([f"ok {turn}", "AKIAIOSFODNN7EXAMPLE"]),
                      {"n": turn, "user.note": "x" * 50})
        a, b = fast(normalize_span(record)), exact(normalize_span(record))
        assert a.step.content == b.step.content and a.step.redacted == b.step.redacted and a.attributes == b.attributes
        history.append(f"turn {turn} " + ("sk-proj-" + "x" * 24 if turn % 2 else "clean"))
