"""Every recorded OTel fixture convention normalizes to the same canonical steps.

The fixtures in `tests/fixtures/otel/` record one agent scenario (see its README) with many
instrumentation packages. Each is read both from its flat dump (`NAME.json`) and from its OTLP/JSON
export (`NAME.otlp.json` + `NAME.logs.otlp.json`); both must give identical steps, and the steps
must hold the exact canonical messages, whatever produced them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from otel_replay import Store
from otel_replay.normalize.messages import canonical_bytes
from otel_replay.normalize.pipeline import NormalizedSpan, normalize_spans
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.sources.flat_json import read_flat
from otel_replay.normalize.sources.otlp_json import logs_from_request, spans_from_request
from otel_replay.normalize.step import NormalizedStep
from otel_replay.store.ingest import ingest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
OTEL = FIXTURES / "otel"
LANGFUSE_OTLP = FIXTURES / "langfuse" / "otlp" / "trace_wrong_answer.otlp.json"

# --- the scenario (tests/fixtures/otel/README.md) ----------------------------------------------

SYSTEM = "You are a helpful weather assistant. Use tools when needed."
QUESTION = "What's the weather in Paris?"
ARGS = {"city": "Paris", "unit": "celsius"}
RESULT = '{"city": "Paris", "temperature_c": 18, "condition": "partly cloudy"}'
RESULT_COMPACT = '{"city":"Paris","temperature_c":18,"condition":"partly cloudy"}'
FINAL = "It is currently 18°C and partly cloudy in Paris."
ANTHROPIC_PREAMBLE = "I'll check the weather in Paris."
RATE_LIMIT_PROMPT = "RATE_LIMIT please"
CONVERSATIONS = ("conv_7f3a", "conv_stream_9b1c", "conv_err_0001")
TOOL_DEFINITION = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    },
}


@dataclass(frozen=True)
class Spec:
    """What one fixture is expected to normalize to, where producers legitimately differ."""

    provider: str = "openai"
    error_type: str = "openai.RateLimitError"  # of the failing chat step, wrappers stripped
    tool_definitions: bool = True  # the chat spans carry the tool definitions
    tool_result: str = RESULT  # the execute_tool span's result, as the producer recorded it
    stream_output: bool = True  # the streaming chat spans record their output messages
    raw_error_type: str | None = None  # `error.type` on the failing chat span, when rewritten

    @property
    def model(self) -> str:
        return "gpt-4o-mini" if self.provider == "openai" else "claude-sonnet-4-5"

    @property
    def call_ids(self) -> tuple[str, str]:
        """Tool call ids of turn 1 and of the streaming turn 2."""
        if self.provider == "openai":
            return "call_weather_01", "call_stream_02"
        return "toolu_01weather", "toolu_stream02"

    @property
    def tokens(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """(input, output) tokens of turn 1's two chat calls."""
        if self.provider == "openai":
            return (82, 18), (125, 14)
        return (120, 40), (160, 16)


CLASS_WRAPPED = "<class 'openai.RateLimitError'>"
SPECS: dict[str, Spec] = {
    "openai-v2_span_only": Spec(tool_definitions=False, raw_error_type=CLASS_WRAPPED),
    "openai-v2_event_only": Spec(tool_definitions=False, raw_error_type=CLASS_WRAPPED),
    "openai-v2_span_and_event": Spec(tool_definitions=False, raw_error_type=CLASS_WRAPPED),
    "openai-v2_legacy_v1.30": Spec(tool_definitions=False, error_type="RateLimitError"),
    "util-genai-1.1_handler_span_and_event": Spec(
        tool_definitions=False, tool_result=RESULT_COMPACT, raw_error_type=CLASS_WRAPPED
    ),
    "genai-openai_span_and_event": Spec(),
    "util-genai-1.3_handler_span_and_event": Spec(tool_result=RESULT_COMPACT),
    "anthropic-sdk-native_content": Spec(
        provider="anthropic",
        error_type="rate_limit_error",
        tool_definitions=False,
        stream_output=False,
    ),
    "openinference-openai": Spec(),
    "openinference-openai_genai-semconv": Spec(),
    "traceloop-openai_attributes": Spec(error_type="RateLimitError"),
    "traceloop-openai_events": Spec(error_type="RateLimitError", tool_definitions=False),
    "traceloop-openai-0.49_legacy-attributes": Spec(error_type="RateLimitError"),
}
NAMES = sorted(SPECS)
OPENAI_NAMES = [n for n in NAMES if SPECS[n].provider == "openai"]
VARIANTS = ("flat", "otlp")
# Content that only travels in log records: the spans alone carry none.
CONTENT_ONLY_IN_LOGS = ("openai-v2_event_only", "openai-v2_legacy_v1.30", "traceloop-openai_events")


