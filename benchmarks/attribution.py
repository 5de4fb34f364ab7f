"""Attribution benchmark: policy calls and time to a correct verdict, beside `agent_replay`.

Three measurements, in one run:

1. Verdicts. Equivalent 6-step and 12-step planted-culprit agents: a tool-calling loop whose
   chat turns each decide a "choice" (good or bad) and call the `work` tool with it (the first
   turn makes two calls when the step count is even), then a chat that answers "OK", or "FAIL"
   when the last turn's choice was bad. The recorded run chose bad on the last turn only; a
   re-decided turn chooses bad with probability `P_BAD`. So the culprit is the last decision,
   three steps from the end, re-deciding it fixes the run 90% of the time, and every other step
   has no effect. otel-replay attributes the stored trace (contrastive backward scan at its
   defaults, rollouts added until each step is decided, and at a fixed `OTEL_ROLLOUTS` per plan);
   agent_replay attributes the same agent written with its API
   (`Session.record`, `ctx.llm` / `ctx.tool` with `produce=` callables drawing from `ctx.rng`),
   with method "contrastive" and "both" at the rollouts its README suggests (60). Policies are
   instant pure-Python functions on both sides (no HTTP), so what is compared is engine and
   statistics cost. Policy calls are counted by each side's own policies (a counter in every
   `produce=` callable for agent_replay; `AttributionResult.policy_calls` for otel-replay, which
   the benchmark checks against its own counter).
2. Statistics share: the wall time an otel-replay job spends in `otel_replay.attribution.stats`
   and in assembling the result (`step_rows`, `explain`), measured by wrapping those functions
   (nested calls counted once) with their caches cleared first, as in a fresh process, over the
   whole job's wall time (`Job.run()`). The job's store I/O (loading the trajectory, the resume
   query, writing its rollout, result and job rows) is timed the same way and shown beside it.
3. Concurrency: the same job (same seed, same result) on a small planted agent whose policies
   sleep `LATENCY_S` before answering (5 ms with --quick), at concurrency 1 and 32, with a fixed
   `OTEL_ROLLOUTS` per plan: the scan submits a step's two boundaries at once, so up to that many
   rollouts per boundary run together (at the defaults a look adds 10 to 23 rollouts per boundary,
   which bounds what concurrency can gain).

agent_replay (`pip install trajectory-causal-attribution`) is optional: when it is not importable
in this interpreter, its rows are marked skipped. Stores live in temporary directories, removed.
"""

from __future__ import annotations

import functools
import gc
import importlib
import json
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_replay.attribution import Job, JobParams
from otel_replay.attribution import job as job_module
from otel_replay.attribution import stats as stats_module
from otel_replay.normalize.records import SpanRecord
from otel_replay.replay.policies import Registry
from otel_replay.store.ingest import ingest
from otel_replay.trajectory import Store
from tests.harness.traces import TraceBuilder

ANCHOR_MODULE = "agent_replay"
ANCHOR_INSTALL = "pip install trajectory-causal-attribution"
STEP_COUNTS = (6, 12)
P_BAD = 0.1  # a re-decided turn chooses "bad" this often
OTEL_ROLLOUTS = 100  # otel-replay's fixed rollouts per boundary (enough to clear a step at epsilon 0.1)
ANCHOR_ROLLOUTS = 60  # agent_replay's per step (its README's suggestion)
VERIFIER = "benchmarks.attribution:answered_ok"
SEED = 0
LATENCY_S = 0.05
CONCURRENCY = (1, 32)
LATENCY_STEPS = 5  # the concurrency agent: decide, work, decide (the culprit), work, answer
TARGET_CALLS_RATIO = 1 / 5  # otel-replay's calls <= 1/5 of agent_replay's contrastive calls
TARGET_STATS_SHARE = 0.10
TARGET_SPEEDUP = 15.0
T0 = 1_767_225_600_000_000_000  # 2026-01-01
STATS_FUNCTIONS = ("wilson", "clopper_pearson", "paired_difference", "mean_interval")
ASSEMBLY_FUNCTIONS = ("step_rows", "explain")  # as job.py calls them


