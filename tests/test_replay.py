"""The replay engine's semantics, on stored trajectories built from real spans."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import pytest

from otel_replay import ReplayPlan, Store, replay, replay_async
from otel_replay.normalize.records import SpanRecord
from otel_replay.replay.policies import Registry
from otel_replay.store.ingest import ingest
from tests.helpers import FIXTURES, REPO, needs_openai_v2

T0 = 1_767_225_600_000_000_000


def text(s: str, role: str = "assistant") -> dict:
    return {"role": role, "parts": [{"type": "text", "content": s}]}


def call(cid: str, name: str, **arguments) -> dict:
    return {"role": "assistant", "parts": [{"type": "tool_call", "id": cid, "name": name, "arguments": arguments}]}


def result(cid: str, response: str) -> dict:
    return {"role": "tool", "parts": [{"type": "tool_call_response", "id": cid, "response": response}]}


def build(tmp_path, turns: list[tuple[str, ...]], trace: int = 1):
    """A stored agent trace. turns: ("llm", inputs, outputs) or ("tool", name, call_id, args, result)."""
    tid, spans = f"{trace:032x}", []
    root = f"{trace:08x}00000000"
    spans.append(SpanRecord(tid, root, None, "invoke_agent a", start_ns=T0, end_ns=T0 + 10**9,
                            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}))
    for n, turn in enumerate(turns, start=1):
        sid, start = f"{trace:08x}{n:08x}", T0 + n * 1000
        if turn[0] == "llm":
            attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                     "gen_ai.input.messages": json.dumps(turn[1]), "gen_ai.output.messages": json.dumps(turn[2])}
            spans.append(SpanRecord(tid, sid, root, "chat m", start_ns=start, end_ns=start + 500, attributes=attrs))
        else:
            _, name, cid, args, res = turn
            attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": cid,
                     "gen_ai.tool.call.arguments": json.dumps(args), "gen_ai.tool.call.result": res}
            spans.append(SpanRecord(tid, sid, root, f"execute_tool {name}", start_ns=start, end_ns=start + 500, attributes=attrs))
    ingest(tmp_path, spans, source="test")
    return Store(tmp_path).trajectory(tid)


SYSTEM, USER = text("be helpful", "system"), text("weather in Paris?", "user")
ASK = call("c1", "weather", city="Paris")
SUNNY = '{"sky": "sunny"}'
ANSWER = text("It is sunny.")


@pytest.fixture()
def loop(tmp_path):
    """llm asks weather -> tool -> llm answers."""
    return build(tmp_path, [("llm", [SYSTEM, USER], [ASK]), ("tool", "weather", "c1", {"city": "Paris"}, SUNNY),
                            ("llm", [SYSTEM, USER, ASK, result("c1", SUNNY)], [ANSWER])])


def reader_policies(weather: str = '{"sky": "rain"}', first_call=ASK) -> Registry:
    """A model that calls weather once, then reports the sky it was told; a weather tool."""
    registry = Registry()

    def chat(step, inputs, rng):
        last = inputs.messages[-1]
        if last["role"] == "tool":
            return f"It is {json.loads(last['parts'][0]['response'])['sky']}."
        return [first_call]

    registry.register("llm", None, chat)
    registry.register("tool", "weather", lambda arguments, rng: weather)
    return registry


def test_factual_replay_serves_every_step_from_the_recording(loop):
    run = replay(loop, ReplayPlan.factual(), policies=Registry())
    assert [o.source for o in run.steps] == ["recording"] * 3
    assert run.final_output == "It is sunny." and run.policy_calls == 0 and run.diverged_at is None and run.ok
    assert [o.output_hash for o in run.steps] == [o.output_hash for o in replay(loop, policies=Registry()).steps]


def test_a_changed_tool_result_reaches_the_next_history_by_call_id_and_forces_a_rerun(loop):
    run = replay(loop, ReplayPlan.resample(1), policies=reader_policies())
    assert [o.source for o in run.steps] == ["recording", "policy", "policy"]  # step 2 held but its inputs changed
    assert run.steps[2].inputs[-1] == result("c1", '{"sky": "rain"}')
    assert run.final_output == "It is rain." and run.diverged_at == 1 and run.policy_calls == 2


def test_observe_replaces_what_the_tool_saw(loop):
    run = replay(loop, ReplayPlan.observe(1, '{"sky": "snow"}'), policies=reader_policies())
    assert [o.source for o in run.steps] == ["recording", "observed", "policy"]
    assert run.final_output == "It is snow."


def test_do_on_the_last_step_needs_no_policy(loop):
    run = replay(loop, ReplayPlan.do(2, "Forced answer."), policies=Registry())
    assert run.final_output == "Forced answer." and run.policy_calls == 0 and run.diverged_at == 2


def test_new_call_arguments_flow_into_the_tool_step(loop):
    rome = call("c1", "weather", city="Rome")
    registry = reader_policies()
    run = replay(loop, ReplayPlan.do(0, [rome]), policies=registry)
    assert run.steps[1].inputs == ({"role": "assistant", "parts": [rome["parts"][0]]},)
    assert run.steps[1].source == "policy"  # arguments changed, so the held tool step re-runs
    assert run.steps[2].inputs[2] == rome and run.final_output == "It is rain."


def test_an_answer_without_tool_calls_ends_the_run(loop):
    run = replay(loop, ReplayPlan.do(0, "I won't look it up."), policies=Registry())
    assert [o.source for o in run.steps] == ["forced", "skipped", "skipped"]
    assert run.final_output == "I won't look it up." and run.policy_calls == 0


def test_remove_a_tool_result(loop):
    registry = Registry()
    registry.register("llm", None, lambda step, inputs, rng: f"saw {len(inputs.messages)} messages")
    run = replay(loop, ReplayPlan.remove(1), policies=registry)
    assert run.steps[1].source == "removed"
    assert run.steps[2].inputs == (SYSTEM, USER, ASK) and run.final_output == "saw 3 messages"


def test_the_loop_continues_past_the_recording(loop):
    registry = Registry()
    counter = iter(range(100))

    def chat(step, inputs, rng):
        n = next(counter)
        return [call(f"x{n}", "weather", city="Oslo")] if n < 2 else "Done looking."

    registry.register("llm", None, chat)
    registry.register("tool", "weather", lambda a, rng: '{"sky": "grey"}')
    run = replay(loop, ReplayPlan.resample(2), policies=registry)
    past = [(o.index, o.kind, o.source) for o in run.steps[3:]]
    assert past == [(None, "tool", "policy"), (None, "llm", "policy"), (None, "tool", "policy"), (None, "llm", "policy")]
    assert run.final_output == "Done looking." and not run.truncated


def test_max_steps_truncates_an_endless_loop(loop):
    registry = Registry()
    registry.register("llm", None, lambda step, inputs, rng: [call(f"k{rng.random()}", "weather", city="X")])
    registry.register("tool", "weather", lambda a, rng: "{}")
    run = replay(loop, ReplayPlan.resample(2), policies=registry, max_steps=9)
    assert run.truncated and len(run.steps) <= 10


def test_missing_policy_and_observation_only_are_unreplayable_never_a_verdict(loop, tmp_path):
    run = replay(loop, ReplayPlan.resample(1), policies=Registry())
    assert not run.ok and run.unreplayable.index == 1 and run.unreplayable.cause == "missing-policy"
    assert '@policies.tool("weather")' in run.unreplayable.reason
    bare = build(tmp_path / "bare", [("llm", [], [])])  # content not captured
    run = replay(bare, ReplayPlan.resample(0), policies=reader_policies())
    assert run.unreplayable.cause == "observation-only" and run.final_output == ""


def test_a_policy_that_raises_or_returns_the_wrong_type_is_reported(loop):
    registry = Registry()
    registry.register("llm", None, lambda step, inputs, rng: 42)
    run = replay(loop, ReplayPlan.resample(0), policies=registry)
    assert run.unreplayable.cause == "policy-error" and "returned int" in run.unreplayable.reason
    registry.register("llm", None, lambda step, inputs, rng: 1 / 0)
    run = replay(loop, ReplayPlan.resample(0), policies=registry)
    assert "ZeroDivisionError" in run.unreplayable.reason


def test_resolution_prefers_kind_name_over_kind(loop):
    registry = reader_policies()
    registry.register("tool", None, lambda a, rng: '{"sky": "generic"}')
    assert replay(loop, ReplayPlan.resample(1), policies=registry).final_output == "It is rain."


def test_branching_agent_binds_by_kind_name_and_inputs(tmp_path):
    """Recorded: weather(Paris) then news(Paris). A changed first answer calls news first, then weather:
    both tool results are served from the recording because their arguments match, wherever they sit."""
    news = '{"headline": "calm"}'
    a, b = call("c1", "weather", city="Paris"), call("c2", "news", city="Paris")
    traj = build(tmp_path, [
        ("llm", [USER], [a]), ("tool", "weather", "c1", {"city": "Paris"}, SUNNY),
        ("llm", [USER, a, result("c1", SUNNY)], [b]), ("tool", "news", "c2", {"city": "Paris"}, news),
        ("llm", [USER, a, result("c1", SUNNY), b, result("c2", news)], [text("sunny and calm")])])
    registry = Registry()

    def chat(step, inputs, rng):
        seen = [m for m in inputs.messages if m["role"] == "tool"]
        return [[call("n1", "news", city="Paris")], [call("w1", "weather", city="Paris")], "both done"][len(seen)]

    registry.register("llm", None, chat)
    registry.register("tool", None, lambda a, rng: pytest.fail("tools must be served from the recording"))
    run = replay(traj, ReplayPlan.resample(0), policies=registry)
    tools = [o for o in run.steps if o.kind == "tool" and o.source != "skipped"]
    assert [o.name for o in tools] == ["news", "weather"]
    assert all(o.source == "recording" for o in tools)
    assert run.final_output == "both done"


def test_swap_model_asks_the_policy_for_another_model(loop):
    seen = []
    registry = reader_policies()
    registry.register("llm", None, lambda step, inputs, rng: seen.append(inputs.model) or "ok")
    run = replay(loop, ReplayPlan.factual().with_model("bigger-model"), policies=registry)
    assert seen and set(seen) == {"bigger-model"} and run.final_output == "ok"


def test_coalition_and_resample_from_plans(loop):
    plan = ReplayPlan.coalition({0, 2}, steps=3)
    assert [plan.action(i).action.value for i in range(3)] == ["hold", "resample", "hold"]
    assert [ReplayPlan.resample_from(1).action(i).action.value for i in range(3)] == ["hold", "resample", "resample"]
    with pytest.raises(ValueError, match="non-negative"):
        ReplayPlan.do(-1, "x")


def test_same_trajectory_plan_and_seed_give_byte_identical_runs_in_another_process(loop, tmp_path):
    registry = Registry()
    registry.register("llm", None, lambda step, inputs, rng: f"draw {rng.random():.17f}")
    registry.register("tool", None, lambda a, rng: json.dumps({"sky": rng.choice(["a", "b", "c"])}))
    here = replay(loop, ReplayPlan.resample_from(0), seed=11, policies=registry)
    assert here.digest == replay(loop, ReplayPlan.resample_from(0), seed=11, policies=registry).digest
    assert here.digest != replay(loop, ReplayPlan.resample_from(0), seed=12, policies=registry).digest
    script = f"""