# --- loading and normalizing (cached: every test only reads the results) ------------------------


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@functools.cache
def records(name: str, variant: str) -> tuple[list[SpanRecord], list[LogEvent]]:
    """The fixture's spans and log records, from the flat dump or from the OTLP/JSON files."""
    if variant == "flat":
        return read_flat(_read_json(OTEL / f"{name}.json"))
    spans = list(spans_from_request(_read_json(OTEL / f"{name}.otlp.json")))
    logs_path = OTEL / f"{name}.logs.otlp.json"
    logs = list(logs_from_request(_read_json(logs_path))) if logs_path.exists() else []
    return spans, logs


@functools.cache
def normalized(name: str, variant: str, with_logs: bool = True) -> tuple[list[NormalizedSpan], int]:
    """Normalized spans and the number of log records that matched no span."""
    spans, logs = records(name, variant)
    result, unmatched = normalize_spans(spans, logs if with_logs else [])
    return result, len(unmatched)


def traces(items: Sequence[NormalizedSpan]) -> list[list[NormalizedStep]]:
    """Steps per trace, each ordered by start time; traces in the order they started."""
    by_trace: dict[str, list[NormalizedStep]] = defaultdict(list)
    for item in items:
        if item.step is not None:
            by_trace[item.span.trace_id].append(item.step)
    ordered = [
        sorted(steps, key=lambda s: (s.start_ns or 0, s.span_id)) for steps in by_trace.values()
    ]
    return sorted(ordered, key=lambda steps: steps[0].start_ns or 0)


def turn(name: str, variant: str, number: int, *, with_logs: bool = True) -> list[NormalizedStep]:
    """The steps of scenario turn `number` (1..3): the n-th trace, checked by its conversation id."""
    steps = traces(normalized(name, variant, with_logs)[0])[number - 1]
    agent = steps[0]
    assert agent.kind == "agent", f"{name}: turn {number} does not start with its agent span"
    assert agent.conversation_id == CONVERSATIONS[number - 1]
    return steps


def llm_steps(steps: Sequence[NormalizedStep]) -> list[NormalizedStep]:
    return [s for s in steps if s.kind == "llm"]


# --- expected canonical messages ----------------------------------------------------------------


