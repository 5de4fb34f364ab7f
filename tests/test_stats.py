"""The intervals claim 95%: simulations check they cover 95%, and that adaptive stopping with
the confidence sequence keeps false blame at or below alpha."""

from __future__ import annotations

import numpy as np
import pytest

from otel_replay.attribution import stats


def _exact_coverage(interval, n: int, p: float) -> float:
    """Coverage computed exactly: the binomial probability of every k whose interval holds p."""
    from math import comb

    bounds = [interval(k, n) for k in range(n + 1)]
    return sum(comb(n, k) * p**k * (1 - p) ** (n - k) for k, (low, high) in enumerate(bounds) if low <= p <= high)


@pytest.mark.parametrize("p", [0.01, 0.05, 0.1, 0.2, 0.5, 0.8, 0.9, 0.97])
@pytest.mark.parametrize("n", [10, 20, 30, 60])
def test_clopper_pearson_covers_at_least_95_percent(p, n):
    assert _exact_coverage(stats.clopper_pearson, n, p) >= 0.95


def test_wilson_can_dip_below_95_percent_which_is_why_verdicts_do_not_use_it():
    wilson = lambda k, n: tuple(float(x) for x in stats.wilson(k, n))  # noqa: E731
    assert _exact_coverage(wilson, 20, 0.05) < 0.95


@pytest.mark.parametrize(("p1", "p2"), [(0.9, 0.1), (0.5, 0.5), (0.2, 0.05), (1.0, 0.1), (0.97, 0.03)])
def test_difference_interval_covers_at_least_95_percent(p1, p2):
    rng = np.random.default_rng(2)
    n = 30
    k1, k2 = rng.binomial(n, p1, size=4000), rng.binomial(n, p2, size=4000)
    intervals = [stats.cp_difference(int(a), n, int(b), n) for a, b in zip(k1, k2, strict=True)]
    hits = sum(low <= p1 - p2 <= high for low, high in intervals)
    assert hits / 4000 >= 0.95


def test_confidence_sequence_covers_at_every_sample_size_at_once():
    rng = np.random.default_rng(3)
    p, horizon, sims = 0.3, 400, 2000
    draws = rng.random((sims, horizon)) < p
    k = np.cumsum(draws, axis=1)
    n = np.arange(1, horizon + 1)
    low, high = stats.confidence_sequence(k, n)
    ever_missed = np.any((low > p) | (high < p), axis=1)
    assert ever_missed.mean() <= 0.05  # time-uniform: the whole path stays covered 95% of the time


def test_adaptive_stopping_does_not_inflate_false_blame():
    """A no-culprit step: held and re-decided arms fail at the same rate. Rollouts are added in
    batches of 10 until the interval excludes zero (blame) or a budget of 200; blame must stay <= alpha."""
    rng = np.random.default_rng(4)
    alpha, sims, batch, cap = 0.05, 3000, 10, 200
    for p in (0.1, 0.5):
        blamed = 0
        for _ in range(sims):
            k1 = k2 = n = 0
            while n < cap:
                k1 += rng.binomial(batch, p)
                k2 += rng.binomial(batch, p)
                n += batch
                low, high = stats.cs_difference(k1, n, k2, n, alpha)
                if low > 0:
                    blamed += 1
                    break
                if high < 0:
                    break
        assert blamed / sims <= alpha, (p, blamed / sims)


def test_naive_intervals_with_the_same_stopping_would_inflate_it():
    """The reason for confidence sequences: peeking with fixed-size intervals blames far more often."""
    rng = np.random.default_rng(5)
    blamed, sims = 0, 1500
    for _ in range(sims):
        k1 = k2 = n = 0
        while n < 200:
            k1 += rng.binomial(10, 0.5)
            k2 += rng.binomial(10, 0.5)
            n += 10
            if stats.newcombe(k1, n, k2, n)[0] > 0:
                blamed += 1
                break
    assert blamed / sims > 0.05
