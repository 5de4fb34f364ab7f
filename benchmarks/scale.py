"""Scale benchmark: attribution throughput on one machine and on Ray, and store cost by size.

1. Throughput. The 5-step planted agent of the attribution benchmark (decide, work, decide,
   work, answer), every step re-decided, so a rollout makes 5 policy calls; each policy awaits
   `asyncio.sleep(POLICY_LATENCY_S)` (a model or tool call's latency) and then answers. The same
   rollouts (same seeds) run through the local executor (a thread pool; each thread runs the
   async policies on its own event loop) at concurrency 1..64 and through the Ray executor with
   1..N workers on this machine (Ray actors, one rollout at a time each; workers that mostly sleep
   oversubscribe the CPUs: each reserves `RAY_WORKER_CPUS` CPUs). The rows must agree across engines. With instant
   policies the rate is CPU-bound, which gives the CPU cost of a rollout. A real attribution job
   on the same agent gives the rollouts one verdict takes; from those, the 100-node arithmetic.
2. Store. Synthetic GenAI agent traces of 10 spans (`scale_store`) written as segments through
   the store's writer, compacted, then: one trace's trajectory (what `attribute` loads), one
   trace's spans (what `export` reads), and a step-name aggregate over every step. Time per span
   between sizes shows whether cost grows linearly with the traces stored; bytes per span too.

Stores live in temporary directories, removed. Ray is optional (`pip install 'otel-replay[ray]'`):
without it the Ray rows say skipped.
"""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.attribution import LATENCY_STEPS, PlantedAgent, planted_policies, store_agent
from benchmarks.scale_store import build_store, query_times, word_pool
from otel_replay.attribution import Job, JobParams
from otel_replay.attribution.executors import Executor, RayExecutor
from otel_replay.attribution.plans import Budget, RolloutSpec, boundary_plan
from otel_replay.attribution.rollouts import RolloutRunner
from otel_replay.attribution.verifiers import build as build_verifier
from otel_replay.replay.policies import Registry
from otel_replay.trajectory import Store, Trajectory

POLICY_LATENCY_S = 0.2
LOCAL_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
RAY_WORKERS = (1, 2, 4, 8, 16)
RAY_WORKER_CPUS = 0.125  # 16 workers, sleeping most of the time, on 2 CPUs
STORE_SIZES = (10**5, 10**6, 10**7)
QUICK_LOCAL, QUICK_RAY, QUICK_SIZES = (1, 8, 64), (1, 4), (10**4, 10**5)
MIN_ROLLOUTS = 4  # per throughput point; at least two waves of the concurrency
INSTANT_ROLLOUTS, QUICK_INSTANT_ROLLOUTS = 400, 100
SLEEPY = "benchmarks.scale:sleepy_policies"
INSTANT = "benchmarks.scale:instant_policies"
VERIFIER = "benchmarks.attribution:answered_ok"
SEED = 0
CLUSTER_NODES = 100
NODE_CPUS = 16  # assumed per node of the hypothetical cluster
AGENT = PlantedAgent.of(LATENCY_STEPS)


# -- policies importable by name (Ray workers rebuild them from these specs) ------------------------
def _delayed(fn: Callable[..., Any]) -> Callable[..., Any]:
    async def policy(*args: Any) -> Any:
        await asyncio.sleep(POLICY_LATENCY_S)
        return fn(*args)
    return policy


def sleepy_policies(registry: Registry) -> None:
    """The planted agent's policies, each awaiting POLICY_LATENCY_S first."""
    base = planted_policies(AGENT)
    registry.register("llm", None, _delayed(base.resolve("llm", None)))
    registry.register("tool", "work", _delayed(base.resolve("tool", "work")))


def instant_policies(registry: Registry) -> None:
    base = planted_policies(AGENT)
    registry.register("llm", None, base.resolve("llm", None))
    registry.register("tool", "work", base.resolve("tool", "work"))


def _registry(hook: Callable[[Registry], None]) -> Registry:
    registry = Registry()
    hook(registry)
    return registry


