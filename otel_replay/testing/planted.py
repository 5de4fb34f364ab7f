"""Agents with a planted culprit, for tests and the accuracy benchmark.

A pipeline agent makes `TURNS` decisions; at each turn the (simulated) model calls a tool with a
choice, "good" or "bad" (bad with probability `P_BAD` when re-decided), and after the last turn
it answers "OK" or "FAIL" from the choices the tools reported back. Each topology fixes which
choices the recorded run made and how the outcome depends on them, so the culprit is known by
construction. Turn t's decision is llm step 2t.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otel_replay.testing.model import ChatRequest, Reply, SimulatedModel, ToolCall
from otel_replay.testing.recording import recording, run_tool_loop

TURNS = 4
P_BAD = 0.1


@dataclass(frozen=True)
class Topology:
    name: str
    forced: dict[int, str]  # the recorded run's choices (others good)
    fails: Callable[[list[str]], bool]  # outcome from the choices
    culprit: int | None  # llm step index of the culprit (None: no culprit)
    echo: dict[int, int] = field(default_factory=dict)  # turn -> the earlier turn whose choice it repeats
    tools: dict[int, str] = field(default_factory=dict)  # turn -> tool name (default "work")
    chance: bool = False  # the verifier fails at random (no step is to blame)
    corrupt: frozenset[int] = frozenset()  # turns whose tool reports "bad" whatever it was asked (when recorded)
    turns: int = TURNS
    effect: float | None = None  # the culprit's true contrastive effect, by construction
    handoff: frozenset[int] = frozenset()  # turns whose tool call hands the decision to a sub-agent


def _bad(turn: int) -> Callable[[list[str]], bool]:
    return lambda choices: choices[turn] == "bad"


# effect = P(fail | culprit held) - P(fail | culprit and later steps re-decided), with P_BAD = 0.1
TOPOLOGIES = {t.name: t for t in (
    Topology("single-late", {3: "bad"}, _bad(3), culprit=6, effect=0.9),
    Topology("corrupted-tool-output", {}, _bad(2), culprit=5, corrupt=frozenset({2}), effect=0.9),
    Topology("misleading-retrieval", {}, _bad(1), culprit=3, corrupt=frozenset({1}), tools={1: "search"}, effect=0.9),
    Topology("poisoned-tool-argument", {1: "bad"}, _bad(1), culprit=2, effect=0.9),
    Topology("wrong-instruction-step-0", {0: "bad"}, _bad(0), culprit=0, effect=0.9),
    Topology("dropped-message", {2: "bad"}, _bad(2), culprit=4, effect=0.9),
    Topology("butterfly", {0: "bad", 3: "bad"}, _bad(3), culprit=6, effect=0.9),
    Topology("and", {1: "bad", 3: "bad"}, lambda c: c[1] == "bad" and c[3] == "bad", culprit=6, effect=0.9),
    Topology("or", {1: "bad", 3: "bad"}, lambda c: c[1] == "bad" or c[3] == "bad", culprit=2, effect=0.81),
    Topology("echo", {1: "bad"}, _bad(3), culprit=2, echo={3: 1}, effect=0.9),
    Topology("non-resamplable", {3: "bad"}, _bad(3), culprit=6, tools={2: "audit"}, effect=0.9),
    Topology("long-loop", {13: "bad"}, _bad(13), culprit=26, turns=15, effect=0.9),
    # turn 2's tool `delegate` runs a sub-agent whose one llm step (index 6, after the tool step 5 that
    # contains it) answers the choice; the parent consumes that answer as the tool's result
    Topology("multi-agent-handoff", {2: "bad"}, _bad(2), culprit=6, handoff=frozenset({2}),
             tools={2: "delegate"}, effect=0.9),
    Topology("control", {}, lambda c: False, culprit=None, chance=True),
)}


SUB_AGENT = "researcher"
SUB_AGENT_PROMPT = "You are the researcher. Decide the choice for turn "


def pipeline_script(topology: Topology, recording: bool) -> Callable[[ChatRequest, random.Random], Reply]:
    def script(request: ChatRequest, rng: random.Random) -> Reply:
        system = next((str(m.get("content")) for m in request.messages if m.get("role") == "system"), "")
        if system.startswith(SUB_AGENT_PROMPT):  # the sub-agent answers the handed-off choice in text
            turn = int(system[len(SUB_AGENT_PROMPT):].rstrip("."))
            if recording:
                return topology.forced.get(turn, "good")
            return "bad" if rng.random() < P_BAD else "good"
        results = [json.loads(content) for _, content in request.tool_results()]
        turn = len(results)
        if turn < topology.turns:
            if turn in topology.echo:
                choice = results[topology.echo[turn]]["choice"]
            elif turn in topology.handoff:
                return ToolCall(topology.tools.get(turn, "delegate"), {"turn": turn})
            elif recording:
                choice = topology.forced.get(turn, "good")
            else:
                choice = "bad" if rng.random() < P_BAD else "good"
            return ToolCall(topology.tools.get(turn, "work"), {"turn": turn, "choice": choice})
        return "FAIL" if topology.fails([r["choice"] for r in results]) else "OK"
    return script


def work(turn: int, choice: str) -> str:
    return json.dumps({"turn": turn, "choice": choice})


TOOL_FUNCTIONS = {"work": work, "audit": work, "search": work}


def recorded_tools(topology: Topology, client: Any = None, tracer: Any = None) -> dict[str, Callable[..., str]]:
    """The tools as they behaved in the recorded run (corrupting the planted turns; `delegate` runs
    the sub-agent, whose spans nest under the tool's span)."""
    def corrupting(turn: int, choice: str) -> str:
        return work(turn, "bad" if turn in topology.corrupt else choice)

    def delegate(turn: int) -> str:
        messages = [{"role": "system", "content": f"{SUB_AGENT_PROMPT}{turn}."},
                    {"role": "user", "content": f"Turn {turn}: good or bad?"}]
        answer, _ = run_tool_loop(client, tracer, SUB_AGENT, messages, [], {}, 1)
        return work(turn, answer)

    return {**{name: corrupting for name in TOOL_FUNCTIONS}, "delegate": delegate}
TOOLS = [{"type": "function", "function": {"name": name, "description": "Carry out one step.",
                                           "parameters": {"type": "object", "properties": {
                                               "turn": {"type": "integer"}, "choice": {"type": "string"}}}}}
         for name in (*TOOL_FUNCTIONS, "delegate")]


def ok(final_output: str, rollout: Any = None) -> float:
    """Verifier: the agent answered OK."""
    return 1.0 if final_output.strip() == "OK" else 0.0


def by_chance(final_output: str, rollout: Any = None) -> float:
    """Verifier for the control: fails 10% of the time whatever the agent did (seeded by the rollout)."""
    return 0.0 if random.Random(f"chance:{getattr(rollout, 'seed', 0)}").random() < P_BAD else ok(final_output)


def record_planted(store: Any, topology: Topology, model_seed: int = 0) -> str:
    """Run the pipeline agent once with the topology's recorded choices; returns the trace id."""
    model = SimulatedModel(pipeline_script(topology, recording=True), model_seed)
    # seeded ids: the same topology and seed give the same trace id, so rollouts (seeded by it) repeat
    with recording(store, f"planted-{topology.name}", model, ids=f"{topology.name}:{model_seed}") as (client, tracer):
        messages = [{"role": "user", "content": f"Run the {topology.name} task."}]
        _, trace_id = run_tool_loop(client, tracer, topology.name, messages, TOOLS,
                                    recorded_tools(topology, client, tracer), topology.turns + 1)
    return trace_id


def planted_registry(topology: Topology, base_url: str, registry: Any = None) -> Any:
    """Policies for re-deciding the pipeline: the replay model, and `work` (not `audit`: it has none)."""
    from otel_replay.replay.builtin.openai_policy import openai_policy
    from otel_replay.replay.policies import Registry

    registry = registry if registry is not None else Registry()
    registry.register("llm", None, openai_policy(base_url=base_url, api_key="sim", tools=TOOLS))

    def tool(arguments: dict[str, Any], rng: random.Random) -> str:
        turn, choice = arguments["turn"], arguments["choice"]
        flaky = turn in topology.corrupt and rng.random() < P_BAD  # a re-run tool corrupts now and then
        return work(turn, "bad" if flaky else choice)

    for name in ("work", "search"):
        registry.register("tool", name, tool)
    return registry


def replay_model(topology: Topology, seed: int = 0) -> SimulatedModel:
    return SimulatedModel(pipeline_script(topology, recording=False), seed)
