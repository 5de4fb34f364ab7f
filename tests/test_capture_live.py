"""Live capture: the real openai SDK + opentelemetry-instrumentation-openai-v2 + ReplayProcessor."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from otel_replay import Store
from tests.helpers import REPO, needs_openai_v2, run_module

pytestmark = needs_openai_v2  # every test here records or runs the demo's agent (openai-v2)

FINAL = "It is currently 18°C and partly cloudy in Paris."
RESULT = '{"city": "Paris", "temperature_c": 18, "condition": "partly cloudy"}'


def _only_trace(store: Store) -> str:
    (trace_id,) = store.list_traces().column("trace_id").to_pylist()
    return trace_id


@pytest.mark.parametrize("content", ["span_only", "event_only"])
def test_tool_loop_is_stored_with_payloads(tmp_path, content):
    stats = json.loads(run_module("tests.agents.weather_loop", str(tmp_path), "--content", content).splitlines()[-1])
    assert stats["dropped_queue_full"] == 0 and stats["accepted"] == stats["written_spans"] == 4

    traj = Store(tmp_path).trajectory(_only_trace(Store(tmp_path)))
    assert [(s.index, s.kind, s.name) for s in traj.steps] == [
        (0, "llm", "chat gpt-4o-mini"), (1, "tool", "get_weather"), (2, "llm", "chat gpt-4o-mini")]
    first, tool, second = traj.steps
    assert first.inputs == (
        {"role": "system", "parts": [{"type": "text", "content": "You answer weather questions."}]},
        {"role": "user", "parts": [{"type": "text", "content": "What's the weather in Paris?"}]},
    )
    call = {"type": "tool_call", "id": "call_0", "name": "get_weather", "arguments": {"city": "Paris"}}
    assert first.outputs == ({"role": "assistant", "parts": [call]},)
    assert first.finish_reasons == ("tool_call",)
    assert tool.tool_call_id == "call_0"
    assert tool.outputs == ({"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_0", "response": RESULT}]},)
    assert second.inputs[2:] == first.outputs + tool.outputs  # the history carries the call and the result
    assert second.output_text == FINAL and traj.final_output == FINAL
    assert {(e.source, e.target, e.via) for e in traj.edges} >= {(0, 1, "tool_call"), (1, 2, "tool_result"), (0, 2, "message")}
    assert all(s.agent == "weather-agent" and not s.observation_only for s in traj.steps)
    assert traj.service_name == "weather-service"


def test_without_content_steps_are_observation_only_and_the_warning_names_the_setting(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tests.agents.weather_loop", str(tmp_path), "--content", "none"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("arrive without message content") == 1  # once, not per span
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" in done.stderr
    rows = Store(tmp_path).sql("select kind, observation_only from steps where kind = 'llm'").to_pylist()
    assert rows == [{"kind": "llm", "observation_only": True}] * 2
