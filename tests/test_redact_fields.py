"""Every text field of a span is redacted before it is stored, not only its payloads and attribute
values: span, scope, event and step names, attribute and resource keys, error type, models, provider,
agent name, conversation and tool-call ids, finish reasons, request parameters; and a secret split
across a message's text parts.

Each test goes through a real path (the capture processor under an OTel SDK `TracerProvider`, or
`ingest`), reads the rows back through `Catalog`, and compares them with values written out by hand.
"""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import StatusCode

from otel_replay import ReplayPlan, ReplayProcessor, Store, replay
from otel_replay.normalize.privacy import Privacy
from otel_replay.normalize.records import SpanRecord
from otel_replay.normalize.redact import Redactor
from otel_replay.replay.policies import Registry
from otel_replay.replay.verify import verify_factual
from otel_replay.store.catalog import Catalog
from otel_replay.store.ingest import ingest
from tests.harness.traces import TraceBuilder
from tests.test_redact_fast import planted

EMAIL = "jane.roe@example.com"
KEY = "sk-proj-" + "Q7f3" * 8
CARD_ID = "call_4111111111111111"  # a tool-call id holding a card number (Luhn-valid Visa test number)
E, K, C = "[REDACTED:email]", "[REDACTED:openai_key]", "[REDACTED:credit_card]"


def rows(root, table: str, columns: str) -> list[dict]:
    return Catalog(root).sql(f"select {columns} from {table} order by start_ns").to_pylist()


def everything(root) -> str:
    """Every stored row of the three tables, as one string."""
    catalog = Catalog(root)
    return json.dumps([catalog.sql(f"select * from {t}").to_pylist() for t in ("span_rows", "step_rows", "message_rows")],
                      default=str, ensure_ascii=False)


# -- item 1: the fields that used to be stored as sent -------------------------------------------
def _capture(root, redact: Redactor | bool = True) -> None:
    resource = Resource.create({"service.name": f"billing {EMAIL}", f"team/{EMAIL}": "payments",
                                "deployment.environment": "prod"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(ReplayProcessor(root, redact=redact))
    tracer = provider.get_tracer(f"agents/{EMAIL}", f"1.0 {KEY}")
    call = {"role": "assistant", "parts": [{"type": "tool_call", "id": CARD_ID, "name": f"lookup:{EMAIL}",
                                            "arguments": {"q": "refund"}}]}
    with tracer.start_as_current_span(f"invoke_agent {EMAIL}", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": f"helper for {EMAIL}",
            "gen_ai.conversation.id": f"conv:{EMAIL}", f"app.user/{EMAIL}": True}) as agent:
        agent.add_event(f"handoff to {EMAIL}", {"n": 1})
        with tracer.start_as_current_span(f"chat ft:gpt-4o:{EMAIL}", attributes={
                "gen_ai.operation.name": "chat", "gen_ai.provider.name": f"openai {KEY}",
                "gen_ai.request.model": f"ft:gpt-4o:{EMAIL}", "gen_ai.response.model": f"ft:gpt-4o:{EMAIL}:2024",
                "gen_ai.response.finish_reasons": [f"stop {EMAIL}"], "error.type": f"QuotaError for {EMAIL}",
                "gen_ai.request.stop_sequences": [f"END {KEY}"], "gen_ai.request.temperature": 0.5,
                "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "refund"}]}]),
                "gen_ai.output.messages": json.dumps([call])}) as chat:
            chat.set_status(StatusCode.ERROR, "quota")
        with tracer.start_as_current_span(f"execute_tool lookup:{EMAIL}", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": f"lookup:{EMAIL}",
                "gen_ai.tool.call.id": CARD_ID, "gen_ai.tool.call.arguments": json.dumps({"q": "refund"}),
                "gen_ai.tool.call.result": "refunded"}):
            pass
    provider.shutdown()


