"""The anchors on the accuracy benchmark's cases: agent_replay run on the same planted agents,
and tracefork's own `validate` / `bench` figures as its commands report them.

agent_replay cannot read an OpenTelemetry trace, so each planted topology is written again with
its API (`ctx.llm` / `ctx.tool` with `produce=` policies): the same turns, tools, echoes,
corruptions, observation-only tool and outcome rule, recorded with the same choices, so its step
indices are ours and its verdict is scored against the same ground truth. tracefork needs
Python >= 3.12 and runs its own fixtures, so its numbers are printed as reported, never mixed
into ours.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from otel_replay.testing.planted import COIN, FLIP, P_BAD, Topology, work

TRACEFORK_ENV = "OTEL_REPLAY_TRACEFORK"  # path to a `tracefork` executable (its own Python >= 3.12 venv)


def agent_replay_module() -> Any | None:
    try:
        return importlib.import_module("agent_replay")
    except ImportError:
        return None


class _Calls:
    def __init__(self) -> None:
        self.n = 0


def _agent(topology: Topology, calls: _Calls, recording: bool) -> Callable[..., str]:
    """The planted pipeline through agent_replay's context."""
    def run(ctx: Any, question: str) -> str:
        history: list[dict[str, Any]] = [{"role": "user", "content": question}]
        results: list[dict[str, Any]] = []
        for turn in range(topology.turns):
            def decide(turn: int = turn) -> dict[str, Any]:
                calls.n += 1
                if turn in topology.echo:
                    choice = results[topology.echo[turn]]["choice"]
                elif recording:
                    choice = topology.forced.get(turn, "good")
                else:
                    choice = "bad" if ctx.rng.random() < topology.bad_rate(turn) else "good"
                return {"turn": turn, "choice": choice}

            if turn in topology.handoff:  # the sub-agent decides; its answer is the delegate tool's result
                decision = ctx.llm("chat", produce=lambda turn=turn: _count(calls, {"turn": turn}), messages=history)
                history = [*history, {"role": "assistant", "tool_call": decision}]

                def research(turn: int = turn) -> str:
                    calls.n += 1
                    if recording:
                        return topology.forced.get(turn, "good")
                    return "bad" if ctx.rng.random() < topology.bad_rate(turn) else "good"

                answer = ctx.llm("researcher", produce=research, messages=[{"role": "system", "content": turn}])
                result = ctx.tool("delegate", produce=lambda turn=turn, answer=answer: _count(calls, work(turn, answer)),
                                  turn=turn, answer=answer)
                results.append(json.loads(result))
                history = [*history, {"role": "tool", "content": result}]
                continue
            decision = ctx.llm("chat", produce=decide, messages=history)
            history = [*history, {"role": "assistant", "tool_call": decision}]
            name = topology.tools.get(turn, "work")

            def tool(decision: dict[str, Any] = decision, turn: int = turn) -> str:
                calls.n += 1
                rate = topology.flaky.get(turn, P_BAD if turn in topology.corrupt else 0.0)
                corrupt = turn in topology.corrupt if recording else rate > 0 and ctx.rng.random() < rate
                return work(turn, "bad" if corrupt else decision["choice"])

            result = ctx.tool(name, produce=tool, resamplable=name != "audit", **decision)
            results.append(json.loads(result))
            history = [*history, {"role": "tool", "content": result}]

        def answer() -> str:
            calls.n += 1
            failing = topology.fails([r["choice"] for r in results])
            if failing and not recording and topology.catches and ctx.rng.random() < topology.catches:
                return "OK"
            return "FAIL" if failing else "OK"

        final = ctx.llm("chat", produce=answer, messages=history)
        chance = {"by_chance": P_BAD, "coin": COIN}.get(topology.verifier)
        if chance is not None and ctx.rng.random() < chance:  # the verifier fails the run by chance
            return "FAIL"
        if topology.verifier == "flips" and ctx.rng.random() < FLIP:  # a noisy verifier
            return "OK" if final == "FAIL" else "FAIL"
        return final
    return run


def _count(calls: _Calls, value: Any) -> Any:
    calls.n += 1
    return value


