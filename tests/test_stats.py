"""The intervals claim their level: exact computations and simulations check the coverage of each
interval, and that sampling look by look until a decision keeps the error rate at alpha."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest

from otel_replay.attribution import stats
from otel_replay.attribution.sequential import (
    HARMFUL,
    NEGLIGIBLE,
    PROTECTIVE,
    UNDECIDED,
    Design,
    Pairs,
    classify,
    rollouts_to_decide,
    sequential_looks,
)


def _exact_coverage(interval, n: int, p: float) -> float:
    """Coverage computed exactly: the binomial probability of every k whose interval holds p."""
    bounds = [interval(k, n) for k in range(n + 1)]
    return sum(comb(n, k) * p**k * (1 - p) ** (n - k) for k, (low, high) in enumerate(bounds) if low <= p <= high)


@pytest.mark.parametrize("p", [0.01, 0.05, 0.1, 0.2, 0.5, 0.8, 0.9, 0.97])
@pytest.mark.parametrize("n", [10, 20, 30, 60])
def test_clopper_pearson_covers_at_least_95_percent(p, n):
    assert _exact_coverage(stats.clopper_pearson, n, p) >= 0.95


def test_clopper_pearson_matches_the_beta_quantiles_and_its_closed_edges():
    from scipy.stats import beta

    for k, n, alpha in [(3, 10, 0.05), (0, 25, 0.01), (25, 25, 0.01), (187, 400, 0.001)]:
        low, high = stats.clopper_pearson(k, n, alpha)
        assert low == pytest.approx(0.0 if k == 0 else beta.ppf(alpha / 2, k, n - k + 1), abs=1e-12)
        assert high == pytest.approx(1.0 if k == n else beta.ppf(1 - alpha / 2, k + 1, n - k), abs=1e-12)


def test_wilson_can_dip_below_95_percent_which_is_why_verdicts_do_not_use_it():
    wilson = lambda k, n: tuple(float(x) for x in stats.wilson(k, n))  # noqa: E731
    assert _exact_coverage(wilson, 20, 0.05) < 0.95


def _paired_coverage(n: int, up: float, down: float, alpha: float) -> float:
    """Exact coverage of `paired_difference`: the trinomial probability of every (up, down) count
    whose interval holds the effect up - down."""
    effect, tie = up - down, 1 - up - down
    covered = 0.0
    for u in range(n + 1):
        for d in range(n - u + 1):
            low, high = stats.paired_difference(u, d, n, alpha)
            if low <= effect + 1e-12 and effect - 1e-12 <= high:
                covered += comb(n, u) * comb(n - u, d) * up**u * down**d * tie ** (n - u - d)
    return covered


@pytest.mark.parametrize(("up", "down"), [(0.0, 0.0), (0.05, 0.0), (0.25, 0.0), (0.47, 0.09), (0.25, 0.25),
                                          (0.1, 0.3), (0.9, 0.0), (0.6, 0.4), (0.02, 0.01)])
@pytest.mark.parametrize("n", [10, 25, 40])
def test_the_paired_interval_covers_at_least_its_level(up, down, n):
    """Computed exactly over every outcome, for effects from none to large, arms that mostly agree
    and arms that disagree as often as two independent runs would."""
    assert _paired_coverage(n, up, down, 0.05) >= 0.95
    assert _paired_coverage(n, up, down, 0.2) >= 0.8


def test_the_paired_interval_is_narrow_when_the_arms_agree_and_honest_when_they_do_not():
    agree = stats.paired_difference(0, 0, 100, 0.05)
    assert agree[0] < 0 < agree[1] <= 0.06  # 100 pairs that all agree: within +-0.06
    noisy = stats.paired_difference(25, 25, 100, 0.05)
    assert noisy[1] - noisy[0] > 0.3  # half the pairs disagree, both ways: nothing is known to +-0.15
    small = stats.paired_difference(25, 0, 100, 0.001)
    assert small[0] > 0.05  # a quarter of the pairs flip one way only: a real effect, at alpha 0.001


def test_a_verdict_follows_from_the_interval_and_the_band():
    assert classify(0.11, 0.5, 0.1) == HARMFUL  # above the band: a real effect bigger than what counts as none
    assert classify(0.01, 0.5, 0.1) == UNDECIDED  # excludes 0 but reaches into the band: maybe no effect
    assert classify(0.01, 0.09, 0.1) == NEGLIGIBLE  # real, and smaller than what counts
    assert classify(-0.5, -0.01, 0.1) == PROTECTIVE
    assert classify(-0.08, 0.09, 0.1) == NEGLIGIBLE
    assert classify(-0.07, 0.41, 0.1) == UNDECIDED  # the "locked-in" that held an effect of 0.4
    assert classify(0.0, 0.75, 0.1) == UNDECIDED  # touching 0 is not excluding it


def test_looks_grow_to_the_cap_and_one_sits_where_agreeing_arms_are_cleared():
    assert sequential_looks(400) == (20, 30, 45, 68, 102, 153, 230, 345, 400)
    assert sequential_looks(10) == (10,)
    design = Design.sequential(400).with_tests(9)
    clear = next(n for n in design.looks if stats.paired_difference(0, 0, n, design.look_alpha)[1] <= 0.1)
    assert stats.paired_difference(0, 0, clear - 1, design.look_alpha)[1] > 0.1  # not one rollout later than needed
    assert design.look_alpha == pytest.approx(0.05 / (9 * len(design.looks)))
    assert Design.fixed(30).with_tests(9).looks == (30,)


def test_the_cost_of_deciding_grows_as_the_effect_nears_the_band():
    design = Design.sequential(400).with_tests(3)
    far = rollouts_to_decide(Pairs(100, 40, 0), design)  # +0.40, the pairs that differ all one way
    middle = rollouts_to_decide(Pairs(100, 30, 0), design)  # +0.30
    near = rollouts_to_decide(Pairs(100, 23, 10), design)  # +0.13, a third of the pairs differ
    assert far is not None and middle is not None and near is not None
    assert far < middle <= 400 < near  # beyond the cap: what a longer run would need
    assert rollouts_to_decide(Pairs(100, 30, 20), design) is None  # +0.10: on the band's edge, never
    assert rollouts_to_decide(Pairs(100, 50, 50), design, limit=1000) is None  # no effect, every pair differs


def test_peeking_with_fixed_size_intervals_would_inflate_false_blame():
    """Why looks are paid for: a no-effect step whose arms disagree half the time, tested at
    nine looks with the single-look interval each time, is blamed more often than alpha; the
    schedule's split keeps it below alpha."""
    rng = np.random.default_rng(5)
    looks = sequential_looks(400)
    naive = split = 0
    sims = 1500
    for _ in range(sims):
        d = rng.choice([-1, 0, 1], p=[0.25, 0.5, 0.25], size=looks[-1])
        flags = []
        for alpha in (0.05, 0.05 / len(looks)):
            flags.append(any(stats.paired_difference(int((d[:n] == 1).sum()), int((d[:n] == -1).sum()), n, alpha)[0] > 0
                             for n in looks))
        naive += flags[0]
        split += flags[1]
    assert naive / sims > split / sims
    assert split / sims <= 0.025 + 0.01  # one side of alpha = 0.05, with a binomial margin


def test_student_t_interval_uses_the_t_quantile():
    values = np.array([1.0, 0.0, 1.0, 1.0, 0.5])
    mean, low, high = stats.mean_interval(values, 0.05)
    half = 2.7764451051977987 * values.std(ddof=1) / np.sqrt(5)  # t(0.975, 4)
    assert mean == pytest.approx(0.7) and high - mean == pytest.approx(min(half, 1 - mean))
    assert low == pytest.approx(mean - half)
