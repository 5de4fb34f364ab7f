"""Accuracy benchmark: does attribution name the planted culprit, across fault topologies?

Each case is a real agent run (the real `openai` SDK against the simulated model over HTTP, the
real OpenTelemetry instrumentation, `ReplayProcessor` into a store) whose culprit and every step's
true effect are known by construction (`otel_replay.testing.planted`). otel-replay attributes it
at the defaults of `otel-replay attribute`; agent_replay attributes the same agent written with
its own API (`accuracy_anchors`), at its defaults; the same recorded trace is also judged by
baselines that read the frozen trace or skip the Point-of-Commitment rule: last step, first
errored step, and max-magnitude (the largest contrastive effect from a full profile, without
taking the latest significant step).

Per case it records the verdict, the step named, every verdict the true effects contradict (a
step called decisive that is not the planted culprit, or contributing with no real effect, and
any blame on a control), and whether each reported interval covers its step's true effect.

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

from benchmarks.accuracy_anchors import (
    agent_replay_case,
    format_tracefork,
    tracefork_reported,
)
from benchmarks.machine import load_average
from otel_replay.attribution import Job, JobParams
from otel_replay.attribution.plans import rollout_seed
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.planted import (
    TOPOLOGIES,
    VERIFIERS,
    Topology,
    planted_registry,
    record_planted,
    replay_model,
    true_effects,
    verifier_spec,
)
from otel_replay.trajectory import Store

SEEDS = 5
SEARCH = "scan"  # the contrastive search the benchmark measures: the default of `otel-replay attribute`
PROFILE_ROLLOUTS = 10  # per plan of the max-magnitude baseline's full profile (it needs a ranking, not tight intervals)
EPSILON = 0.1  # the default band


def job_seed(topology: Topology, trace_id: str, final_output: str, seed: int) -> int:
    """The first job seed from `seed` on whose factual rollout the topology's verifier fails (a verifier
    that fails at random must fail the recorded run, as it did when the run was flagged)."""
    verifier = VERIFIERS[topology.verifier]
    for candidate in range(seed, seed + 1000):
        fake = type("Run", (), {"seed": rollout_seed(candidate, trace_id, 0), "plan": "factual"})()
        if verifier(final_output, fake) < 0.5:
            return candidate
    raise RuntimeError(f"no job seed makes the {topology.verifier} verifier fail {topology.name}'s recorded run")


def judge(topology: Topology, steps: list[dict[str, Any]], epsilon: float = EPSILON) -> dict[str, Any]:
    """What the true effects say of a result's step verdicts: the claims they contradict and which
    reported intervals cover them (None where the enumeration does not model the topology)."""
    effects = true_effects(topology)
    false_decisive = [s["index"] for s in steps if s["verdict"] == "decisive" and s["index"] != topology.culprit]
    covered: list[bool] = []
    if effects is None:
        return {"false_decisive": false_decisive, "false_contributing": [], "false_cleared": [], "covered": None}
    false_contributing = [s["index"] for s in steps if s["verdict"] == "contributing" and effects[s["index"]] <= epsilon]
    false_cleared = [s["index"] for s in steps if s["verdict"] in ("locked-in", "no effect")
                     and abs(effects[s["index"]]) > epsilon]
    for s in steps:
        if s.get("ci_low") is not None:
            covered.append(s["ci_low"] - 1e-9 <= effects[s["index"]] <= s["ci_high"] + 1e-9)
    return {"false_decisive": false_decisive, "false_contributing": false_contributing,
            "false_cleared": false_cleared, "covered": covered}


class _Clock:
    """CPU seconds of this process (all its threads) per phase of a case."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._at = time.process_time()

    def lap(self, phase: str) -> None:
        now = time.process_time()
        self.phases[phase] = round(now - self._at, 3)
        self._at = now


