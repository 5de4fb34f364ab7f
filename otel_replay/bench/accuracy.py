"""Accuracy benchmark: does attribution name the planted culprit, across fault topologies?

Each case is a real agent run (the real `openai` SDK against the simulated model over HTTP, the
real OpenTelemetry instrumentation, `ReplayProcessor` into a store) whose culprit is known by
construction (`otel_replay.testing.planted`). otel-replay attributes it (`--search gallop`);
agent_replay attributes the same agent written with its own API (`accuracy_anchors`); the same recorded trace
is also judged by baselines that read the frozen trace or skip the Point-of-Commitment rule:
last step, first errored step, and max-magnitude (the largest contrastive effect from a full
profile, without taking the latest significant step).

Cases are independent, and each is a pure function of its topology and seed (seeded trace ids;
rollouts seeded by trace, plan and seed), so they run in one worker process per CPU and give the
rows of a serial run; the max-magnitude profile reads back the rollouts the attribution job
already ran instead of running them again.
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from otel_replay.attribution import Job, JobParams
from otel_replay.attribution.rollouts import rollout_seed
from otel_replay.bench.accuracy_anchors import (
    agent_replay_case,
    format_tracefork,
    tracefork_reported,
)
from otel_replay.bench.machine import load_average
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
PROFILE_ROLLOUTS = 10  # per plan of the max-magnitude baseline's full profile (it needs a ranking, not tight intervals)


def _control_seed(trace_id: str) -> int:
    """A job seed whose factual rollout the chance verifier fails (the run "failed by chance")."""
    for seed in range(1000):
        fake = type("Run", (), {"seed": rollout_seed(seed, trace_id, "factual", 0)})()
        if by_chance("OK", fake) == 0.0:
            return seed
    raise RuntimeError("no failing seed for the control")


class _Clock:
    """CPU seconds of this process (all its threads) per phase of a case."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._at = time.process_time()

    def lap(self, phase: str) -> None:
        now = time.process_time()
        self.phases[phase] = round(now - self._at, 3)
        self._at = now


def _case(root: Path, topology: Topology, seed: int, rollouts: int, max_magnitude: bool) -> dict[str, Any]:
    clock = _Clock()
    trace_id = record_planted(root, topology, model_seed=seed)
    store = Store(root)
    traj = store.trajectory(trace_id)
    verifier = "otel_replay.testing.planted:by_chance" if topology.chance else "otel_replay.testing.planted:ok"
    job_seed = _control_seed(trace_id) if topology.chance else seed
    clock.lap("record")
    with SimulatedModelServer(replay_model(topology, seed)) as server:
        registry = planted_registry(topology, server.base_url)
        job = Job(store, JobParams([trace_id], verifier, rollouts=rollouts, seed=job_seed, concurrency=8,
                                   search=SEARCH), registry)
        started = time.perf_counter()
        (result,) = job.run()
        wall = time.perf_counter() - started
        clock.lap("attribution")
        magnitude = None
        if max_magnitude:
            magnitude, _ = max_magnitude_profile(store, job.params, registry, reuse=job.job_id)
            clock.lap("max_magnitude")
    culprit = result.culprit
    llm_steps = [s.index for s in traj.steps if s.kind == "llm"]
    errored = [s.index for s in traj.steps if s.status == "error"]
    by_agent = {s.index: s.agent for s in traj.steps}
    theirs = agent_replay_case(topology, seed, rollouts)
    clock.lap("agent_replay")
    return {
        "topology": topology.name, "seed": seed, "truth": topology.culprit,
        "predicted": culprit["index"] if culprit else None,
        "agent_correct": (culprit is not None and topology.culprit is not None
                          and by_agent.get(culprit["index"]) == by_agent.get(topology.culprit)),
        "covered": (culprit is not None and topology.effect is not None
                    and culprit["ci_low"] <= topology.effect <= culprit["ci_high"]),
        "policy_calls": result.policy_calls, "wall_s": wall, "steps": len(traj.steps),
        "agent_replay": theirs,
        "baselines": {"last step": llm_steps[-1] if llm_steps else None,
                      "first errored step": errored[0] if errored else None,
                      "max magnitude (no PoC)": magnitude},
        "cpu_s": clock.phases,
    }


def max_magnitude_profile(store: Store, params: JobParams, registry: Any, reuse: str | None = None
                          ) -> tuple[int | None, list[dict[str, Any]]]:
    """The max-magnitude baseline: the step with the largest effect in a full profile (every step scored,
    `PROFILE_ROLLOUTS` a plan), without the Point-of-Commitment rule; and the profile's step rows.

    With `reuse`, the profile runs as that job (as a resume would). Its plans and seeds are that job's, so
    the rollouts the job already ran are the same rows: they are read back from the store and only the
    missing ones run."""
    profile = replace(params, rollouts=PROFILE_ROLLOUTS, full=True, search="scan", adaptive=False)
    job = Job(store, profile, registry) if reuse is None else Job(store, profile, registry, job_id=reuse)
    (full,) = job.run()
    scored = [s for s in full.steps if s["estimate"] is not None]
    return (max(scored, key=lambda s: s["estimate"])["index"] if scored else None), full.steps


