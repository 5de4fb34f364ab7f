"""Secrets inside parsed JSON (tool-call arguments, structured results, attributes), checked against
expectations that do not come from the redactor: whatever the nesting and whatever the key, a planted
secret is not in what the redactor returns, a value under a key named like a secret is replaced, and
the message format's own words are left alone."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_replay import Store
from otel_replay.normalize.redact import Redactor
from otel_replay.store.ingest import ingest
from tests.harness.traces import TraceBuilder

SECRETS = {
    "email": "jane.roe@example.com",
    "openai_key": "sk-proj-" + "Q7f3" * 8,
    "credit_card": "4111 1111 1111 1111",
    "bearer": "Bearer abcdefghijklmnop1234",
    "aws": "AKIA" + "ABCDEFGHIJKLMNOP",
}
SECRET_NAMES = ["token", "pass", "pin", "secretValue", "secret_value", "password", "api_key", "user_pin",
                "x-auth-token", "passphrase", "Authorization", "cookie"]
PLAIN_KEYS = ["role", "type", "content", "query", "to", "note", "arguments", "value", "name", "id", "data"]
REDACTORS = {"gated": Redactor(), "exact": Redactor(gates=False)}

secret = st.sampled_from(sorted(SECRETS.values()))
plain = st.sampled_from(["hello", "the weather in Paris", "order A-1042", "assistant", "user", "42"])
leaf = st.one_of(secret, plain, st.integers(0, 10**6), st.none())
key = st.one_of(st.sampled_from(PLAIN_KEYS), secret)  # a secret as a key, too
json_values = st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(key, inner, max_size=4)), max_leaves=14)


def _text(value) -> str:
    return orjson.dumps(value).decode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values, st.sampled_from(sorted(REDACTORS)))
def test_no_planted_secret_survives_anywhere_in_a_json_value(value, which):
    redacted, _ = REDACTORS[which].value(value)
    out = _text(redacted)
    for found in SECRETS.values():
        assert found not in out, (found, out)


@pytest.mark.parametrize("which", sorted(REDACTORS))
@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_value_under_a_key_named_like_a_secret_is_replaced(which, name):
    for value in ({name: "abc123xyz"}, {"arguments": {"q": "x", name: 7}}, [{"a": {name: ["v"]}}]):
        out = _text(REDACTORS[which].value(value)[0])
        assert "abc123xyz" not in out and "7}" not in out.replace(" ", "") and '["v"]' not in out, out
        assert "[REDACTED:sensitive_field]" in out


@pytest.mark.parametrize("which", sorted(REDACTORS))
def test_role_and_type_hold_only_the_format_words(which):
    message = {"role": "assistant", "parts": [
        {"type": "tool_call", "id": "c1", "name": "send",
         "arguments": {"type": SECRETS["email"], "role": SECRETS["openai_key"], SECRETS["email"]: "to"}},
        {"type": "text", "content": "done"}]}
    redacted, found = REDACTORS[which].value(message)
    out = _text(redacted)
    assert not any(s in out for s in SECRETS.values()), out
    assert redacted["role"] == "assistant" and [p["type"] for p in redacted["parts"]] == ["tool_call", "text"]
    assert {"email", "openai_key"} <= found
    broad = Redactor(patterns={"word": "[a-z_]{4,}"})  # a user's pattern that matches the format's words
    kept, _ = broad.value(message)
    assert kept["role"] == "assistant" and kept["parts"][0]["type"] == "tool_call"


def test_secrets_in_tool_call_arguments_never_reach_the_stored_message_bodies(tmp_path):
    """Through the import pipeline (the same redaction capture and the receiver apply): a tool call
    whose arguments hold secrets under "type", under secret-named keys and as keys."""
    arguments = {"type": SECRETS["email"], "token": "tok_abcdef123456", "pin": "4321",
                 SECRETS["openai_key"]: "key as a key", "note": SECRETS["credit_card"]}
    builder = TraceBuilder(agent="helper", model="gpt-4o")
    builder.chat([{"role": "user", "parts": [{"type": "text", "content": "send it"}]}],
                 {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "send",
                                                  "arguments": arguments}]})
    builder.tool("send", "c1", arguments, "sent")
    ingest(tmp_path / "store", builder.spans, source="test")
    bodies = Store(tmp_path / "store").sql("select body from message_rows").column("body").to_pylist()
    stored = "\n".join(str(b) for b in bodies)
    assert "send it" in stored  # the rows are there
    for leaked in (SECRETS["email"], SECRETS["openai_key"], "4111 1111 1111 1111", "tok_abcdef123456", '"4321"'):
        assert leaked not in stored, leaked


def test_a_langsmith_error_stores_no_secret_in_its_type_or_message(tmp_path):
    """The error type is read from the error's text: only a dotted name before a parenthesis or colon
    counts, and whatever is kept is scanned like the message beside it."""
    trace, tool_id = "01a22dcb-e115-7677-9a4f-7792566b4851", "01a22dcb-e115-7677-9a4f-7792566b4852"
    root = {"id": trace, "name": "agent", "run_type": "chain", "start_time": "2026-11-30T18:51:05.000000Z",
            "end_time": "2026-11-30T18:51:07.000000Z", "trace_id": trace, "parent_run_id": None,
            "dotted_order": "20261130T185105000000Z" + trace, "inputs": {"q": "refund?"}, "outputs": {"a": "no"}}
    errors = [f"openai.AuthenticationError: Incorrect API key {SECRETS['openai_key']} (request 1)",
              f"Incorrect key {SECRETS['openai_key']} for {SECRETS['email']}. Retry (later)",
              f"{SECRETS['email']}.bad(1)"]
    runs = [root]
    for n, error in enumerate(errors):
        run_id = tool_id[:-1] + str(n)
        runs.append({"id": run_id, "name": f"lookup_{n}", "run_type": "tool",
                     "start_time": f"2026-11-30T18:51:06.{n}00000Z", "end_time": f"2026-11-30T18:51:06.{n}50000Z",
                     "trace_id": trace, "parent_run_id": trace,
                     "dotted_order": f"{root['dotted_order']}.20261130T18510{6}{n}00000Z{run_id}",
                     "inputs": {"order_id": "A-1"}, "outputs": None, "status": "error", "error": error})
    (tmp_path / "runs.json").write_text(orjson.dumps(runs).decode())
    from click.testing import CliRunner

    from otel_replay.cli import main as cli

    out = CliRunner().invoke(cli, ["--store", str(tmp_path / "store"), "import", "langsmith", str(tmp_path / "runs.json")])
    assert out.exit_code == 0, out.output
    rows = Store(tmp_path / "store").sql("select name, error_type, error_message from steps where error_type is not null "
                                         "order by name").to_pylist()
    assert [r["error_type"] for r in rows] == ["openai.AuthenticationError", "error", "error"]
    stored = orjson.dumps(rows).decode()
    assert SECRETS["openai_key"] not in stored and SECRETS["email"] not in stored