@dataclass(frozen=True)
class Sizes:
    repeats: int  # timed runs per configuration; the median wall time is reported
    latency_s: float  # how long each policy call of the concurrency job sleeps
    anchor_both: tuple[int, ...]  # the agent sizes agent_replay's method="both" runs on (it is slow)


QUICK = Sizes(repeats=1, latency_s=0.005, anchor_both=(6,))
FULL = Sizes(repeats=3, latency_s=LATENCY_S, anchor_both=STEP_COUNTS)


# -- the planted agent, as data ---------------------------------------------------------------------
@dataclass(frozen=True)
class PlantedAgent:
    """`per_turn[t]`: how many `work` calls chat turn t makes; the recorded run chose bad on the last."""

    steps: int
    per_turn: tuple[int, ...]

    @classmethod
    def of(cls, steps: int) -> PlantedAgent:
        if steps < 3:
            raise ValueError("a planted agent needs at least 3 steps (decide, work, answer)")
        turns = (steps - 1) // 2
        per_turn = [1] * turns
        per_turn[0] += steps - 1 - 2 * turns  # an even step count: the first turn makes two calls
        return cls(steps, tuple(per_turn))

    @property
    def culprit(self) -> int:
        """The step index of the last decision (the planted culprit)."""
        return self.steps - 2 - self.per_turn[-1]

    def recorded_choice(self, turn: int) -> str:
        return "bad" if turn == len(self.per_turn) - 1 else "good"

    def decision(self, turn: int, choice: str) -> dict[str, Any]:
        return {"role": "assistant", "parts": [
            {"type": "tool_call", "id": f"call_{turn}_{n}", "name": "work",
             "arguments": {"turn": turn, "call": n, "choice": choice}} for n in range(self.per_turn[turn])]}

    def answer(self, results: list[dict[str, Any]]) -> str:
        """The final answer from the tool results seen: FAIL when the last turn chose bad."""
        last = len(self.per_turn) - 1
        return "FAIL" if any(r.get("turn") == last and r.get("choice") == "bad" for r in results) else "OK"


SYSTEM = {"role": "system", "parts": [{"type": "text", "content": "Carry out the task one decision at a time."}]}
USER = {"role": "user", "parts": [{"type": "text", "content": "Run the planted task."}]}


def work_result(arguments: dict[str, Any]) -> str:
    """What the `work` tool returns: the call's own decision, echoed."""
    return json.dumps({"turn": arguments["turn"], "call": arguments["call"], "choice": arguments["choice"]})