def test_names_ids_models_and_keys_of_a_captured_span_are_redacted_in_every_column(tmp_path):
    _capture(tmp_path)
    spans = rows(tmp_path, "span_rows", "name, scope_name, scope_version, service_name, attributes, events, resource")
    assert [s["name"] for s in spans] == [f"invoke_agent {E}", f"chat ft:gpt-4o:{E}", f"execute_tool lookup:{E}"]
    assert {(s["scope_name"], s["scope_version"]) for s in spans} == {(f"agents/{E}", f"1.0 {K}")}
    assert {s["service_name"] for s in spans} == {f"billing {E}"}
    agent, chat, tool = spans
    assert json.loads(agent["events"])[0]["name"] == f"handoff to {E}"
    assert json.loads(agent["attributes"])[f"app.user/{E}"] is True  # the key, redacted; its value kept
    assert json.loads(agent["attributes"])["gen_ai.conversation.id"] == f"conv:{E}"
    resource = json.loads(agent["resource"])
    assert resource[f"team/{E}"] == "payments" and resource["service.name"] == f"billing {E}"
    assert json.loads(chat["attributes"])["error.type"] == f"QuotaError for {E}"

    steps = rows(tmp_path, "step_rows", "kind, name, agent_name, conversation_id, provider, request_model, "
                                         "response_model, error_type, finish_reasons, request_params, tool_name, "
                                         "tool_call_id, service_name, redacted")
    assert [(s["kind"], s["name"]) for s in steps] == [("agent", f"helper for {E}"), ("llm", f"chat ft:gpt-4o:{E}"),
                                                       ("tool", f"lookup:{E}")]
    agent, chat, tool = steps
    assert (agent["agent_name"], agent["conversation_id"]) == (f"helper for {E}", f"conv:{E}")
    assert (chat["provider"], chat["request_model"], chat["response_model"]) == (
        f"openai {K}", f"ft:gpt-4o:{E}", f"ft:gpt-4o:{E}:2024")
    assert chat["error_type"] == f"QuotaError for {E}" and chat["finish_reasons"] == [f"stop {E}"]
    assert json.loads(chat["request_params"]) == {"stop_sequences": [f"END {K}"], "temperature": 0.5}
    assert (tool["tool_name"], tool["tool_call_id"]) == (f"lookup:{E}", f"call_{C}")
    assert {s["service_name"] for s in steps} == {f"billing {E}"}
    # where each was found: the span's own names and attributes, the error, the request parameters a
    # policy is given ("input"), the messages (the call's id and the tool's name), the step's columns
    assert agent["redacted"] == ["attributes:email", "attributes:openai_key", "step:email"]
    assert chat["redacted"] == ["attributes:email", "attributes:openai_key", "error:email", "input:openai_key",
                                "output:credit_card", "output:email", "step:email", "step:openai_key"]
    assert tool["redacted"] == ["attributes:credit_card", "attributes:email", "attributes:openai_key",
                                "input:credit_card", "input:email", "output:credit_card", "step:credit_card",
                                "step:email"]
    # the call id in the chat's answer redacts to the same text as the tool step's column: replay binds them
    bodies = [json.loads(b) for b in Catalog(tmp_path).sql("select body from message_rows").column("body").to_pylist()]
    assert {"role": "assistant", "parts": [{"type": "tool_call", "id": f"call_{C}", "name": f"lookup:{E}",
                                            "arguments": {"q": "refund"}}]} in bodies
    stored = everything(tmp_path)
    assert EMAIL not in stored and KEY not in stored and "4111111111111111" not in stored


def test_without_redaction_the_same_capture_stores_them_as_sent(tmp_path):
    """The control: the test above fails for the right reason when nothing is redacted."""
    _capture(tmp_path, redact=False)
    stored = everything(tmp_path)
    assert EMAIL in stored and KEY in stored and CARD_ID in stored


def test_a_rule_naming_the_attribute_a_column_is_read_from_replaces_the_column(tmp_path):
    """Except the tool's name and call id, which the messages carry too: a rule on the attribute does
    not reach those, so the columns stay equal to them (replay binds by them)."""
    builder = TraceBuilder(agent="helper")
    builder.spans[0].attributes = {**builder.spans[0].attributes, "gen_ai.conversation.id": "conv-42",
                                   "session.id": "s-1"}
    builder.chat([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}],
                 {"role": "assistant", "parts": [{"type": "text", "content": "hello"}]})
    builder.tool("lookup", "c1", {"q": 1}, "ok")
    rules = ["gen_ai.conversation.id", "gen_ai.request.model", "gen_ai.tool.name", "gen_ai.tool.call.id"]
    ingest(tmp_path, builder.spans, source="test", privacy=Privacy(Redactor(attributes=rules)))
    steps = rows(tmp_path, "step_rows", "kind, conversation_id, request_model, tool_name, tool_call_id")
    assert steps == [{"kind": "agent", "conversation_id": "[REDACTED:attribute]", "request_model": None,
                      "tool_name": None, "tool_call_id": None},
                     {"kind": "llm", "conversation_id": None, "request_model": "[REDACTED:attribute]",
                      "tool_name": None, "tool_call_id": None},
                     {"kind": "tool", "conversation_id": None, "request_model": None, "tool_name": "lookup",
                      "tool_call_id": "c1"}]
    attributes = [json.loads(a) for a in Catalog(tmp_path).sql("select attributes from span_rows order by start_ns")
                  .column("attributes").to_pylist()]
    assert attributes[2]["gen_ai.tool.name"] == attributes[2]["gen_ai.tool.call.id"] == "[REDACTED:attribute]"