def text(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": content}]}


def call_part(call_id: str) -> dict[str, Any]:
    return {"type": "tool_call", "id": call_id, "name": "get_weather", "arguments": ARGS}


def assistant_call(spec: Spec, call_id: str, *, preamble: bool) -> dict[str, Any]:
    """The assistant's tool-call message (Anthropic's turn-1 reply also says what it will do)."""
    parts = [call_part(call_id)]
    if preamble and spec.provider == "anthropic":
        parts.insert(0, {"type": "text", "content": ANTHROPIC_PREAMBLE})
    return {"role": "assistant", "parts": parts}


def tool_message(spec: Spec, call_id: str) -> dict[str, Any]:
    """The tool result as sent to the model: role `tool` for OpenAI, `user` for Anthropic."""
    role = "tool" if spec.provider == "openai" else "user"
    return {
        "role": role,
        "parts": [{"type": "tool_call_response", "id": call_id, "response": RESULT}],
    }


def first_request(spec: Spec) -> list[dict[str, Any]]:
    if spec.provider == "openai":  # the system prompt stays a message of the request
        return [text("system", SYSTEM), text("user", QUESTION)]
    return [text("user", QUESTION)]  # Anthropic: a separate `system` (see expected_system)


def expected_system(spec: Spec) -> list[dict[str, Any]]:
    return [] if spec.provider == "openai" else [{"type": "text", "content": SYSTEM}]


def follow_up_request(spec: Spec, call_id: str, *, preamble: bool) -> list[dict[str, Any]]:
    return [
        *first_request(spec),
        assistant_call(spec, call_id, preamble=preamble),
        tool_message(spec, call_id),
    ]


def assert_canonical(messages: Sequence[dict[str, Any]]) -> None:
    """Canonical form: role + parts, no nulls, no finish_reason in messages, args parsed."""
    for message in messages:
        assert set(message) <= {"role", "parts", "name"}, message
        assert "null" not in canonical_bytes(message).decode(), message
        for part in message["parts"]:
            if part["type"] == "tool_call":
                assert isinstance(part["arguments"], dict), part
            if part["type"] == "tool_call_response":
                assert isinstance(part["response"], str), part


# --- the two sources agree --------------------------------------------------------------------


def test_every_fixture_has_a_spec() -> None:
    found = {
        p.name.removesuffix(".otlp.json")
        for p in OTEL.glob("*.otlp.json")
        if not p.name.endswith(".logs.otlp.json")
    }
    assert found == set(SPECS), "a fixture was added or removed: describe it in SPECS"
    for name in NAMES:
        assert (OTEL / f"{name}.json").is_file()


@pytest.mark.parametrize("name", NAMES)
def test_flat_and_otlp_give_identical_steps(name: str) -> None:
    flat, flat_unmatched = normalized(name, "flat")
    otlp, otlp_unmatched = normalized(name, "otlp")
    assert flat_unmatched == otlp_unmatched == 0
    assert [n.problems for n in flat] == [n.problems for n in otlp] == [[] for _ in flat]
    assert len(records(name, "flat")[1]) == len(records(name, "otlp")[1])

    def by_span(items: Sequence[NormalizedSpan]) -> dict[str, Any]:
        return {n.span.span_id: (dataclasses.asdict(n.step) if n.step else None) for n in items}

    assert by_span(flat) == by_span(otlp)
    assert all(n.step is not None for n in flat), "every fixture span is a step"


# --- 1. turn 1: the non-streaming tool loop ------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", NAMES)
def test_turn1_tool_loop(name: str, variant: str) -> None:
    spec = SPECS[name]
    call_id = spec.call_ids[0]
    steps = turn(name, variant, 1)
    agent, llm0, tool, llm1 = steps
    assert [s.kind for s in steps] == ["agent", "llm", "tool", "llm"]
    assert [s.name for s in steps] == [
        "weather-agent",
        f"chat {spec.model}",
        "get_weather",
        f"chat {spec.model}",
    ]
    assert all(s.status != "error" and s.error_type is None for s in steps)

    assert agent.agent_name == "weather-agent"
    assert agent.operation == "invoke_agent"

    # first chat call: the question in, the tool call out
    assert llm0.operation == "chat"
    assert llm0.provider == spec.provider
    assert llm0.request_model == spec.model
    assert llm0.content.system == expected_system(spec)
    assert llm0.content.inputs == first_request(spec)
    assert llm0.content.outputs == [assistant_call(spec, call_id, preamble=True)]
    assert llm0.finish_reasons == ["tool_call"]
    assert (llm0.input_tokens, llm0.output_tokens) == spec.tokens[0]

    # the tool: the call as the model made it, and its result
    assert (tool.tool_name, tool.tool_call_id, tool.operation) == (
        "get_weather",
        call_id,
        "execute_tool",
    )
    assert tool.content.inputs == [{"role": "assistant", "parts": [call_part(call_id)]}]
    assert tool.content.outputs == [
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": call_id, "response": spec.tool_result}],
        }
    ]
    assert json.loads(spec.tool_result) == json.loads(RESULT)

    # follow-up chat call: the whole history in, the final answer out
    assert llm1.content.system == expected_system(spec)
    assert llm1.content.inputs == follow_up_request(spec, call_id, preamble=True)
    assert llm1.content.outputs == [text("assistant", FINAL)]
    assert llm1.finish_reasons == ["stop"]
    assert (llm1.input_tokens, llm1.output_tokens) == spec.tokens[1]

    for step in (llm0, llm1):
        assert step.content.tools == ([TOOL_DEFINITION] if spec.tool_definitions else [])
        assert step.has_payload
        assert_canonical(step.content.inputs)
        assert_canonical(step.content.outputs)
    assert_canonical(tool.content.inputs + tool.content.outputs)


