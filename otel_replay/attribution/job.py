"""Attribution jobs: one or many traces, resumable, concurrent, budgeted; everything is rows.

A job's rollouts, results and state are Parquet segments in the store (tables `rollout_rows`,
`result_rows`, `job_rows`), so estimates and aggregates are SQL, and a job killed mid-way
resumes by skipping the rollouts it already has (each is a pure function of trace, plan, seed).
One process at a time runs a given job id (`lock.JobLock`); jobs with different ids share a store
freely, since every row is keyed by its job id.

Text produced by policies (rollout outputs, error messages, repair candidates) is redacted before
it is stored, as capture and imports redact what they store: the built-in detectors by default,
a rules file (`redact_rules`, the format of `--redact-rules`), or nothing (`redact=False`). The
setting is a job parameter, so a resumed job redacts as it did.

The verifier (and, through `otel_replay.attribute`, the policies) may be Python callables instead
of importable specs. Such a job's stored parameters name them (`in_process`), and a resume that
does not give them again fails saying so: another process cannot import a closure.

A job scores each recorded run before replaying it and stores that outcome (`outcome_rows`). With
`skip_unattributable` (batch jobs over `--where`, and `watch`), a trace that passes the verifier or
cannot be replayed is skipped and listed (`skip_rows`) instead of failing the whole job. A job
stopped before its end (Ctrl-C, SIGTERM, `request_stop`, or a budget it may get more of) is marked
`interrupted` (or `paused`) and resumes like any other.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, cast

from otel_replay.attribution import outcomes, verifiers
from otel_replay.attribution import repair as repair_search
from otel_replay.attribution.contrastive import (
    ContrastiveScan,
    RunnerOutcomes,
    ScanOptions,
    Search,
    StepEstimate,
    StepVerdict,
    label,
)
from otel_replay.attribution.explain import explain
from otel_replay.attribution.lock import JobLock, JobLocked
from otel_replay.attribution.model import Culprit, ShapleyValue
from otel_replay.attribution.plans import Budget, BudgetExhausted, RolloutSpec
from otel_replay.attribution.result import (
    AttributionResult,
    Explanation,
    Method,
    finding_verdict,
    mark_culprit,
    shapley_finding,
    step_rows,
)
from otel_replay.attribution.rollouts import Executor, RolloutRunner
from otel_replay.attribution.sequential import (
    DEFAULT_ALPHA,
    DEFAULT_EPSILON,
    DEFAULT_MAX_ROLLOUTS,
    Design,
)
from otel_replay.errors import OtelReplayError
from otel_replay.normalize.redact import RedactionConfigError, Redactor
from otel_replay.replay import ReplayPlan
from otel_replay.replay.engine import DEFAULT_POLICY_TIMEOUT_S
from otel_replay.replay.policies import Registry
from otel_replay.store import queries
from otel_replay.store.writer import write_rows
from otel_replay.trajectory import Store, Trajectory

FLUSH_ROWS = 200
FLUSH_INTERVAL_S = 10.0  # rollouts are written at least this often, so a crash loses little work


class AttributionError(OtelReplayError):
    """The job cannot run: a passing run without --credit, an unknown trace, a bad verifier."""


class JobInterrupted(AttributionError):
    """The job stopped before its end and is resumable: `status` is `interrupted` (asked to stop)
    or `paused` (the calls it was granted ran out; `watch` grants more later)."""

    def __init__(self, message: str, status: str = "interrupted") -> None:
        super().__init__(message)
        self.status = status


class StoppableBudget(Budget):
    """A job's budget that can also be closed: the job is stopping, no policy call starts after."""

    def __init__(self, limit: int | None, spent: int = 0) -> None:
        super().__init__(limit, spent)
        self.closed = False

    def take(self) -> None:
        if self.closed:
            raise BudgetExhausted("the job is stopping")
        super().take()

    def close(self) -> None:
        self.closed = True

    @property
    def exhausted(self) -> bool:
        return self.closed or super().exhausted