def test_a_redacted_tool_call_id_still_binds_the_tool_result_in_replay(tmp_path):
    """The id is redacted alike in the tool step's column and in the messages that carry it, so a
    re-run tool's new result reaches the next model call, as it does with a clean id."""
    builder = TraceBuilder()
    user = {"role": "user", "parts": [{"type": "text", "content": "refund order 7"}]}
    ask = {"role": "assistant", "parts": [{"type": "tool_call", "id": CARD_ID, "name": "refund", "arguments": {"order": 7}}]}
    answer = {"role": "tool", "parts": [{"type": "tool_call_response", "id": CARD_ID, "response": "done"}]}
    builder.chat([user], ask)
    builder.tool("refund", CARD_ID, {"order": 7}, "done")
    builder.chat([user, ask, answer], {"role": "assistant", "parts": [{"type": "text", "content": "Refunded."}]})
    ingest(tmp_path, builder.spans, source="test")
    traj = Store(tmp_path).trajectory(builder.trace_id)
    assert traj.steps[1].tool_call_id == f"call_{C}"
    assert verify_factual(traj).ok
    seen = []
    registry = Registry()
    registry.register("llm", None, lambda step, inputs, rng: seen.append(inputs.messages) or
                      [{"role": "assistant", "parts": [{"type": "text", "content": "ok"}]}])
    run = replay(traj, ReplayPlan.do(1, "refused"), 0, policies=registry)
    assert run.ok, run.unreplayable
    assert {"role": "tool", "parts": [{"type": "tool_call_response", "id": f"call_{C}", "response": "refused"}]} \
        in seen[-1]


def test_a_failing_rule_still_runs_the_builtins_on_the_names_it_keeps(tmp_path):
    def broken(text: str) -> str:
        raise RuntimeError("rule bug")

    builder = TraceBuilder(agent=f"helper for {EMAIL}")
    builder.tool(f"lookup:{EMAIL}", CARD_ID, {"q": 1}, "ok")
    ingest(tmp_path, builder.spans, source="test", privacy=Privacy(Redactor(functions=[broken])))
    steps = rows(tmp_path, "step_rows", "name, agent_name, tool_name, tool_call_id, redacted")
    assert steps == [{"name": f"helper for {E}", "agent_name": f"helper for {E}", "tool_name": None,
                      "tool_call_id": None, "redacted": ["all:redaction-failed"]},
                     {"name": f"lookup:{E}", "agent_name": None, "tool_name": f"lookup:{E}",
                      "tool_call_id": f"call_{C}", "redacted": ["all:redaction-failed"]}]
    assert EMAIL not in everything(tmp_path)


