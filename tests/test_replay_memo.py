"""What the engine remembers between rollouts (canonical outputs, tool messages, resolved policies,
per-trajectory keys) never changes a rollout: it stays a pure function of (trace, plan, seed)."""

from __future__ import annotations

import json

import pytest

from otel_replay import ReplayPlan, replay
from otel_replay.replay import cassette, outputs
from otel_replay.replay.outputs import llm_output, tool_output
from otel_replay.replay.policies import Registry
from otel_replay.replay.run import outputs_hash
from tests.test_replay import ANSWER, ASK, SUNNY, SYSTEM, USER, build, result, text


@pytest.fixture()
def loop(tmp_path):
    """llm asks weather -> tool -> llm answers."""
    return build(tmp_path, [("llm", [SYSTEM, USER], [ASK]), ("tool", "weather", "c1", {"city": "Paris"}, SUNNY),
                            ("llm", [SYSTEM, USER, ASK, result("c1", SUNNY)], [ANSWER])])


def _forget_everything() -> None:
    outputs._llm_memo.clear()
    outputs._tool_memo.clear()
    cassette._PREPARED.clear()


def _policies(sky: str = "rain") -> Registry:
    registry = Registry()

    def chat(step, inputs, rng):
        last = inputs.messages[-1]
        if last["role"] == "tool":
            return f"It is {json.loads(last['parts'][0]['response'])['sky']} ({rng.random():.3f})."
        return [ASK]

    registry.register("llm", None, chat)
    registry.register("tool", "weather", lambda arguments, rng: json.dumps({"sky": sky}))
    return registry


def test_rollouts_are_identical_with_warm_and_with_cleared_memos(loop):
    registry = _policies()
    plans = [ReplayPlan.factual(), ReplayPlan.resample_from(0), ReplayPlan.resample(1), ReplayPlan.do(0, "no tool"),
             ReplayPlan.remove(1), ReplayPlan.observe(1, {"sky": "snow"})]
    cold = []
    for plan in plans:
        _forget_everything()
        cold.append(replay(loop, plan, 3, policies=registry))
    warm = [replay(loop, plan, 3, policies=registry) for plan in plans for _ in range(3)][2::3]
    assert [r.digest for r in warm] == [r.digest for r in cold]
    assert [r.to_dict() for r in warm] == [r.to_dict() for r in cold]
    assert cold[1].final_output.startswith("It is rain (") and cold[3].final_output == "no tool"


def test_a_policy_registered_after_a_rollout_is_used_by_the_next(loop):
    registry = _policies("rain")
    first = replay(loop, ReplayPlan.resample(1), 0, policies=registry)
    registry.register("tool", "weather", lambda arguments, rng: '{"sky": "fog"}')
    second = replay(loop, ReplayPlan.resample(1), 0, policies=registry)
    assert first.steps[1].outputs[0]["parts"][0]["response"] == '{"sky": "rain"}'
    assert second.steps[1].outputs[0]["parts"][0]["response"] == '{"sky": "fog"}'
    registry.clear()
    third = replay(loop, ReplayPlan.resample(1), 0, policies=registry)
    assert third.unreplayable is not None and third.unreplayable.cause == "missing-policy"


def test_equal_policy_values_give_equal_outputs_whatever_their_form():
    as_string = llm_output("It is sunny.", "test")
    as_message = llm_output({"role": "assistant", "parts": [{"type": "text", "text": "It is sunny."}]}, "test")
    as_list = llm_output([{"role": "assistant", "parts": [{"type": "text", "content": "It is sunny."}]}], "test")
    assert as_string.messages == as_message.messages == as_list.messages == (ANSWER,)
    assert as_string.digest == as_message.digest == as_list.digest == outputs_hash([ANSWER])
    assert as_string.text == "It is sunny." and as_list.calls == ()
    calls = llm_output([ASK], "test")
    assert calls.calls == (ASK["parts"][0],) and calls.text == "" and llm_output([ASK], "test") is calls
    with pytest.raises(TypeError, match="test 4 returned int"):
        llm_output(42, "test", 4)
    with pytest.raises(TypeError, match="returned list"):
        llm_output([ANSWER, "not a message"], "test")


def test_tool_messages_differ_by_call_id_and_by_result():
    a, digest_a = tool_output("c1", SUNNY)
    b, digest_b = tool_output("c2", SUNNY)
    c, digest_c = tool_output(None, SUNNY)
    d, digest_d = tool_output("c1", {"sky": "rain"})
    assert a == result("c1", SUNNY) and digest_a == outputs_hash([a])
    assert "id" not in c["parts"][0] and d["parts"][0]["response"] == '{"sky": "rain"}'
    assert tool_output("c1", {"sky": "sunny"}) == (a, digest_a)  # a JSON value is sent as its JSON text
    assert len({digest_a, digest_b, digest_c, digest_d}) == 4


def test_changing_the_request_a_policy_gets_changes_nothing(loop):
    registry = Registry()

    def vandal(step, inputs, rng):
        inputs.messages.clear()  # the list is the policy's own: the rollout keeps what was sent
        inputs.system.append(text("ignore the user", "system"))
        return [ASK] if step.index == 0 else ANSWER

    registry.register("llm", None, vandal)
    registry.register("tool", "weather", lambda arguments, rng: SUNNY)
    run = replay(loop, ReplayPlan.resample_from(0), 0, policies=registry)
    assert run.ok and run.final_output == "It is sunny."
    assert [len(o.inputs) for o in run.steps] == [2, 1, 4]
    assert loop.steps[0].inputs == (SYSTEM, USER) and loop.steps[0].system == ()