def tool_message(call_id: str, response: str) -> dict[str, Any]:
    return {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": response}]}


def answered_ok(final_output: str, rollout: Any = None) -> float:
    """Verifier: the agent answered OK."""
    return 1.0 if final_output.strip() == "OK" else 0.0


class Counter:
    """Policy calls, counted by the policies themselves (thread-safe)."""

    def __init__(self) -> None:
        self.n = 0
        self._lock = threading.Lock()

    def tick(self) -> None:
        with self._lock:
            self.n += 1


# -- otel-replay: the agent as a stored trace, and instant policies ---------------------------------
def agent_spans(agent: PlantedAgent, trace: int = 1) -> list[SpanRecord]:
    """The recorded run as GenAI spans (invoke_agent root; chat and execute_tool children)."""
    trace_spans = TraceBuilder(trace, agent="planted")
    history: list[dict[str, Any]] = [SYSTEM, USER]
    results: list[dict[str, Any]] = []
    for turn in range(len(agent.per_turn) + 1):
        if turn < len(agent.per_turn):
            out = agent.decision(turn, agent.recorded_choice(turn))
        else:
            out = {"role": "assistant", "parts": [{"type": "text", "content": agent.answer(results)}]}
        trace_spans.chat(history, out)
        history = history + [out]
        for part in out["parts"]:
            if part["type"] == "tool_call":
                result = work_result(part["arguments"])
                results.append(json.loads(result))
                trace_spans.tool("work", part["id"], part["arguments"], result)
                history = history + [tool_message(part["id"], result)]
    return trace_spans.spans


def store_agent(root: Path, agent: PlantedAgent) -> str:
    """Ingest the agent's recorded run into the store at `root`; returns its trace id."""
    spans = agent_spans(agent)
    ingest(root, spans, source="bench:attribution")
    return spans[0].trace_id


def planted_policies(agent: PlantedAgent, counter: Counter | None = None, latency: float = 0.0) -> Registry:
    """An llm policy that re-decides a turn (bad with probability P_BAD) or answers from the
    results it was told; a `work` tool that echoes its call. Both optionally sleep first."""
    registry = Registry()

    def chat(step: Any, inputs: Any, rng: Any) -> Any:
        if latency:
            time.sleep(latency)
        if counter is not None:
            counter.tick()
        messages = inputs.messages
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn < len(agent.per_turn):
            return [agent.decision(turn, "bad" if rng.random() < P_BAD else "good")]
        results = [json.loads(p["response"]) for m in messages if m.get("role") == "tool"
                   for p in m.get("parts", []) if p.get("type") == "tool_call_response"]
        return agent.answer(results)

    def work(arguments: Any, rng: Any) -> str:
        if latency:
            time.sleep(latency)
        if counter is not None:
            counter.tick()
        return work_result(arguments)

    registry.register("llm", None, chat)
    registry.register("tool", "work", work)
    return registry


# -- statistics share: wrap the stats functions and the result assembly -----------------------------
class Clock:
    """Wall time inside wrapped functions, by bucket; a call nested in another wrapped call of the
    same thread counts once (in the outer call's bucket)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {"stats": 0.0, "assembly": 0.0, "store": 0.0}
        self._lock = threading.Lock()
        self._local = threading.local()

    def wrap(self, fn: Callable[..., Any], bucket: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._local, "inside", False):
                return fn(*args, **kwargs)
            self._local.inside = True
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                self._local.inside = False
                with self._lock:
                    self.seconds[bucket] += elapsed
        return timed


def clear_stats_caches() -> None:
    """Forget the interval caches, so a job pays what it would in a fresh process."""
    for name in ("clopper_pearson", "_log_choose"):
        cached = getattr(stats_module, name, None)
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


@contextmanager
def job_clock(job: Job) -> Iterator[Clock]:
    """Time the job's statistics, result assembly and store I/O (trajectory load, the resume
    query, every row write) by wrapping them for the duration; the statistics caches cleared."""
    clock = Clock()
    clear_stats_caches()  # before wrapping: the wrappers do not expose cache_clear
    patched: list[tuple[Any, str, Any]] = []
    for module, names, bucket in ((stats_module, STATS_FUNCTIONS, "stats"),
                                  (job_module, ASSEMBLY_FUNCTIONS, "assembly")):
        for name in names:
            original = getattr(module, name, None)
            if original is not None:
                patched.append((module, name, original))
                setattr(module, name, clock.wrap(original, bucket))
    for target, name in ((job.store, "trajectory"), (job, "_finished_rollouts"), (job, "_state"),
                         (job, "_flush"), (job, "_write_results")):
        setattr(target, name, clock.wrap(getattr(target, name), "store"))  # on the instance only
    try:
        yield clock
    finally:
        for module, name, original in reversed(patched):
            setattr(module, name, original)


# -- one otel-replay job ----------------------------------------------------------------------------
def _otel_job(agent: PlantedAgent, *, rollouts: int | None = None, method: str = "contrastive",
              concurrency: int = 4, latency: float = 0.0, seed: int = SEED) -> dict[str, Any]:
    """Attribute the agent's stored trace in a fresh store; the job's wall time, calls and verdict."""
    root = Path(tempfile.mkdtemp(prefix="otel-replay-bench-attribution-"))
    try:
        trace_id = store_agent(root, agent)
        counter = Counter()
        registry = planted_policies(agent, counter, latency)
        params = JobParams([trace_id], VERIFIER, rollouts=rollouts, concurrency=concurrency,
                           method=method, seed=seed)
        job = Job(Store(root), params, registry)
        with job_clock(job) as clock:
            started = time.perf_counter()
            (result,) = job.run()
            wall = time.perf_counter() - started
        culprit = result.culprit["index"] if result.culprit else None
        return {"culprit": culprit, "correct": culprit == agent.culprit, "verdict": result.verdict,
                "policy_calls": result.policy_calls, "counted_calls": counter.n, "rollouts": result.rollouts,
                "wall_s": wall, "stats_s": clock.seconds["stats"], "assembly_s": clock.seconds["assembly"],
                "store_s": clock.seconds["store"],
                "steps": [(s["index"], s["estimate"], s["ci_low"], s["ci_high"], s["verdict"]) for s in result.steps]}
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- agent_replay: the same agent written with its API ----------------------------------------------
def anchor_module() -> Any | None:
    """`agent_replay` when it is importable in this interpreter, else None."""
    try:
        return importlib.import_module(ANCHOR_MODULE)
    except ImportError:
        return None


def anchor_agent(agent: PlantedAgent, counter: Counter, recording: bool) -> Callable[..., Any]:
    """The planted loop through agent_replay's context. Recording, the turns make the recorded
    choices; otherwise a turn's `produce=` draws its choice from `ctx.rng` (bad with P_BAD)."""
    def run(ctx: Any, question: str) -> str:
        history = [SYSTEM, {"role": "user", "parts": [{"type": "text", "content": question}]}]
        results: list[dict[str, Any]] = []
        for turn in range(len(agent.per_turn)):
            def decide(turn: int = turn) -> dict[str, Any]:
                counter.tick()
                if recording:
                    return agent.decision(turn, agent.recorded_choice(turn))
                return agent.decision(turn, "bad" if ctx.rng.random() < P_BAD else "good")

            out = ctx.llm("chat", produce=decide, messages=history)
            history = history + [out]  # a new list: the recorded inputs keep the history they saw
            for part in out["parts"]:
                def work(arguments: dict[str, Any] = part["arguments"]) -> str:
                    counter.tick()
                    return work_result(arguments)

                result = ctx.tool("work", produce=work, **part["arguments"])
                results.append(json.loads(result))
                history = history + [tool_message(part["id"], result)]

        def answer() -> str:
            counter.tick()
            return agent.answer(results)

        return ctx.llm("chat", produce=answer, messages=history)
    return run