def test_free_text_kind_status_and_links_of_an_import_are_redacted(tmp_path):
    """Flat JSON imports take a span's kind and status code as text, and keep a link as the mapping
    it came in: all scanned, a link without attributes too."""
    t0 = 1_767_225_600_000_000_000
    span = SpanRecord("0" * 31 + "5", "0" * 15 + "6", None, "lookup", kind=f"CLIENT {EMAIL}", status_code=f"weird {EMAIL}",
                      start_ns=t0, end_ns=t0 + 1000, links=[{"trace_id": "ab" * 16, "span_id": "cd" * 8, "note": f"from {EMAIL}"}],
                      attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"})
    ingest(tmp_path, [span], source="test")
    (stored,) = rows(tmp_path, "span_rows", "span_kind, status_code, links")
    assert (stored["span_kind"], stored["status_code"]) == (f"CLIENT {E}", f"weird {E}")
    assert json.loads(stored["links"]) == [{"trace_id": "ab" * 16, "span_id": "cd" * 8, "note": f"from {E}"}]
    assert rows(tmp_path, "step_rows", "status") == [{"status": f"weird {E}"}]


# -- item 3: a secret split across a message's text parts ------------------------------------------
SPLIT = [  # the parts as sent, and as they must be stored
    (["key sk-proj-QLabcd", "efghijklmnopqrstuvwxyz0123 please"], [f"key {K}", f"{K} please"]),
    (["write to jane.roe@exa", "mple.com today"], [f"write to {E}", f"{E} today"]),
    (["api_key=", "hunter2hunter2 ok"], ["api_key=", "[REDACTED:secret_assignment] ok"]),
    (["card 4111 1111", " 1111 1111 thanks"], [f"card {C}", f"{C} thanks"]),
    (["sk-proj-", "QLabcdefghijklm", "nopqrstuvwxyz0123"], [K, K, K]),  # three parts, the middle one all secret
    (["no secret here", "nor here"], ["no secret here", "nor here"]),
]


@pytest.mark.parametrize(("sent", "stored"), SPLIT)
@pytest.mark.parametrize("gates", [True, False])
def test_a_secret_split_across_text_parts_is_redacted_in_each_part(tmp_path, sent, stored, gates):
    message = {"role": "user", "parts": [{"type": "text", "content": t} for t in sent]}
    builder = TraceBuilder()
    builder.chat([message], {"role": "assistant", "parts": [{"type": "text", "content": "ok"}]})
    ingest(tmp_path, builder.spans, source="test", privacy=Privacy(Redactor(gates=gates)))
    bodies = [orjson.loads(b) for b in Catalog(tmp_path).sql("select body from message_rows").column("body").to_pylist()]
    assert {"role": "user", "parts": [{"type": "text", "content": t} for t in stored]} in bodies


def test_split_parts_in_an_agent_loop_history_and_in_system_instructions(tmp_path):
    """A message resent in later turns (memoized, gated as one JSON with the others) and system
    instructions (a list of parts) are scanned joined too."""
    split = {"role": "user", "parts": [{"type": "text", "content": "mail jane.roe@exa"},
                                       {"type": "text", "content": "mple.com please"}]}
    builder = TraceBuilder()
    history = [{"role": "user", "parts": [{"type": "text", "content": "hello " * 30}]}, split]
    for turn in range(3):
        answer = {"role": "assistant", "parts": [{"type": "text", "content": f"turn {turn}"}]}
        builder.chat(list(history), answer)
        history.append(answer)
    builder.spans[1].attributes = {**builder.spans[1].attributes, "gen_ai.system_instructions": json.dumps(
        [{"type": "text", "content": "the admin key is sk-proj-QL"}, {"type": "text", "content": "abcdefghijklmnopqrstuvwx"}])}
    ingest(tmp_path, builder.spans, source="test")
    bodies = [orjson.loads(b) for b in Catalog(tmp_path).sql("select body from message_rows").column("body").to_pylist()]
    assert {"role": "user", "parts": [{"type": "text", "content": f"mail {E}"},
                                      {"type": "text", "content": f"{E} please"}]} in bodies
    assert [{"type": "text", "content": f"the admin key is {K}"}, {"type": "text", "content": K}] in bodies
    stored = everything(tmp_path)
    assert "jane.roe@exa" not in stored and "QLabcdefghijklmnopqrstuvwx" not in stored


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planted(), st.lists(st.integers(0, 400), max_size=4))
def test_however_a_text_is_cut_into_parts_what_it_holds_is_redacted(text, cuts):
    """A text cut anywhere into text parts: gated and exact agree, and no secret the whole text's
    scan finds is left readable in the parts (each part it reaches is redacted)."""
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    parts = [{"type": "text", "content": text[a:b]} for a, b in zip(bounds, bounds[1:], strict=False)] or [{"type": "text", "content": ""}]
    message = {"role": "user", "parts": parts}
    fast, exact = Redactor().messages([message]), Redactor(gates=False).messages([message])
    assert fast == exact
    joined = "".join(p.get("content", "") for p in fast[0][0]["parts"] if p["type"] == "text")
    whole = Redactor(gates=False).text(text)[0]
    for start, end, _ in Redactor(gates=False)._builtin_hits(text, None):
        found = text[start:end]
        if len(found) >= 6 and "[" not in found and "]" not in found:
            assert found not in joined or found in whole, (found, joined)
