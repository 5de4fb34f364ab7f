"""Replay benchmark: engine overhead per replayed step, beside `agent_replay`, in one run.

Both engines replay an equivalent agent: a tool-calling loop of N steps (chat turns, each
asking for one tool call, one turn asking for two in parallel so N can be even, then a chat
that answers). The recorded chat requests carry the growing history, as a real agent's do, and
agent_replay's agent passes the same history as the inputs of its `ctx.llm` call, so both
engines key their cassette on the same content. Policies are instant: a tool policy returns a
constant string and an llm policy returns a prebuilt message that calls the next tool or
answers, so what is timed is the engine, not the work.

Two modes per engine, both timed on the replay call alone (the trajectory is built, and
agent_replay's session recorded, once, outside the timed region):
- factual: every step served from the recording;
- re-decide: every step from step 0 re-run by its policy (`ReplayPlan.resample_from(0)` /
  agent_replay's `ReplayPlan.ablate_from(0)`). The tool policy returns a different result than
  the recording, as a re-decided step would, so each engine also carries the change downstream.

The figure is µs per step: the median over many rounds of the mean time of one replay call in a
batch of consecutive calls (~300 replayed steps), divided by N. Each round times a batch of each
engine back to back, with the garbage collector off (as `timeit` does), so both see the same
machine, each with its own warm caches (as in an attribution, which replays one trajectory many
times). agent_replay (`pip install trajectory-causal-attribution`) is optional: when it is not
importable in this interpreter, its columns are marked skipped.
"""

from __future__ import annotations

import gc
import importlib
import json
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.machine import load_average
from otel_replay.normalize.records import SpanRecord
from otel_replay.replay import ReplayPlan, replay
from otel_replay.replay.policies import Registry
from otel_replay.store.ingest import ingest
from otel_replay.trajectory import Store, Trajectory
from tests.harness.traces import TraceBuilder

ANCHOR_MODULE = "agent_replay"
ANCHOR_INSTALL = "pip install trajectory-causal-attribution"
TARGET_RATIO = 1 / 3  # otel-replay's per-step cost <= 1/3 of agent_replay's
STEP_COUNTS = (6, 50)
MODES = ("factual", "re-decide")
T0 = 1_767_225_600_000_000_000  # 2026-01-01
TOOLS = ("search_docs", "get_order", "lookup_customer")
SYSTEM = {"role": "system", "parts": [{"type": "text", "content": (
    "You are a support agent for an online shop. Use the tools to look up orders, customers and "
    "the help centre before you answer. Answer in two sentences at most and cite what you used.")}]}
USER = {"role": "user", "parts": [{"type": "text", "content": (
    "My order 81723 arrived damaged and the replacement never shipped. Can you check what happened "
    "and tell me when I will get it?")}]}
RESAMPLED_RESULT = '{"status": "resampled", "detail": "an instant tool policy"}'


@dataclass(frozen=True)
class Sizes:
    rounds: int  # timed batches per (steps, mode, engine); the median is reported
    warmup: int  # untimed rounds first
    batch_steps: int  # replayed steps per batch: a batch is max(1, batch_steps // N) replay calls


QUICK = Sizes(rounds=12, warmup=1, batch_steps=150)
FULL = Sizes(rounds=250, warmup=3, batch_steps=300)


# -- the agent, as data ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Agent:
    """An N-step tool loop: `turns[t]` is the assistant message of chat turn t, `answer` the last."""

    steps: int
    turns: tuple[dict[str, Any], ...]
    answer: dict[str, Any]

    @classmethod
    def of(cls, steps: int) -> Agent:
        if steps < 3:
            raise ValueError("an agent needs at least 3 steps (chat, tool, chat)")
        chats = (steps - 1) // 2  # chat turns before the answer; each makes 1 call, the last one 1 or 2
        per_turn = [1] * chats
        per_turn[-1] += steps - 1 - 2 * chats
        turns, k = [], 0
        for calls in per_turn:
            parts = []
            for _ in range(calls):
                parts.append({"type": "tool_call", "id": f"call_{k}", "name": TOOLS[k % len(TOOLS)],
                              "arguments": {"query": f"order 81723 item {k}", "limit": 3}})
                k += 1
            turns.append({"role": "assistant", "parts": parts})
        answer = {"role": "assistant", "parts": [{"type": "text", "content": (
            "The replacement for order 81723 is packed and ships tomorrow; you will get it within 3 days.")}]}
        return cls(steps, tuple(turns), answer)

    def reply(self, turn: int) -> dict[str, Any]:
        """What the model says on chat turn `turn`: the next tool call(s), or the answer."""
        return self.turns[turn] if turn < len(self.turns) else self.answer

    def replies_by_history_length(self) -> dict[int, dict[str, Any]]:
        """The reply for each request, by its number of messages (system, user, then each turn's)."""
        out, length = {}, 2
        for turn in range(len(self.turns) + 1):
            out[length] = self.reply(turn)
            if turn < len(self.turns):
                length += 1 + len(self.turns[turn]["parts"])
        return out