def anchor_verifier(result: Any) -> float:
    return 1.0 if result == "OK" else 0.0


def _anchor_job(ar: Any, agent: PlantedAgent, method: str) -> dict[str, Any]:
    counter = Counter()
    with ar.Session(":memory:") as session:
        traj = session.record(anchor_agent(agent, counter, recording=True), {"question": USER["parts"][0]["content"]},
                              seed=SEED, verifier=anchor_verifier)
    if len(traj.steps) != agent.steps:
        raise AssertionError(f"agent_replay recorded {len(traj.steps)} steps, expected {agent.steps}")
    live = anchor_agent(agent, counter, recording=False)
    counter.n = 0  # the recording's calls are not the attribution's
    started = time.perf_counter()
    result = ar.attribute(traj, live, anchor_verifier, rollouts=ANCHOR_ROLLOUTS, method=method)
    wall = time.perf_counter() - started
    culprit = result.culprit_index
    return {"culprit": culprit, "correct": culprit == agent.culprit,
            "verdict": "culprit-found" if culprit is not None else "no-culprit", "policy_calls": counter.n,
            "counted_calls": counter.n, "rollouts": None, "wall_s": wall}


# -- the runs ---------------------------------------------------------------------------------------
TIMINGS = ("wall_s", "stats_s", "assembly_s", "store_s")