# --- 2. turn 2: streaming ----------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", NAMES)
def test_turn2_streamed_tool_call_is_reassembled(name: str, variant: str) -> None:
    spec = SPECS[name]
    call_id = spec.call_ids[1]
    steps = turn(name, variant, 2)
    assert [s.kind for s in steps] == ["agent", "llm", "tool", "llm"]
    _, llm0, tool, llm1 = steps

    assert tool.tool_call_id == call_id
    assert tool.content.inputs == [{"role": "assistant", "parts": [call_part(call_id)]}]
    # the reassembled call, resent in the follow-up history (the streamed reply had no preamble)
    assert llm1.content.inputs == follow_up_request(spec, call_id, preamble=False)
    assert llm0.finish_reasons == ["tool_call"]
    assert llm1.finish_reasons == ["stop"]
    if spec.stream_output:
        # one tool_call part with parsed arguments (Traceloop's leading empty text part dropped)
        assert llm0.content.outputs == [assistant_call(spec, call_id, preamble=False)]
        assert llm1.content.outputs == [text("assistant", FINAL)]
    else:
        # The anthropic SDK records no output messages for streamed responses.
        assert llm0.content.outputs == []
        assert llm1.content.outputs == []


# --- 3. turn 3: the rate-limited call ---------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", NAMES)
def test_turn3_failing_call_is_an_error(name: str, variant: str) -> None:
    spec = SPECS[name]
    steps = turn(name, variant, 3)
    assert [s.kind for s in steps] == ["agent", "llm"]
    agent, llm = steps

    assert llm.status == "error"
    assert llm.error_type == spec.error_type
    assert llm.content.inputs == [text("user", RATE_LIMIT_PROMPT)]
    assert llm.content.outputs == []
    assert llm.output_tokens is None

    # every fixture's agent span ends with status ERROR: the exception propagated
    raw_agent = next(s for s in records(name, variant)[0] if s.span_id == agent.span_id)
    assert raw_agent.status_code == "error"
    assert agent.status == "error"
    assert agent.error_type == f"{spec.provider}.RateLimitError"


@pytest.mark.parametrize("name", [n for n in NAMES if SPECS[n].raw_error_type])
def test_class_wrapper_is_stripped_from_error_type(name: str) -> None:
    spec = SPECS[name]
    failing = llm_steps(turn(name, "flat", 3))[0]
    raw = next(s for s in records(name, "flat")[0] if s.span_id == failing.span_id)
    assert raw.attributes["error.type"] == spec.raw_error_type
    assert failing.error_type == "openai.RateLimitError"


def test_openinference_error_type_comes_from_the_exception_event() -> None:
    failing = llm_steps(turn("openinference-openai", "flat", 3))[0]
    raw = next(
        s for s in records("openinference-openai", "flat")[0] if s.span_id == failing.span_id
    )
    assert "error.type" not in raw.attributes
    assert [e.name for e in raw.events] == ["exception"]
    assert failing.error_type == "openai.RateLimitError"


# --- 4. the same step rows whatever the instrumentation ----------------------------------------

REFERENCE = "openai-v2_span_only"


def step_row(step: NormalizedStep) -> dict[str, Any]:
    """The convention-independent part of an llm step (what the store hashes and compares)."""
    return {
        "kind": step.kind,
        "name": step.name,
        "system": canonical_bytes(step.content.system),
        "inputs": [canonical_bytes(m) for m in step.content.inputs],
        "outputs": [canonical_bytes(m) for m in step.content.outputs],
        "finish_reasons": step.finish_reasons,
        "tokens": (step.input_tokens, step.output_tokens),
        "request_model": step.request_model,
        "provider": step.provider,
    }


@pytest.mark.parametrize("name", [n for n in OPENAI_NAMES if n != REFERENCE])
def test_openai_turn1_llm_steps_identical_across_conventions(name: str) -> None:
    for number in (1, 2):
        reference = [step_row(s) for s in llm_steps(turn(REFERENCE, "flat", number))]
        other = [step_row(s) for s in llm_steps(turn(name, "flat", number))]
        assert other == reference, f"turn {number}"


def test_tool_definitions_differ_only_where_the_producer_omits_them() -> None:
    with_definitions = {n for n in NAMES if llm_steps(turn(n, "flat", 1))[0].content.tools}
    assert set(NAMES) - with_definitions == {
        "openai-v2_span_only",  # openai-v2 2.4b0 never sets gen_ai.tool.definitions
        "openai-v2_event_only",
        "openai-v2_span_and_event",
        "openai-v2_legacy_v1.30",
        "util-genai-1.1_handler_span_and_event",  # its chat spans come from openai-v2
        "traceloop-openai_events",  # events mode: the definitions are not emitted at all
        "anthropic-sdk-native_content",  # the SDK's own spans record no tool definitions
    }
    for name in with_definitions:
        for step in llm_steps(turn(name, "flat", 1)):
            assert step.content.tools == [TOOL_DEFINITION], name


