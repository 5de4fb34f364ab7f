"""Two producers tracing one model call give one step, by evidence rather than by nesting.

The real cases run the real SDKs and instrumentations (tests/agents/duplicate_calls.py) against a
model API on 127.0.0.1, captured live by ReplayProcessor, imported from the OTLP/JSON files that
script records (tests/fixtures/duplicate_calls/), and received by the OTLP receiver: each call is
one step carrying both span ids, and two real calls in flight together stay two steps. The
property tests interleave real calls and their duplicates as hypothesis draws them and check
that the steps are the calls, each with its own payload.
"""

from __future__ import annotations

import json
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from otel_replay import Store
from otel_replay.capture.receiver import OtlpReceiver
from otel_replay.normalize.records import SpanRecord
from otel_replay.store.import_files import import_files
from otel_replay.store.ingest import ingest
from otel_replay.trajectory.model import Step, Trajectory
from tests.agents.duplicate_calls import (
    ANTHROPIC_MODEL,
    FAN_OUT,
    FINAL,
    FIXTURES,
    QUESTION,
    answer_to,
    fixture_name,
)
from tests.helpers import needs_openai_v2, needs_openllmetry_anthropic, run_module

OPENLLMETRY, ANTHROPIC_SDK = "opentelemetry.instrumentation.anthropic", "com.anthropic.sdk.python"
OPENAI_V2, OPENINFERENCE = "opentelemetry.util.genai.handler", "openinference.instrumentation.openai"
FRAMEWORK = "duplicate-calls.framework"


# --- the real instrumentations: capture, import and collect -------------------------------------

def _capture(root: Path, scenario: str, sdk_content: bool) -> Store:
    run_module("tests.agents.duplicate_calls", scenario, "--store", str(root), *(["--sdk-content"] if sdk_content else []))
    return Store(root)


def _import(root: Path, scenario: str, sdk_content: bool) -> Store:
    import_files(root, "otlp", [FIXTURES / fixture_name(scenario, sdk_content)], jobs=1)
    return Store(root)


