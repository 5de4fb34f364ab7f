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


TOPOLOGIES = {
    "single-late": Topology("single-late", {3: "bad"}, lambda c: c[3] == "bad", culprit=6),
    "butterfly": Topology("butterfly", {0: "bad", 3: "bad"}, lambda c: c[3] == "bad", culprit=6),
    "and": Topology("and", {1: "bad", 3: "bad"}, lambda c: c[1] == "bad" and c[3] == "bad", culprit=6),
    "or": Topology("or", {1: "bad", 3: "bad"}, lambda c: c[1] == "bad" or c[3] == "bad", culprit=2),
    "echo": Topology("echo", {1: "bad"}, lambda c: c[3] == "bad", culprit=2, echo={3: 1}),
    "non-resamplable": Topology("non-resamplable", {3: "bad"}, lambda c: c[3] == "bad", culprit=6,
                                tools={2: "audit"}),
    "control": Topology("control", {}, lambda c: False, culprit=None, chance=True),
}


def pipeline_script(topology: Topology, recording: bool) -> Callable[[ChatRequest, random.Random], Reply]:
    def script(request: ChatRequest, rng: random.Random) -> Reply:
        results = [json.loads(content) for _, content in request.tool_results()]
        turn = len(results)
        if turn < TURNS:
            if turn in topology.echo:
                choice = results[topology.echo[turn]]["choice"]
            elif recording:
                choice = topology.forced.get(turn, "good")
            else:
                choice = "bad" if rng.random() < P_BAD else "good"
            return ToolCall(topology.tools.get(turn, "work"), {"turn": turn, "choice": choice})
        return "FAIL" if topology.fails([r["choice"] for r in results]) else "OK"
    return script


def work(turn: int, choice: str) -> str:
    return json.dumps({"turn": turn, "choice": choice})


TOOL_FUNCTIONS = {"work": work, "audit": work}
TOOLS = [{"type": "function", "function": {"name": name, "description": "Carry out one step.",
                                           "parameters": {"type": "object", "properties": {
                                               "turn": {"type": "integer"}, "choice": {"type": "string"}}}}}
         for name in TOOL_FUNCTIONS]


def ok(final_output: str, rollout: Any = None) -> float:
    """Verifier: the agent answered OK."""
    return 1.0 if final_output.strip() == "OK" else 0.0


def by_chance(final_output: str, rollout: Any = None) -> float:
    """Verifier for the control: fails 10% of the time whatever the agent did (seeded by the rollout)."""
    return 0.0 if random.Random(f"chance:{getattr(rollout, 'seed', 0)}").random() < P_BAD else ok(final_output)


def record_planted(store: Any, topology: Topology, model_seed: int = 0) -> str:
    """Run the pipeline agent once with the topology's recorded choices; returns the trace id."""
    model = SimulatedModel(pipeline_script(topology, recording=True), model_seed)
    with recording(store, f"planted-{topology.name}", model) as (client, tracer):
        messages = [{"role": "user", "content": f"Run the {topology.name} task."}]
        _, trace_id = run_tool_loop(client, tracer, topology.name, messages, TOOLS, TOOL_FUNCTIONS, TURNS + 1)
    return trace_id


def planted_registry(topology: Topology, base_url: str, registry: Any = None) -> Any:
    """Policies for re-deciding the pipeline: the replay model, and `work` (not `audit`: it has none)."""
    from otel_replay.replay.builtin.openai_policy import openai_policy
    from otel_replay.replay.policies import Registry

    registry = registry if registry is not None else Registry()
    registry.register("llm", None, openai_policy(base_url=base_url, api_key="sim", tools=TOOLS))
    registry.register("tool", "work", lambda arguments, rng: work(**arguments))
    return registry


def replay_model(topology: Topology, seed: int = 0) -> SimulatedModel:
    return SimulatedModel(pipeline_script(topology, recording=False), seed)
