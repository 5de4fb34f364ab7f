"""Accuracy benchmark: does attribution name the planted culprit, across fault topologies?

Each case is a real agent run (the real `openai` SDK against the simulated model over HTTP, the
real OpenTelemetry instrumentation, `ReplayProcessor` into a store) whose culprit is known by
construction (`otel_replay.testing.planted`). otel-replay attributes it (`--search gallop`);
agent_replay attributes the same agent written with its own API (`accuracy_anchors`); the same recorded trace
is also judged by baselines that read the frozen trace or skip the Point-of-Commitment rule:
last step, first errored step, and max-magnitude (the largest contrastive effect from a full
profile, without taking the latest significant step).
"""

from __future__ import annotations

import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from otel_replay.attribution import Job, JobParams
from otel_replay.attribution.rollouts import rollout_seed
from otel_replay.bench.accuracy_anchors import (
    agent_replay_case,
    format_tracefork,
    tracefork_reported,
)
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.planted import (
    TOPOLOGIES,
    Topology,
    by_chance,
    planted_registry,
    record_planted,
    replay_model,
)
from otel_replay.trajectory import Store

SEEDS = 5
SEARCH = "gallop"  # the contrastive search the benchmark measures (`otel-replay attribute --search gallop`)


def _control_seed(trace_id: str) -> int:
    """A job seed whose factual rollout the chance verifier fails (the run "failed by chance")."""
    for seed in range(1000):
        fake = type("Run", (), {"seed": rollout_seed(seed, trace_id, "factual", 0)})()
        if by_chance("OK", fake) == 0.0:
            return seed
    raise RuntimeError("no failing seed for the control")


def _case(root: Path, topology: Topology, seed: int, rollouts: int, max_magnitude: bool) -> dict[str, Any]:
    trace_id = record_planted(root, topology, model_seed=seed)
    store = Store(root)
    traj = store.trajectory(trace_id)
    verifier = "otel_replay.testing.planted:by_chance" if topology.chance else "otel_replay.testing.planted:ok"
    job_seed = _control_seed(trace_id) if topology.chance else seed
    with SimulatedModelServer(replay_model(topology, seed)) as server:
        registry = planted_registry(topology, server.base_url)
        started = time.perf_counter()
        (result,) = Job(store, JobParams([trace_id], verifier, rollouts=rollouts, seed=job_seed, concurrency=8,
                                      search=SEARCH),
                        registry).run()
        wall = time.perf_counter() - started
        magnitude = None
        if max_magnitude:
            # a full profile, to pick the largest effect without the Point-of-Commitment rule (10 rollouts a plan:
            # the baseline needs the ranking, not tight intervals)
            (full,) = Job(store, JobParams([trace_id], verifier, rollouts=10, seed=job_seed, concurrency=8,
                                           full=True), registry).run()
            scored = [s for s in full.steps if s["estimate"] is not None]
            magnitude = max(scored, key=lambda s: s["estimate"])["index"] if scored else None
    culprit = result.culprit
    llm_steps = [s.index for s in traj.steps if s.kind == "llm"]
    errored = [s.index for s in traj.steps if s.status == "error"]
    by_agent = {s.index: s.agent for s in traj.steps}
    return {
        "topology": topology.name, "seed": seed, "truth": topology.culprit,
        "predicted": culprit["index"] if culprit else None,
        "agent_correct": (culprit is not None and topology.culprit is not None
                          and by_agent.get(culprit["index"]) == by_agent.get(topology.culprit)),
        "covered": (culprit is not None and topology.effect is not None
                    and culprit["ci_low"] <= topology.effect <= culprit["ci_high"]),
        "policy_calls": result.policy_calls, "wall_s": wall, "steps": len(traj.steps),
        "agent_replay": agent_replay_case(topology, seed, rollouts),
        "baselines": {"last step": llm_steps[-1] if llm_steps else None,
                      "first errored step": errored[0] if errored else None,
                      "max magnitude (no PoC)": magnitude},
    }


def run_accuracy_bench(quick: bool = False) -> dict[str, Any]:
    seeds = 1 if quick else SEEDS
    rollouts = 12 if quick else 20
    work = Path(tempfile.mkdtemp(prefix="otel-replay-bench-accuracy-"))
    cases = []
    try:
        for topology in TOPOLOGIES.values():
            for seed in range(seeds):
                cases.append(_case(work / f"{topology.name}-{seed}", topology, seed, rollouts, max_magnitude=not quick))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"quick": quick, "seeds": seeds, "rollouts": rollouts, "search": SEARCH, "cases": cases,
            "tracefork": {"skipped": "not run in --quick mode"} if quick else tracefork_reported(),
            "machine": f"{platform.machine()}, CPython {platform.python_version()}"}


def _rate(values: list[bool]) -> str:
    return f"{100 * sum(values) / len(values):.0f}%" if values else "—"