def _case(root: Path, topology: Topology, seed: int, rollouts: int | None, max_magnitude: bool) -> dict[str, Any]:
    clock = _Clock()
    trace_id = record_planted(root, topology, model_seed=seed)
    store = Store(root)
    traj = store.trajectory(trace_id)
    clock.lap("record")
    with SimulatedModelServer(replay_model(topology, seed)) as server:
        registry = planted_registry(topology, server.base_url)
        job = Job(store, JobParams([trace_id], verifier_spec(topology), rollouts=rollouts,
                                   seed=job_seed(topology, trace_id, traj.final_output, seed), concurrency=8,
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
    theirs = agent_replay_case(topology, seed)
    clock.lap("agent_replay")
    judged = judge(topology, result.steps)
    return {
        "topology": topology.name, "seed": seed, "truth": topology.culprit, "verdict": result.verdict,
        "predicted": culprit["index"] if culprit else None, "candidates": result.candidates,
        "agent_correct": (culprit is not None and topology.culprit is not None
                          and by_agent.get(culprit["index"]) == by_agent.get(topology.culprit)),
        "covered": (culprit is not None and topology.effect is not None
                    and culprit["ci_low"] <= topology.effect <= culprit["ci_high"]),
        "intervals_covered": judged["covered"],
        "false_decisive": judged["false_decisive"], "false_contributing": judged["false_contributing"],
        "false_cleared": judged["false_cleared"],
        "policy_calls": result.policy_calls, "rollouts": result.rollouts, "wall_s": wall, "steps": len(traj.steps),
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
    profile = replace(params, rollouts=PROFILE_ROLLOUTS, full=True, search="scan")
    job = Job(store, profile, registry) if reuse is None else Job(store, profile, registry, job_id=reuse)
    (full,) = job.run()
    scored = [s for s in full.steps if s["estimate"] is not None]
    return (max(scored, key=lambda s: s["estimate"])["index"] if scored else None), full.steps


def _run_case(spec: tuple[str, int, int | None, bool, str]) -> dict[str, Any]:
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


def _run_cases(specs: list[tuple[str, int, int | None, bool, str]], workers: int, loads: list[float]
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
    rollouts = None  # the defaults: each step sampled until its interval decides it
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


TARGETS = {"top1_decided": 0.95, "top1": 0.90, "undecided": 0.10, "false_decisive": 0.05, "calls_ratio": 0.25}


def _claims_wrong(case: dict[str, Any]) -> bool:
    """A blamed step the truth contradicts: decisive but not the planted culprit, contributing with no
    effect beyond the band, or any blame on a control."""
    if case["truth"] is None:
        return case["predicted"] is not None or bool(case["false_decisive"] or case["false_contributing"])
    return bool(case["false_decisive"] or case["false_contributing"])


def summarize(cases: list[dict[str, Any]]) -> dict[str, float | None]:
    faulty = [c for c in cases if c["truth"] is not None]
    controls = [c for c in cases if c["truth"] is None]
    decided = [c for c in faulty if c["verdict"] in ("culprit-found", "no-culprit")]
    right = [c for c in faulty if c["predicted"] == c["truth"]]
    intervals = [hit for c in cases for hit in (c.get("intervals_covered") or [])]
    theirs = [c for c in cases if c.get("agent_replay")]
    ours_calls = sum(c["policy_calls"] for c in theirs) / len(theirs) if theirs else None
    their_calls = sum(c["agent_replay"]["policy_calls"] for c in theirs) / len(theirs) if theirs else None
    return {"top1": len(right) / max(1, len(faulty)),
            "top1_decided": sum(c["predicted"] == c["truth"] for c in decided) / max(1, len(decided)),
            "undecided": sum(c["verdict"] == "undecided" for c in faulty) / max(1, len(faulty)),
            "false_decisive": sum(_claims_wrong(c) for c in cases) / max(1, len(cases)),
            "false_decisive_faulty": sum(_claims_wrong(c) for c in faulty) / max(1, len(faulty)),
            "false_blame": sum(_claims_wrong(c) for c in controls) / max(1, len(controls)),
            "false_cleared": sum(bool(c["false_cleared"]) for c in cases) / max(1, len(cases)),
            "coverage": sum(c["covered"] for c in right) / max(1, len(right)),
            "intervals_coverage": sum(intervals) / len(intervals) if intervals else None,
            "calls": sum(c["policy_calls"] for c in cases) / max(1, len(cases)),
            "calls_ratio": ours_calls / their_calls if theirs and their_calls else None}


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def format_accuracy_table(result: dict[str, Any]) -> str:
    cases = result["cases"]
    names = list(dict.fromkeys(c["topology"] for c in cases))
    baselines = list(cases[0]["baselines"]) if cases else []
    anchor = any(c.get("agent_replay") for c in cases)
    head = ["topology", "steps", "culprit", "top-1", "undecided", "wrong blame", "intervals cover truth",
            "policy calls", *(["agent_replay top-1", "agent_replay policy calls"] if anchor else []),
            *[f"baseline: {b}" for b in baselines]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        rows = [c for c in cases if c["topology"] == name]
        truth = rows[0]["truth"]
        control = truth is None
        effect = TOPOLOGIES[name].effect if name in TOPOLOGIES else None
        top1 = (_rate([r["predicted"] is None for r in rows]) + " (no blame)") if control else _rate(
            [r["predicted"] == truth for r in rows])
        covered = [hit for r in rows for hit in (r.get("intervals_covered") or [])]
        cells = [name, str(rows[0]["steps"]),
                 "none" if control else f"step {truth}" + (f" ({effect:+.2f})" if effect is not None else ""),
                 top1, _rate([r["verdict"] == "undecided" for r in rows]), _rate([_claims_wrong(r) for r in rows]),
                 _rate(covered) if covered else "—", f"{sum(r['policy_calls'] for r in rows) / len(rows):,.0f}"]
        if anchor:
            theirs = [r["agent_replay"] for r in rows if r.get("agent_replay")]
            cells.append((_rate([t["predicted"] is None for t in theirs]) + " (no blame)") if control else
                         _rate([t["predicted"] == truth for t in theirs]))
            cells.append(f"{sum(t['policy_calls'] for t in theirs) / max(1, len(theirs)):,.0f}")
        for b in baselines:
            picks = [r["baselines"][b] for r in rows]
            cells.append("—" if control or all(p is None for p in picks) and b.startswith("max") else
                         _rate([p == truth for p in picks]))
        lines.append("| " + " | ".join(cells) + " |")
    summary = summarize(cases)
    faulty = [c for c in cases if c["truth"] is not None]
    rollouts = "until decided (the defaults)" if result.get("rollouts") is None else f"{result['rollouts']} per plan"
    lines += ["", f"Overall ({len(faulty)} faulty cases, {len(cases) - len(faulty)} controls, {result['seeds']} seed(s), "
                  f"rollouts {rollouts}, `--search {result.get('search', 'scan')}`): top-1 "
                  f"{_pct(summary['top1_decided'])} of decided verdicts and {_pct(summary['top1'])} of all faulty cases; "
                  f"undecided {_pct(summary['undecided'])} of faulty cases; wrong blame in {_pct(summary['false_decisive'])} "
                  f"of all cases ({_pct(summary['false_decisive_faulty'])} of faulty cases, {_pct(summary['false_blame'])} "
                  f"of controls); a step cleared (locked-in, no effect) whose true effect is outside ±{EPSILON:g} in "
                  f"{_pct(summary['false_cleared'])} of cases; {_pct(summary['intervals_coverage'])} of the reported "
                  f"intervals cover their step's true effect (simultaneous 95%), the named culprit's in "
                  f"{_pct(summary['coverage'])}; {summary['calls']:,.0f} policy calls per case on average.",
              f"Wrong blame: a step called decisive that is not the planted culprit, a step called contributing whose "
              f"true effect is not above +{EPSILON:g}, or any blame on a control. True effects are computed exactly from each "
              "topology's construction (`otel_replay.testing.planted.true_effects`); the sub-agent topology is "
              "judged on its culprit only."]
    for b in baselines:
        picks = [(c["baselines"][b], c["truth"]) for c in faulty]
        if all(p is None for p, _ in picks) and b.startswith("max"):
            continue
        lines.append(f"Baseline {b}: top-1 {100 * sum(p == t for p, t in picks) / max(1, len(picks)):.0f}%.")
    lines += _anchor_lines(cases, names)
    lines.append(_targets(summary))
    lines.append(format_tracefork(result.get("tracefork") or {"skipped": "not run"}))
    lines += _run_lines(result)
    return "\n".join(lines)


def _targets(summary: dict[str, float | None]) -> str:
    def mark(ok: bool) -> str:
        return "pass" if ok else "FAIL"

    t = TARGETS
    parts = [f"top-1 of decided >= {_pct(t['top1_decided'])}: {_pct(summary['top1_decided'])} "
             f"({mark((summary['top1_decided'] or 0) >= t['top1_decided'])})",
             f"top-1 of faulty >= {_pct(t['top1'])}: {_pct(summary['top1'])} ({mark((summary['top1'] or 0) >= t['top1'])})",
             f"undecided <= {_pct(t['undecided'])}: {_pct(summary['undecided'])} "
             f"({mark((summary['undecided'] or 0) <= t['undecided'])})",
             f"wrong blame <= {_pct(t['false_decisive'])}: {_pct(summary['false_decisive'])} "
             f"({mark((summary['false_decisive'] or 0) <= t['false_decisive'])})"]
    ratio = summary["calls_ratio"]
    parts.append(f"mean policy calls <= 1/4 of agent_replay's: {'—' if ratio is None else f'{ratio:.2f}'} "
                 f"({'not measured' if ratio is None else mark(ratio <= t['calls_ratio'])})")
    return "Targets: " + "; ".join(parts) + "."


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
    """agent_replay's accuracy and policy calls on the same cases."""
    judged = [c for c in cases if c.get("agent_replay")]
    if not judged:
        return ["agent_replay: skipped (not importable here; `pip install trajectory-causal-attribution`)."]
    faulty = [c for c in judged if c["truth"] is not None]
    controls = [c for c in judged if c["truth"] is None]
    top1 = sum(c["agent_replay"]["predicted"] == c["truth"] for c in faulty) / max(1, len(faulty))
    false_blame = sum(c["agent_replay"]["predicted"] is not None for c in controls) / max(1, len(controls))
    wrong = sum(c["agent_replay"]["predicted"] not in (None, c["truth"]) for c in faulty) / max(1, len(faulty))
    ours = sum(c["policy_calls"] for c in judged) / len(judged)
    theirs = sum(c["agent_replay"]["policy_calls"] for c in judged) / len(judged)
    cheaper = sum(sum(r["policy_calls"] for r in rows) < sum(r["agent_replay"]["policy_calls"] for r in rows)
                  for name in names if (rows := [c for c in judged if c["topology"] == name]))
    rollouts = judged[0]["agent_replay"]["rollouts"]
    return [f"agent_replay on the same agents (its contrastive method and Point-of-Commitment rule at its defaults, "
            f"{rollouts} rollouts per intervention): top-1 {100 * top1:.0f}% of faulty cases, a wrong step named in "
            f"{100 * wrong:.0f}%, blame on {100 * false_blame:.0f}% of controls; {theirs:,.0f} policy calls per case "
            f"against our {ours:,.0f} (ratio {ours / theirs:.2f}); fewer calls than agent_replay on {cheaper} of "
            f"{len(names)} topologies."]
