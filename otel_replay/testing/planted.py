"""Agents with a planted culprit, for tests and the accuracy benchmark.

A pipeline agent makes `TURNS` decisions; at each turn the (simulated) model calls a tool with a
choice, "good" or "bad" (bad with probability `P_BAD`, or the topology's own rate, when
re-decided), and after the last turn it answers "OK" or "FAIL" from the choices the tools
reported back. Each topology fixes which choices the recorded run made and how the outcome
depends on them, so the culprit and its effect are known by construction. Turn t's decision is
llm step 2t, its tool step 2t + 1; the answer is step 2 * turns.

The hard cases vary what the simple ones hold fixed: a re-decided answer that catches a failure
now and then (`catches`), tools that misreport at random when re-run (`flaky`), a verifier that
flips scores or fails at random (`verifier`), small effects (a re-decided turn that is often bad
again, `p_bad`).
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
    culprit: int | None  # step index of the culprit (None: no culprit)
    echo: dict[int, int] = field(default_factory=dict)  # turn -> the earlier turn whose choice it repeats
    tools: dict[int, str] = field(default_factory=dict)  # turn -> tool name (default "work")
    chance: bool = False  # the verifier fails at random (no step is to blame)
    corrupt: frozenset[int] = frozenset()  # turns whose tool reports "bad" whatever it was asked (when recorded)
    turns: int = TURNS
    effect: float | None = None  # the culprit's true contrastive effect, by construction
    handoff: frozenset[int] = frozenset()  # turns whose tool call hands the decision to a sub-agent
    p_bad: dict[int, float] = field(default_factory=dict)  # turn -> P(bad) when re-decided (default P_BAD)
    flaky: dict[int, float] = field(default_factory=dict)  # turn -> P(a re-run tool reports bad whatever it was asked)
    catches: float = 0.0  # P(a re-decided answer says OK although the choices fail): it catches the failure
    verifier: str = "ok"  # this module's verifier: ok, by_chance, flips, coin
    note: str = ""  # what makes the case hard, for the benchmark's table

    def bad_rate(self, turn: int) -> float:
        return self.p_bad.get(turn, P_BAD)


def _bad(turn: int) -> Callable[[list[str]], bool]:
    return lambda choices: choices[turn] == "bad"


FLIP = 0.08  # the noisy verifier flips this share of its scores
COIN = 0.5  # the chance control's verifier fails this often whatever the run did


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
    Topology("control", {}, lambda c: False, culprit=None, chance=True, verifier="by_chance"),
    # -- the hard cases ---------------------------------------------------------------------------
    Topology("small-effect-at-commitment", {3: "bad"}, _bad(3), culprit=6, effect=0.25, p_bad={3: 0.75},
             note="the culprit's effect is 0.25: re-decided, turn 3 is bad again 75% of the time"),
    # the issue's agent: the tool glitched (step 1, +0.375: re-run it glitches half the time), the answer
    # (step 2, +0.25) could still have caught it: the point of commitment is the answer, not the bigger effect
    Topology("bigger-effect-earlier", {}, _bad(0), culprit=2, effect=0.25, turns=1, corrupt=frozenset({0}),
             flaky={0: 0.5}, catches=0.25, p_bad={0: 0.0},
             note="step 1 has the bigger effect (+0.375); the answer (+0.25) is the point of commitment"),
    Topology("noisy-verifier", {3: "bad"}, _bad(3), culprit=6, effect=0.9 * (1 - 2 * FLIP), verifier="flips",
             note=f"the verifier flips {100 * FLIP:.0f}% of scores at random (not tied to the rollout's seed)"),
    Topology("interacting-small", {1: "bad", 3: "bad"}, lambda c: c[1] == "bad" and c[3] == "bad", culprit=6,
             effect=0.25, p_bad={1: 0.75, 3: 0.75},
             note="fails only if turns 1 and 3 are both bad; each re-decided is bad again 75% of the time "
                  "(effects +0.19 and +0.25)"),
    Topology("long-run-middle", {8: "bad"}, _bad(8), culprit=16, turns=16, effect=0.9 * 0.95, catches=0.05,
             note="33 steps, the culprit in the middle; a re-decided answer catches the failure 5% of the time "
                  "(a real effect inside the band, after the culprit)"),
    Topology("random-tool", {2: "bad"}, lambda c: c[2] == "bad" or c[3] == "bad", culprit=4,
             effect=0.9 * 0.9 * 0.7, flaky={3: 0.3},
             note="turn 3's tool, re-run, reports bad 30% of the time whatever it was asked: part of the "
                  "failures are the tool's randomness"),
    Topology("chance-50", {}, lambda c: False, culprit=None, chance=True, verifier="coin",
             note=f"no culprit: the verifier fails {100 * COIN:.0f}% of runs at random"),
    Topology("hopeless", {}, lambda c: True, culprit=None,
             note="no culprit: the agent's answer fails whatever any step decides"),
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
            return "bad" if rng.random() < topology.bad_rate(turn) else "good"
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
                choice = "bad" if rng.random() < topology.bad_rate(turn) else "good"
            return ToolCall(topology.tools.get(turn, "work"), {"turn": turn, "choice": choice})
        failing = topology.fails([r["choice"] for r in results])
        if failing and not recording and topology.catches and rng.random() < topology.catches:
            return "OK"  # the re-decided answer catches the failure
        return "FAIL" if failing else "OK"
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
    """Verifier for the control: fails 10% of the time whatever the agent did (seeded by the rollout's
    seed, so every plan's rollout r shares its coin)."""
    return 0.0 if random.Random(f"chance:{getattr(rollout, 'seed', 0)}").random() < P_BAD else ok(final_output)


def _own_coin(rollout: Any, salt: str) -> float:
    """A draw of the rollout's own, not shared with the other plans' rollout of the same seed."""
    return random.Random(f"{salt}:{getattr(rollout, 'plan', '')}:{getattr(rollout, 'seed', 0)}").random()


def flips(final_output: str, rollout: Any = None) -> float:
    """A noisy verifier: `ok`, with FLIP of its scores flipped at random."""
    score = ok(final_output)
    return 1.0 - score if _own_coin(rollout, "flip") < FLIP else score


def coin(final_output: str, rollout: Any = None) -> float:
    """Verifier for the chance control: fails COIN of the runs at random, whatever the agent did."""
    return 0.0 if _own_coin(rollout, "coin") < COIN else ok(final_output)


VERIFIERS = {"ok": ok, "by_chance": by_chance, "flips": flips, "coin": coin}


def verifier_spec(topology: Topology) -> str:
    return f"{__name__}:{topology.verifier}"


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
        rate = topology.flaky.get(turn, P_BAD if turn in topology.corrupt else 0.0)
        flaky = rate > 0 and rng.random() < rate  # a re-run tool misreports now and then
        return work(turn, "bad" if flaky else choice)

    for name in ("work", "search"):
        registry.register("tool", name, tool)
    return registry


def replay_model(topology: Topology, seed: int = 0) -> SimulatedModel:
    return SimulatedModel(pipeline_script(topology, recording=False), seed)


def failure_rate(topology: Topology, boundary: int) -> float:
    """f(boundary): P(the run fails | steps before `boundary` held as recorded, the rest re-decided),
    by exact enumeration of the pipeline's choices (a handed-off turn counts as its decision)."""
    dist: dict[tuple[str, ...], float] = {(): 1.0}
    for turn in range(topology.turns):
        grown: dict[tuple[str, ...], float] = {}
        for history, p in dist.items():
            if turn in topology.echo:
                choices = [(history[topology.echo[turn]], 1.0)]
            elif 2 * turn < boundary:
                choices = [(topology.forced.get(turn, "good"), 1.0)]
            else:
                rate = topology.bad_rate(turn)
                choices = [("bad", rate), ("good", 1 - rate)]
            for choice, p_choice in choices:
                if 2 * turn + 1 < boundary:
                    reports = [("bad" if turn in topology.corrupt else choice, 1.0)]
                else:
                    rate = topology.flaky.get(turn, P_BAD if turn in topology.corrupt else 0.0)
                    reports = [("bad", rate), (choice, 1 - rate)]
                for report, p_report in reports:
                    key = (*history, report)
                    grown[key] = grown.get(key, 0.0) + p * p_choice * p_report
        dist = grown
    total = 0.0
    for history, p in dist.items():
        failing = topology.fails(list(history))
        fails = (1 - topology.catches if 2 * topology.turns >= boundary else 1.0) if failing else 0.0
        if topology.verifier == "flips":
            fails = FLIP + (1 - 2 * FLIP) * fails
        elif topology.verifier == "coin":
            fails = COIN + (1 - COIN) * fails
        elif topology.verifier == "by_chance":
            fails = P_BAD + (1 - P_BAD) * fails
        total += p * fails
    return total


def true_effects(topology: Topology) -> dict[int, float] | None:
    """Every step's true contrastive effect, f(i + 1) - f(i) (None for a topology with a sub-agent,
    whose extra step the enumeration does not model)."""
    if topology.handoff:
        return None
    steps = 2 * topology.turns + 1
    rates = [failure_rate(topology, k) for k in range(steps + 1)]
    return {i: rates[i + 1] - rates[i] for i in range(steps)}
