"""Running rollouts: concurrently, under a hard budget of policy calls, scored by the verifier.

Every rollout is a pure function of (trajectory, plan, seed), so the executor is swappable
(`executors.py`: a thread pool in this process by default, or Ray workers).
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import xxhash

from otel_replay.attribution import verifiers
from otel_replay.attribution.executors import Executor, LocalExecutor
from otel_replay.normalize.redact import Redactor
from otel_replay.replay import ReplayPlan, replay
from otel_replay.replay.engine import DEFAULT_POLICY_TIMEOUT_S
from otel_replay.replay.guard import CallRefused
from otel_replay.replay.policies import Registry
from otel_replay.trajectory import Trajectory

FINAL_OUTPUT_CHARS = 2000  # of a rollout's final output kept in its row (after redaction)


class BudgetExhausted(CallRefused):
    """The job's policy-call budget is spent (the call is refused, not made)."""


class Budget:
    """A hard cap on policy calls, shared by all rollouts of a job; never exceeded."""

    def __init__(self, limit: int | None, spent: int = 0) -> None:
        self.limit = limit
        self.spent = spent
        self._lock = threading.Lock()

    def take(self) -> None:
        with self._lock:
            if self.limit is not None and self.spent >= self.limit:
                raise BudgetExhausted(f"the budget of {self.limit} policy calls is spent")
            self.spent += 1

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.spent >= self.limit


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


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    plan: ReplayPlan
    step_index: int | None
    role: str
    rollout: int


def rollout_seed(job_seed: int, trace_id: str, plan_key: str, rollout: int) -> int:
    return int(xxhash.xxh3_64_hexdigest(f"{job_seed}:{trace_id}:{plan_key}:{rollout}".encode()), 16) % (2**31)


class RolloutRunner:
    """Runs rollouts of one job and turns each into a `rollout_rows` row."""

    def __init__(self, job_id: str, registry: Registry, verifier: verifiers.Verifier, threshold: float,
                 seed: int, concurrency: int, budget: Budget, credit: bool = False, max_steps: int = 64,
                 on_row: Callable[[dict[str, Any]], None] | None = None,
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
        self.done: dict[tuple[str, str, int], dict[str, Any]] = {}  # finished rollouts (resume)

    def can_resample(self, trajectory: Trajectory, index: int) -> bool:
        step = trajectory.step(index)
        if step.observation_only:
            return False
        return self.registry.resolve(step.kind, step.tool_name or step.name, step.model) is not None

    def run(self, trajectory: Trajectory, specs: Iterable[RolloutSpec]) -> list[dict[str, Any]]:
        """Rows for every spec (already-finished ones are reused, not re-run)."""
        specs = list(specs)
        rows: list[dict[str, Any] | None] = [self.done.get((trajectory.trace_id, s.plan.key(), s.rollout)) for s in specs]
        todo = [i for i, row in enumerate(rows) if row is None]
        if todo and not self.budget.exhausted:
            for i, row in zip(todo, self.executor.map(self, trajectory, [specs[i] for i in todo]), strict=True):
                rows[i] = row
        return [r for r in rows if r is not None]

    def _one(self, trajectory: Trajectory, spec: RolloutSpec) -> dict[str, Any] | None:
        row = self.rollout(trajectory, spec)
        return None if row is None else self.record(row)

    def rollout(self, trajectory: Trajectory, spec: RolloutSpec) -> dict[str, Any] | None:
        """Run one rollout and score it; its row as produced (`record` finishes it). Runs anywhere."""
        if self.budget.exhausted:
            return None
        key = spec.plan.key()
        seed = rollout_seed(self.seed, trajectory.trace_id, key, spec.rollout)
        started = time.perf_counter()
        run = replay(trajectory, spec.plan, seed, policies=self.registry, max_steps=self.max_steps,
                     policy_timeout_s=self.policy_timeout_s)
        if run.unreplayable and run.unreplayable.cause == "refused":
            return None  # not a result: the rollout was cut off by the budget
        score = None if run.unreplayable else verifiers.score(self.verifier, run.final_output, run)
        failed = None if score is None else (score >= self.threshold if self.credit else score < self.threshold)
        culprit_output = next((list(o.outputs) for o in run.steps if o.index == spec.step_index), None)
        row = {
            "job_id": self.job_id, "trace_id": trajectory.trace_id, "plan": key, "step_index": spec.step_index,
            "role": spec.role, "rollout": spec.rollout, "seed": seed, "score": score, "failed": failed,
            "unreplayable": run.unreplayable is not None and not run.errored, "errored": run.errored,
            "reason": str(run.unreplayable) if run.unreplayable else None,
            "policy_calls": run.policy_calls, "tokens": run.tokens, "diverged_at": run.diverged_at,
            "duration_ms": (time.perf_counter() - started) * 1000, "final_output": run.final_output,
            "digest": run.digest, "detail": json.dumps({"step_output": culprit_output}) if culprit_output else None,
        }
        return row

    def record(self, row: dict[str, Any]) -> dict[str, Any]:
        """Redact the row's policy-made text (in place: every holder sees the stored row), cut the final
        output to `FINAL_OUTPUT_CHARS`, remember the row and hand it on; in the process that owns the job."""
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
        self.done[(row["trace_id"], row["plan"], row["rollout"])] = row
        if self.on_row:
            self.on_row(row)
        return row

    def redact(self, value: Any) -> Any:
        """A policy-made JSON value (a repair candidate) as it may be stored."""
        return value if self.redactor is None else self.redactor.value(value)[0]