# -- throughput -------------------------------------------------------------------------------------
def _point(trajectory: Trajectory, registry: Registry, n: int, concurrency: int,
           executor: Executor | None = None) -> dict[str, Any]:
    """n rollouts (every step re-decided) through one executor; rate and the rows' identity."""
    runner = RolloutRunner("bench-scale", registry, build_verifier(VERIFIER), 0.5, SEED, concurrency, Budget(None),
                           executor=executor)
    plan = boundary_plan([s.index for s in trajectory.steps], 0)
    specs = [RolloutSpec(plan, 0, "boundary", r) for r in range(n)]
    started = time.perf_counter()
    rows = runner.run(trajectory, specs)
    wall = time.perf_counter() - started
    if len(rows) != n or any(r["failed"] is None for r in rows):
        raise RuntimeError(f"{n - len(rows)} of {n} rollouts missing or unscored: {rows[:1]}")
    return {"rollouts": n, "wall_s": wall, "rate": n / wall, "policy_calls": sum(r["policy_calls"] for r in rows),
            "identity": [(r["seed"], r["score"], r["failed"], r["digest"]) for r in rows[:MIN_ROLLOUTS]]}


def _local(trajectory: Trajectory, levels: tuple[int, ...]) -> list[dict[str, Any]]:
    registry = _registry(sleepy_policies)
    return [{"engine": "local", "concurrency": c, **_point(trajectory, registry, max(MIN_ROLLOUTS, 2 * c), c)}
            for c in levels]


def _ray(trajectory: Trajectory, levels: tuple[int, ...], instant_n: int) -> dict[str, Any]:
    try:
        import ray
    except ImportError:
        return {"skipped": "ray is not installed (pip install 'otel-replay[ray]')"}
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    try:
        sleepy, instant = _registry(sleepy_policies), _registry(instant_policies)
        points, startup = [], 0.0
        for w in levels:
            began = time.perf_counter()
            executor = RayExecutor(SLEEPY, VERIFIER, workers=w, worker_cpus=RAY_WORKER_CPUS, rollouts_per_task=1,
                                   registry=sleepy)  # returns once every worker has loaded the policies
            startup += time.perf_counter() - began
            points.append({"engine": "ray", "concurrency": w,
                           **_point(trajectory, sleepy, max(MIN_ROLLOUTS, 2 * w), w, executor)})
            executor.close()
        fast = RayExecutor(INSTANT, VERIFIER, workers=max(levels), worker_cpus=RAY_WORKER_CPUS, registry=instant)
        cpu = _point(trajectory, instant, instant_n, max(levels), fast)
        fast.close()
        return {"points": points, "startup_s": startup, "instant": {"workers": max(levels), **cpu},
                "resources": {k: float(v) for k, v in ray.cluster_resources().items() if k in ("CPU", "memory")}}
    finally:
        if started_here:
            ray.shutdown()


def _verdict(root: Path, trace_id: str) -> dict[str, Any]:
    """One real attribution job on the agent (instant policies): the rollouts a verdict takes."""
    (result,) = Job(Store(root), JobParams([trace_id], VERIFIER, seed=SEED, concurrency=4),
                    _registry(instant_policies)).run()
    return {"rollouts": result.rollouts, "policy_calls": result.policy_calls, "verdict": result.verdict,
            "culprit": result.culprit["index"] if result.culprit else None, "planted": AGENT.culprit}


def run_throughput(quick: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="otel-replay-bench-scale-"))
    try:
        trace_id = store_agent(root, AGENT)
        trajectory = Store(root).trajectory(trace_id)
        local = _local(trajectory, QUICK_LOCAL if quick else LOCAL_CONCURRENCY)
        instant_n = QUICK_INSTANT_ROLLOUTS if quick else INSTANT_ROLLOUTS
        local_cpu = _point(trajectory, _registry(instant_policies), instant_n, 2)
        ray = _ray(trajectory, QUICK_RAY if quick else RAY_WORKERS, instant_n)
        verdict = _verdict(root, trace_id)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    reference = local[0]["identity"]
    points = local + ray.get("points", [])
    for p in points:
        p["same_rows"] = p.pop("identity") == reference
    for instant in (local_cpu, ray.get("instant")):
        if instant:  # instant policies answer as the sleeping ones do: the same rows
            instant["same_rows"] = instant.pop("identity") == reference
    return {"latency_s": POLICY_LATENCY_S, "steps": AGENT.steps, "calls_per_rollout": points[0]["policy_calls"] /
            points[0]["rollouts"], "points": points, "local_instant": {"concurrency": 2, **local_cpu},
            "ray": {k: v for k, v in ray.items() if k != "points"}, "verdict": verdict}