def _run_case(spec: tuple[str, int, int, bool, str]) -> dict[str, Any]:
    """One case from plain arguments (what a worker process receives)."""
    name, seed, rollouts, max_magnitude, root = spec
    return _case(Path(root), TOPOLOGIES[name], seed, rollouts, max_magnitude)


def default_workers() -> int:
    """One worker process per CPU this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _cpu_s() -> float:
    """CPU seconds of this process and of its children that have ended (this process only without
    `resource`, which is POSIX)."""
    try:
        import resource
    except ImportError:
        return time.process_time()
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def _run_cases(specs: list[tuple[str, int, int, bool, str]], workers: int, loads: list[float]
               ) -> list[dict[str, Any]]:
    """Every case, in `specs` order; the 1-minute load average is appended to `loads` as each ends.

    Cases are independent and each is a pure function of its topology and seed (seeded trace ids,
    seeded rollouts), so running them in `workers` processes changes no row."""
    cases: list[dict[str, Any] | None] = [None] * len(specs)
    if workers <= 1:
        for i, spec in enumerate(specs):
            cases[i] = _run_case(spec)
            loads.append(_load_1min())
        return [c for c in cases if c is not None]
    # spawn, not fork: the parent may hold threads (a fork copies their locks in whatever state they are);
    # the long cases first, so the workers finish together
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        running = {pool.submit(_run_case, specs[i]): i
                   for i in sorted(range(len(specs)), key=lambda i: -TOPOLOGIES[specs[i][0]].turns)}
        for done in as_completed(running):
            cases[running[done]] = done.result()
            loads.append(_load_1min())
    return [c for c in cases if c is not None]


def _load_1min() -> float:
    return round((load_average() or [0.0])[0], 2)


def run_accuracy_bench(quick: bool = False, workers: int | None = None) -> dict[str, Any]:
    seeds = 1 if quick else SEEDS
    rollouts = 12 if quick else 20
    workers = max(1, min(workers or default_workers(), len(TOPOLOGIES) * seeds))
    work = Path(tempfile.mkdtemp(prefix="otel-replay-bench-accuracy-"))
    specs = [(topology.name, seed, rollouts, not quick, str(work / f"{topology.name}-{seed}"))
             for topology in TOPOLOGIES.values() for seed in range(seeds)]
    loads = [_load_1min()]
    started, cpu_before = time.perf_counter(), _cpu_s()
    try:
        cases = _run_cases(specs, workers, loads)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    elapsed, cpu = time.perf_counter() - started, _cpu_s() - cpu_before
    return {"quick": quick, "seeds": seeds, "rollouts": rollouts, "search": SEARCH, "cases": cases,
            # the cases only (tracefork runs after them); CPU of this process and its workers
            "run": {"workers": workers, "elapsed_s": round(elapsed, 1), "cpu_s": round(cpu, 1),
                    "load_avg_1min": loads},  # before the first case, then as each case ended
            "tracefork": {"skipped": "not run in --quick mode"} if quick else tracefork_reported(),
            "machine": f"{platform.machine()}, CPython {platform.python_version()}, {os.cpu_count()} CPUs"}


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
    lines += _run_lines(result)
    return "\n".join(lines)


def _run_lines(result: dict[str, Any]) -> list[str]:
    """How long the run took and where its CPU went (absent from results written before they were recorded)."""
    run = result.get("run")
    if not run:
        return []
    phases: dict[str, float] = {}
    for case in result["cases"]:
        for phase, seconds in (case.get("cpu_s") or {}).items():
            phases[phase] = phases.get(phase, 0.0) + seconds
    names = {"record": "recording the agent runs", "attribution": "our attribution",
             "max_magnitude": "the max-magnitude profile", "agent_replay": "agent_replay"}
    loads = run["load_avg_1min"]
    return [f"Run: {len(result['cases'])} cases in {run['elapsed_s'] / 60:.1f} min wall, "
            f"{run['cpu_s'] / 60:.1f} min CPU, {run['workers']} worker process(es); 1-minute load average "
            f"{loads[0]:.2f} at the start, {sum(loads) / len(loads):.2f} mean and {max(loads):.2f} max as the "
            f"cases ended (its own workers count in it); {result['machine']}.",
            "CPU by phase: " + ", ".join(f"{names.get(p, p)} {s:.0f} s" for p, s in phases.items()) + "."]


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
