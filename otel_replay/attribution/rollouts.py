"""Running rollouts: concurrently, under a hard budget of policy calls, scored by the verifier.

Every rollout is a pure function of (trajectory, plan, seed), so the executor is swappable
(`LocalExecutor`: a thread pool in this process, the default; `executors.RayExecutor`: Ray workers).

A boundary rollout whose re-decided step reproduces the recording is, from there on, the same
rollout as the plan holding that step with the same seed (`plans`): the runner stops it there and
takes its outcome from that rollout (running it if the job has not yet), so such a rollout costs
one policy call, and the pair's two outcomes agree exactly, as they would if both had been run.
Each policy call is cut off after `policy_timeout_s`; a rollout whose policy raised or timed out
is `errored`: stored, never scored, so it counts as neither a pass nor a fail.

Text the policies produced (the final output, the culprit step's output, an error message) is
redacted with the job's `Redactor` when a rollout is recorded, before anything keeps or stores it:
the verifier scores the text as produced, and the rows (in memory, on disk, on resume) are the
same redacted ones, so a resumed job still equals an uninterrupted one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from otel_replay.attribution import verifiers
from otel_replay.attribution.plans import Budget, RolloutSpec, rollout_seed
from otel_replay.normalize.messages import canonical_bytes, content_hash
from otel_replay.normalize.redact import Redactor
from otel_replay.replay import replay
from otel_replay.replay.engine import DEFAULT_POLICY_TIMEOUT_S
from otel_replay.replay.policies import Registry
from otel_replay.trajectory import Trajectory

FINAL_OUTPUT_CHARS = 2000  # of a rollout's final output kept in its row (after redaction)
Row = dict[str, Any]
RowKey = tuple[str, str, int]  # trace, plan key, rollout


class Executor(Protocol):
    def map(self, runner: RolloutRunner, trajectory: Trajectory, specs: Sequence[RolloutSpec]) -> list[Row | None]:
        """Run the specs; rows in spec order (None: cut off by the budget), each handed to the
        runner's `record` as it arrives."""
        ...