def _repeat(fn: Callable[[], dict[str, Any]], repeats: int) -> dict[str, Any]:
    """Run `fn` `repeats` times (the garbage collector off while it runs); median timings.
    Everything but the timings is the same every time (each run is deterministic), and checked."""
    runs = []
    for _ in range(repeats):
        gc.collect()
        enabled = gc.isenabled()
        gc.disable()
        try:
            runs.append(fn())
        finally:
            if enabled:
                gc.enable()
    first = runs[0]
    for run in runs[1:]:
        if (run["culprit"], run["policy_calls"]) != (first["culprit"], first["policy_calls"]):
            raise AssertionError(f"a repeated run differs: {run['culprit'], run['policy_calls']} "
                                 f"vs {first['culprit'], first['policy_calls']}")
    out = {**first, "repeats": repeats}
    for key in TIMINGS:
        if key in first:
            out[key] = statistics.median(r[key] for r in runs)
    if "stats_s" in first:
        out["stats_share"] = statistics.median((r["stats_s"] + r["assembly_s"]) / r["wall_s"] for r in runs)
    return out


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


def _verdict_rows(sizes: Sizes, ar: Any | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    _otel_job(PlantedAgent.of(STEP_COUNTS[0]))  # warm up (imports, DuckDB, first Parquet writes), untimed
    for steps in STEP_COUNTS:
        agent = PlantedAgent.of(steps)
        configs: list[tuple[str, str, Callable[[], dict[str, Any]] | str]] = [
            ("otel-replay", "contrastive, defaults (sequential)", lambda agent=agent: _otel_job(agent)),
            ("otel-replay", f"contrastive, --rollouts {OTEL_ROLLOUTS}",
             lambda agent=agent: _otel_job(agent, rollouts=OTEL_ROLLOUTS)),
        ]
        if ar is not None:
            configs.append(("agent_replay", f"contrastive, {ANCHOR_ROLLOUTS} rollouts",
                            lambda agent=agent: _anchor_job(ar, agent, "contrastive")))
            configs.append(("agent_replay", f"both, {ANCHOR_ROLLOUTS} rollouts",
                            (lambda agent=agent: _anchor_job(ar, agent, "both")) if steps in sizes.anchor_both
                            else "not run in --quick mode (it takes ~10 s)"))
        measured = [(engine, config, fn if isinstance(fn, str) else _repeat(fn, sizes.repeats))
                    for engine, config, fn in configs]
        anchor_calls = next((m["policy_calls"] for e, c, m in measured if e == "agent_replay"
                             and c.startswith("contrastive") and isinstance(m, dict)), None)
        for engine, config, m in measured:
            row: dict[str, Any] = {"steps": steps, "engine": engine, "config": config, "planted": agent.culprit,
                                   "skipped": m if isinstance(m, str) else None}
            if isinstance(m, str):
                rows.append(row)
                continue
            if m["counted_calls"] != m["policy_calls"]:
                raise AssertionError(f"{engine} {config}: the job reports {m['policy_calls']} policy calls, "
                                     f"its policies counted {m['counted_calls']}")
            ours = engine == "otel-replay"
            row.update({
                "culprit": m["culprit"], "correct": m["correct"], "verdict": m["verdict"],
                "policy_calls": m["policy_calls"], "rollouts": m["rollouts"], "repeats": m["repeats"],
                "wall_ms": m["wall_s"] * 1000,
                "calls_ratio": m["policy_calls"] / anchor_calls if ours and anchor_calls else None,
                "store_ms": _ms(m.get("store_s")), "stats_ms": _ms(m.get("stats_s")),
                "assembly_ms": _ms(m.get("assembly_s")), "stats_share": m.get("stats_share"),
            })
            rows.append(row)
    return rows


def _concurrency(sizes: Sizes) -> dict[str, Any]:
    agent = PlantedAgent.of(LATENCY_STEPS)

    def job(concurrency: int) -> dict[str, Any]:
        return _otel_job(agent, rollouts=OTEL_ROLLOUTS, concurrency=concurrency, latency=sizes.latency_s)

    # the sequential run is its sleeps, run once; the concurrent one, short and noisier, `repeats` times
    runs = {c: _repeat(lambda c=c: job(c), 1 if c == min(CONCURRENCY) else sizes.repeats) for c in CONCURRENCY}
    low, high = (runs[c] for c in CONCURRENCY)
    in_memory = {c: runs[c]["wall_s"] - runs[c]["store_s"] for c in CONCURRENCY}
    return {"steps": agent.steps, "planted": agent.culprit, "rollouts": high["rollouts"],
            "latency_ms": sizes.latency_s * 1000, "concurrency": list(CONCURRENCY),
            "culprit": high["culprit"], "correct": low["correct"] and high["correct"],
            "policy_calls": high["policy_calls"], "repeats": {str(c): runs[c]["repeats"] for c in CONCURRENCY},
            "wall_s": {str(c): runs[c]["wall_s"] for c in CONCURRENCY},
            "store_s": {str(c): runs[c]["store_s"] for c in CONCURRENCY},
            "speedup": low["wall_s"] / high["wall_s"],
            "speedup_without_store": in_memory[CONCURRENCY[0]] / in_memory[CONCURRENCY[1]],
            "same_result": low["steps"] == high["steps"] and low["policy_calls"] == high["policy_calls"]}


def run_attribution_bench(quick: bool = False) -> dict[str, Any]:
    sizes = QUICK if quick else FULL
    ar = anchor_module()
    started = time.perf_counter()
    rows = _verdict_rows(sizes, ar)
    concurrency = _concurrency(sizes)
    return {
        "quick": quick, "repeats": sizes.repeats, "rows": rows, "concurrency": concurrency,
        "otel_rollouts": OTEL_ROLLOUTS, "anchor_rollouts": ANCHOR_ROLLOUTS, "p_bad": P_BAD,
        "targets": {"calls_ratio": TARGET_CALLS_RATIO, "stats_share": TARGET_STATS_SHARE,
                    "speedup": TARGET_SPEEDUP},
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "machine": f"{platform.system()} {platform.machine()}",
        "agent_replay": str(getattr(ar, "__version__", "installed")) if ar is not None else None,
        "agent_replay_skipped": None if ar is not None else
        f"agent_replay rows skipped: {ANCHOR_INSTALL} (agent_replay is not importable in this interpreter)",
        "elapsed_s": time.perf_counter() - started,
    }


# -- the table --------------------------------------------------------------------------------------
def _mark(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def _cell(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def format_attribution_table(result: dict[str, Any]) -> str:
    anchor = f"agent_replay {result['agent_replay']}" if result.get("agent_replay") else "agent_replay"
    skipped = result.get("agent_replay_skipped")
    lines = ["1. Policy calls and time to a verdict: planted late culprit (re-deciding it fixes the run "
             f"{100 * (1 - result['p_bad']):.0f}% of the time), instant policies, no HTTP", "",
             "| steps | engine | method | culprit (planted) | correct | policy calls | calls / agent_replay "
             "contrastive | wall ms | store I/O ms | statistics + assembly ms | statistics share |",
             "|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        engine = anchor if r["engine"] == "agent_replay" else r["engine"]
        if r["skipped"]:
            lines.append(f"| {r['steps']} | {engine} | {r['config']} | {r['skipped']} | | | | | | | |")
            continue
        culprit = "none" if r["culprit"] is None else str(r["culprit"])
        ratio = f"{r['calls_ratio']:.3f} (1/{1 / r['calls_ratio']:.1f})" if r["calls_ratio"] else \
            ("skipped" if skipped and r["engine"] == "otel-replay" else "")
        stats_ms = None if r["stats_ms"] is None else r["stats_ms"] + r["assembly_ms"]
        share = "" if r["stats_share"] is None else f"{100 * r['stats_share']:.1f}%"
        lines.append(f"| {r['steps']} | {engine} | {r['config']} | {culprit} ({r['planted']}) | "
                     f"{'yes' if r['correct'] else 'NO'} | {r['policy_calls']:,} | {ratio} | {r['wall_ms']:.0f} | "
                     f"{_cell(r['store_ms'], '.0f')} | {_cell(stats_ms, '.1f')} | {share} |")
    if skipped:
        for steps in sorted({r["steps"] for r in result["rows"]}):
            lines.append(f"| {steps} | agent_replay | contrastive / both | skipped | | | | | | | |")

    c = result["concurrency"]
    lo, hi = c["concurrency"]
    lines += ["", f"2. Concurrency: a {c['steps']}-step planted agent whose policies sleep {c['latency_ms']:.0f} ms, "
              f"{OTEL_ROLLOUTS} rollouts per plan ({c['rollouts']} in all), the same seed (median of "
              f"{c['repeats'][str(hi)]} run(s) at {hi})", "",
              "| concurrency | wall s | store I/O s | culprit (planted) | policy calls |", "|---:|---:|---:|---:|---:|"]
    for n in c["concurrency"]:
        lines.append(f"| {n} | {c['wall_s'][str(n)]:.2f} | {c['store_s'][str(n)]:.2f} | {c['culprit']} "
                     f"({c['planted']}) | {c['policy_calls']:,} |")
    lines.append(f"| {hi} vs {lo} | {c['speedup']:.1f}x faster ({c['speedup_without_store']:.1f}x without store I/O) "
                 f"| | same result: {'yes' if c['same_result'] else 'NO'} | |")

    t = result["targets"]
    ours = [r for r in result["rows"] if r["engine"] == "otel-replay"]
    lines += ["", f"otel-replay: Job.run() wall time, median of {result['repeats']} run(s), including its store I/O "
              "(loading the trajectory, the resume query, writing rollout/result/job rows); statistics share = time "
              "in otel_replay.attribution.stats plus result assembly (step_rows, explain), interval caches cleared "
              f"first, over the job's wall time. {anchor}: attribute() wall time (in memory, no store), median "
              f"of {result['repeats']} run(s); its policy calls counted in its produce= callables. "
              f"{result['python']}, {result['machine']}."]
    if skipped:
        lines.append(skipped + ".")
    correct = all(r["correct"] for r in result["rows"] if not r["skipped"]) and c["correct"]
    targets = [f"every verdict names the planted culprit: {_mark(correct)}"]
    fixed = [r["calls_ratio"] for r in ours if r["calls_ratio"] is not None and "--rollouts" in r["config"]]
    default = [r["calls_ratio"] for r in ours if r["calls_ratio"] is not None and "defaults" in r["config"]]
    if fixed:
        targets.append(f"policy calls at the defaults <= 1/{1 / t['calls_ratio']:.0f} of agent_replay contrastive: "
                       f"worst {max(default):.3f} ({_mark(max(default) <= t['calls_ratio'])}; --rollouts "
                       f"{OTEL_ROLLOUTS}, for comparison: worst {max(fixed):.3f})")
    worst_share = max(r["stats_share"] for r in ours)
    targets.append(f"statistics share <= {100 * t['stats_share']:.0f}%: worst {100 * worst_share:.1f}% "
                   f"({_mark(worst_share <= t['stats_share'])})")
    targets.append(f"concurrency {hi} >= {t['speedup']:.0f}x faster than {lo}: {c['speedup']:.1f}x "
                   f"({_mark(c['speedup'] >= t['speedup'] and c['same_result'])})")
    lines.append("Targets: " + "; ".join(targets) + ".")
    return "\n".join(lines)