def _collect(root: Path, scenario: str, sdk_content: bool) -> Store:
    body = (FIXTURES / fixture_name(scenario, sdk_content)).read_bytes()
    with OtlpReceiver(root, http_port=0, grpc_port=0) as receiver:
        request = urllib.request.Request(f"{receiver.http_endpoint}/v1/traces", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
    return Store(root)


SOURCES: dict[str, Callable[[Path, str, bool], Store]] = {"capture": _capture, "import": _import, "collect": _collect}


def _runs(store: Store) -> dict[str, Trajectory]:
    """The two traces of a scenario run, by agent: the weather loop and the fan-out."""
    runs = {}
    for trace_id in store.list_traces().column("trace_id").to_pylist():
        trajectory = store.trajectory(trace_id)
        runs[trajectory.root_name.removeprefix("invoke_agent ")] = trajectory
    assert sorted(runs) == ["fan-out", "weather-agent"]
    return runs


def _text(messages: tuple[dict[str, Any], ...]) -> str:
    return " ".join(p.get("content", "") for m in messages for p in m.get("parts", []) if p.get("type") == "text")


def _span_rows(store: Store, step: Step) -> list[dict[str, Any]]:
    """The spans behind a step, in the order of its span_ids."""
    rows = {r["span_id"]: r for r in store.sql("select span_id, parent_span_id, scope_name, start_ns, end_ns from spans"
                                              ).to_pylist()}
    return [rows[s] for s in step.span_ids]


def _check_run(store: Store, producers: set[str]) -> dict[str, Trajectory]:
    """Each model call is one step traced by both producers; the loop is three steps, the fan-out two."""
    runs = _runs(store)
    weather, fan_out = runs["weather-agent"], runs["fan-out"]
    assert [(s.index, s.kind) for s in weather.steps] == [(0, "llm"), (1, "tool"), (2, "llm")]
    first, tool, second = weather.steps
    assert QUESTION in _text(first.inputs) and not first.observation_only
    assert [p["name"] for m in first.outputs for p in m["parts"] if p["type"] == "tool_call"] == ["get_weather"]
    assert second.output_text == FINAL and weather.final_output == FINAL and not second.observation_only
    assert len(tool.span_ids) == 1
    assert [s.index for s in fan_out.steps] == [0, 1] and all(s.kind == "llm" for s in fan_out.steps)
    asked = []
    for step in fan_out.steps:  # each step has the payload of its own call
        (question,) = [q for q in FAN_OUT if q in _text(step.inputs)]
        assert step.output_text == answer_to(question) and not step.observation_only
        asked.append(question)
    assert sorted(asked) == sorted(FAN_OUT)
    for step in (first, second, *fan_out.steps):
        assert len(step.span_ids) == 2 and step.span_ids[0] == step.span_id
        assert {r["scope_name"] for r in _span_rows(store, step)} == producers
    counts = store.sql("select root_name, steps, llm_steps, observation_only_steps from traces order by root_name").to_pylist()
    assert counts == [{"root_name": "invoke_agent fan-out", "steps": 2, "llm_steps": 2, "observation_only_steps": 0},
                      {"root_name": "invoke_agent weather-agent", "steps": 3, "llm_steps": 2, "observation_only_steps": 0}]
    return runs


@pytest.mark.parametrize("sdk_content", [False, True], ids=["sdk-metadata-only", "sdk-content"])
@pytest.mark.parametrize("source", [pytest.param(s, marks=needs_openllmetry_anthropic) if s == "capture" else s for s in SOURCES])
def test_openllmetry_anthropic_and_the_sdks_own_sibling_spans_are_one_step(tmp_path, source, sdk_content):
    store = SOURCES[source](tmp_path, "anthropic-openllmetry", sdk_content)
    runs = _check_run(store, {OPENLLMETRY, ANTHROPIC_SDK})
    for trajectory in runs.values():
        for step in (s for s in trajectory.steps if s.kind == "llm"):
            spans = _span_rows(store, step)
            assert spans[0]["parent_span_id"] == spans[1]["parent_span_id"]  # siblings, not parent and child
            assert step.model == ANTHROPIC_MODEL and step.input_tokens is not None
    # without content from the SDK, the instrumentation's span is the one with payloads, so it is kept
    if not sdk_content:
        assert all(_span_rows(store, s)[0]["scope_name"] == OPENLLMETRY
                   for t in runs.values() for s in t.steps if s.kind == "llm")
    assert [(s.input_tokens, s.output_tokens) for s in runs["weather-agent"].steps if s.kind == "llm"] == [(120, 40), (160, 16)]


@pytest.mark.parametrize("source", [pytest.param(s, marks=needs_openai_v2) if s == "capture" else s for s in SOURCES])
def test_openai_v2_and_openinference_on_one_client_are_one_step_per_call(tmp_path, source):
    store = SOURCES[source](tmp_path, "openai-openinference", False)
    runs = _check_run(store, {OPENAI_V2, OPENINFERENCE})
    for step in (s for t in runs.values() for s in t.steps if s.kind == "llm"):
        outer, inner = sorted(_span_rows(store, step), key=lambda r: r["start_ns"])
        assert inner["parent_span_id"] == outer["span_id"]  # one instrumentation's span inside the other's
    assert [(s.input_tokens, s.output_tokens) for s in runs["weather-agent"].steps if s.kind == "llm"] == [(82, 18), (125, 14)]


@pytest.mark.parametrize("source", list(SOURCES))
def test_a_framework_llm_span_over_the_sdks_span_is_one_step(tmp_path, source):
    store = SOURCES[source](tmp_path, "framework-anthropic", False)
    runs = _check_run(store, {FRAMEWORK, ANTHROPIC_SDK})
    second = runs["weather-agent"].steps[2]
    framework, sdk = _span_rows(store, second)
    assert framework["scope_name"] == FRAMEWORK and sdk["parent_span_id"] == second.span_id  # nested
    # the framework's span names no model: the SDK's span (its child) supplies it, name included
    assert second.model == ANTHROPIC_MODEL and second.name == f"chat {ANTHROPIC_MODEL}"


# --- the rule, span by span: what is one call and what is two ----------------------------------

TRACE, AGENT = "ab" * 16, "a0" * 8
MS = 1_000_000
T0 = 1_764_527_400_000_000_000
# producer -> (scope, provider, attribute shape)
PRODUCERS: dict[str, tuple[str, str, str]] = {
    "openllmetry": (OPENLLMETRY, "anthropic", "genai"),
    "anthropic-sdk": (ANTHROPIC_SDK, "anthropic", "genai"),
    "framework": (FRAMEWORK, "anthropic", "openinference"),
    "openai-v2": (OPENAI_V2, "openai", "genai"),
    "openinference": (OPENINFERENCE, "openai", "openinference"),
}
PAIRINGS = [("openllmetry", "anthropic-sdk"), ("anthropic-sdk", "openllmetry"), ("framework", "anthropic-sdk"),
            ("openai-v2", "openinference"), ("openinference", "openai-v2")]


@dataclass(frozen=True)
class Call:
    """One real model call: its span from the producer with payloads, and maybe a duplicate span.

    `duplicate`: none, or the second producer's span inside the first (its child), around it (its
    parent) or beside it (a sibling under the agent), `lead`/`lag` ns apart at the ends.
    """

    start: int
    duration: int
    model: str = "model-a"
    duplicate: str = "inside"
    lead: int = 0
    lag: int = 0
    duplicate_payload: bool = False  # the duplicate records the same request and response
    duplicate_model: bool = True  # False: the duplicate names no model (a framework span may not)


def _question(i: int) -> str:
    return f"Question {i}: what happened on day {i}?"


def _answer(i: int) -> str:
    return f"Answer {i}."


def _attributes(producer: str, i: int, call: Call, payload: bool, model: bool) -> dict[str, Any]:
    """The span attributes `producer` writes for call `i`, as that instrumentation shapes them."""
    _, provider, shape = PRODUCERS[producer]
    if shape == "openinference":
        attrs: dict[str, Any] = {"openinference.span.kind": "LLM", "llm.provider": provider,
                                 "llm.token_count.prompt": 10 + i, "llm.token_count.completion": 3}
        if model:
            attrs["llm.model_name"] = call.model
        if payload:
            attrs |= {"llm.input_messages.0.message.role": "user", "llm.input_messages.0.message.content": _question(i),
                      "llm.output_messages.0.message.role": "assistant",
                      "llm.output_messages.0.message.content": _answer(i)}
        return attrs
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
             "gen_ai.usage.input_tokens": 10 + i, "gen_ai.usage.output_tokens": 3}
    if model:
        attrs |= {"gen_ai.request.model": call.model, "gen_ai.response.model": f"{call.model}-2025"}
    if producer == "anthropic-sdk":
        attrs["anthropic.message.stop_reason"] = "end_turn"
    if payload:
        attrs |= {"gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": _question(i)}]}]),
                  "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": _answer(i)}],
                                                         "finish_reason": "stop"}])}
    return attrs


