"""Contrastive attribution with the Point-of-Commitment rule.

For step i: effect_i = P(fail | steps <= i held) - P(fail | steps < i held, i re-decided), where
steps after the boundary are re-decided in both arms. With f(k) = P(fail | steps < k held, the
rest re-decided), effect_i = f(i + 1) - f(i), so neighbouring steps share rollouts. The culprit
is the latest step whose interval excludes zero; the default search scans backwards from the
last step and stops there (early steps are the expensive ones).

The effects telescope: f(b + 1) - f(a) is the summed effect of steps a..b, so `search="gallop"`
tests blocks of 1, 2, 4, ... steps backwards from the last one and bisects the first block whose
interval excludes zero (its later half first). It needs far fewer of the expensive early
boundaries when the culprit is early or absent, and assumes that effects inside a block do not
cancel (a protective step right before a harmful one could hide it): steps cleared as part of a
block are reported "not scored", and `search="scan"` tests every step on its own.
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
    search: str = "scan"  # scan: every step backwards; gallop: blocks, then bisection


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
        scored = [r for r in rows if r["failed"] is not None]  # unreplayable and errored rollouts are not scored
        return sum(1 for r in scored if r["failed"]), len(scored)

    def _estimate(self, i: int, adaptive: bool, upper: int | None = None) -> StepEstimate:
        """The effect of step i, or of the block i..upper-1 when `upper` is given: f(upper) - f(i)."""
        o = self.options
        n = o.batch if adaptive else o.rollouts
        est = StepEstimate(i)
        upper = i + 1 if upper is None else upper
        while True:
            held, resampled = self._sample((upper, i), n)
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
        if self.options.search == "gallop" and not self.options.full:
            return self._gallop(estimates)
        return self._scan(estimates, self.resamplable)

    def _scan(self, estimates: dict[int, StepEstimate], candidates: list[int]) -> list[StepEstimate]:
        culprit = None
        for i in reversed(candidates):
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

    def _upper(self, position: int) -> int:
        """The boundary just after the resamplable step at `position` (len(trajectory) after the last)."""
        nxt = position + 1
        return self.resamplable[nxt] if nxt < len(self.resamplable) else len(self.traj)

    def _block(self, lo: int, hi: int) -> StepEstimate:
        """The summed effect of the resamplable steps at positions lo..hi."""
        return self._estimate(self.resamplable[lo], self.options.adaptive, self._upper(hi))

    def _gallop(self, estimates: dict[int, StepEstimate]) -> list[StepEstimate]:
        hi, size = len(self.resamplable) - 1, 1
        while hi >= 0 and not self.runner.budget.exhausted:
            lo = max(0, hi - size + 1)
            block = self._block(lo, hi)
            # the latest significant step is in a significant block (an unreplayable one is scanned)
            if (block.verdict == "unreplayable" or block.significant) and \
                    self._bisect(estimates, lo, hi, block) is not None:
                break
            hi, size = lo - 1, size * 2
        return [estimates[i] for i in sorted(estimates)]

    def _bisect(self, estimates: dict[int, StepEstimate], lo: int, hi: int, block: StepEstimate) -> int | None:
        """The latest significant step among positions lo..hi, later half first."""
        if lo == hi or block.verdict == "unreplayable":
            self._scan(estimates, self.resamplable[lo:hi + 1])
            return next((i for i, e in estimates.items() if e.culprit), None)
        mid = (lo + hi + 1) // 2
        for a, b in ((mid, hi), (lo, mid - 1)):
            part = self._block(a, b)
            if part.significant or part.verdict == "unreplayable":
                found = self._bisect(estimates, a, b, part)
                if found is not None:
                    return found
        # the block's effect is significant but neither half's is: test its steps one by one
        self._scan(estimates, self.resamplable[lo:hi + 1])
        return next((i for i, e in estimates.items() if e.culprit), None)

    def held_rows(self, k: int) -> list[dict]:
        return self.rows.get(k, [])