import json, sys
from otel_replay import ReplayPlan, Store, replay
from otel_replay.replay.policies import Registry
r = Registry()
r.register("llm", None, lambda step, inputs, rng: f"draw {{rng.random():.17f}}")
r.register("tool", None, lambda a, rng: json.dumps({{"sky": rng.choice(["a", "b", "c"])}}))
t = Store(sys.argv[1]).trajectory("{loop.trace_id}")
print(replay(t, ReplayPlan.resample_from(0), seed=11, policies=r).digest)
"""
    other = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO,
                           capture_output=True, text=True, env={"PYTHONHASHSEED": "123", "PATH": ""}, timeout=120)
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == here.digest


def test_async_policies_and_sync_policies_do_not_block_the_event_loop(loop):
    registry = Registry()

    async def chat(step, inputs, rng):
        await asyncio.sleep(0.01)
        return "async answer"

    def slow_tool(arguments, rng):
        time.sleep(0.3)
        return '{"sky": "slow"}'

    registry.register("llm", None, chat)
    registry.register("tool", "weather", slow_tool)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        run = await replay_async(loop, ReplayPlan.resample(1), policies=registry)
        task.cancel()
        return run, ticks

    run, ticks = asyncio.run(main())
    assert run.final_output == "async answer" and ticks >= 10  # the loop kept running during the 0.3 s tool


@pytest.mark.parametrize("fixture", sorted(p.name for p in (FIXTURES / "otel").glob("*.json")
                                           if not p.name.endswith("otlp.json")))
def test_factual_replay_reproduces_every_fixture_trace(tmp_path, fixture):
    from otel_replay.normalize.sources.flat_json import read_flat
    from otel_replay.replay.verify import verify_factual

    spans, logs = read_flat(json.loads((FIXTURES / "otel" / fixture).read_text()))
    ingest(tmp_path, spans, logs, source="test")
    store = Store(tmp_path)
    for trace_id in store.list_traces().column("trace_id").to_pylist():
        check = verify_factual(store.trajectory(trace_id), Registry())
        assert check.ok, (fixture, trace_id, check.first_mismatch, check.run.unreplayable)


def test_threads_can_replay_concurrently(loop):
    registry = reader_policies()
    digests = set()

    def work():
        digests.add(replay(loop, ReplayPlan.resample(1), seed=5, policies=registry).digest)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(digests) == 1


def test_policies_load_from_a_module_and_from_entry_points(tmp_path, monkeypatch, loop):
    from otel_replay.replay import policies

    (tmp_path / "shop_policies.py").write_text(
        "from otel_replay import policies\n"
        "@policies.tool('weather')\n"
        "def weather(arguments, rng):\n    return '{\"sky\": \"from module\"}'\n"
        "def register(registry):\n"
        "    registry.register('llm', None, lambda step, inputs, rng: 'from entry point')\n")
    dist = tmp_path / "shop_policies-1.0.dist-info"  # an installed distribution, as pip would leave it
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: shop-policies\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[otel_replay.policies]\nshop = shop_policies:register\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    policies.registry.clear()
    try:
        assert policies.load_entry_points() == ["shop"]
        policies.load_module("shop_policies")
        assert policies.registry.keys() == ["llm", "tool:weather"]
        run = replay(loop, ReplayPlan.resample_from(1))  # the default registry
        assert run.steps[1].outputs[0]["parts"][0]["response"] == '{"sky": "from module"}'
        assert run.final_output == "from entry point"
        with pytest.raises(policies.PolicyError, match="cannot import policies module"):
            policies.load_module("no_such_policies_module")
    finally:
        policies.registry.clear()


def test_a_new_tool_call_id_alone_does_not_unhold_later_steps(loop):
    """Step 0 re-decided makes the same call under another id: step 2 stays served from the recording."""
    registry = Registry()
    registry.register("llm", None, lambda step, inputs, rng: [call("other-id", "weather", city="Paris")])
    registry.register("tool", "weather", lambda arguments, rng: SUNNY)
    run = replay(loop, ReplayPlan.resample(0), policies=registry)
    assert [o.source for o in run.steps] == ["policy", "recording", "recording"]
    assert run.steps[1].outputs[0]["parts"][0]["id"] == "other-id"  # the tool answers the live call
    assert run.final_output == "It is sunny."


def test_a_tool_call_that_failed_in_the_recording_is_held_as_failed(tmp_path):
    """An errored tool step stored no result (LangSmith, Langfuse): holding it changes nothing downstream."""
    tid = f"{5:032x}"
    root = f"{5:08x}00000000"
    recorded_error = result("c1", "Error: ValueError('bad input')")
    spans = [SpanRecord(tid, root, None, "invoke_agent a", start_ns=T0, end_ns=T0 + 10**9,
                        attributes={"gen_ai.operation.name": "invoke_agent"}),
             SpanRecord(tid, f"{5:08x}00000001", root, "chat m", start_ns=T0 + 1000, end_ns=T0 + 2000, attributes={
                 "gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps([USER]),
                 "gen_ai.output.messages": json.dumps([ASK])}),
             SpanRecord(tid, f"{5:08x}00000002", root, "execute_tool weather", start_ns=T0 + 3000, end_ns=T0 + 4000,
                        status_code="error", attributes={
                 "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "weather", "gen_ai.tool.call.id": "c1",
                 "gen_ai.tool.call.arguments": json.dumps({"city": "Paris"}), "error.type": "ValueError"}),
             SpanRecord(tid, f"{5:08x}00000003", root, "chat m", start_ns=T0 + 5000, end_ns=T0 + 6000, attributes={
                 "gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps([USER, ASK, recorded_error]),
                 "gen_ai.output.messages": json.dumps([text("Sorry, the weather service failed.")])})]
    ingest(tmp_path, spans, source="test")
    traj = Store(tmp_path).trajectory(tid)
    run = replay(traj, ReplayPlan.factual(), policies=Registry())
    assert [o.source for o in run.steps] == ["recording"] * 3 and run.policy_calls == 0 and run.ok
    assert run.final_output == "Sorry, the weather service failed."


@needs_openai_v2
def test_a_sub_agents_new_answer_reaches_the_parent_through_the_tool_it_ran_under(tmp_path):
    from otel_replay.testing import SimulatedModelServer
    from otel_replay.testing.planted import (
        TOPOLOGIES,
        planted_registry,
        record_planted,
        replay_model,
    )

    topology = TOPOLOGIES["multi-agent-handoff"]
    traj = Store(tmp_path).trajectory(record_planted(tmp_path, topology))
    tool, answer = traj.step(5), traj.step(6)
    assert (tool.tool_name, answer.agent) == ("delegate", "researcher")
    with SimulatedModelServer(replay_model(topology)) as server:
        registry = planted_registry(topology, server.base_url)
        factual = replay(traj, ReplayPlan.factual(), 0, policies=registry)
        assert factual.final_output == "FAIL" and factual.policy_calls == 0
        run = replay(traj, ReplayPlan.do(6, "good"), 0, policies=registry)
    delivered = next(o for o in run.steps if o.index == 5)
    assert delivered.source == "sub-agent" and '"choice": "good"' in delivered.outputs[0]["parts"][0]["response"]
    parent_next = next(o for o in run.steps if o.index == 7)
    assert parent_next.source == "policy"  # its history now holds the new tool result, so it is re-decided
    assert run.final_output == "OK" and run.unreplayable is None
