"""Contrastive attribution with the Point-of-Commitment rule, decided sequentially.

For step i: effect_i = P(fail | steps <= i held) - P(fail | steps < i held, i re-decided), later
steps re-decided in both arms. With f(k) = P(fail | steps < k held, the rest re-decided),
effect_i = f(i + 1) - f(i), so neighbouring steps share rollouts; rollout r of every boundary
plan has the same seed, so the two arms are compared pair by pair (`stats.paired_difference`).

The culprit is the point of commitment: the latest step whose effect is bigger than the band
±epsilon (an effect inside counts as none). The default search
scans backwards from the last step, sampling each step until its interval decides it
(`sequential`): harmful (the interval is above +epsilon), protective (below 0), negligible (inside
±epsilon), or, at the cap, undecided. The scan passes a step only when it is decided; a step it
cannot decide is never read as "no effect": the scan goes on to find the latest harmful step, and
the result names both as candidates instead of one culprit.

`search="gallop"` tests blocks of 1, 2, 4, ... steps backwards from the last one (the effects
telescope: f(b + 1) - f(a) is the summed effect of steps a..b) and splits, later half first, any
block it cannot clear. A block cleared as negligible or protective clears its steps: that
assumes effects inside a block do not cancel (a protective step right before a harmful one could
hide it); `search="scan"` tests every step on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

from otel_replay.attribution import stats
from otel_replay.attribution.plans import boundary_spec
from otel_replay.attribution.rollouts import RolloutRunner, Row
from otel_replay.attribution.sequential import (
    HARMFUL,
    NEGLIGIBLE,
    PROTECTIVE,
    UNDECIDED,
    Decision,
    Design,
    Pairs,
    classify,
    rollouts_to_decide,
    would_decide,
)
from otel_replay.trajectory import Trajectory

StepVerdict = Literal["decisive", "contributing", "locked-in", "no effect", "protective", "undecided",
                      "observation-only", "no policy", "unreplayable", "not scored"]
"""A step's verdict (result.STEP_VERDICTS lists them in the report's order)."""

CLEARED: Final = "cleared"  # a decision: the step was cleared as part of a negligible or protective block (gallop)
Search = Literal["scan", "gallop"]
"""The contrastive search: `scan` every step backwards, or `gallop` (blocks, then halves)."""
Stopped = Literal["decided", "cap", "futile", "budget"]


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
    verdict: StepVerdict = "not scored"
    culprit: bool = False
    decision: Decision | Literal["cleared"] | None = None  # None: not tested
    stopped: Stopped | None = None  # why sampling stopped: decided, cap, futile (more would not decide), budget
    to_decide: int | None = None  # rollouts per plan that would decide an undecided step (None: not by 100k)
    calls_per_rollout: float | None = None  # policy calls one more pair of its two arms takes, on average


@dataclass(frozen=True, slots=True)
class ScanOptions:
    design: Design = field(default_factory=Design)
    full: bool = False
    search: Search = "scan"


class Outcomes(Protocol):
    """Rollout outcomes of the boundary plans, by rollout index: True failed, False passed, None not
    scored. `RunnerOutcomes` runs real rollouts; a test may draw them from known rates."""

    def sample(self, boundaries: Sequence[int], count: int) -> None:
        """Make rollouts 0 .. count - 1 of each boundary plan (as far as the budget allows)."""

    def outcomes(self, boundary: int, count: int) -> list[bool | None] | None:
        """The first `count` outcomes, or None when some of them were never run (the budget)."""

    def calls_per_rollout(self, boundary: int) -> float | None: ...

    @property
    def exhausted(self) -> bool: ...


class RunnerOutcomes:
    """Boundary outcomes from real rollouts."""

    def __init__(self, trajectory: Trajectory, runner: RolloutRunner, resamplable: list[int]) -> None:
        self.traj = trajectory
        self.runner = runner
        self.resamplable = resamplable
        self.rows: dict[int, dict[int, Row]] = {}  # boundary -> rollout -> row

    def sample(self, boundaries: Sequence[int], count: int) -> None:
        specs = [boundary_spec(self.resamplable, k, r) for k in boundaries
                 for r in range(count) if r not in self.rows.get(k, {})]
        if not specs:
            return
        by_key = {boundary_spec(self.resamplable, k, 0).plan.key(): k for k in boundaries}
        for row in self.runner.run(self.traj, specs):
            self.rows.setdefault(by_key[row["plan"]], {})[row["rollout"]] = row

    def outcomes(self, boundary: int, count: int) -> list[bool | None] | None:
        rows = self.rows.get(boundary, {})
        if any(r not in rows for r in range(count)):
            return None
        return [rows[r]["failed"] for r in range(count)]

    def calls_per_rollout(self, boundary: int) -> float | None:
        rows = self.rows.get(boundary, {})
        return sum(r["policy_calls"] for r in rows.values()) / len(rows) if rows else None

    def rows_of(self, boundary: int) -> list[Row]:
        return list(self.rows.get(boundary, {}).values())

    @property
    def exhausted(self) -> bool:
        return self.runner.budget.exhausted


def tests_for(resamplable: int, search: Search, full: bool) -> int:
    """How many contrasts the search may test, so alpha is split over all of them."""
    if search != "gallop" or full:
        return max(1, resamplable)
    tests, hi, size = 0, resamplable - 1, 1
    while hi >= 0:
        lo = max(0, hi - size + 1)
        tests += 2 * (hi - lo + 1) - 1  # the block and every half it may be split into, down to single steps
        hi, size = lo - 1, size * 2
    return max(1, tests)


class ContrastiveScan:
    def __init__(self, steps: Sequence[int], end: int, resamplable: list[int], source: Outcomes,
                 options: ScanOptions, fixed: dict[int, StepVerdict] | None = None,
                 on_step: Callable[[StepEstimate], None] | None = None) -> None:
        """`steps`: every step index; `end`: the boundary after the last step (all held: the factual
        plan); `fixed`: the verdicts of steps that cannot be re-decided (observation-only, no policy)."""
        self.steps = list(steps)
        self.end = end
        self.resamplable = resamplable
        self.source = source
        self.options = options
        self.design = options.design.with_tests(tests_for(len(resamplable), options.search, options.full))
        self.fixed = fixed or {}
        self.on_step = on_step

    def run(self) -> list[StepEstimate]:
        estimates = {i: StepEstimate(i, verdict=self.fixed.get(i, "not scored")) for i in self.steps}
        if self.options.search == "gallop" and not self.options.full:
            self._gallop(estimates)
        else:
            self._scan(estimates)
        label(estimates, self.resamplable)
        return [estimates[i] for i in sorted(estimates)]

    # -- one contrast, sampled until decided ------------------------------------------------------
    def _upper(self, position: int) -> int:
        """The boundary just after the resamplable step at `position` (`end` after the last)."""
        nxt = position + 1
        return self.resamplable[nxt] if nxt < len(self.resamplable) else self.end

    def decide(self, index: int, held: int, redecided: int) -> StepEstimate:
        """The effect f(held) - f(redecided), reported as step `index`'s, sampled look by look."""
        design, est = self.design, StepEstimate(index)
        pairs = Pairs()
        for look in design.looks:
            self.source.sample((held, redecided), look)
            h, r = self.source.outcomes(held, look), self.source.outcomes(redecided, look)
            if h is None or r is None:  # the budget cut this look short: the last whole look stands
                est.stopped = "budget"
                break
            pairs = Pairs.of(h, r, look)
            if pairs.n == 0:
                est.verdict, est.decision, est.stopped = "unreplayable", UNDECIDED, "decided"
                return est
            self._fill(est, pairs)
            if est.decision != UNDECIDED:
                est.stopped = "decided"
                return est
            if look == design.cap:
                est.stopped = "cap"
            elif not would_decide(pairs, design.cap, design):
                est.stopped = "futile"
            else:
                continue
            break
        if est.decision is None:  # not one whole look: nothing to say
            est.verdict = "not scored"
            return est
        est.to_decide = rollouts_to_decide(pairs, design)
        est.calls_per_rollout = sum(self.source.calls_per_rollout(k) or 0.0 for k in (held, redecided))
        return est

    def _fill(self, est: StepEstimate, pairs: Pairs) -> None:
        alpha = self.design.look_alpha
        est.n_held = est.n_resampled = pairs.n
        est.fail_held, est.fail_resampled = pairs.held_failures / pairs.n, pairs.redecided_failures / pairs.n
        est.estimate = pairs.estimate
        est.ci_low, est.ci_high = pairs.interval(alpha)
        est.held_ci = stats.clopper_pearson(pairs.held_failures, pairs.n, alpha)
        est.resampled_ci = stats.clopper_pearson(pairs.redecided_failures, pairs.n, alpha)
        est.decision = classify(est.ci_low, est.ci_high, self.design.epsilon)

    def _single(self, estimates: dict[int, StepEstimate], position: int) -> StepEstimate:
        i = self.resamplable[position]
        est = self.decide(i, self._upper(position), i)
        estimates[i] = est
        if self.on_step:
            self.on_step(est)
        return est

    # -- the searches -------------------------------------------------------------------------------
    def _scan(self, estimates: dict[int, StepEstimate]) -> None:
        for position in reversed(range(len(self.resamplable))):
            if self.source.exhausted:
                break
            est = self._single(estimates, position)
            if est.decision == HARMFUL and not self.options.full:
                break

    def _gallop(self, estimates: dict[int, StepEstimate]) -> None:
        hi, size = len(self.resamplable) - 1, 1
        while hi >= 0 and not self.source.exhausted:
            lo = max(0, hi - size + 1)
            if self._resolve(estimates, lo, hi):
                return
            hi, size = lo - 1, size * 2

    def _resolve(self, estimates: dict[int, StepEstimate], lo: int, hi: int) -> bool:
        """Decide the positions lo..hi, later ones first; True once a harmful single step is found."""
        if self.source.exhausted:
            return True
        if lo == hi:
            return self._single(estimates, lo).decision == HARMFUL
        block = self.decide(self.resamplable[lo], self._upper(hi), self.resamplable[lo])
        if block.decision in (NEGLIGIBLE, PROTECTIVE):
            for i in self.resamplable[lo:hi + 1]:
                estimates[i].decision = CLEARED
            return False
        mid = (lo + hi + 1) // 2
        return self._resolve(estimates, mid, hi) or self._resolve(estimates, lo, mid - 1)