def recorded_result(call: dict[str, Any]) -> str:
    return json.dumps({"tool": call["name"], "query": call["arguments"]["query"],
                       "status": "recorded", "detail": "replacement shipped 2026-01-02"})


def tool_message(call_id: str, response: str) -> dict[str, Any]:
    return {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": response}]}


# -- otel-replay: the agent as a stored trace -------------------------------------------------------
def agent_spans(agent: Agent, trace: int = 1) -> list[SpanRecord]:
    """The recorded run of `agent` as GenAI spans (invoke_agent root, chat and execute_tool children)."""
    trace_spans = TraceBuilder(trace, agent="support")
    history = [SYSTEM, USER]
    for turn in range(len(agent.turns) + 1):
        out = agent.reply(turn)
        trace_spans.chat(history, out)
        history = history + [out]
        for part in out["parts"]:
            if part["type"] == "tool_call":
                result = recorded_result(part)
                trace_spans.tool(part["name"], part["id"], part["arguments"], result)
                history = history + [tool_message(part["id"], result)]
    return trace_spans.spans


def build_trajectory(agent: Agent) -> Trajectory:
    """Ingest the agent's spans into a temporary store and read its trajectory back."""
    work = Path(tempfile.mkdtemp(prefix="otel-replay-bench-replay-"))
    try:
        spans = agent_spans(agent)
        ingest(work, spans, source="bench:replay")
        return Store(work).trajectory(spans[0].trace_id)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def instant_policies(agent: Agent) -> Registry:
    """An llm policy that answers from the history's length; one tool policy returning a constant."""
    registry = Registry()
    replies = agent.replies_by_history_length()

    def chat(step: Any, inputs: Any, rng: Any) -> dict[str, Any]:
        return replies[len(inputs.messages)]

    registry.register("llm", None, chat)
    registry.register("tool", None, lambda arguments, rng: RESAMPLED_RESULT)
    return registry


def _otel_case(agent: Agent) -> dict[str, Callable[[], Any]]:
    traj = build_trajectory(agent)
    if len(traj.steps) != agent.steps:
        raise AssertionError(f"the stored trace has {len(traj.steps)} steps, expected {agent.steps}")
    registry = instant_policies(agent)
    plans = {"factual": ReplayPlan.factual(), "re-decide": ReplayPlan.resample_from(0)}
    expect = {"factual": "recording", "re-decide": "policy"}
    calls = {}
    for mode, plan in plans.items():
        def call(plan: ReplayPlan = plan) -> Any:
            return replay(traj, plan, 0, policies=registry)
        run = call()  # check once, untimed, that the replay does what the mode says
        if not run.ok or len(run.steps) != agent.steps or {o.source for o in run.steps} != {expect[mode]}:
            raise AssertionError(f"otel-replay {mode} replay of the {agent.steps}-step agent went wrong: "
                                 f"{run.unreplayable} {[o.source for o in run.steps]}")
        if run.final_output != agent.answer["parts"][0]["content"]:
            raise AssertionError(f"otel-replay {mode} replay ended with {run.final_output!r}")
        calls[mode] = call
    return calls


# -- agent_replay: the same agent written with its API ----------------------------------------------
def anchor_module() -> Any | None:
    """`agent_replay` when it is importable in this interpreter, else None."""
    try:
        return importlib.import_module(ANCHOR_MODULE)
    except ImportError:
        return None


def anchor_agent(agent: Agent, tool_result: Callable[[dict[str, Any]], str]) -> Callable[..., Any]:
    """The same loop through agent_replay's context: `ctx.llm` / `ctx.tool` with `produce=` policies."""
    def run(ctx: Any, question: str) -> str:
        history = [SYSTEM, {"role": "user", "parts": [{"type": "text", "content": question}]}]
        turn = 0
        while True:
            out = ctx.llm("chat", produce=lambda turn=turn: agent.reply(turn), messages=history)
            history = history + [out]  # a new list: the recorded inputs keep the history they saw
            calls = [p for p in out["parts"] if p["type"] == "tool_call"]
            if not calls:
                return out["parts"][0]["content"]
            for call in calls:
                result = ctx.tool(call["name"], produce=lambda call=call: tool_result(call), **call["arguments"])
                history = history + [tool_message(call["id"], result)]
            turn += 1
    return run


def _anchor_case(ar: Any, agent: Agent) -> dict[str, Callable[[], Any]]:
    question = USER["parts"][0]["content"]
    with ar.Session(":memory:") as session:
        traj = session.record(anchor_agent(agent, recorded_result), {"question": question}, seed=0)
    if len(traj.steps) != agent.steps:
        raise AssertionError(f"agent_replay recorded {len(traj.steps)} steps, expected {agent.steps}")
    live = anchor_agent(agent, lambda call: RESAMPLED_RESULT)
    plans = {"factual": ar.ReplayPlan.factual(len(traj.steps)), "re-decide": ar.ReplayPlan.ablate_from(0)}
    calls = {}
    for mode, plan in plans.items():
        def call(plan: Any = plan) -> Any:
            return ar.replay(live, traj, plan, seed=0)
        if call() != agent.answer["parts"][0]["content"]:
            raise AssertionError(f"agent_replay {mode} replay of the {agent.steps}-step agent went wrong")
        calls[mode] = call
    return calls


# -- timing -----------------------------------------------------------------------------------------
def _mean_ns(fn: Callable[[], Any], calls: int) -> float:
    """Mean wall time of one call over `calls` consecutive calls."""
    started = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - started) / calls