def _span(producer: str, span_id: str, parent: str, start: int, end: int, attributes: dict[str, Any],
          status: str = "unset") -> SpanRecord:
    return SpanRecord(trace_id=TRACE, span_id=span_id, parent_span_id=parent, name=f"{producer} call", kind="CLIENT",
                      start_ns=T0 + start, end_ns=T0 + end, status_code=status, attributes=attributes,
                      resource={"service.name": "duplicates"}, scope_name=PRODUCERS[producer][0])


def _spans(calls: list[Call], pairing: tuple[str, str]) -> list[SpanRecord]:
    """An agent span, and for each call its primary span (ids p..) and its duplicate (ids d..)."""
    first, second = pairing
    end = max(c.start + c.duration for c in calls) + 10 * MS
    spans = [SpanRecord(trace_id=TRACE, span_id=AGENT, parent_span_id=None, name="invoke_agent a", start_ns=T0,
                        end_ns=T0 + end, attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"},
                        scope_name="agent")]
    for i, c in enumerate(calls):
        primary, duplicate = f"{i + 1:08x}".rjust(16, "1"), f"{i + 1:08x}".rjust(16, "d")
        p_start, p_end = c.start, c.start + c.duration
        d_start, d_end, p_parent, d_parent = {
            "inside": (p_start + c.lead, p_end - c.lag, AGENT, primary),
            "around": (p_start - c.lead, p_end + c.lag, duplicate, AGENT),
            "beside": (p_start + c.lead, p_end + c.lag, AGENT, AGENT),
            "none": (0, 0, AGENT, AGENT),
        }[c.duplicate]
        spans.append(_span(first, primary, p_parent, p_start, p_end, _attributes(first, i, c, True, True)))
        if c.duplicate != "none":
            attrs = _attributes(second, i, c, c.duplicate_payload, c.duplicate_model)
            spans.append(_span(second, duplicate, d_parent, d_start, d_end, attrs))
    return spans


def _steps(spans: list[SpanRecord]) -> tuple[Store, Trajectory]:
    root = Path(tempfile.mkdtemp(prefix="duplicates-"))
    ingest(root, spans, source="test", privacy=None)
    store = Store(root)
    return store, store.trajectory(TRACE)


