"""Contrastive attribution with the Point-of-Commitment rule.

For step i: effect_i = P(fail | steps <= i held) - P(fail | steps < i held, i re-decided), where
steps after the boundary are re-decided in both arms. With f(k) = P(fail | steps < k held, the
rest re-decided), effect_i = f(i + 1) - f(i), so neighbouring steps share rollouts. The culprit
is the latest step whose interval excludes zero; the default search scans backwards from the
last step and stops there (early steps are the expensive ones).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from otel_replay.attribution import stats
from otel_replay.attribution.rollouts import RolloutRunner, RolloutSpec
from otel_replay.replay import ReplayPlan
from otel_replay.replay.plan import Action, Intervention
from otel_replay.trajectory import Trajectory


@dataclass(slots=True)
class StepEstimate:
    index: int
    estimate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    fail_held: float | None = None
    fail_resampled: float | None = None
    held_ci: tuple[float, float] | None = None
    resampled_ci: tuple[float, float] | None = None
    n_held: int = 0
    n_resampled: int = 0
    verdict: str = "not scored"
    culprit: bool = False

    @property
    def significant(self) -> bool:
        return self.ci_low is not None and self.ci_low > 0


@dataclass(frozen=True, slots=True)
class ScanOptions:
    rollouts: int = 30
    adaptive: bool = False
    target_width: float = 0.3
    max_rollouts: int = 200
    batch: int = 10
    full: bool = False
    alpha: float = 0.05


def boundary_plan(resamplable: list[int], k: int) -> ReplayPlan:
    """Steps before k held; every resamplable step from k on re-decided."""
    return ReplayPlan(tuple((j, Intervention(Action.RESAMPLE)) for j in resamplable if j >= k), label=f"from({k})")


class ContrastiveScan:
    def __init__(self, trajectory: Trajectory, runner: RolloutRunner, options: ScanOptions,
                 on_step: Callable[[StepEstimate], None] | None = None) -> None:
        self.traj = trajectory
        self.runner = runner
        self.options = options
        self.on_step = on_step
        self.resamplable = [s.index for s in trajectory.steps if runner.can_resample(trajectory, s.index)]
        self.rows: dict[int, list[dict]] = {}  # boundary k -> rollout rows

    def _sample(self, boundaries: tuple[int, ...], n: int) -> list[list[dict]]:
        """n rollouts of each boundary plan, all submitted at once (they run concurrently)."""
        specs = []
        for k in boundaries:
            plan = boundary_plan(self.resamplable, k)
            role = "factual" if not plan.interventions else "boundary"
            specs += [RolloutSpec(plan, k if k < len(self.traj) else None, role, r) for r in range(n)]
        rows = self.runner.run(self.traj, specs)
        for k in boundaries:
            key = boundary_plan(self.resamplable, k).key()
            self.rows[k] = [r for r in rows if r["plan"] == key]
        return [self.rows[k] for k in boundaries]

    @staticmethod
    def _counts(rows: list[dict]) -> tuple[int, int]:
        scored = [r for r in rows if not r["unreplayable"]]
        return sum(1 for r in scored if r["failed"]), len(scored)

    def _estimate(self, i: int, adaptive: bool) -> StepEstimate:
        o = self.options
        n = o.batch if adaptive else o.rollouts
        est = StepEstimate(i)
        while True:
            held, resampled = self._sample((i + 1, i), n)
            (kh, nh), (kr, nr) = self._counts(held), self._counts(resampled)
            est.n_held, est.n_resampled = nh, nr
            if nh == 0 or nr == 0:
                est.verdict = "unreplayable"
                return est
            est.fail_held, est.fail_resampled = kh / nh, kr / nr
            est.estimate = est.fail_held - est.fail_resampled
            if adaptive:
                est.ci_low, est.ci_high = stats.cs_difference(kh, nh, kr, nr, o.alpha)
                (hl, rl), (hh, rh) = stats.confidence_sequence([kh, kr], [nh, nr], o.alpha / 2)
            else:
                est.ci_low, est.ci_high = stats.cp_difference(kh, nh, kr, nr, o.alpha)
                (hl, hh), (rl, rh) = stats.clopper_pearson(kh, nh, o.alpha), stats.clopper_pearson(kr, nr, o.alpha)
            est.held_ci, est.resampled_ci = (float(hl), float(hh)), (float(rl), float(rh))
            decided = est.ci_low > 0 or est.ci_high < 0 or est.ci_high - est.ci_low <= o.target_width
            if not adaptive or decided or n >= o.max_rollouts or self.runner.budget.exhausted:
                return est
            n = min(o.max_rollouts, n + o.batch)

    def run(self) -> list[StepEstimate]:
        estimates = {s.index: StepEstimate(s.index) for s in self.traj.steps}
        for index in estimates:
            if index not in self.resamplable:
                estimates[index].verdict = "observation-only" if self.traj.step(index).observation_only else "no policy"
        culprit = None
        for i in reversed(self.resamplable):
            if self.runner.budget.exhausted:
                break
            est = self._estimate(i, self.options.adaptive)
            estimates[i] = est
            if est.verdict == "unreplayable":
                if self.on_step:
                    self.on_step(est)
                continue
            est.verdict = "decisive" if est.significant and culprit is None else \
                "contributing" if est.significant else "no effect"
            if est.significant and culprit is None:
                culprit = i
                est.culprit = True
            if self.on_step:
                self.on_step(est)
            if culprit is not None and not self.options.full:
                break
        if culprit is not None:
            for i, est in estimates.items():
                if i > culprit and est.verdict == "no effect":
                    est.verdict = "locked-in"
        return [estimates[i] for i in sorted(estimates)]

    def held_rows(self, k: int) -> list[dict]:
        return self.rows.get(k, [])