def _raw_chat_attributes(name: str) -> dict[str, Any]:
    first_llm = llm_steps(turn(name, "flat", 1))[0]
    return dict(
        next(s for s in records(name, "flat")[0] if s.span_id == first_llm.span_id).attributes
    )


def test_raw_tool_definition_shapes_differ_but_normalize_equal() -> None:
    # Traceloop writes gen_ai.tool.definitions flattened; OpenInference keeps the OpenAI tool object
    traceloop = json.loads(
        _raw_chat_attributes("traceloop-openai_attributes")["gen_ai.tool.definitions"]
    )
    assert traceloop == [TOOL_DEFINITION]
    openinference = json.loads(
        _raw_chat_attributes("openinference-openai")["llm.tools.0.tool.json_schema"]
    )
    assert (
        openinference["type"] == "function"
        and "function" in openinference
        and "name" not in openinference
    )
    legacy = _raw_chat_attributes("traceloop-openai-0.49_legacy-attributes")
    assert (
        "gen_ai.tool.definitions" not in legacy
        and legacy["llm.request.functions.0.name"] == "get_weather"
    )
    for name in (
        "traceloop-openai_attributes",
        "openinference-openai",
        "traceloop-openai-0.49_legacy-attributes",
    ):
        assert llm_steps(turn(name, "flat", 1))[0].content.tools == [TOOL_DEFINITION]


def test_raw_finish_reasons_differ_but_normalize_equal() -> None:
    raw = {n: _raw_chat_attributes(n).get("gen_ai.response.finish_reasons") for n in OPENAI_NAMES}
    assert raw["genai-openai_span_and_event"] == ["tool_calls"]  # provider value kept
    assert raw["traceloop-openai_attributes"] == ["tool_call"]  # already normalized
    anthropic = _raw_chat_attributes("anthropic-sdk-native_content")
    assert anthropic["anthropic.message.stop_reason"] == "tool_use"
    for name in NAMES:
        assert llm_steps(turn(name, "flat", 1))[0].finish_reasons == ["tool_call"], name


def test_openinference_genai_semconv_tool_result_is_the_exact_string() -> None:
    # OpenInference's gen_ai.input.messages holds the tool result JSON-parsed; the step keeps the
    # string that was sent (from llm.input_messages), like every other convention.
    name = "openinference-openai_genai-semconv"
    follow_up = llm_steps(turn(name, "flat", 1))[1]
    raw = next(s for s in records(name, "flat")[0] if s.span_id == follow_up.span_id)
    raw_tool = json.loads(raw.attributes["gen_ai.input.messages"])[3]["parts"][0]
    assert raw_tool["response"] == json.loads(RESULT)
    assert follow_up.content.inputs[3]["parts"][0]["response"] == RESULT


def test_anthropic_tool_result_block_is_the_exact_string() -> None:
    # The anthropic SDK records a string tool_result as one text block; the step keeps the string.
    name = "anthropic-sdk-native_content"
    follow_up = llm_steps(turn(name, "flat", 1))[1]
    raw = next(s for s in records(name, "flat")[0] if s.span_id == follow_up.span_id)
    raw_tool = json.loads(raw.attributes["gen_ai.input.messages"])[2]["parts"][0]
    assert raw_tool["response"] == [{"type": "text", "text": RESULT}]
    assert follow_up.content.inputs[2] == tool_message(SPECS[name], "toolu_01weather")


def test_util_genai_handler_tool_result_is_reserialized_by_the_producer() -> None:
    # TelemetryHandler.tool() serializes the result object itself (compact JSON): the exact string
    # the tool returned is not on the span, so the tool step differs from the chat history's copy.
    for name in ("util-genai-1.1_handler_span_and_event", "util-genai-1.3_handler_span_and_event"):
        _, _, tool, llm1 = turn(name, "flat", 1)
        assert tool.content.outputs[0]["parts"][0]["response"] == RESULT_COMPACT
        assert llm1.content.inputs[3]["parts"][0]["response"] == RESULT


# --- 5. end to end through the store ------------------------------------------------------------