def _call_of(step: Step) -> int:
    """The call whose question the step's input is."""
    (i,) = [int(t.split()[1].rstrip(":")) for t in [_text(step.inputs)] if t.startswith("Question")]
    return i


@st.composite
def interleavings(draw: st.DrawFn) -> tuple[list[Call], tuple[str, str]]:
    """1-6 real calls at any times (sequential, overlapping, simultaneous), most with a duplicate
    span from a second producer that sits within 2 ms of it, as instrumentation overhead puts it."""
    pairing = draw(st.sampled_from(PAIRINGS))
    calls = []
    for _ in range(draw(st.integers(1, 6))):
        duplicate = draw(st.sampled_from(["inside", "around", "beside", "none"]))
        payload = draw(st.booleans())
        calls.append(Call(
            start=draw(st.integers(10, 300)) * MS + draw(st.integers(0, MS)),
            duration=draw(st.integers(10, 150)) * MS,
            model=draw(st.sampled_from(["model-a", "model-b"])),
            duplicate=duplicate,
            lead=draw(st.integers(0, 2 * MS)),
            lag=draw(st.integers(0, 2 * MS)),
            duplicate_payload=payload,
            # a span without a model merges only with its parent or child, or with the same request
            duplicate_model=draw(st.booleans()) if duplicate in ("inside", "around") or payload else True,
        ))
    return calls, pairing


def _unambiguous(calls: list[Call], i: int) -> bool:
    """No other call of the model is within 8 ms of call i at both ends (twice the farthest a
    duplicate sits from its call): its duplicate cannot be closer to another call than to its own."""
    c = calls[i]
    return all(abs(c.start - o.start) + abs(c.duration + c.start - o.start - o.duration) > 8 * MS
               for j, o in enumerate(calls) if j != i and o.model == c.model)


SIMULTANEOUS = [Call(start=50 * MS, duration=40 * MS, lead=MS, lag=MS) for _ in range(4)]


@settings(max_examples=25, deadline=None)  # the slow suite generates 300 more (below)
@given(interleavings())
@example((SIMULTANEOUS, ("openllmetry", "anthropic-sdk")))  # four identical calls at once: in order, in one round
@example(([replace(c, duplicate="beside") for c in SIMULTANEOUS], ("openai-v2", "openinference")))
@example(([Call(start=10 * MS, duration=20 * MS), Call(start=30 * MS + 1, duration=20 * MS, duplicate="none")],
          ("openllmetry", "anthropic-sdk")))  # sequential calls, the second without a duplicate
