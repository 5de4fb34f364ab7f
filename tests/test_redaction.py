"""Secrets never reach the store: built-in detectors and user rules, applied by capture, import and
collect before anything is written; payload switches; redacted steps flagged for replay; blame
export without payloads.

Everything real: the OTel SDK and its OTLP exporters, the receiver on 127.0.0.1, the CLI, Parquet
on disk. Each check reads every stored file back and searches it for the secrets.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import example, given
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import StatusCode

from otel_replay import ReplayPlan, ReplayProcessor, Store, replay
from otel_replay.capture.receiver import OtlpReceiver
from otel_replay.cli import main as cli
from otel_replay.export.blame import blame_spans
from otel_replay.export.files import to_otlp_json
from otel_replay.normalize.messages import canonical_messages, content_hash
from otel_replay.normalize.privacy import Privacy
from otel_replay.normalize.records import SpanEvent
from otel_replay.normalize.redact import BUILTINS, RedactionConfigError, Redactor
from otel_replay.replay.caveats import redaction_caveats
from otel_replay.replay.policies import Registry
from otel_replay.replay.verify import verify_factual
from otel_replay.store.ingest import ingest
from tests.harness.traces import TraceBuilder
from tests.helpers import chat_attributes, needs_openai_v2, provider_with
from tests.test_export import _attrs, _spans, attributed, export_over_http  # noqa: F401 - the demo attribution fixture

OPENAI = "sk-proj-T3BlbkFJabcdefghijklmnop0123"
EMAIL = "jane.doe+billing@example.com"
CARD = "4111 1111 1111 1111"
AWS = "AKIAIOSFODNN7EXAMPLE"
BEARER = "eyTok.abc-def_ghi"
SECRETS = (OPENAI, EMAIL, CARD, AWS, BEARER, "hunter2hunter2", "u-7731")


def stored_text(root) -> str:
    """Every value of every row of every Parquet file under the store, as one string."""
    rows = [pq.read_table(path).to_pylist() for path in sorted(root.rglob("*.parquet"))]
    assert rows, f"nothing stored under {root}"
    return json.dumps(rows, default=str, ensure_ascii=False)


def assert_no_secret(root, secrets=SECRETS) -> None:
    text = stored_text(root)
    leaked = [s for s in secrets if s in text]
    assert not leaked, f"stored in clear: {leaked}"


# -- the detectors --------------------------------------------------------------------------------
FOUND = [
    ("my key is sk-proj-abcdefghijklmnopqrstuvwx1234.", "sk-proj-abcdefghijklmnopqrstuvwx1234", "openai_key"),
    ("ANTHROPIC sk-ant-api03-abcdefghijklmnopqrstuvwxyz012345", "sk-ant-api03-abcdefghijklmnopqrstuvwxyz012345",
     "anthropic_key"),
    ("stripe: sk_live_abcdefghijklmnop1234", "sk_live_abcdefghijklmnop1234", "stripe_key"),
    ("token ghp_" + "a1" * 18, "ghp_" + "a1" * 18, "github_token"),
    ("pat github_pat_11ABCDEFG0123456789_abcdefghij", "github_pat_11ABCDEFG0123456789_abcdefghij", "github_token"),
    ("aws_access_key_id AKIAIOSFODNN7EXAMPLE,", "AKIAIOSFODNN7EXAMPLE", "aws_access_key"),
    ("key=AIzaSyA-abcdefghijklmnopqrstuvwxyz01234", "AIzaSyA-abcdefghijklmnopqrstuvwxyz01234", "google_api_key"),
    ("slack xoxb-123456789012-abcdefABCDEF", "xoxb-123456789012-abcdefABCDEF", "slack_token"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEA",
     "private_key"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N", "eyJzdWIiOiIxMjM0NTY3ODkwIn0",
     "jwt"),
    ("Authorization: Bearer abc.def-ghi_jkl~mno", "abc.def-ghi_jkl~mno", "bearer_token"),
    ("write to jane.doe+billing@mail.example.co.uk today", "jane.doe+billing@mail.example.co.uk", "email"),
    ("OPENAI_API_KEY=s3cr3tvalue&x=1", "s3cr3tvalue", "secret_assignment"),
    ('{"password": "hunter2hunter2"}', "hunter2hunter2", "secret_assignment"),
    ("client_secret: 'zzzzzzzz'", "zzzzzzzz", "secret_assignment"),
    ("card 4111 1111 1111 1111 exp 12/29", "4111 1111 1111 1111", "credit_card"),
    ("mc 5555-5555-5555-4444.", "5555-5555-5555-4444", "credit_card"),
    ("amex 378282246310005", "378282246310005", "credit_card"),
    ("discover 6011111111111117 jcb 3530111333300000", "6011111111111117", "credit_card"),
]


@pytest.mark.parametrize(("text", "secret", "name"), FOUND)
def test_each_builtin_detector_finds_its_secret(text, secret, name):
    out, names = Redactor().text(text)
    assert secret not in out and f"[REDACTED:{name}]" in out and name in names
    assert Redactor(disable=[name]).text(text)[0] != out  # each can be turned off by name


LOOKALIKES = [
    "task-abcdefghijklmnopqrstuvwxyz0123 is a job name",  # 'sk-' inside a word
    "order 4111 1111 1111 1112 (fails Luhn)",
    "timestamps 1767225600000 and 1767225600000000000, id 7000000000000000",  # no issuer prefix
    "uuid 550e8400-e29b-41d4-a716-446655440000 and phone +1 415 555 0134",
    "max_tokens: 512, key: value, monkey: bananas, the token count: twelve",
    "dates 2025-01-01T10:00:00Z and version 4.1.1111.1111",
    "an @mention and user@localhost and a@b",
    "Bearer", "AKIA", "sk-", "",
]


@pytest.mark.parametrize("text", LOOKALIKES)
def test_lookalikes_are_left_alone(text):
    out, names = Redactor().text(text)
    assert (out, names) == (text, frozenset())


@pytest.mark.parametrize("number", ["4111111111111111", "5555555555554444", "378282246310005", "6011111111111117",
                                    "3530111333300000", "4222222222222", "2223003122003222", "36227206271667"])
def test_card_numbers_need_the_luhn_check_and_an_issuer(number):
    assert Redactor().text(f"pay {number} now")[1] == {"credit_card"}
    broken = number[:-1] + str((int(number[-1]) + 1) % 10)
    assert Redactor().text(f"pay {broken} now")[1] == frozenset()


def test_user_rules_regex_attribute_names_and_a_callable():
    def city(text: str) -> str:
        return text.replace("Paris", "a city")

    r = Redactor(patterns={"customer": r"CUST-\d{4}", "ticket": r"ticket=(?P<secret>\w+)"},
                 attributes=["enduser.id", "app.user.*"], functions=[city], disable=["email"])
    out, names = r.text("CUST-1234 ticket=abc123 in Paris, mail a@b.co")
    assert out == "[REDACTED:customer] ticket=[REDACTED:ticket] in a city, mail a@b.co"
    assert names == {"customer", "ticket", "city"}
    attrs, names = r.attributes({"enduser.id": "u-1", "App.User.Name": "Jane", "http.route": "/x", "pwd": "p"})
    assert attrs == {"enduser.id": "[REDACTED:attribute]", "App.User.Name": "[REDACTED:attribute]",
                     "http.route": "/x", "pwd": "[REDACTED:sensitive_field]"}
    # attribute names apply to the keys of JSON objects inside payloads too (tool-call arguments)
    message = {"role": "assistant", "parts": [{"type": "tool_call", "name": "f",
                                                "arguments": {"enduser.id": 7, "api_key": "x", "q": "ok"}}]}
    out, names = r.value(message)
    assert out["parts"][0]["arguments"] == {"enduser.id": "[REDACTED:attribute]",
                                            "api_key": "[REDACTED:sensitive_field]", "q": "ok"}
    assert message["parts"][0]["arguments"]["api_key"] == "x"  # the input is never modified
    assert Redactor(builtins=False).text(f"{OPENAI} {EMAIL}") == (f"{OPENAI} {EMAIL}", frozenset())
    assert Redactor(placeholder="<{name}>").text(EMAIL)[0] == "<email>"


def test_same_input_same_placeholder_and_untouched_values_are_the_same_object():
    r = Redactor()
    clean = {"role": "user", "parts": [{"type": "text", "content": "nothing secret here " * 50}]}
    assert r.value(clean)[0] is clean and r.messages([clean])[0][0] is clean
    raw = {"role": "user", "parts": [{"type": "text", "content": f"mail {EMAIL}"}]}
    canonical_messages([raw])
    (dirty,) = canonical_messages([raw])  # seen twice: normalize hands out this same object from now on
    first, second = r.messages([dirty])[0][0], Redactor().value(dirty)[0]
    assert first == second and r.messages([dirty])[0][0] is first  # memoized: an agent loop resends it
    one_off = {"role": "user", "parts": [{"type": "text", "content": f"once {EMAIL}"}]}  # not shared: not kept
    assert r.messages([one_off])[0][0] == r.messages([one_off])[0][0] and not r._memo.get(id(one_off))


SURROUNDING = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80)


@given(SURROUNDING, st.sampled_from([f[1] for f in FOUND if f[2] not in ("secret_assignment", "private_key",
                                                                         "bearer_token", "jwt")]), SURROUNDING)
@example("x", "jane.doe+billing@mail.example.co.uk", "")
@example("4", "4111 1111 1111 1111", "1")
def test_a_planted_secret_never_survives_whatever_surrounds_it(before, secret, after):
    out, names = Redactor().text(f"{before} {secret} {after}")
    assert secret not in out and names


@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=300))
def test_redaction_never_raises_and_redacted_text_is_stable(text):
    r = Redactor()
    out, _ = r.text(text)
    assert r.text(out)[0] == out


@pytest.mark.parametrize(("rules", "message"), [
    ("patterns:\n  bad: '('\n", "patterns.bad: invalid regex"),
    ("disable: [emails]\n", "disable: unknown built-in detector(s) emails"),
    ("patterns:\n  empty: 'x*'\n", "matches the empty string"),
    ("colour: red\n", "unknown field(s) colour"),
    ("functions: ['nosuch.module:f']\n", "functions: cannot import 'nosuch.module:f'"),
    ("attributes: enduser.id\n", "attributes must be a list of names"),
])
def test_bad_rules_files_name_the_file_and_the_field(tmp_path, rules, message):
    path = tmp_path / "rules.yaml"
    path.write_text(rules)
    with pytest.raises(RedactionConfigError) as err:
        Redactor.from_file(path)
    assert str(path) in str(err.value) and message in str(err.value)
    bad_json = tmp_path / "rules.json"
    bad_json.write_text('{"patterns": {"a": "x",}}')
    with pytest.raises(RedactionConfigError, match=r"rules.json: not valid JSON \(line 1, column 2[34]"):
        Redactor.from_file(bad_json)


def test_bad_privacy_options_fail_at_construction(tmp_path):
    with pytest.raises(ValueError, match="unknown step kind"):
        ReplayProcessor(tmp_path, capture_payloads={"llms": False})
    with pytest.raises(ValueError, match="must be True or False"):
        ReplayProcessor(tmp_path, capture_payloads={"llm": "no"})
    with pytest.raises(ValueError, match="redact must be a Redactor"):
        ReplayProcessor(tmp_path, redact="yes")
    assert not (tmp_path / "step_rows").exists()


# -- capture --------------------------------------------------------------------------------------
def _agent_run(provider: TracerProvider) -> None:
    """An agent whose messages, tool call, attributes, events and status all carry secrets."""
    tracer = provider.get_tracer("agent")
    with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                    "gen_ai.agent.name": "a", "enduser.id": "u-7731"}):
        with tracer.start_as_current_span("chat m", attributes={
                **chat_attributes(f"my email is {EMAIL}, key {OPENAI}", f"card {CARD} charged"),
                "http.request.header.authorization": f"Bearer {BEARER}"}):
            pass
        with tracer.start_as_current_span("execute_tool login", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "login", "gen_ai.tool.call.id": "c1",
                "gen_ai.tool.call.arguments": json.dumps({"user": "jane", "password": "hunter2hunter2"}),
                "gen_ai.tool.call.result": f"ok, using {AWS}"}) as tool:
            tool.add_event("exception", {"exception.type": "AuthError", "exception.message": f"bad key {OPENAI}"})
            tool.set_status(StatusCode.ERROR, f"rejected {EMAIL}")


def test_capture_redacts_before_anything_is_written(tmp_path):
    processor = ReplayProcessor(tmp_path, redact=Redactor(attributes=["enduser.id"]))
    provider = provider_with(processor)
    _agent_run(provider)
    provider.shutdown()
    assert_no_secret(tmp_path)
    store = Store(tmp_path)
    flags = {r["name"]: r["redacted"] for r in store.sql("select name, redacted from steps where kind <> 'agent'").to_pylist()}
    assert flags == {"chat m": ["attributes:sensitive_field", "input:email", "input:openai_key", "output:credit_card"],
                     "login": ["attributes:email", "attributes:openai_key", "error:email", "input:sensitive_field",
                               "output:aws_access_key"]}
    # content addresses are of the redacted bytes: the secret never reached message_rows
    for row in store.sql("select hash, body from messages").to_pylist():
        assert row["hash"] == content_hash(row["body"].encode())
    traj = store.trajectory(store.list_traces().to_pylist()[0]["trace_id"])
    assert "[REDACTED:email]" in json.dumps(traj.steps[0].inputs) and traj.steps[0].redacted


def test_capture_payloads_false_and_per_kind(tmp_path):
    nothing, some = tmp_path / "nothing", tmp_path / "some"
    for root, switch in ((nothing, False), (some, {"llm": True, "tool": False})):
        provider = provider_with(ReplayProcessor(root, capture_payloads=switch))
        _agent_run(provider)
        with provider.get_tracer("t").start_as_current_span("chat legacy", attributes={
                "gen_ai.operation.name": "chat", "gen_ai.request.model": "legacy"}) as span:  # content in an event
            span.add_event("gen_ai.content.prompt", {"gen_ai.prompt": "tell me the launch codes 0000"})
        provider.shutdown()
    assert "launch codes" not in stored_text(nothing) and "jane" not in stored_text(nothing)
    steps = Store(nothing).sql("select kind, observation_only from steps where kind <> 'agent'").to_pylist()
    assert {s["kind"] for s in steps} == {"llm", "tool"} and all(s["observation_only"] for s in steps)
    assert not list(nothing.glob("message_rows/*/*.parquet"))  # no payload at all
    rows = {r["kind"]: r for r in Store(some).sql(
        "select kind, observation_only, has_payload from steps where name in ('chat m', 'login')").to_pylist()}
    assert rows["llm"]["has_payload"] and rows["tool"]["observation_only"]
    assert "jane" not in stored_text(some)  # the tool's arguments were not stored


def test_a_failing_rule_fails_closed(tmp_path):
    def broken(text: str) -> str:
        raise RuntimeError("rule bug")

    builder = TraceBuilder()
    builder.chat([{"role": "user", "parts": [{"type": "text", "content": f"call {EMAIL}"}]}],
                 {"role": "assistant", "parts": [{"type": "text", "content": "ok"}]})
    result = ingest(tmp_path, builder.spans, source="test",
                    privacy=Privacy(Redactor(builtins=False, functions=[broken])))
    assert any("redaction failed: RuntimeError: rule bug; payloads and attributes dropped" in p for p in result.problems)
    assert_no_secret(tmp_path, [EMAIL])
    (step,) = Store(tmp_path).sql("select redacted, observation_only from steps where kind = 'llm'").to_pylist()
    assert step == {"redacted": ["all:redaction-failed"], "observation_only": True}


# -- import and collect ---------------------------------------------------------------------------
def _otlp_file(path) -> str:
    builder = TraceBuilder(trace=7)
    builder.chat([{"role": "user", "parts": [{"type": "text", "content": f"I am {EMAIL}, ticket T-20931"}]}],
                 {"role": "assistant", "parts": [{"type": "text", "content": f"noted, key {OPENAI}"}]})
    builder.spans[1].events.append(SpanEvent("exception", None, {"exception.message": f"Bearer {BEARER}"}))
    path.write_text(json.dumps(to_otlp_json(builder.spans)))
    return builder.trace_id


def test_import_redacts_by_default_and_takes_rules_and_switches(tmp_path):
    source = tmp_path / "trace.json"
    trace_id = _otlp_file(source)
    rules = tmp_path / "rules.yaml"
    rules.write_text("disable: [openai_key]\npatterns:\n  ticket: 'T-[0-9]{5}'\n")

    def run(store: str, *options: str):
        out = CliRunner().invoke(cli, ["--store", str(tmp_path / store), "import", "otlp", str(source), *options])
        assert out.exit_code == 0, out.output
        return out.output, stored_text(tmp_path / store)

    output, text = run("default")
    assert "redacted before storage: content of 1 steps" in output
    assert all(s not in text for s in (EMAIL, OPENAI, BEARER)) and "T-20931" in text
    _, text = run("rules", "--redact-rules", str(rules))
    assert "T-20931" not in text and EMAIL not in text and OPENAI in text  # user rule on, one built-in off
    _, text = run("raw", "--no-redact")
    assert EMAIL in text and OPENAI in text
    _, text = run("none", "--payloads", "none")
    assert EMAIL not in text and "T-20931" not in text
    assert Store(tmp_path / "none").trajectory(trace_id).steps[0].observation_only
    rules.write_text("patterns:\n  bad: '['\n")
    out = CliRunner().invoke(cli, ["--store", str(tmp_path / "x"), "import", "otlp", str(source),
                                   "--redact-rules", str(rules)])
    assert out.exit_code == 2 and f"{rules}: patterns.bad: invalid regex" in out.output, out.output
    out = CliRunner().invoke(cli, ["--store", str(tmp_path / "x"), "import", "otlp", str(source), "--payloads", "llm,db"])
    assert out.exit_code == 2 and "--payloads" in out.output and not (tmp_path / "x").exists()


def test_collect_redacts_what_the_receiver_stores(tmp_path):
    rules = Redactor(patterns={"ticket": r"T-[0-9]{5}"})
    for root, processor in ((tmp_path / "default", None), (tmp_path / "rules", ReplayProcessor(tmp_path / "rules",
                                                                                               redact=rules))):
        with OtlpReceiver(root, http_port=0, grpc_port=0, processor=processor) as rx:
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{rx.http_endpoint}/v1/traces")))
            _agent_run(provider)
            with provider.get_tracer("t").start_as_current_span("chat m", attributes=chat_attributes("ticket T-20931")):
                pass
            provider.shutdown()
        assert_no_secret(root, [EMAIL, OPENAI, CARD, AWS, BEARER, "hunter2hunter2"])
    assert "T-20931" in stored_text(tmp_path / "default") and "T-20931" not in stored_text(tmp_path / "rules")


def test_collect_refuses_bad_privacy_options_before_listening(tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text('{"disable": ["mail"]}')
    for args, message in ((["--redact-rules", str(rules)], "disable: unknown built-in detector(s) mail"),
                          (["--redact-rules", str(rules), "--no-redact"], "--redact-rules or --no-redact, not both"),
                          (["--payloads", "everything"], "use all, none, or step kinds")):
        out = CliRunner().invoke(cli, ["--store", str(tmp_path / "s"), "collect", "--http-port", "0",
                                       "--grpc-port", "0", *args])
        assert out.exit_code == 2 and message in out.output, out.output


def test_segments_written_before_the_redacted_column_still_read_and_compact(tmp_path):
    from otel_replay.store.compact import compact_store

    for trace in (1, 2):
        builder = TraceBuilder(trace=trace)
        builder.chat([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}],
                     {"role": "assistant", "parts": [{"type": "text", "content": "hello"}]})
        ingest(tmp_path, builder.spans, source="test")
    for path in tmp_path.glob("step_rows/*/*.parquet"):  # as an older version wrote them
        pq.write_table(pq.read_table(path).drop(["redacted"]), path)
    assert Store(tmp_path).trajectory(f"{1:032x}").steps[0].redacted == ()
    assert {r.table for r in compact_store(tmp_path, None, grace_s=0)} >= {"step_rows"}
    assert Store(tmp_path).sql("select count(*) n from steps where redacted is null").column("n")[0].as_py() == 4


# -- replay ---------------------------------------------------------------------------------------
def test_held_redacted_steps_replay_exactly_and_policies_that_see_placeholders_are_flagged(tmp_path):
    builder = TraceBuilder()
    user = {"role": "user", "parts": [{"type": "text", "content": f"refund order 7 for {EMAIL}"}]}
    ask = {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "refund", "arguments": {"order": 7}}]}
    builder.chat([user], ask)
    builder.tool("refund", "c1", {"order": 7}, "done")
    builder.chat([user, ask, {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "done"}]}],
                 {"role": "assistant", "parts": [{"type": "text", "content": "Refunded."}]})
    ingest(tmp_path, builder.spans, source="test")
    traj = Store(tmp_path).trajectory(builder.trace_id)
    assert [s.redacted for s in traj.steps] == [("input:email",), (), ("input:email",)]
    check = verify_factual(traj)  # every step held: served from the recording, bit for bit
    assert check.ok and redaction_caveats(traj, check.run) == ()

    seen = []
    registry = Registry()
    registry.register("llm", None, lambda step, inputs, rng: seen.append(inputs.messages) or [ask])
    run = replay(traj, ReplayPlan.resample(0), 1, policies=registry)
    assert "[REDACTED:email]" in json.dumps(seen[0]) and EMAIL not in json.dumps(seen)
    (caveat,) = redaction_caveats(traj, run)
    assert caveat.startswith("step 0 (llm chat m) was re-run by its policy on redacted text (input:email)")

    shown = CliRunner().invoke(cli, ["--store", str(tmp_path), "show", builder.trace_id])
    assert "redacted before storage" in shown.output and "step 0: input:email" in shown.output, shown.output


# -- blame export ---------------------------------------------------------------------------------
def _exported_strings(requests) -> str:
    values = []
    for _, _, span in _spans(requests):
        values += [span.name, *map(str, _attrs(span.attributes).values())]
        for event in span.events:
            values += [event.name, *map(str, _attrs(event.attributes).values())]
        for link in span.links:
            values += map(str, _attrs(link.attributes).values())
    return "\n".join(values)


@needs_openai_v2
def test_blame_export_carries_no_payload_unless_asked(attributed):  # noqa: F811 - the fixture
    store, job_id, report = attributed
    traj = Store(store).trajectory(report["trace_id"])
    payload_text = [traj.final_output[:40], *(s.output_text[:40] for s in traj.steps if s.output_text),
                    "A-1024", "A-1042", "delivered on time"]
    assert report["repair"]["valid"] and "A-1042" in json.dumps(report["repair"]["output"])
    exported = _exported_strings(export_over_http(store, job_id))
    assert "WHERE Step 0 (llm chat sim-gpt" in exported and "otel_replay.repair" in exported
    leaked = [p for p in payload_text if p and p in exported]
    assert not leaked, f"payload text in exported spans: {leaked}"
    root = Store(store).sql("select root_span_id from traces where trace_id = ?", [report["trace_id"]]).column(0)[0].as_py()
    asked = "\n".join(str(v) for s in blame_spans(report, root, payloads=True) for e in s.events
                      for v in e.attributes.values())
    assert "A-1042" in asked  # with payloads, the repaired output travels


def test_builtins_are_documented_in_the_help():
    out = CliRunner().invoke(cli, ["import", "otlp", "--help"])
    assert all(name in out.output.replace("\n", " ").replace("  ", " ") for name in BUILTINS)
