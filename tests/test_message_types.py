"""The typed message model (`otel_replay.normalize.message_types`) and its run-time check.

Every message the normalizer makes from every recorded fixture is a valid `Message`; a message
broken in one field is rejected with that field's path; messages stay valid (and unchanged) through
the store; and the optional converters to util.genai's types round-trip every part kind.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_replay import Store
from otel_replay.normalize.message_types import (
    PART_KINDS,
    InvalidMessage,
    Message,
    check_message,
    check_messages,
    from_genai,
    to_genai,
)
from otel_replay.normalize.messages import canonical_messages
from otel_replay.normalize.pipeline import normalize_spans
from otel_replay.normalize.records import SpanRecord
from otel_replay.normalize.sources.files import read
from otel_replay.replay import replay
from otel_replay.store.ingest import ingest
from otel_replay.trajectory import Step, Trajectory
from tests.helpers import FIXTURES, needs_util_genai

# --- every recorded convention --------------------------------------------------------------------


def _sources() -> list[Path]:
    """Every importable fixture: a span file (its `.logs.otlp.json` joins it) or the Who&When tree."""
    skip = {"traces_list.json"}  # a page of trace ids: no spans
    files = [
        p for p in sorted(FIXTURES.rglob("*.json*"))
        if p.suffix in (".json", ".jsonl") and not p.name.endswith(".logs.otlp.json") and p.name not in skip
        and "whowhen" not in p.parts
    ]
    return [*files, FIXTURES / "whowhen"]


SOURCES = _sources()


def _id(path: Path) -> str:
    return str(path.relative_to(FIXTURES))


@functools.cache
def _normalized(path: Path) -> tuple[Any, ...]:
    batch = read("auto", path)
    logs = list(batch.logs)
    companion = path.with_name(path.name.replace(".otlp.json", ".logs.otlp.json"))
    if companion != path and companion.exists():
        logs += read("otlp", companion).logs
    items, _ = normalize_spans(batch.spans, logs)
    return tuple(item.step for item in items if item.step is not None)


def _payloads(steps: Any) -> Iterator[tuple[str, list[Any]]]:
    """(where, messages) of every step; system instructions as the parts of one system message."""
    for step in steps:
        content = getattr(step, "content", step)
        yield f"{step.span_id} inputs", list(content.inputs)
        yield f"{step.span_id} outputs", list(content.outputs)
        if content.system:
            yield f"{step.span_id} system", [{"role": "system", "parts": list(content.system)}]


def test_the_fixture_list_covers_every_recorded_source() -> None:
    assert {p.relative_to(FIXTURES).parts[0] for p in SOURCES} >= {
        "otel", "duplicate_calls", "langfuse", "langsmith", "whowhen"
    }


@pytest.mark.parametrize("path", SOURCES, ids=_id)
def test_every_normalized_fixture_message_is_valid(path: Path) -> None:
    steps = _normalized(path)
    count = 0
    for where, messages in _payloads(steps):
        try:
            check_messages(messages)
        except InvalidMessage as exc:
            raise AssertionError(f"{_id(path)} {where}: {exc}") from None
        count += len(messages)
    assert count > 0, f"{_id(path)}: no messages normalized, so nothing was checked"


@pytest.mark.parametrize("path", [FIXTURES / "otel" / "anthropic-sdk-native_content.otlp.json",
                                  FIXTURES / "langfuse" / "otlp" / "trace_wrong_answer.otlp.json",
                                  FIXTURES / "otel" / "openai-v2_event_only.otlp.json"], ids=_id)
def test_fixture_messages_stay_valid_through_the_store(tmp_path: Path, path: Path) -> None:
    batch = read("auto", path)
    logs = list(batch.logs)
    companion = path.with_name(path.name.replace(".otlp.json", ".logs.otlp.json"))
    if companion.exists():
        logs += read("otlp", companion).logs
    ingest(tmp_path, batch.spans, logs, source="test")
    store = Store(tmp_path)
    checked = 0
    for trace_id in store.sql("select trace_id from traces").column("trace_id").to_pylist():
        for step in store.trajectory(trace_id).steps:
            check_messages([*step.inputs, *step.outputs])
            check_messages([{"role": "system", "parts": list(step.system)}] if step.system else [])
            checked += len(step.inputs) + len(step.outputs)
    assert checked > 0


def test_rollout_messages_are_valid(tmp_path: Path) -> None:
    path = FIXTURES / "langfuse" / "otlp" / "trace_wrong_answer.otlp.json"
    ingest(tmp_path, read("auto", path).spans, source="test")
    store = Store(tmp_path)
    (trace_id,) = store.sql("select trace_id from traces").column("trace_id").to_pylist()
    run = replay(store.trajectory(trace_id))  # every step held: served from the recording
    assert run.ok and len(run.steps) >= 5
    for outcome in run.steps:
        check_messages([*outcome.inputs, *outcome.outputs])


def test_an_unbound_tool_steps_call_is_a_tool_call_part() -> None:
    """A tool step no recorded llm step called: the engine rebuilds its call from the step itself."""
    call = {"type": "tool_call", "name": "lookup", "id": "c1", "arguments": {"q": "x"}}
    step = Step(index=0, span_id="a" * 16, parent_span_id=None, kind="tool", operation="execute_tool", name="lookup",
                status="ok", start_ns=1, end_ns=2, tool_name="lookup", tool_call_id="c1",
                inputs=({"role": "assistant", "parts": [call]},),
                outputs=({"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "found"}]},))
    (outcome,) = replay(Trajectory(trace_id="b" * 32, steps=(step,))).steps
    assert check_messages(list(outcome.inputs)) == [{"role": "assistant", "parts": [call]}]


# --- generated messages ---------------------------------------------------------------------------

JSON_LEAVES = (
    st.none() | st.booleans() | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
)
JSON = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
OBJECTS = st.dictionaries(st.text(max_size=5), JSON, max_size=3)
TEXT = st.text(max_size=20)
MODALITY = st.sampled_from(["image", "video", "audio", "document"]) | TEXT


def _part(kind: str, required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"type": st.just(kind), **required}, optional=optional)


PARTS = st.one_of(
    _part("text", {"content": TEXT}, {}),
    _part("reasoning", {"content": TEXT}, {}),
    _part("tool_call", {"name": TEXT}, {"id": TEXT, "arguments": OBJECTS}),
    _part("tool_call_response", {}, {"id": TEXT, "response": TEXT | OBJECTS}),
    _part("server_tool_call", {"name": TEXT}, {"id": TEXT, "server_tool_call": OBJECTS}),
    _part("server_tool_call_response", {}, {"id": TEXT, "server_tool_call_response": OBJECTS}),
    _part("blob", {"modality": MODALITY, "content": st.binary(max_size=12).map(lambda b: base64.b64encode(b).decode())},
          {"mime_type": TEXT}),
    _part("file", {"modality": MODALITY, "file_id": TEXT}, {"mime_type": TEXT}),
    _part("uri", {"modality": MODALITY, "uri": TEXT}, {"mime_type": TEXT}),
    _part("compaction", {}, {"id": TEXT, "content": TEXT}),
    st.tuples(
        st.text(min_size=1, max_size=12).filter(lambda t: t not in PART_KINDS),
        st.dictionaries(st.text(max_size=6).filter(lambda k: k != "type"), JSON.filter(lambda v: v is not None),
                        max_size=3),
    ).map(lambda kv: {**kv[1], "type": kv[0]}),
)
ROLES = st.sampled_from(["user", "assistant", "system", "tool"]) | st.text(min_size=1, max_size=10)
MESSAGES = st.fixed_dictionaries({"role": ROLES, "parts": st.lists(PARTS, max_size=4)}, optional={"name": TEXT})
MESSAGES_WITH_PARTS = st.fixed_dictionaries({"role": ROLES, "parts": st.lists(PARTS, min_size=1, max_size=4)})

# the string fields each kind requires (the check rejects a part without one, or with a non-string)
REQUIRED = {"text": ["content"], "reasoning": ["content"], "tool_call": ["name"], "server_tool_call": ["name"],
            "blob": ["modality", "content"], "file": ["modality", "file_id"], "uri": ["modality", "uri"]}


@given(MESSAGES)
def test_generated_messages_are_valid(message: dict[str, Any]) -> None:
    assert check_message(message) is message


def _break(message: dict[str, Any], data: st.DataObject) -> str:
    """Break one field of `message` in place; returns the path the error must name."""
    i = data.draw(st.integers(0, len(message["parts"]) - 1), label="part")
    part = message["parts"][i]
    at = f"parts[{i}]"
    choices = ["role-missing", "role-type", "name-type", "extra-key", "parts-type", "part-type", "type-missing",
               "type-type", "null", "not-json"]
    if part["type"] in REQUIRED:
        choices += ["required-missing", "required-type"]
    how = data.draw(st.sampled_from(choices), label="mutation")
    if how == "role-missing":
        del message["role"]
        return "role"
    if how == "role-type":
        message["role"] = data.draw(st.sampled_from([5, None, "", ["user"]]))
        return "role"
    if how == "name-type":
        message["name"] = data.draw(st.sampled_from([5, None, {"n": 1}]))
        return "name"
    if how == "extra-key":
        message["finish_reason"] = "stop"  # kept on the step in canonical form, never on the message
        return "finish_reason"
    if how == "parts-type":
        message["parts"] = data.draw(st.sampled_from([None, "text", {"type": "text"}]))
        return "parts"
    if how == "part-type":
        message["parts"][i] = data.draw(st.sampled_from(["hello", 3, None, ["text"]]))
        return at
    if how == "type-missing":
        del part["type"]
        return f"{at}.type"
    if how == "type-type":
        part["type"] = data.draw(st.sampled_from([1, "", None, ["text"]]))
        return f"{at}.type"
    if how == "null":
        key = data.draw(st.sampled_from(sorted(k for k in part if k != "type") or ["id"]))
        part[key] = None
        return f"{at}.{key}"
    if how == "not-json":  # a value JSON cannot hold, nested in any field
        key = data.draw(st.sampled_from(["arguments", "response", "x_extra"]))
        part[key] = {"a": [1, data.draw(st.sampled_from([{1, 2}, object(), float("nan"), b"raw"]))]}
        return f"{at}.{key}.a[1]"
    field = data.draw(st.sampled_from(REQUIRED[part["type"]]))
    if how == "required-missing":
        del part[field]
    else:
        part[field] = data.draw(st.sampled_from([7, ["x"], {"content": "x"}, True]))
    return f"{at}.{field}"


@settings(max_examples=400)
@given(MESSAGES_WITH_PARTS, st.data())
def test_a_broken_field_is_rejected_with_its_path(message: dict[str, Any], data: st.DataObject) -> None:
    broken = copy.deepcopy(message)
    path = _break(broken, data)
    with pytest.raises(InvalidMessage) as info:
        check_message(broken)
    assert info.value.path == path, str(info.value)
    assert str(info.value).startswith(f"{path}: ")


@given(st.lists(MESSAGES, max_size=3), st.data())
def test_a_list_error_names_the_message(messages: list[dict[str, Any]], data: st.DataObject) -> None:
    bad = data.draw(st.sampled_from([3, "text", None]))
    position = data.draw(st.integers(0, len(messages)))
    messages = [*messages[:position], bad, *messages[position:]]
    with pytest.raises(InvalidMessage) as info:
        check_messages(messages)
    assert info.value.path == f"[{position}]"


@pytest.mark.parametrize("value", [{1, 2}, object(), float("nan"), float("-inf"), b"raw", {1: "non-string key"}],
                         ids=["set", "object", "nan", "inf", "bytes", "int-key"])
@given(MESSAGES_WITH_PARTS, st.data())
def test_a_value_json_cannot_hold_is_rejected_where_it_is(value: object, message: dict[str, Any],
                                                           data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(message["parts"]) - 1))
    key = data.draw(st.sampled_from(["arguments", "response", "x_extra"]))
    broken = copy.deepcopy(message)
    broken["parts"][i][key] = {"a": [1, value]}
    with pytest.raises(InvalidMessage) as info:
        check_message(broken)
    assert info.value.path == f"parts[{i}].{key}.a[1]", str(info.value)


def test_the_documented_example_path() -> None:
    message = {"role": "assistant", "parts": [
        {"type": "text", "content": "checking"},
        {"type": "tool_call", "name": "a", "arguments": {}},
        {"type": "tool_call", "name": "b", "arguments": {"when": {"tomorrow"}}},
    ]}
    with pytest.raises(InvalidMessage, match=r"^parts\[2\]\.arguments\.when: a set is not a JSON value$"):
        check_message(message)
    with pytest.raises(InvalidMessage, match=r"^\[1\]\.parts\[2\]\.arguments\.when: "):
        check_messages([{"role": "user", "parts": []}, message])


def test_a_known_type_is_checked_as_its_kind_not_as_a_generic_part() -> None:
    with pytest.raises(InvalidMessage, match=r"^parts\[0\]\.content: missing"):
        check_message({"role": "user", "parts": [{"type": "text", "text": "the producer's key"}]})
    # an unknown type keeps whatever keys its producer gave it
    part = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    assert check_message({"role": "user", "parts": [part]})["parts"] == [part]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(MESSAGES, min_size=1, max_size=4), st.lists(MESSAGES, max_size=2))
def test_generated_messages_survive_the_store(tmp_path_factory: pytest.TempPathFactory,
                                              inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> None:
    root = tmp_path_factory.mktemp("store")
    span = SpanRecord(trace_id="ab" * 16, span_id="cd" * 8, parent_span_id=None, name="chat m", start_ns=1, end_ns=2,
                      attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                                  "gen_ai.input.messages": json.dumps(inputs),
                                  "gen_ai.output.messages": json.dumps(outputs)})
    ingest(root, [span], source="test", privacy=None)
    (step,) = Store(root).trajectory("ab" * 16).steps
    assert check_messages(list(step.inputs)) == canonical_messages(json.loads(json.dumps(inputs)))
    assert check_messages(list(step.outputs)) == canonical_messages(json.loads(json.dumps(outputs)))


# --- opentelemetry.util.genai.types ---------------------------------------------------------------


@needs_util_genai
@given(MESSAGES)
def test_util_genai_round_trip(message: dict[str, Any]) -> None:
    from opentelemetry.util.genai import types as genai

    message.pop("name", None)  # util.genai's messages have no name
    typed: Message = check_message(message)
    as_input = to_genai(typed)
    as_output = to_genai(typed, finish_reason="stop")
    assert isinstance(as_input, genai.InputMessage)
    assert isinstance(as_output, genai.OutputMessage) and as_output.finish_reason == "stop"
    assert from_genai(as_input) == message
    assert from_genai(as_output) == message


@needs_util_genai
def test_util_genai_objects_of_each_kind() -> None:
    from opentelemetry.util.genai import types as genai

    message = check_message({"role": "user", "parts": [
        {"type": "text", "content": "look"},
        {"type": "blob", "modality": "image", "mime_type": "image/png", "content": base64.b64encode(b"\x89PNG").decode()},
        {"type": "tool_call_response", "id": "c1", "response": "18C"},
        {"type": "image_url", "image_url": {"url": "u"}},
    ]})
    parts = to_genai(message).parts
    assert parts[0] == genai.Text(content="look")
    assert parts[1] == genai.Blob(mime_type="image/png", modality="image", content=b"\x89PNG")
    assert parts[2] == genai.ToolCallResponse(response="18C", id="c1")
    assert parts[3] == genai.GenericPart(type="image_url", value={"image_url": {"url": "u"}})