def _turn_trace_ids(name: str, variant: str) -> list[str]:
    return [steps[0].trace_id for steps in traces(normalized(name, variant)[0])]


@pytest.mark.parametrize(
    ("name", "variant"),
    [
        ("openai-v2_span_and_event", "flat"),
        ("traceloop-openai_events", "otlp"),
        ("anthropic-sdk-native_content", "otlp"),
    ],
)
def test_store_trajectory_end_to_end(tmp_path: Path, name: str, variant: str) -> None:
    spec = SPECS[name]
    call_id = spec.call_ids[0]
    spans, logs = records(name, variant)
    result = ingest(tmp_path, spans, logs, source="test")
    assert result.problems == [] and result.unmatched_logs == 0
    turn1, _, turn3 = _turn_trace_ids(name, variant)[:3]
    store = Store(tmp_path)

    trajectory = store.trajectory(turn1)
    steps = trajectory.steps
    assert [s.index for s in steps] == list(range(len(steps))) == [0, 1, 2]
    assert [s.kind for s in steps] == ["llm", "tool", "llm"]
    assert [a.name for a in trajectory.agents] == ["weather-agent"]
    assert {s.agent for s in steps} == {"weather-agent"}
    assert {s.agent_span_id for s in steps} == {trajectory.agents[0].span_id}
    llm0, tool, llm1 = steps
    assert list(llm0.outputs) == [assistant_call(spec, call_id, preamble=True)]
    assert list(llm1.inputs) == follow_up_request(spec, call_id, preamble=True)
    assert tool.tool_call_id == call_id
    assert list(llm1.finish_reasons) == ["stop"]

    edges = {(e.source, e.target, e.via, e.key) for e in trajectory.edges}
    assert (0, 1, "tool_call", call_id) in edges
    assert (1, 2, "tool_result", call_id) in edges
    assert (0, 2, "message", llm0.output_hashes[0]) in edges
    assert llm0.output_hashes[0] in llm1.input_hashes
    assert trajectory.final_output == FINAL

    sql = "select step_index, kind, name, tool_call_id, span_id from steps where trace_id = ? and kind <> 'agent' order by step_index"
    rows = store.sql(sql, [turn1]).to_pylist()
    assert rows == [
        {
            "step_index": s.index,
            "kind": s.kind,
            "name": s.name,
            "tool_call_id": s.tool_call_id,
            "span_id": s.span_id,
        }
        for s in steps
    ]
    assert store.sql("select status from traces where trace_id = ?", [turn3]).to_pylist() == [
        {"status": "error"}
    ]

    def counts() -> tuple[int, ...]:
        row = store.sql(
            "select (select count(*) from spans), (select count(*) from steps), (select count(*) from step_rows)"
        ).to_pylist()[0]
        return tuple(int(v) for v in row.values())

    spans_before, steps_before, rows_before = counts()
    assert spans_before == len(spans)
    ingest(tmp_path, spans, logs, source="test")  # the same file, imported again
    assert counts() == (spans_before, steps_before, 2 * rows_before)
    assert store.trajectory(turn1).steps == steps


# --- 6. Langfuse OTLP ---------------------------------------------------------------------------


@functools.cache
def langfuse() -> tuple[list[SpanRecord], list[NormalizedStep]]:
    spans = list(spans_from_request(_read_json(LANGFUSE_OTLP)))
    items, _ = normalize_spans(spans, [])
    steps = sorted((n.step for n in items if n.step is not None), key=lambda s: s.start_ns or 0)
    return spans, [s for s in steps if s.kind != "agent"]


