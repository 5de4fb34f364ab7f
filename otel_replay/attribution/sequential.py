"""Sequential decisions on one contrast: when to look, what an interval says, when to give up.

A contrast compares two plans' rollouts paired by rollout index (the same seeds). Rollouts are
added in batches and the interval is computed at a fixed schedule of looks (`Design.looks`:
20, 30, 45, ... rollouts per plan up to the cap, and one more where a step whose two arms always
agree is first cleared, the commonest decision); the error rate is split evenly over
the looks and over every contrast the search may test (`Design.tests`), Bonferroni's way. The
schedule depends only on the design, never on the data. So however the
search stops, the intervals it reports hold simultaneously with probability at least 1 - alpha:
a verdict is wrong only when some interval misses its effect.

What an interval says about an effect (`classify`), with the practical-equivalence band ±epsilon:
- `harmful`: the lower bound is above +epsilon (the recorded decision made failure more likely, by
  more than the band: an effect inside the band counts as none, so a real but smaller effect is
  not a culprit);
- `protective`: the upper bound is below 0 (it made failure less likely);
- `negligible`: the whole interval lies inside [-epsilon, +epsilon];
- `undecided`: anything else, an interval that excludes 0 but reaches into the band included. It
  is never read as "no effect".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from otel_replay.attribution import stats

Decision = Literal["harmful", "protective", "negligible", "undecided"]
"""What one interval says of an effect (`classify`)."""
HARMFUL: Final = "harmful"
PROTECTIVE: Final = "protective"
NEGLIGIBLE: Final = "negligible"
UNDECIDED: Final = "undecided"
FIRST_LOOK = 20
LOOK_GROWTH = 1.5
DEFAULT_MAX_ROLLOUTS = 400  # resolves an effect of 0.2 from the band at epsilon 0.1 with noisy arms
DEFAULT_EPSILON = 0.1
DEFAULT_ALPHA = 0.05


def sequential_looks(cap: int, first: int = FIRST_LOOK, growth: float = LOOK_GROWTH) -> tuple[int, ...]:
    """Rollouts per plan at each look: first, first * growth, ... and the cap itself last."""
    looks = []
    n = min(first, cap)
    while n < cap:
        looks.append(n)
        n = max(n + 1, math.ceil(n * growth))
    looks.append(cap)
    return tuple(looks)


@dataclass(frozen=True, slots=True)
class Design:
    """How one search decides: the error rate, the band, the looks and the number of contrasts."""

    alpha: float = DEFAULT_ALPHA
    epsilon: float = DEFAULT_EPSILON
    looks: tuple[int, ...] = sequential_looks(DEFAULT_MAX_ROLLOUTS)
    tests: int = 1  # contrasts the search may test: alpha is split over them

    @classmethod
    def fixed(cls, rollouts: int, *, alpha: float = DEFAULT_ALPHA, epsilon: float = DEFAULT_EPSILON,
              tests: int = 1) -> Design:
        """One look at `rollouts`: no sequential sampling."""
        return cls(alpha=alpha, epsilon=epsilon, looks=(rollouts,), tests=tests)

    @classmethod
    def sequential(cls, max_rollouts: int, *, alpha: float = DEFAULT_ALPHA, epsilon: float = DEFAULT_EPSILON,
                   tests: int = 1) -> Design:
        return cls(alpha=alpha, epsilon=epsilon, looks=sequential_looks(max_rollouts), tests=tests)

    def with_tests(self, tests: int) -> Design:
        return _with_tests(self, max(1, tests))

    def _with_clearing_look(self) -> Design:
        """One more look, at the size that clears a step whose two arms always agree (computed at the
        alpha per look that the extra look leaves)."""
        with_one_more = Design(self.alpha, self.epsilon, (*self.looks, 0), self.tests).look_alpha
        clear = next((n for n in range(1, self.cap)
                      if stats.paired_difference(0, 0, n, with_one_more)[1] <= self.epsilon), None)
        if clear is None or clear in self.looks:
            return self
        return Design(self.alpha, self.epsilon, tuple(sorted((*self.looks, clear))), self.tests)

    @property
    def look_alpha(self) -> float:
        """The error rate each single interval is computed at."""
        return self.alpha / (self.tests * len(self.looks))

    @property
    def cap(self) -> int:
        return self.looks[-1]


@functools.lru_cache(maxsize=256)
def _with_tests(design: Design, tests: int) -> Design:
    split = Design(design.alpha, design.epsilon, design.looks, tests)
    return split._with_clearing_look() if len(design.looks) > 1 else split


def classify(low: float, high: float, epsilon: float) -> Decision:
    if low > epsilon:
        return HARMFUL
    if high < 0:
        return PROTECTIVE
    if low >= -epsilon and high <= epsilon:
        return NEGLIGIBLE
    return UNDECIDED


@dataclass(frozen=True, slots=True)
class Pairs:
    """Paired outcomes of two plans over the same rollout seeds (unscored pairs left out)."""

    n: int = 0
    up: int = 0  # held arm failed, re-decided arm did not
    down: int = 0  # re-decided arm failed, held arm did not
    held_failures: int = 0
    redecided_failures: int = 0

    @classmethod
    def of(cls, held: Sequence[bool | None], redecided: Sequence[bool | None], count: int) -> Pairs:
        """The pairs among the first `count` rollouts of each arm (None: not scored)."""
        n = up = down = hf = rf = 0
        for h, r in zip(held[:count], redecided[:count], strict=False):
            if h is None or r is None:
                continue
            n += 1
            hf += h
            rf += r
            up += h and not r
            down += r and not h
        return cls(n, up, down, hf, rf)

    @property
    def estimate(self) -> float | None:
        return None if self.n == 0 else (self.up - self.down) / self.n

    def interval(self, alpha: float) -> tuple[float, float]:
        return stats.paired_difference(self.up, self.down, self.n, alpha)

    def scaled(self, n: int, shift: float = 0.0) -> Pairs:
        """These pairs' proportions carried to n pairs, with `shift` more of them going the held arm's
        way (or, negative, the other way): projections of what more rollouts would show."""
        if self.n == 0:
            return Pairs(n)
        up, down = self.up / self.n, self.down / self.n
        if shift >= 0:
            up = min(1.0 - down, up + shift)
        else:
            down = min(1.0 - up, down - shift)
        return Pairs(n, round(n * up), round(n * down))


FUTILITY_AFTER = 45  # rollouts per plan before a step may be given up on: early estimates are crude
OPTIMISM = 2.0  # standard errors the effect may move by before more rollouts are judged useless


def would_decide(pairs: Pairs, n: int, design: Design) -> bool:
    """Whether pairs like these, at their effect or `OPTIMISM` standard errors either side, would be
    decided at n pairs: the test for stopping early when more rollouts are unlikely to help (it
    never makes a verdict wrong, only undecided sooner)."""
    if pairs.n < FUTILITY_AFTER:
        return True
    mean = (pairs.up - pairs.down) / pairs.n
    second = (pairs.up + pairs.down) / pairs.n
    error = OPTIMISM * max(math.sqrt(max(second - mean * mean, 0.0) / pairs.n), 1 / pairs.n)
    for shift in (0.0, error, -error):
        low, high = pairs.scaled(n, shift).interval(design.look_alpha)
        if classify(low, high, design.epsilon) != UNDECIDED:
            return True
    return False


def rollouts_to_decide(pairs: Pairs, design: Design, limit: int = 100_000) -> int | None:
    """Rollouts per plan at which pairs with these proportions would be decided: a look of this
    design, or the cap of a longer one (None: not by `limit`); what an undecided step would cost."""
    if pairs.n == 0:
        return None
    for n in design.looks:
        if n >= pairs.n and _decided_at(pairs, n, design):
            return n
    n = math.ceil(design.cap * LOOK_GROWTH)
    while n <= limit:
        if len(design.looks) == 1:
            longer = Design.fixed(n, alpha=design.alpha, epsilon=design.epsilon).with_tests(design.tests)
        else:
            longer = Design.sequential(n, alpha=design.alpha, epsilon=design.epsilon).with_tests(design.tests)
        if _decided_at(pairs, n, longer):
            return n
        n = math.ceil(n * LOOK_GROWTH)
    return None


def _decided_at(pairs: Pairs, n: int, design: Design) -> bool:
    low, high = pairs.scaled(n).interval(design.look_alpha)
    return classify(low, high, design.epsilon) != UNDECIDED