class LocalExecutor:
    """Threads in this process; sync policies run in the threads, async ones on each thread's own loop."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = max(1, concurrency)

    def map(self, runner: RolloutRunner, trajectory: Trajectory, specs: Sequence[RolloutSpec]) -> list[Row | None]:
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda spec: runner._one(trajectory, spec), specs))


class BudgetedRegistry(Registry):
    """A registry whose policies draw on a Budget before every call."""

    def __init__(self, inner: Registry, budget: Budget) -> None:
        super().__init__(dict(inner._by_key))
        self.budget = budget

    def resolve(self, kind: str, name: str | None, model: str | None = None) -> Any:
        fn = super().resolve(kind, name, model)
        if fn is None:
            return None

        def counted(*args: Any) -> Any:
            self.budget.take()
            return fn(*args)
        return counted


class RolloutRunner:
    """Runs rollouts of one job and turns each into a `rollout_rows` row."""

    def __init__(self, job_id: str, registry: Registry, verifier: verifiers.Verifier, threshold: float,
                 seed: int, concurrency: int, budget: Budget, credit: bool = False, max_steps: int = 64,
                 on_row: Callable[[Row], None] | None = None,
                 policy_timeout_s: float | None = DEFAULT_POLICY_TIMEOUT_S, executor: Executor | None = None,
                 redactor: Redactor | None = None) -> None:
        self.job_id = job_id
        self.registry = BudgetedRegistry(registry, budget)
        self.verifier = verifier
        self.threshold = threshold
        self.seed = seed
        self.concurrency = max(1, concurrency)
        self.budget = budget
        self.credit = credit
        self.max_steps = max_steps
        self.on_row = on_row
        self.policy_timeout_s = policy_timeout_s
        self.executor = executor or LocalExecutor(self.concurrency)
        self.redactor = redactor  # None: policy output is stored as produced
        self.done: dict[RowKey, Row] = {}  # finished rollouts (resume)
        self._done_lock = threading.Lock()

    def can_resample(self, trajectory: Trajectory, index: int) -> bool:
        step = trajectory.step(index)
        if step.observation_only:
            return False
        return self.registry.resolve(step.kind, step.tool_name or step.name, step.model) is not None

    def run(self, trajectory: Trajectory, specs: Iterable[RolloutSpec]) -> list[Row]:
        """Rows for every spec (already-finished ones are reused, not re-run); a spec cut off by the
        budget has no row."""
        specs = list(specs)
        trace = trajectory.trace_id
        todo = [s for s in specs if (trace, s.plan.key(), s.rollout) not in self.done]
        if todo and not self.budget.exhausted:
            self._complete(trajectory, todo)
        return [row for s in specs if (row := self.done.get((trace, s.plan.key(), s.rollout))) is not None]

    def _complete(self, trajectory: Trajectory, specs: list[RolloutSpec]) -> None:
        """Run `specs`; a rollout that stopped where it coincides with the plan holding its step waits
        for that plan's rollout of the same seed, which runs in a later pass if the job lacks it."""
        trace = trajectory.trace_id
        waiting: list[tuple[RolloutSpec, Row]] = []
        pending = specs
        while pending and not self.budget.exhausted:
            queued: dict[RowKey, RolloutSpec] = {}
            for spec, row in zip(pending, self.executor.map(self, trajectory, pending), strict=True):
                if row is None or row.get("coincides_at") is None:
                    continue
                waiting.append((spec, row))
                other = self.coinciding_spec(spec, row["coincides_at"])
                key = (trace, other.plan.key(), other.rollout)
                if key not in self.done:
                    queued[key] = other
            pending = list(queued.values())
        while waiting:  # a chain (a rollout waiting on one that waits too) resolves back to front
            still: list[tuple[RolloutSpec, Row]] = []
            for spec, row in waiting:
                finished = self.done.get((trace, self.coinciding_spec(spec, row["coincides_at"]).plan.key(),
                                          spec.rollout))
                if finished is None:
                    still.append((spec, row))
                else:
                    self.record(self._continued(row, finished))
            if len(still) == len(waiting):  # the rest wait on rollouts the budget cut off
                break
            waiting = still

    @staticmethod
    def coinciding_spec(spec: RolloutSpec, index: int) -> RolloutSpec:
        plan = spec.plan.holding(index)
        first = plan.first_intervened
        return RolloutSpec(plan, first, "boundary" if plan.interventions else "factual", spec.rollout, spec.reuse)

    @staticmethod
    def _continued(row: Row, other: Row) -> Row:
        """The row of a rollout that coincided with `other` from its re-decided step on."""
        detail = json.loads(row["detail"]) if row["detail"] else {}
        detail["continued_as"] = other["plan"]
        return {**row, "coincides_at": None, "score": other["score"], "failed": other["failed"],
                "unreplayable": other["unreplayable"], "errored": other["errored"], "reason": other["reason"],
                "diverged_at": other["diverged_at"], "final_output": other["final_output"],
                "digest": content_hash(canonical_bytes([row["plan"], row["seed"], other["digest"]])),
                "detail": json.dumps(detail)}

    def _one(self, trajectory: Trajectory, spec: RolloutSpec) -> Row | None:
        row = self.rollout(trajectory, spec)
        return None if row is None else self.record(row)

    def rollout(self, trajectory: Trajectory, spec: RolloutSpec) -> Row | None:
        """Run one rollout and score it; its row as produced (`record` finishes it). Runs anywhere."""
        if self.budget.exhausted:
            return None
        key = spec.plan.key()
        seed = rollout_seed(self.seed, trajectory.trace_id, spec.rollout)
        started = time.perf_counter()
        run = replay(trajectory, spec.plan, seed, policies=self.registry, max_steps=self.max_steps,
                     policy_timeout_s=self.policy_timeout_s, reuse=spec.reuse)
        if run.unreplayable and run.unreplayable.cause == "refused":
            return None  # not a result: the rollout was cut off by the budget
        waits = run.coincides_at is not None
        score = None if run.unreplayable or waits else verifiers.score(self.verifier, run.final_output, run)
        failed = None if score is None else (score >= self.threshold if self.credit else score < self.threshold)
        step_output = next((list(o.outputs) for o in run.steps if o.index == spec.step_index), None)
        return {
            "job_id": self.job_id, "trace_id": trajectory.trace_id, "plan": key, "step_index": spec.step_index,
            "role": spec.role, "rollout": spec.rollout, "seed": seed, "score": score, "failed": failed,
            "unreplayable": run.unreplayable is not None and not run.errored, "errored": run.errored,
            "reason": str(run.unreplayable) if run.unreplayable else None,
            "policy_calls": run.policy_calls, "tokens": run.tokens, "diverged_at": run.diverged_at,
            "duration_ms": (time.perf_counter() - started) * 1000, "final_output": run.final_output,
            "digest": run.digest, "detail": json.dumps({"step_output": step_output}) if step_output else None,
            "coincides_at": run.coincides_at,
        }

    def record(self, row: Row) -> Row:
        """Redact the row's policy-made text (in place: every holder sees the stored row), cut the final
        output to `FINAL_OUTPUT_CHARS`, remember the row and hand it on; in the process that owns the job.
        A row still waiting for the rollout it coincides with is returned as it is."""
        if row.get("coincides_at") is not None:
            return row
        redactor = self.redactor
        if redactor is not None:
            row["final_output"] = redactor.text(row["final_output"])[0]
            if row["reason"]:
                row["reason"] = redactor.text(row["reason"])[0]
            if row["detail"]:
                detail, found = redactor.value(json.loads(row["detail"]))
                if found:
                    row["detail"] = json.dumps(detail)
        row["final_output"] = row["final_output"][:FINAL_OUTPUT_CHARS]
        row.pop("coincides_at", None)
        with self._done_lock:
            self.done[(row["trace_id"], row["plan"], row["rollout"])] = row
        if self.on_row:
            self.on_row(row)
        return row

    def redact(self, value: Any) -> Any:
        """A policy-made JSON value (a repair candidate) as it may be stored."""
        return value if self.redactor is None else self.redactor.value(value)[0]
