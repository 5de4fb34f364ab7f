"""Replay end to end: the support agent (real openai SDK, real instrumentation, the simulated
model over real HTTP) recorded, replayed, forked and diffed through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from otel_replay import ReplayPlan, Store, replay
from otel_replay.cli import main as cli
from otel_replay.replay.builtin.openai_policy import openai_policy
from otel_replay.replay.builtin.wire import from_anthropic_content, to_anthropic, to_openai
from otel_replay.replay.policies import Registry
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.support_agent import TOOL_FUNCTIONS, TOOLS, refunded, support_model
from tests.helpers import REPO, needs_openai_v2

POLICIES = "otel_replay.testing.support_policies"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    store = tmp_path_factory.mktemp("support")
    out = subprocess.run([sys.executable, "examples/support_agent.py", "--store", str(store)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "FAILED (the customer was owed a refund)" in out.stdout
    (trace_id,) = Store(store).list_traces().column("trace_id").to_pylist()
    return store, trace_id


@pytest.fixture(autouse=True)
def clean_registry():
    from otel_replay.replay import policies

    policies.registry.clear()
    yield
    policies.registry.clear()


def cli_run(store, *args):
    return CliRunner().invoke(cli, ["--store", str(store), *args])


@needs_openai_v2
def test_the_example_records_the_planted_failure(recorded):
    store, trace_id = recorded
    traj = Store(store).trajectory(trace_id)
    assert [(s.kind, s.name) for s in traj.steps] == [("llm", "chat sim-gpt"), ("tool", "lookup_order"), ("llm", "chat sim-gpt")]
    assert traj.steps[0].outputs[0]["parts"][0]["arguments"] == {"order_id": "A-1024"}  # the planted fault
    assert refunded(traj.final_output) == 0.0
    assert traj.steps[0].tools == ()  # openai-v2 2.4b0 does not record tool definitions: policies supply them


@needs_openai_v2
def test_replay_command_proves_factual_replay(recorded):
    store, trace_id = recorded
    out = cli_run(store, "replay", trace_id)
    assert out.exit_code == 0, out.output
    assert "reproduced bit for bit: 3 steps, 0 policy calls" in out.output


@needs_openai_v2
def test_builtin_openai_policy_against_the_simulated_server(recorded):
    store, trace_id = recorded
    traj = Store(store).trajectory(trace_id)
    registry = Registry()
    with SimulatedModelServer(support_model()) as server:
        registry.register("llm", None, openai_policy(base_url=server.base_url, api_key="sim", tools=TOOLS))
        for name, fn in TOOL_FUNCTIONS.items():
            registry.register("tool", name, lambda arguments, rng, fn=fn: fn(**arguments))
        outcomes = [refunded(replay(traj, ReplayPlan.resample_from(0), seed=s, policies=registry).final_output)
                    for s in range(10)]
        late = [refunded(replay(traj, ReplayPlan.resample_from(2), seed=s, policies=registry).final_output)
                for s in range(5)]
    assert sum(outcomes) >= 6  # re-deciding the lookup usually fixes the run (typo rate 10%)
    assert sum(late) == 0  # re-deciding only the last step cannot: the lookup already went wrong


@needs_openai_v2
def test_fork_stores_a_linked_child_and_diff_finds_the_divergence(recorded):
    store, trace_id = recorded
    out = cli_run(store, "fork", trace_id, "--at", "0", "--do",
                  json.dumps([{"role": "assistant", "parts": [{"type": "tool_call", "id": "fix", "name": "lookup_order",
                                                               "arguments": {"order_id": "A-1042"}}]}]),
                  "--policies", POLICIES)
    assert out.exit_code == 0, out.output
    assert "diverged at step 0" in out.output and "refunded $89.50" in out.output
    child = out.output.split()[2]
    root = Store(store).sql("select attributes, links from spans where trace_id = ? and parent_span_id is null", [child])
    attrs, links = json.loads(root.column("attributes")[0].as_py()), json.loads(root.column("links")[0].as_py())
    assert attrs["otel_replay.fork.parent_trace_id"] == trace_id and attrs["otel_replay.fork.step"] == 0
    assert links[0]["trace_id"] == trace_id
    diff = cli_run(store, "diff", trace_id, child)
    assert diff.exit_code == 0 and "first divergence: step 0" in diff.output and "added" in diff.output
    assert cli_run(store, "replay", child).exit_code == 0  # a child trace replays like any other


@pytest.mark.parametrize(("args", "message"), [
    (["fork", "0" * 32, "--at", "0", "--resample"], "no trace"),
    (["fork", "TRACE", "--at", "7", "--resample"], "there is no step 7"),
    (["fork", "TRACE", "--at", "0", "--do", "{oops"], "not valid JSON"),
    (["fork", "TRACE", "--at", "0"], "give exactly one of"),
    (["fork", "TRACE", "--at", "0", "--resample", "--policies", "no.such.module"], "cannot import policies module"),
    (["fork", "TRACE", "--at", "0", "--resample"], "no llm policy"),
    (["diff", "TRACE", "f" * 32], "no trace"),
])
@needs_openai_v2
def test_bad_input_is_a_clear_error_and_writes_nothing(recorded, args, message):
    store, trace_id = recorded
    before = sorted(p.name for p in store.glob("*/*/*.parquet"))
    out = cli_run(store, *[trace_id if a == "TRACE" else a for a in args])
    assert out.exit_code in (1, 2) and message in out.output, out.output
    assert "Traceback" not in out.output
    assert sorted(p.name for p in store.glob("*/*/*.parquet")) == before


@needs_openai_v2
def test_a_policy_returning_the_wrong_type_fails_the_fork_cleanly(recorded, tmp_path, monkeypatch):
    store, trace_id = recorded
    (tmp_path / "bad_policies.py").write_text(
        "from otel_replay import policies\n@policies.llm\ndef chat(step, inputs, rng):\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = sorted(p.name for p in store.glob("*/*/*.parquet"))
    out = cli_run(store, "fork", trace_id, "--at", "0", "--resample", "--policies", "bad_policies")
    assert out.exit_code == 1 and "returned int" in out.output
    assert sorted(p.name for p in store.glob("*/*/*.parquet")) == before


def test_wire_conversions_round_trip():
    history = [{"role": "system", "parts": [{"type": "text", "content": "sys"}]},
               {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
               {"role": "assistant", "parts": [{"type": "tool_call", "id": "t1", "name": "f", "arguments": {"x": 1}}]},
               {"role": "tool", "parts": [{"type": "tool_call_response", "id": "t1", "response": "42"}]}]
    wire = to_openai(history)
    assert wire[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert wire[3] == {"role": "tool", "tool_call_id": "t1", "content": "42"}
    system, messages = to_anthropic(history)
    assert system == "sys" and [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"][0] == {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}
    assert messages[2]["content"][0] == {"type": "tool_result", "tool_use_id": "t1", "content": "42"}
    back = from_anthropic_content([{"type": "text", "text": "ok"}, {"type": "tool_use", "id": "t2", "name": "g", "input": {}}])
    assert back == [{"role": "assistant", "parts": [{"type": "text", "content": "ok"},
                                                     {"type": "tool_call", "id": "t2", "name": "g", "arguments": {}}]}]