def describe(fn: Any) -> str:
    """A callable's name, `module:qualname`, as a stored job names what it was given."""
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', None) or type(fn).__module__}:{qualname}"


@dataclass(slots=True)
class JobParams:
    trace_ids: list[str]
    # how to rebuild it: "module:fn", "contains:TEXT", "regex:RE", "json-schema:FILE"; or the function itself
    verifier: str | verifiers.Verifier
    threshold: float = 0.5
    method: Method = "contrastive"
    rollouts: int | None = None  # fixed rollouts per plan; None: sequential, up to max_rollouts
    max_rollouts: int = DEFAULT_MAX_ROLLOUTS  # the cap per plan of sequential sampling
    epsilon: float = DEFAULT_EPSILON  # the practical-equivalence band: effects within +-epsilon are "no effect"
    alpha: float = DEFAULT_ALPHA  # the error rate, over every step the search tests
    full: bool = False
    repair: bool = False
    concurrency: int = 4
    max_policy_calls: int | None = None
    seed: int = 0
    credit: bool = False
    policies: str | None = None
    shapley_permutations: int = 20
    policy_timeout_s: float | None = DEFAULT_POLICY_TIMEOUT_S  # per policy call; None: no limit
    search: Search = "scan"  # contrastive search: scan every step backwards, or gallop (blocks, then halves)
    redact: bool = True  # redact policy-made text before it is stored (the built-in detectors) ...
    redact_rules: str | None = None  # ... or with these rules (a YAML or JSON file, as `--redact-rules`)
    skip_unattributable: bool = False  # skip (and list) a trace that passes or cannot be replayed, not fail the job
    # what was given as Python objects, which a resume must be given again: "verifier" / "policies" -> their names
    in_process: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if callable(self.verifier):
            self.in_process.setdefault("verifier", describe(self.verifier))

    def to_json(self) -> str:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        if callable(self.verifier):
            data["verifier"] = self.in_process["verifier"]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobParams:
        """Stored parameters, those of older versions included (`adaptive` capped each plan at
        `rollouts`; `target_width` is gone)."""
        data = json.loads(text)
        if data.pop("adaptive", False):
            data["max_rollouts"], data["rollouts"] = data.get("rollouts") or DEFAULT_MAX_ROLLOUTS, None
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def design(self) -> Design:
        """How the contrastive search decides: fixed rollouts per plan, or sequential up to the cap."""
        if self.rollouts is not None:
            return Design.fixed(self.rollouts, alpha=self.alpha, epsilon=self.epsilon)
        return Design.sequential(self.max_rollouts, alpha=self.alpha, epsilon=self.epsilon)


def build_verifier(spec: str | verifiers.Verifier) -> verifiers.Verifier:
    return spec if callable(spec) else verifiers.build(spec)


def not_resumable(job_id: str, missing: dict[str, str]) -> str:
    """Why a job started from Python callables cannot be resumed without them, and how to resume it."""
    given = "; ".join(f"the {what} {name}" for what, name in sorted(missing.items()))
    again = ", ".join(f"{what}=..." for what in sorted(missing))
    return (f"job {job_id} was started from Python with callables that have no importable path ({given}), so "
            f"another process cannot rebuild them: resume it from Python, giving the same ones again: "
            f"otel_replay.attribute(resume={job_id!r}, {again})")


def build_redactor(redact: bool, rules: str | None) -> Redactor | None:
    """The redactor a job applies to policy-made text; a bad rules file is an AttributionError."""
    if rules is not None and not redact:
        raise AttributionError("give redaction rules or turn redaction off, not both")
    if rules is None:
        return Redactor() if redact else None
    try:
        return Redactor.from_file(rules)
    except RedactionConfigError as exc:
        raise AttributionError(f"redaction rules: {exc}") from None