def summarize(cases: list[dict[str, Any]]) -> dict[str, float]:
    faulty = [c for c in cases if c["truth"] is not None]
    controls = [c for c in cases if c["truth"] is None]
    right = [c for c in faulty if c["predicted"] == c["truth"]]
    return {"top1": len(right) / max(1, len(faulty)),
            "false_blame": sum(c["predicted"] is not None for c in controls) / max(1, len(controls)),
            "coverage": sum(c["covered"] for c in right) / max(1, len(right))}


def format_accuracy_table(result: dict[str, Any]) -> str:
    cases = result["cases"]
    names = list(dict.fromkeys(c["topology"] for c in cases))
    baselines = list(cases[0]["baselines"]) if cases else []
    anchor = any(c.get("agent_replay") for c in cases)
    head = ["topology", "steps", "culprit", "top-1", "agent", "interval covers effect", "policy calls", "wall s",
            *[f"baseline: {b}" for b in baselines],
            *(["agent_replay top-1", "agent_replay policy calls"] if anchor else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        rows = [c for c in cases if c["topology"] == name]
        truth = rows[0]["truth"]
        control = truth is None
        top1 = _rate([r["predicted"] is None for r in rows]) + " (no blame)" if control else _rate(
            [r["predicted"] == truth for r in rows])
        cover = "—" if control else _rate([r["covered"] for r in rows if r["predicted"] == truth])
        agent = "—" if control else _rate([r["agent_correct"] for r in rows])
        cells = [name, str(rows[0]["steps"]), "none" if control else f"step {truth}", top1, agent, cover,
                 f"{sum(r['policy_calls'] for r in rows) / len(rows):,.0f}",
                 f"{sum(r['wall_s'] for r in rows) / len(rows):.1f}"]
        for b in baselines:
            picks = [r["baselines"][b] for r in rows]
            cells.append("—" if control or all(p is None for p in picks) and b.startswith("max") else
                         _rate([p == truth for p in picks]))
        if anchor:
            theirs = [r["agent_replay"] for r in rows if r.get("agent_replay")]
            cells.append((_rate([t["predicted"] is None for t in theirs]) + " (no blame)") if control else
                         _rate([t["predicted"] == truth for t in theirs]))
            cells.append(f"{sum(t['policy_calls'] for t in theirs) / max(1, len(theirs)):,.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    summary = summarize(cases)
    faulty = [c for c in cases if c["truth"] is not None]
    lines += ["", f"Overall ({len(faulty)} faulty cases, {len(cases) - len(faulty)} controls, {result['seeds']} seed(s), "
                  f"{result['rollouts']} rollouts per plan, `--search {result.get('search', 'scan')}`): top-1 step accuracy {100 * summary['top1']:.0f}%, false blame "
                  f"on controls {100 * summary['false_blame']:.0f}%, interval coverage of the planted effect "
                  f"{100 * summary['coverage']:.0f}% (nominal 95%)."]
    for b in baselines:
        picks = [(c["baselines"][b], c["truth"]) for c in faulty]
        if all(p is None for p, _ in picks) and b.startswith("max"):
            continue
        lines.append(f"Baseline {b}: top-1 {100 * sum(p == t for p, t in picks) / max(1, len(picks)):.0f}%.")
    lines += _anchor_lines(cases, names)
    lines.append(format_tracefork(result.get("tracefork") or {"skipped": "not run"}))
    return "\n".join(lines)


def _anchor_lines(cases: list[dict[str, Any]], names: list[str]) -> list[str]:
    """agent_replay's accuracy on the same cases, and where we spend fewer policy calls than it does."""
    judged = [c for c in cases if c.get("agent_replay")]
    if not judged:
        return ["agent_replay: skipped (not importable here; `pip install trajectory-causal-attribution`)."]
    faulty = [c for c in judged if c["truth"] is not None]
    controls = [c for c in judged if c["truth"] is None]
    top1 = sum(c["agent_replay"]["predicted"] == c["truth"] for c in faulty) / max(1, len(faulty))
    false_blame = sum(c["agent_replay"]["predicted"] is not None for c in controls) / max(1, len(controls))
    fewer, both, ties = [], 0, []
    for name in names:
        rows = [c for c in judged if c["topology"] == name]
        if not all(r["predicted"] == r["truth"] and r["agent_replay"]["predicted"] == r["truth"] for r in rows):
            continue
        both += 1
        ours = sum(r["policy_calls"] for r in rows) / len(rows)
        theirs = sum(r["agent_replay"]["policy_calls"] for r in rows) / len(rows)
        (fewer if ours < theirs else ties).append(f"{name} ({ours:,.0f} vs {theirs:,.0f})")
    return [f"agent_replay on the same agents (its contrastive method and Point-of-Commitment rule, the same "
            f"{judged[0]['agent_replay']['rollouts']} rollouts per intervention): top-1 {100 * top1:.0f}%, false "
            f"blame on controls {100 * false_blame:.0f}%.",
            f"Fewer policy calls per verdict than agent_replay on {len(fewer)} of the {both} topologies where both "
            f"are right" + (f"; not fewer on: {', '.join(ties)}." if ties else ".")]
