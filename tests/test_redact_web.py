"""Secrets written the way the web writes them reach the store redacted: percent-encoded in a URL,
card numbers grouped with dots or no-break spaces, internationalized emails, HTTP basic auth, cookie
headers, passwords in connection URLs. And their lookalikes are stored as they came.

Each text goes through `ingest` as a user message and a tool result; the stored bodies are read back
through `Catalog` and compared with the expected text, written out by hand.
"""

from __future__ import annotations

import orjson
import pytest

from otel_replay.normalize.privacy import Privacy
from otel_replay.normalize.redact import Redactor
from otel_replay.store.catalog import Catalog
from otel_replay.store.ingest import ingest
from tests.harness.traces import TraceBuilder

FOUND = [  # as sent, as it must be stored
    # percent-encoded (a URL's query), once, twice, every character
    ("GET /v1?key=sk%2Dproj%2Dabcdefghijklmnopqrstuvwx1234 now", "GET /v1?key=[REDACTED:openai_key] now"),
    ("https://x.example/?email=user%40example.com&page=2", "https://x.example/?email=[REDACTED:email]&page=2"),
    ("to=%6A%61%6E%65%40example.com", "to=[REDACTED:email]"),
    ("q=user%2540example.com", "q=[REDACTED:email]"),
    ("h=Bearer%20abcdefghijklmnop", "h=Bearer%20[REDACTED:bearer_token]"),
    ("to=jos%C3%A9%40ex%C3%A4mple.de ok", "to=[REDACTED:email] ok"),
    # card numbers in groups split by dots, no-break spaces (U+00A0) and narrow no-break spaces (U+202F)
    ("card 4111.1111.1111.1111 exp 12/29", "card [REDACTED:credit_card] exp 12/29"),
    ("card 4111\u00a01111\u00a01111\u00a01111 ok", "card [REDACTED:credit_card] ok"),
    ("card 5555\u202f5555\u202f5555\u202f4444 ok", "card [REDACTED:credit_card] ok"),
    ("amex 3782.822463.10005.", "amex [REDACTED:credit_card]."),
    # internationalized emails
    ("write to josé@exämple.de today", "write to [REDACTED:email] today"),
    ("联系 用户@例子.公司 谢谢", "联系 [REDACTED:email] 谢谢"),
    ("mail иван@пример.рф", "mail [REDACTED:email]"),
    ("first_last@example.com", "[REDACTED:email]"),
    # HTTP headers
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic [REDACTED:basic_auth]"),
    ("curl -H 'Authorization: Basic YWxhZGRpbjpvcGVuc2VzYW1l' https://x",
     "curl -H 'Authorization: Basic [REDACTED:basic_auth]' https://x"),
    ("Cookie: session=abc123; theme=dark", "Cookie: [REDACTED:cookie_header]"),
    ("Set-Cookie: sid=xyz789; Path=/; HttpOnly\r\nContent-Type: text/html",
     "Set-Cookie: [REDACTED:cookie_header]\r\nContent-Type: text/html"),
    ('{"Cookie": "session=abc123"}', '{"Cookie": "[REDACTED:cookie_header]"}'),
    # passwords in connection URLs (the user and host stay readable)
    ("DSN postgresql://app:hunter2@db.internal:5432/orders", "DSN postgresql://app:[REDACTED:url_credentials]@db.internal:5432/orders"),
    ("mysql://root:s3cret@localhost/app", "mysql://root:[REDACTED:url_credentials]@localhost/app"),
    ("redis://:p4ss@cache:6379/0", "redis://:[REDACTED:url_credentials]@cache:6379/0"),
    ("mongodb+srv://u:p@cluster0.example.net/db", "mongodb+srv://u:[REDACTED:url_credentials]@cluster0.example.net/db"),
    ("amqp://guest:guest@rabbit/", "amqp://guest:[REDACTED:url_credentials]@rabbit/"),
    ("postgresql://app:p%40ss@db/x", "postgresql://app:[REDACTED:url_credentials]@db/x"),
]

LOOKALIKES = [  # stored as sent
    "Basic approach: keep it simple",
    "Basic authentication is simple",
    "pi is 3.141592653589793 and e is 2.718281828459045, 5.123456789012345",
    "version 4111.1111.1111.1112 and 10.0.0.1",
    "price 1\u00a0234\u00a0567 € and 4111\u00a01111\u00a01111\u00a01112",
    "see https://docs.example.com/a%20b/c?x=1%2C2 and 50% off, 100%",
    "https://example.com:8080/path@v2 and user@localhost",
    "cookie: chocolate chip, the Cookie: a small file",
    "ftp://ftp.gnu.org/pub/gnu/ and http://example.com/?next=/login",
    "@app.route('/a') and @mention and 张三@群",
]


def _stored(tmp_path, text: str, gates: bool = True) -> list:
    builder = TraceBuilder()
    builder.chat([{"role": "user", "parts": [{"type": "text", "content": text}]}],
                 {"role": "assistant", "parts": [{"type": "text", "content": "ok"}]})
    builder.tool("fetch", "c1", {"url": "x"}, text)
    ingest(tmp_path, builder.spans, source="test", privacy=Privacy(Redactor(gates=gates)))
    return [orjson.loads(b) for b in Catalog(tmp_path).sql("select body from message_rows").column("body").to_pylist()]


@pytest.mark.parametrize(("sent", "stored"), FOUND)
@pytest.mark.parametrize("gates", [True, False])
def test_web_written_secrets_are_stored_redacted(tmp_path, sent, stored, gates):
    bodies = _stored(tmp_path, sent, gates)
    assert {"role": "user", "parts": [{"type": "text", "content": stored}]} in bodies
    assert {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": stored}]} in bodies


@pytest.mark.parametrize("text", LOOKALIKES)
def test_their_lookalikes_are_stored_as_sent(tmp_path, text):
    bodies = _stored(tmp_path, text)
    assert {"role": "user", "parts": [{"type": "text", "content": text}]} in bodies
    assert Redactor(gates=False).text(text) == (text, frozenset())


@pytest.mark.parametrize("name", ["basic_auth", "cookie_header", "url_credentials"])
def test_the_new_detectors_can_be_turned_off_by_name(name):
    text = {"basic_auth": "Authorization: Basic dXNlcjpwYXNzd29yZA==", "cookie_header": "Cookie: session=abc123",
            "url_credentials": "redis://:p4ss@cache:6379/0"}[name]
    assert Redactor().text(text)[1] == {name}
    assert Redactor(disable=[name]).text(text) == (text, frozenset())