def select_traces(store: Store, predicate: str) -> list[str]:
    """Trace ids matching a SQL predicate over the `traces` view (the user's own SQL, like `otel-replay sql`)."""
    from otel_replay.store.catalog import QueryError

    try:
        rows = store.sql(f"SELECT trace_id FROM traces WHERE ({predicate}) ORDER BY start_ns")  # noqa: S608
    except QueryError as exc:
        said = [line for line in exc.detail.splitlines()[:2] if line and not line.startswith("LINE")]
        raise AttributionError(f"--where {predicate!r}: SQL error: {'; '.join(said)}") from exc  # error and hint
    # cast: `traces.trace_id` is never NULL, so the column holds str only (pyarrow types it list[Any | None])
    return cast("list[str]", rows.column("trace_id").to_pylist())


def load_params(store: Store, job_id: str) -> tuple[JobParams, int]:
    """A stored job's parameters and creation time (for --resume)."""
    rows = store.read(lambda con: con.sql(queries.query("job_state"), params=[job_id]).to_arrow_table()).to_pylist()
    if not rows:
        raise AttributionError(f"no job {job_id!r} in the store at {store.root} (list them with `otel-replay jobs`)")
    return JobParams.from_json(rows[0]["params"]), rows[0]["created_ns"]


def new_job_id() -> str:
    return "j" + os.urandom(6).hex()


def spent_calls(store: Store, job_id: str) -> int:
    """Policy calls a job has spent so far (0 for a job not in the store)."""
    return int(store.named("job_spent", [job_id, job_id])[0][0])


def resume_hint(job_id: str) -> str:
    return f"continue it with: otel-replay attribute --resume {job_id}"


@dataclass(slots=True)
class JobProgress:
    rollouts: int = 0
    policy_calls: int = 0
    leading: str = ""
    trace: str = ""
    traces_done: int = 0