def _to_our_index(topology: Topology, index: int | None) -> int | None:
    """agent_replay records a handoff turn as llm, sub-agent llm, tool; our trace has the tool span
    first (the sub-agent's span nests inside it): map its step index onto ours."""
    if index is None:
        return None
    theirs: list[tuple[str, int]] = []
    ours: list[tuple[str, int]] = []
    for turn in range(topology.turns):
        sub = turn in topology.handoff
        theirs += [("llm", turn), *([("sub", turn)] if sub else []), ("tool", turn)]
        ours += [("llm", turn), ("tool", turn), *([("sub", turn)] if sub else [])]
    theirs.append(("answer", 0))
    ours.append(("answer", 0))
    return ours.index(theirs[index])


def _verifier(result: Any) -> float:
    return 1.0 if result == "OK" else 0.0


def agent_replay_case(topology: Topology, seed: int) -> dict[str, Any] | None:
    """agent_replay's contrastive attribution (its Point-of-Commitment rule) of one planted case, at its
    defaults; None when agent_replay is not installed."""
    ar = agent_replay_module()
    if ar is None:
        return None
    calls = _Calls()
    question = f"Run the {topology.name} task."
    with ar.Session(":memory:") as session:
        for record_seed in range(seed, seed + 1000):  # the control: a seed whose recorded run failed by chance
            traj = session.record(_agent(topology, calls, recording=True), {"question": question},
                                  seed=record_seed, verifier=_verifier)
            if _verifier(traj.result) == 0.0:  # a run the verifier failed (by chance, for the controls)
                break
    if len(traj.steps) != 2 * topology.turns + 1 + len(topology.handoff):
        raise AssertionError(f"agent_replay recorded {len(traj.steps)} steps for {topology.name}")
    calls.n = 0
    started = time.perf_counter()
    rollouts = inspect.signature(ar.attribute).parameters["rollouts"].default
    result = ar.attribute(traj, _agent(topology, calls, recording=False), _verifier, method="contrastive",
                          base_seed=1000 + seed)
    return {"predicted": _to_our_index(topology, result.culprit_index), "policy_calls": calls.n,
            "wall_s": time.perf_counter() - started, "rollouts": rollouts}


def tracefork_reported(executable: str | None = None) -> dict[str, Any]:
    """Run tracefork's `validate` and `bench` in a scratch directory and return their headline
    figures from the reports they write; {"skipped": why} when no executable is configured."""
    exe = executable or os.environ.get(TRACEFORK_ENV) or shutil.which("tracefork")
    if not exe:
        return {"skipped": f"tracefork not found (it needs Python >= 3.12: install it in its own venv and set "
                           f"{TRACEFORK_ENV} to its `tracefork` executable)"}
    out: dict[str, Any] = {"executable": exe}
    with tempfile.TemporaryDirectory(prefix="otel-replay-tracefork-") as work_dir:
        for command in ("validate", "bench"):
            done = subprocess.run([exe, command], cwd=work_dir, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                out[command] = {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
                continue
            report = json.loads(Path(work_dir, f"{'validation' if command == 'validate' else 'bench'}_report.json")
                                .read_text())
            if command == "validate":
                out[command] = {"top1": report["overall_top1_precision"],
                                "negative_control_max_flip": report["negative_control_max_flip"],
                                "classes": len(report["top1_precision_by_class"]),
                                "runs_per_class": report["n_runs_per_class"]}
            else:
                out[command] = {"resolved": report["n_resolved"], "cases": report["n_cases"],
                                "accuracy": report["accuracy"]}
    return out


def format_tracefork(reported: dict[str, Any]) -> str:
    if "skipped" in reported:
        return f"tracefork: skipped — {reported['skipped']}."
    parts = []
    v, b = reported.get("validate", {}), reported.get("bench", {})
    if "top1" in v:
        parts.append(f"`tracefork validate`: top-1 {v['top1']:.2f} over {v['classes']} injected fault classes x "
                     f"{v['runs_per_class']} runs, negative-control max flip {v['negative_control_max_flip']:.2f}")
    elif v:
        parts.append(f"`tracefork validate` failed: {v['error']}")
    if "resolved" in b:
        parts.append(f"`tracefork bench`: {b['resolved']}/{b['cases']} competing planted causes resolved")
    elif b:
        parts.append(f"`tracefork bench` failed: {b['error']}")
    return ("tracefork, as reported by its own commands on its own fixtures (not these cases): "
            + "; ".join(parts) + ".")