def run_replay_bench(quick: bool = False) -> dict[str, Any]:
    sizes = QUICK if quick else FULL
    load, started = load_average(), time.perf_counter()
    ar = anchor_module()
    rows = []
    for steps in STEP_COUNTS:
        agent = Agent.of(steps)
        ours = _otel_case(agent)
        theirs = _anchor_case(ar, agent) if ar is not None else {}
        calls = max(1, sizes.batch_steps // steps)
        for mode in MODES:
            engines = {"otel-replay": ours[mode]}
            if mode in theirs:
                engines["agent_replay"] = theirs[mode]
            samples: dict[str, list[float]] = {name: [] for name in engines}
            enabled = gc.isenabled()
            gc.collect()
            gc.disable()
            try:
                for n in range(sizes.warmup + sizes.rounds):
                    for name, fn in engines.items():  # back to back, so both see the same machine
                        elapsed = _mean_ns(fn, calls)
                        if n >= sizes.warmup:
                            samples[name].append(elapsed)
            finally:
                if enabled:
                    gc.enable()
            us = {name: statistics.median(s) / 1000 / steps for name, s in samples.items()}
            anchor_us = us.get("agent_replay")
            rows.append({"steps": steps, "mode": mode, "rounds": sizes.rounds, "calls_per_batch": calls,
                         "otel_replay_us_per_step": us["otel-replay"],
                         "agent_replay_us_per_step": anchor_us,
                         "ratio": us["otel-replay"] / anchor_us if anchor_us else None})
    return {"quick": quick, "rounds": sizes.rounds, "rows": rows, "target_ratio": TARGET_RATIO,
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "machine": f"{platform.system()} {platform.machine()}", "load_avg_start": load,
            "seconds": time.perf_counter() - started,
            "agent_replay": _anchor_version(ar), "agent_replay_skipped": None if ar is not None else
            f"agent_replay not importable in this interpreter: skipped (install it with `{ANCHOR_INSTALL}`)"}


def _anchor_version(ar: Any | None) -> str | None:
    if ar is None:
        return None
    return str(getattr(ar, "__version__", "installed"))


def format_replay_table(result: dict[str, Any]) -> str:
    skipped = result.get("agent_replay_skipped")
    anchor = f"agent_replay {result['agent_replay']}" if result.get("agent_replay") else "agent_replay"
    lines = [f"| steps | mode | otel-replay µs/step | {anchor} µs/step | otel-replay / agent_replay |",
             "|---:|---|---:|---:|---:|"]
    for r in result["rows"]:
        theirs = f"{r['agent_replay_us_per_step']:.1f}" if r["agent_replay_us_per_step"] is not None else "skipped"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "skipped"
        lines.append(f"| {r['steps']} | {r['mode']} | {r['otel_replay_us_per_step']:.1f} | {theirs} | {ratio} |")
    lines.append("")
    load = result.get("load_avg_start")
    load_text = f", load average at start {', '.join(f'{x:.2f}' for x in load)}" if load else ""
    lines.append(f"Median of {result['rounds']:,} rounds per cell, each a batch of consecutive replays per engine; "
                 f"instant policies, so this is engine overhead. {result['python']}, {result['machine']}{load_text}; "
                 f"{'quick' if result['quick'] else 'full'} run, {result.get('seconds', 0):.1f} s.")
    if skipped:
        lines.append(skipped + ".")
        return "\n".join(lines)
    worst = max(r["ratio"] for r in result["rows"])
    mark = "pass" if worst <= result["target_ratio"] else "FAIL"
    lines.append(f"Target: otel-replay per-step cost <= 1/3 of agent_replay's (ratio <= {result['target_ratio']:.2f}); "
                 f"worst ratio {worst:.2f} ({mark}).")
    return "\n".join(lines)