@dataclass(frozen=True, slots=True)
class Finding:
    """What the step verdicts add up to."""

    culprit: int | None
    candidates: tuple[int, ...]  # undecided (or unknown) steps after the latest harmful one, and it
    untested: tuple[int, ...]  # re-decidable steps never tested (the budget, or a scan that stopped)


def label(estimates: dict[int, StepEstimate], resamplable: Sequence[int]) -> Finding:
    """Verdicts from decisions: the latest harmful step is `decisive` only when every later
    re-decidable step was decided; otherwise it and the undecided later steps are candidates."""
    culprit, candidates, untested = None, [], []
    open_later = harmful_seen = False
    for i in sorted(resamplable, reverse=True):
        est = estimates[i]
        if est.decision == HARMFUL:
            if not harmful_seen and not open_later:
                culprit = i
                est.verdict, est.culprit = "decisive", True
            else:
                est.verdict = "contributing"
                if not harmful_seen:
                    candidates.append(i)
            harmful_seen = True
        elif est.decision == UNDECIDED:
            if est.verdict != "unreplayable":
                est.verdict = "undecided"
            if not harmful_seen:
                candidates.append(i)
                open_later = True
        elif est.decision == PROTECTIVE:
            est.verdict = "protective"
        elif est.decision == NEGLIGIBLE:
            est.verdict = "locked-in" if not harmful_seen else "no effect"
        elif est.decision is None and not harmful_seen:  # never tested, later than any harmful step
            untested.append(i)
            open_later = True
        # CLEARED steps keep "not scored"
    if culprit is not None:
        return Finding(culprit, (), ())
    for i in resamplable:  # "locked-in" says: after the culprit; with none, these had no effect
        if estimates[i].verdict == "locked-in":
            estimates[i].verdict = "no effect"
    return Finding(None, tuple(candidates), tuple(sorted(untested)))