# -- store ------------------------------------------------------------------------------------------
@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """DuckDB draws a progress bar on stdout (fd 1) for queries over 2 s; keep it out of the table."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as sink:
            os.dup2(sink.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def run_store(sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    pool = word_pool()
    out = []
    for spans in sizes:
        root = Path(tempfile.mkdtemp(prefix="otel-replay-bench-scale-store-"))
        try:
            with _no_progress_bars():
                built = build_store(root, spans, pool)
                out.append({**built, **query_times(root)})
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return out


def cluster_estimate(throughput: dict[str, Any]) -> dict[str, Any] | None:
    """Rollouts and verdicts per hour on CLUSTER_NODES nodes, from the per-worker Ray rate here
    (at the most workers measured: contention included)."""
    ray_points = [p for p in throughput["points"] if p["engine"] == "ray"]
    if not ray_points:
        return None
    widest = max(ray_points, key=lambda p: p["concurrency"])
    per_worker = widest["rate"] / widest["concurrency"]
    workers_per_node = NODE_CPUS / RAY_WORKER_CPUS
    cpu_s = (throughput["ray"]["resources"].get("CPU") or 2.0) / throughput["ray"]["instant"]["rate"]
    node_rate = min(workers_per_node * per_worker, NODE_CPUS / cpu_s)
    per_hour = CLUSTER_NODES * node_rate * 3600
    rollouts_per_verdict = throughput["verdict"]["rollouts"]
    return {"workers_measured": widest["concurrency"], "per_worker": per_worker, "workers_per_node": workers_per_node, "cpu_s_per_rollout": cpu_s,
            "node_rate": node_rate, "rollouts_per_hour": per_hour, "rollouts_per_verdict": rollouts_per_verdict,
            "verdicts_per_hour": per_hour / rollouts_per_verdict, "nodes": CLUSTER_NODES, "node_cpus": NODE_CPUS}


def run_scale_bench(quick: bool = False, sizes: tuple[int, ...] | None = None) -> dict[str, Any]:
    throughput = run_throughput(quick)
    store = run_store(tuple(sizes) if sizes else QUICK_SIZES if quick else STORE_SIZES)
    return {"quick": quick, "throughput": throughput, "store": store, "cluster": cluster_estimate(throughput),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, CPython {platform.python_version()}"}


# -- the table --------------------------------------------------------------------------------------
def _ratio_lines(store: list[dict[str, Any]]) -> list[str]:
    lines = []
    for small, big in zip(store, store[1:], strict=False):
        grow = big["spans"] / small["spans"]
        per_span = {k: (big[k] / big["spans"]) / (small[k] / small["spans"])
                    for k in ("aggregate_s", "compact_s", "write_s")}
        lines.append(
            f"{small['spans']:,} -> {big['spans']:,} spans ({grow:.0f}x): time per span x{per_span['aggregate_s']:.2f} "
            f"for the aggregate, x{per_span['compact_s']:.2f} for compaction, x{per_span['write_s']:.2f} for writing "
            f"(1.00 = linear, below = better); one trajectory takes x{big['trajectory_s'] / small['trajectory_s']:.2f} "
            f"the time, one trace's spans x{big['trace_spans_s'] / small['trace_spans_s']:.2f} and the query alone "
            f"x{big['trace_sql_s'] / small['trace_sql_s']:.2f} (1.00 = independent of the store's size); bytes per span x{big['bytes_per_span'] / small['bytes_per_span']:.2f}.")
    return lines


def _cluster_lines(result: dict[str, Any]) -> list[str]:
    c, t = result["cluster"], result["throughput"]
    if c is None:
        return ["100-node estimate: skipped (no Ray measurement)."]
    return [
        f"100-node Ray cluster, from the measured per-worker rate: {c['workers_measured']} Ray workers here ran "
        f"{c['per_worker']:.2f} rollouts/s each ({t['calls_per_rollout']:.0f} policy calls of "
        f"{1000 * t['latency_s']:.0f} ms each per rollout). Assume "
        f"{c['node_cpus']}-CPU nodes running workers of {RAY_WORKER_CPUS} CPU as here: {c['workers_per_node']:.0f} "
        f"workers x {c['per_worker']:.2f} = {c['workers_per_node'] * c['per_worker']:.0f} rollouts/s per node, "
        f"capped by CPU at {c['node_cpus']} / {c['cpu_s_per_rollout'] * 1000:.1f} ms CPU per rollout = "
        f"{c['node_cpus'] / c['cpu_s_per_rollout']:.0f}/s (measured with instant policies, Ray overhead included) "
        f"-> {c['node_rate']:.0f} rollouts/s per node x {c['nodes']} nodes x 3600 s = {c['rollouts_per_hour']:,.0f} "
        f"rollouts/hour; a verdict on this agent took {c['rollouts_per_verdict']} rollouts, so "
        f"~{c['verdicts_per_hour']:,.0f} attributed traces/hour.",
        "Assumptions: the model endpoints keep their latency and accept that many concurrent calls (at "
        f"{c['node_rate'] * c['nodes'] * t['calls_per_rollout']:,.0f} calls/s, rate limits bind first); rollouts "
        "are spread over many jobs (a job runs one trace's boundary pair at a time: at most 2 x --rollouts rollouts "
        "in flight, so ~60 workers per job, and each driver handles every row of its job), e.g. one job per shard of "
        "`--where`; longer agents make rollouts proportionally slower and verdicts costlier.",
    ]


def format_scale_table(result: dict[str, Any]) -> str:
    t = result["throughput"]
    lines = [f"Attribution throughput: {t['steps']}-step agent, every step re-decided, {t['calls_per_rollout']:.0f} "
             f"policy calls per rollout, each awaiting {1000 * t['latency_s']:.0f} ms ({result['machine']}).", "",
             "| engine | concurrency / workers | rollouts | wall s | rollouts/s | per worker | policy calls/s | same rows |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for p in t["points"]:
        lines.append(f"| {p['engine']} | {p['concurrency']} | {p['rollouts']} | {p['wall_s']:.2f} | {p['rate']:.2f} | "
                     f"{p['rate'] / p['concurrency']:.2f} | {p['policy_calls'] / p['wall_s']:.1f} | "
                     f"{'yes' if p['same_rows'] else 'NO'} |")
    li = t["local_instant"]
    lines += ["", f"Instant policies (CPU-bound): local threads at 2: {li['rate']:.0f} rollouts/s"]
    ray = t["ray"]
    if "skipped" in ray:
        lines[-1] += f"; Ray: skipped ({ray['skipped']})."
    else:
        lines[-1] += (f"; Ray, {ray['instant']['workers']} workers, up to 8 rollouts per call: {ray['instant']['rate']:.0f} "
                      f"rollouts/s. Ray workers reserve {RAY_WORKER_CPUS} CPU each (sleeping workers oversubscribe "
                      f"the {ray['resources'].get('CPU', 0):.0f} CPUs); starting the worker processes took "
                      f"{ray['startup_s']:.1f} s in all, not counted.")
    v = t["verdict"]
    lines.append(f"A verdict on this agent (the defaults: rollouts until each step is decided): {v['rollouts']} rollouts, "
                 f"{v['policy_calls']} policy calls, culprit step {v['culprit']} (planted {v['planted']}).")
    lines += ["", "Store: synthetic agent traces of 10 spans, written as segments, compacted, queried "
              "(median of 5, warm page cache, a fresh DuckDB connection each).", "",
              "| spans | traces | segments | write s | compact s | bytes/span | one trajectory ms | one trace's spans ms "
              "| ... on an open connection ms | step-name aggregate ms | aggregate ns/span |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in result["store"]:
        lines.append(f"| {s['spans']:,} | {s['traces']:,} | {s['segments']} | {s['write_s']:.1f} | {s['compact_s']:.1f} | "
                     f"{s['bytes_per_span']:.0f} | {1000 * s['trajectory_s']:.0f} | {1000 * s['trace_spans_s']:.0f} | "
                     f"{1000 * s['trace_sql_s']:.1f} | {1000 * s['aggregate_s']:.0f} | {1e9 * s['aggregate_s'] / s['spans']:.0f} |")
    lines += ["", *_ratio_lines(result["store"]), "", *_cluster_lines(result)]
    return "\n".join(lines)