@example(([Call(start=10 * MS, duration=100 * MS, lead=2 * MS, lag=2 * MS),  # call 0's duplicate is nearer call 1
           Call(start=10 * MS + MS // 2, duration=100 * MS)], ("openllmetry", "anthropic-sdk")))  # a second round pairs it
def test_the_steps_are_the_real_calls_each_with_its_own_payload(case):
    _assert_one_step_per_real_call(case)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(interleavings())
def test_many_more_interleavings_are_one_step_per_real_call(case):
    _assert_one_step_per_real_call(case)


def _assert_one_step_per_real_call(case: tuple[list[Call], tuple[str, str]]) -> None:
    calls, pairing = case
    _, trajectory = _steps(_spans(calls, pairing))
    steps = trajectory.steps
    assert len(steps) == len(calls)  # one step per real call: no duplicate left, no two calls merged
    assert [s.index for s in steps] == list(range(len(calls)))
    assert [s.start_ns for s in steps] == sorted(s.start_ns for s in steps)
    seen = [span for s in steps for span in s.span_ids]
    assert sorted(seen) == sorted(span.span_id for span in _spans(calls, pairing)[1:])  # every span, once
    for step in steps:
        i = _call_of(step)
        assert step.output_text == _answer(i) and not step.observation_only  # the payload of its own call
        primaries = [s for s in step.span_ids if s.startswith("1")]
        assert primaries == [f"{i + 1:08x}".rjust(16, "1")]  # exactly one real call in each step
        assert step.span_ids[0] == step.span_id
        if calls[i].duplicate != "none" and _unambiguous(calls, i):
            assert sorted(step.span_ids) == sorted([primaries[0], f"{i + 1:08x}".rjust(16, "d")])
    assert sorted(_call_of(s) for s in steps) == list(range(len(calls)))


def _llm(store: Store) -> list[dict[str, Any]]:
    return store.sql("select span_ids, status, error_type, input_tokens, output_tokens, finish_reasons, has_payload, "
                     "request_model, name from steps where kind = 'llm' order by step_index").to_pylist()


def test_two_parallel_calls_of_one_instrumentation_are_never_merged():
    # the same producer, the same model, the same instant, no payloads: nothing tells them apart but the
    # producer, and one instrumentation traces each call once
    call = Call(start=10 * MS, duration=30 * MS, duplicate="none")
    spans = _spans([call, call], ("anthropic-sdk", "openllmetry"))
    for span in spans[1:]:
        span.attributes = _attributes("anthropic-sdk", 0, call, False, True)
    store, _ = _steps(spans)
    assert [len(r["span_ids"]) for r in _llm(store)] == [1, 1]


def test_overlapping_calls_with_different_requests_are_two_steps():
    # two producers, both with payloads, overlapping: different requests are different calls
    calls = [Call(start=10 * MS, duration=30 * MS, duplicate="none"), Call(start=10 * MS, duration=30 * MS, duplicate="none")]
    spans = _spans(calls, ("openllmetry", "anthropic-sdk"))
    spans[2] = replace(spans[2], scope_name=ANTHROPIC_SDK, attributes=_attributes("anthropic-sdk", 1, calls[1], True, True))
    store, trajectory = _steps(spans)
    assert [len(r["span_ids"]) for r in _llm(store)] == [1, 1]
    assert sorted(_call_of(s) for s in trajectory.steps) == [0, 1]


@pytest.mark.parametrize(("duplicate", "payload", "merged"), [
    ("beside", False, False),  # a sibling that names no model and records nothing: too little evidence
    ("inside", False, True),  # ... as the call's child: nesting is the evidence
    ("around", False, True),  # ... as its parent
    ("beside", True, True),  # ... with the same request: the request is the evidence
])
def test_a_span_without_a_model_needs_nesting_or_the_same_request(duplicate, payload, merged):
    call = Call(start=10 * MS, duration=30 * MS, duplicate=duplicate, lead=MS, lag=MS, duplicate_payload=payload,
                duplicate_model=False)
    store, trajectory = _steps(_spans([call], ("openai-v2", "openinference")))
    assert [len(r["span_ids"]) for r in _llm(store)] == ([2] if merged else [1, 1])
    assert _call_of(trajectory.steps[0]) == 0


@pytest.mark.parametrize("change", ["model", "provider", "operation", "gap"])
def test_different_models_providers_operations_or_times_are_different_calls(change):
    call = Call(start=10 * MS, duration=30 * MS, duplicate="beside", lead=MS, lag=MS)
    spans = _spans([call], ("openllmetry", "anthropic-sdk"))
    attributes = dict(spans[2].attributes)
    if change == "model":
        attributes |= {"gen_ai.request.model": "model-b", "gen_ai.response.model": "model-b-2025"}
    elif change == "provider":
        attributes["gen_ai.provider.name"] = "aws.bedrock"
    elif change == "operation":
        attributes["gen_ai.operation.name"] = "text_completion"
    spans[2] = replace(spans[2], attributes=attributes,
                       start_ns=spans[1].end_ns + 1 if change == "gap" else spans[2].start_ns,
                       end_ns=spans[1].end_ns + 30 * MS if change == "gap" else spans[2].end_ns)
    store, _ = _steps(spans)
    assert [len(r["span_ids"]) for r in _llm(store)] == [1, 1]


def test_a_merged_step_has_the_richer_payloads_and_every_attribute_of_both_spans():
    call = Call(start=10 * MS, duration=30 * MS, duplicate="beside", lead=MS, lag=2 * MS)
    spans = _spans([call], ("openllmetry", "anthropic-sdk"))
    primary, sdk = spans[1], spans[2]
    primary.attributes = {k: v for k, v in primary.attributes.items() if not k.startswith("gen_ai.usage")}
    sdk.attributes = {**sdk.attributes, "error.type": "overloaded_error"}
    sdk.status_code = "error"
    store, trajectory = _steps(spans)
    (row,) = _llm(store)
    assert row["span_ids"] == [primary.span_id, sdk.span_id]  # the span with payloads first
    assert (row["status"], row["error_type"]) == ("error", "overloaded_error")  # from the SDK's span
    assert (row["input_tokens"], row["output_tokens"]) == (10, 3) and row["has_payload"]
    (step,) = trajectory.steps
    assert step.output_text == _answer(0) and step.span_ids == (primary.span_id, sdk.span_id)
    assert (step.start_ns, step.end_ns) == (primary.start_ns, sdk.end_ns)  # the union of both spans' times