@dataclass
class Job:
    store: Store
    params: JobParams
    registry: Registry
    job_id: str = field(default_factory=new_job_id)
    on_progress: Callable[[JobProgress], None] | None = None
    created_ns: int = field(default_factory=time.time_ns)
    executor: Executor | None = None  # where rollouts run (None: a thread pool of params.concurrency)

    def __post_init__(self) -> None:
        if "verifier" in self.params.in_process and not callable(self.params.verifier):  # a resume without it
            raise AttributionError(not_resumable(self.job_id, self.params.in_process))
        self.verifier = build_verifier(self.params.verifier)
        self.redactor = build_redactor(self.params.redact, self.params.redact_rules)
        self.progress = JobProgress()
        self.budget = StoppableBudget(self.params.max_policy_calls)
        self.errored = 0  # rollouts whose policy raised or timed out (stored, never scored)
        self.skipped: dict[str, str] = {}  # trace -> why it was skipped (skip_unattributable)
        self.pause_when_spent = False  # a spent budget pauses the job (more calls may come) instead of ending it
        self._stop_reason: str | None = None
        self._pending: list[dict[str, Any]] = []
        self._rows_lock = threading.Lock()  # rows arrive from the executor's threads
        self._flushed_at = time.monotonic()

    # -- storage ----------------------------------------------------------------------------------
    def _state(self, status: str, message: str | None = None) -> None:
        if message and self.redactor is not None:  # it may quote a policy's error
            message = self.redactor.text(message)[0]
        write_rows(self.store.root, "job_rows", [{
            "job_id": self.job_id, "created_ns": self.created_ns, "updated_ns": time.time_ns(), "status": status,
            "params": self.params.to_json(), "traces": len(self.params.trace_ids),
            "traces_done": self.progress.traces_done, "rollouts_done": self.progress.rollouts,
            "policy_calls": self.budget.spent, "message": message}])

    def _on_row(self, row: dict[str, Any]) -> None:
        with self._rows_lock:
            self._pending.append(row)
            self.progress.rollouts += 1
            self.errored += bool(row.get("errored"))
            self.progress.policy_calls = self.budget.spent
            if len(self._pending) >= FLUSH_ROWS or time.monotonic() - self._flushed_at >= FLUSH_INTERVAL_S:
                self._flush()
                self._state("running")  # the calls spent so far, for a resume after a crash
        if self.on_progress:
            self.on_progress(self.progress)
        self._check_stop()

    def _flush(self) -> None:
        rows, self._pending = self._pending, []
        self._flushed_at = time.monotonic()
        write_rows(self.store.root, "rollout_rows", rows)

    def request_stop(self, reason: str = "stopped") -> None:
        """Stop the job soon, from any thread or a signal handler: no policy call starts after this, the
        calls in flight finish, their rollouts are kept, and `run` raises JobInterrupted (resumable)."""
        self._stop_reason = reason
        self.budget.close()

    def _check_stop(self) -> None:
        if self._stop_reason is not None:
            raise JobInterrupted(f"job {self.job_id} {self._stop_reason}; {resume_hint(self.job_id)}")
        if self.pause_when_spent and self.budget.exhausted:
            raise JobInterrupted(f"job {self.job_id} paused: the {self.budget.limit} policy calls it was granted "
                                 f"are spent; it resumes when more are granted", status="paused")

    def _skip(self, trace_id: str, reason: str) -> None:
        """Skip a trace of a batch: listed in `skip_rows` (once), the job goes on."""
        if trace_id not in self.skipped:
            write_rows(self.store.root, "skip_rows", [{"job_id": self.job_id, "trace_id": trace_id, "reason": reason,
                                                      "skipped_ns": time.time_ns()}])
        self.skipped[trace_id] = reason

    def _stored_skips(self) -> dict[str, str]:
        return dict(self.store.named("job_skips", [self.job_id]))

    def _finished_rollouts(self) -> dict[tuple[str, str, int], dict[str, Any]]:
        rows = self.store.read(lambda con: con.sql(queries.query("job_rollouts"),
                                                   params=[self.job_id]).to_arrow_table()).to_pylist()
        return {(r["trace_id"], r["plan"], r["rollout"]): r for r in rows}

    # -- the work ---------------------------------------------------------------------------------
    def run(self) -> list[AttributionResult]:
        """Run (or resume) the job; AttributionError if another process is running this job id."""
        self.store.root.ensure()
        lock = JobLock(self.store.root, self.job_id)
        try:
            lock.acquire()
        except (JobLocked, ValueError) as exc:
            raise AttributionError(str(exc)) from None
        try:
            return self._run()
        finally:
            lock.release()

    def _run(self) -> list[AttributionResult]:
        done = self._finished_rollouts()
        self.budget.spent = spent_calls(self.store, self.job_id)
        self.progress.rollouts = len(done)
        self.errored = sum(1 for r in done.values() if r.get("errored"))
        self.skipped = self._stored_skips() if self.params.skip_unattributable else {}
        self._state("running")
        results = []
        try:
            for trace_id in self.params.trace_ids:
                self._check_stop()
                self.progress.trace = trace_id
                if trace_id not in self.skipped:
                    runner = RolloutRunner(self.job_id, self.registry, self.verifier, self.params.threshold,
                                           self.params.seed, self.params.concurrency, self.budget, self.params.credit,
                                           on_row=self._on_row, policy_timeout_s=self.params.policy_timeout_s,
                                           executor=self.executor, redactor=self.redactor)
                    runner.done = {k: v for k, v in done.items() if k[0] == trace_id}
                    result = self.attribute(self.store.trajectory(trace_id), runner)
                    if result is not None:
                        results.append(result)
                self.progress.traces_done += 1
                self._flush()
                self._state("running")
        except (KeyboardInterrupt, JobInterrupted) as exc:  # resumable: not a failure
            self._flush()
            status = exc.status if isinstance(exc, JobInterrupted) else "interrupted"
            self._state(status, str(exc) if isinstance(exc, JobInterrupted)
                        else f"interrupted (Ctrl-C); {resume_hint(self.job_id)}")
            raise
        except BaseException as exc:
            self._flush()
            self._state("failed", f"{type(exc).__name__}: {exc}"[:500])
            raise
        status = "partial" if self.budget.exhausted else "done"
        notes = [summary(results)] if results or not self.skipped else []
        if self.skipped:
            notes.append(f"{len(self.skipped)} skipped (see: otel-replay jobs --skipped --job {self.job_id})")
        if status == "partial":
            notes.append(f"the budget of {self.params.max_policy_calls} policy calls ran out")
        if self.errored:
            notes.append(f"{self.errored} rollouts errored (a policy raised or timed out) and were left out of the "
                         "estimates")
        self._state(status, "; ".join(notes) or None)
        return results

    def attribute(self, trajectory: Trajectory, runner: RolloutRunner) -> AttributionResult | None:
        """One trace's result (written to the store); None when the job skips the trace."""
        p = self.params
        factual = runner.run(trajectory, [RolloutSpec(ReplayPlan.factual(), None, "factual", 0)])
        self._check_stop()
        if not factual or factual[0]["failed"] is None:  # unreplayable, or its policy errored
            why = (f"cannot be replayed factually: {factual[0]['reason']}" if factual else
                   f"not attributed: the budget of {p.max_policy_calls} policy calls ran out before this trace")
            if factual:
                self._outcome(trajectory, None, why)
            if p.skip_unattributable:
                self._skip(trajectory.trace_id, why)
                return None
            raise AttributionError(f"trace {trajectory.trace_id} {why}")
        recorded_score = factual[0]["score"]
        self._outcome(trajectory, recorded_score)
        if not factual[0]["failed"]:
            said = (f"{'failed' if p.credit else 'passed'} the verifier (score {recorded_score:.2f}, threshold "
                    f"{p.threshold})")
            if p.skip_unattributable:
                self._skip(trajectory.trace_id, said)
                return None
            raise AttributionError(
                f"trace {trajectory.trace_id} {said}; attributing a {'failing' if p.credit else 'passing'} run is "
                "an error" + ("" if p.credit else " (use --credit to find which step secured the success)"))
        resamplable = [s.position for s in trajectory.steps if runner.can_resample(trajectory, s.position)]
        fixed: dict[int, StepVerdict] = {s.position: "observation-only" if s.observation_only else "no policy"
                                         for s in trajectory.steps if s.position not in resamplable}
        source = RunnerOutcomes(trajectory, runner, resamplable)
        options = ScanOptions(p.design(), full=p.full, search=p.search)
        scan = ContrastiveScan([s.position for s in trajectory.steps], len(trajectory), resamplable, source, options,
                               fixed, on_step=lambda est: self._lead(trajectory, est))
        estimates: list[StepEstimate] = scan.run() if p.method in ("contrastive", "both") else []
        finding = label({e.index: e for e in estimates}, resamplable) if estimates else None
        rows = step_rows(trajectory, estimates) if estimates else []
        shapley: list[ShapleyValue] = []
        if p.method in ("shapley", "both") and resamplable:
            from otel_replay.attribution.shapley import shapley_values

            shapley = shapley_values(trajectory, runner, resamplable, p.shapley_permutations, p.alpha, p.epsilon)
        if finding is None:
            finding = shapley_finding(shapley, resamplable)
            shapley = mark_culprit(shapley, finding.culprit)
        culprit = next((Culprit.of(r) for r in rows if r.culprit), None)
        if culprit is None and finding.culprit is not None and not rows:  # Shapley alone names it
            culprit = shapley_culprit(trajectory, shapley, finding.culprit)
        repair = None
        if p.repair and finding.culprit is not None:
            tried = repair_search.search(trajectory, runner, finding.culprit, resamplable,
                                         source.rows_of(finding.culprit), p.design(), p.alpha)
            repair = tried[0] if tried else None
        verdict = finding_verdict(finding, resamplable, estimates, shapley)
        result = AttributionResult(
            job_id=self.job_id, trace_id=trajectory.trace_id, method=p.method, verdict=verdict,
            recorded_score=recorded_score, threshold=p.threshold, credit=p.credit, steps=rows, culprit=culprit,
            rollouts=len(runner.done), policy_calls=sum(r["policy_calls"] for r in runner.done.values()),
            repair=repair, explanation={}, alpha=p.alpha, epsilon=p.epsilon,
            sequential=p.rollouts is None, max_rollouts=p.rollouts or p.max_rollouts, tests=scan.design.tests,
            candidates=list(finding.candidates), untested=list(finding.untested),
            budget_exhausted=self.budget.exhausted, max_policy_calls=p.max_policy_calls, shapley=shapley)
        result.explanation = Explanation(explain(trajectory, result, repair, runner, repair_searched=p.repair))
        self._check_stop()  # a stopped job writes no result from a scan its stop cut short
        self._write_results(trajectory, result)
        return result

    def _outcome(self, trajectory: Trajectory, score: float | None, reason: str | None = None) -> None:
        """The recorded run's outcome under this job's verifier, for `traces --failed` and `watch`."""
        name = self.params.in_process.get("verifier") or str(self.params.verifier)
        row = outcomes.outcome_row(trajectory, name, score, self.params.threshold, "attribute", self.job_id, reason)
        outcomes.write(self.store, [row])

    def _lead(self, trajectory: Trajectory, est: StepEstimate) -> None:
        if est.estimate is not None:
            self.progress.leading = f"step {est.index} ({trajectory.step(est.index).name}) {est.estimate:+.2f}"

    def _write_results(self, trajectory: Trajectory, result: AttributionResult) -> None:
        rows = [{
            "job_id": self.job_id, "trace_id": trajectory.trace_id, "step_index": r.index, "span_id": r.span_id,
            "name": r.name, "kind": r.kind, "agent_name": r.agent, "method": "contrastive",
            "estimate": r.estimate, "ci_low": r.ci_low, "ci_high": r.ci_high, "fail_held": r.fail_held,
            "fail_resampled": r.fail_resampled, "n_held": r.n_held, "n_resampled": r.n_resampled,
            "verdict": r.verdict, "culprit": r.culprit, "rank": r.rank} for r in result.steps]
        rows += [{
            "job_id": self.job_id, "trace_id": trajectory.trace_id, "step_index": s.index,
            "span_id": trajectory.step(s.index).span_id, "name": trajectory.step(s.index).name,
            "kind": trajectory.step(s.index).kind, "agent_name": trajectory.step(s.index).agent,
            "method": "shapley", "estimate": s.value, "ci_low": s.ci_low, "ci_high": s.ci_high,
            "fail_held": None, "fail_resampled": None, "n_held": s.samples, "n_resampled": None,
            "verdict": s.verdict, "culprit": s.culprit, "rank": s.rank} for s in result.shapley]
        write_rows(self.store.root, "result_rows", rows)
        write_rows(self.store.root, "report_rows", [{"job_id": self.job_id, "trace_id": trajectory.trace_id,
                                                     "written_ns": time.time_ns(),
                                                     "report": result.to_json(indent=None)}])


def shapley_culprit(trajectory: Trajectory, shapley: list[ShapleyValue], index: int) -> Culprit:
    """The culprit entry of a Shapley-only result (its value as the estimate)."""
    value = next(s for s in shapley if s.index == index)
    step = trajectory.step(index)
    return Culprit(index=index, span_id=step.span_id, name=step.name, kind=step.kind, agent=step.agent,
                   estimate=value.value, ci_low=value.ci_low, ci_high=value.ci_high)


def summary(results: list[AttributionResult]) -> str:
    """The verdicts of a job's traces in a few words, for `otel-replay jobs`."""
    counts: dict[str, int] = {}
    for result in results:
        counts[result.verdict] = counts.get(result.verdict, 0) + 1
    return ", ".join(f"{n} {verdict}" for verdict, n in counts.items()) or "no traces"