def test_langfuse_generations_and_tools() -> None:
    spans, steps = langfuse()
    assert [s.kind for s in steps] == ["llm", "tool", "llm", "tool", "llm"]
    raw = {s.span_id: s for s in spans}

    generations = [s for s in steps if s.kind == "llm"]
    for step in generations:
        usage = json.loads(raw[step.span_id].attributes["langfuse.observation.usage_details"])
        assert (step.input_tokens, step.output_tokens) == (usage["input"], usage["output"])
        assert step.request_model == "gpt-4o-mini"
        assert step.name == "chat gpt-4o-mini"
        assert step.convention == "langfuse"
    assert [(s.input_tokens, s.output_tokens) for s in generations] == [
        (212, 21),
        (268, 20),
        (301, 19),
    ]

    calls = [
        p
        for s in generations
        for m in s.content.outputs
        for p in m["parts"]
        if p["type"] == "tool_call"
    ]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("calculator", {"expression": "2,340 * 17%"}),
        ("calculator", {"expression": "2340 * 0.17"}),
    ]
    tools = [s for s in steps if s.kind == "tool"]
    for tool, call in zip(tools, calls, strict=True):
        metadata = json.loads(
            raw[tool.span_id].attributes["langfuse.observation.metadata.tool_call_id"]
        )
        assert tool.tool_name == "calculator"
        assert tool.tool_call_id == metadata == call["id"]
        assert tool.content.inputs == [{"role": "assistant", "parts": [call]}]

    failed, succeeded = tools
    assert failed.status == "error"
    assert failed.error_message == "Unsupported characters in expression: '2,340 * 17%'"
    assert failed.error_message == raw[failed.span_id].status_message
    assert succeeded.status != "error"
    assert succeeded.content.outputs == [
        {
            "role": "tool",
            "parts": [
                {"type": "tool_call_response", "id": succeeded.tool_call_id, "response": "397.8"}
            ],
        }
    ]

    # the model saw the tool error as the tool message of its next request
    error_reply = generations[1].content.inputs[-1]["parts"][0]
    assert error_reply["type"] == "tool_call_response" and error_reply["id"] == failed.tool_call_id
    assert "Unsupported characters" in error_reply["response"]

    answer = generations[-1].content.outputs
    assert len(answer) == 1 and answer[0]["role"] == "assistant"
    assert "$39.78" in answer[0]["parts"][0]["content"]


def test_langfuse_trajectory_final_output(tmp_path: Path) -> None:
    spans, steps = langfuse()
    ingest(tmp_path, spans, source="langfuse")
    trajectory = Store(tmp_path).trajectory(steps[0].trace_id)
    assert [s.kind for s in trajectory.steps] == ["llm", "tool", "llm", "tool", "llm"]
    assert "$39.78" in trajectory.final_output
    edges = {(e.source, e.target, e.via) for e in trajectory.edges}
    assert {
        (0, 1, "tool_call"),
        (1, 2, "tool_result"),
        (2, 3, "tool_call"),
        (3, 4, "tool_result"),
    } <= edges


# --- 7. content that travels only in log records -----------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", CONTENT_ONLY_IN_LOGS)
def test_content_only_in_logs(name: str, variant: str) -> None:
    assert records(name, variant)[1], "the fixture has log records"
    without = [s for steps in traces(normalized(name, variant, with_logs=False)[0]) for s in steps]
    with_logs = [s for steps in traces(normalized(name, variant)[0]) for s in steps]
    assert [s.span_id for s in without] == [s.span_id for s in with_logs]
    llms_without = [s for s in without if s.kind == "llm"]
    assert len(llms_without) == 5
    for step in llms_without:
        assert not step.has_payload
        assert (step.content.inputs, step.content.outputs) == ([], [])
    # the metadata is on the span either way
    assert [(s.input_tokens, s.output_tokens) for s in llms_without] == [
        (s.input_tokens, s.output_tokens) for s in with_logs if s.kind == "llm"
    ]
    assert [s.finish_reasons for s in llm_steps(turn(name, variant, 1, with_logs=False))] == [
        ["tool_call"],
        ["stop"],
    ]
    streamed = [s.finish_reasons for s in llm_steps(turn(name, variant, 2, with_logs=False))]
    if name.startswith("openai-v2"):  # no gen_ai.response.finish_reasons on its streaming spans
        assert streamed == [[], []]
    else:
        assert streamed == [["tool_call"], ["stop"]]
    assert all(s.has_payload for s in with_logs if s.kind == "llm")
    spec = SPECS[name]
    llm0, llm1 = llm_steps(turn(name, variant, 1))
    assert llm0.content.inputs == first_request(spec)
    assert llm1.content.outputs == [text("assistant", FINAL)]


def test_event_only_without_logs_is_observation_only_in_the_store(tmp_path: Path) -> None:
    name = "openai-v2_event_only"
    spans, _ = records(name, "otlp")
    ingest(tmp_path, spans, source="test")
    rows = (
        Store(tmp_path)
        .sql("select kind, has_payload, observation_only from steps where kind = 'llm'")
        .to_pylist()
    )
    assert len(rows) == 5
    assert all(not r["has_payload"] and r["observation_only"] for r in rows)
