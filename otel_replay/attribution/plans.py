"""The plans attribution runs, how each rollout is named and seeded, and the policy-call budget:
the small core that the scan, the rollout runner and the executors all build on.

Rollout r of every plan of a trace draws from one seed (`rollout_seed` ignores the plan): the
plans' rollouts are paired by index, so a contrast between two plans compares like with like
(common random numbers), and a rollout whose re-decided step reproduces the recording continues
exactly as the plan that holds that step (`ReplayPlan.holding`), which the runner then reuses.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

import xxhash

from otel_replay.replay import ReplayPlan
from otel_replay.replay.guard import CallRefused
from otel_replay.replay.plan import Action, Intervention


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


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    plan: ReplayPlan
    step_index: int | None  # the step the plan is about (None: factual)
    role: str  # factual, boundary, repair, shapley
    rollout: int
    reuse: bool = False  # may continue as the plan holding its first re-decided step, when that reproduces


def rollout_seed(job_seed: int, trace_id: str, rollout: int) -> int:
    """The seed of rollout `rollout` of every plan of a trace in a job."""
    return int(xxhash.xxh3_64_hexdigest(f"{job_seed}:{trace_id}:{rollout}".encode()), 16) % (2**31)


def boundary_plan(resamplable: Iterable[int], k: int) -> ReplayPlan:
    """Steps before k held; every resamplable step from k on re-decided."""
    return ReplayPlan(tuple((j, Intervention(Action.RESAMPLE)) for j in resamplable if j >= k), label=f"from({k})")


def boundary_spec(resamplable: Iterable[int], k: int, rollout: int) -> RolloutSpec:
    plan = boundary_plan(resamplable, k)
    first = plan.first_intervened
    return RolloutSpec(plan, first, "boundary" if plan.interventions else "factual", rollout, reuse=True)


def coalition_plan(resamplable: Iterable[int], held: frozenset[int]) -> ReplayPlan:
    """Steps in `held` held, every other resamplable step re-decided (Shapley coalitions)."""
    return ReplayPlan(tuple((j, Intervention(Action.RESAMPLE)) for j in resamplable if j not in held),
                      label=f"coalition({sorted(held)})")
