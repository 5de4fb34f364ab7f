"""Exact intervals for failure rates and for paired differences of failure rates.

Assumptions, stated once: the rollouts of one plan are independent, identically distributed
Bernoulli trials (rollout r of every plan of a trace draws from its own seed, so rollouts r and
r' are independent), and rollouts that are not scored (unreplayable, or a policy errored) are
missing at random.

- `clopper_pearson`: the exact interval for one rate; its coverage is at least the nominal level
  for every rate and sample size (Wilson's, also here, can dip below it).
- `paired_difference`: the exact interval for a difference of two rates measured on the same
  rollout seeds. Pair r is (held_r, redecided_r); D_r = held_r - redecided_r is +1, 0 or -1, and
  the effect is E[D] = s (2 theta - 1) with s = P(D != 0) and theta = P(D = +1 | D != 0). Exact
  Clopper-Pearson intervals for s (the pairs that differ among all pairs) and for theta (the +1s
  among the pairs that differ, which is binomial given their number), each at alpha / 2, give a
  box whose image is the interval: never below the nominal coverage. When the two arms of most
  pairs agree (the usual case: re-deciding a step mostly reproduces what was recorded), the
  interval is far narrower than two separate rates would allow.
- `mean_interval`: Student's t interval for a mean (Shapley values; an approximation, stated as such).
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist

import numpy as np
from scipy.special import betaincinv


def _z(alpha: float) -> float:
    return NormalDist().inv_cdf(1 - alpha / 2)


def wilson(failures: np.ndarray | int, n: np.ndarray | int, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Wilson's score interval (for comparison only: its coverage dips below nominal)."""
    k, m = np.asarray(failures, dtype=float), np.asarray(n, dtype=float)
    z = _z(alpha)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(m > 0, k / m, 0.0)
        centre = (p + z * z / (2 * m)) / (1 + z * z / m)
        half = z / (1 + z * z / m) * np.sqrt(p * (1 - p) / m + z * z / (4 * m * m))
    low, high = np.clip(centre - half, 0, 1), np.clip(centre + half, 0, 1)
    return np.where(m > 0, low, 0.0), np.where(m > 0, high, 1.0)


@functools.lru_cache(maxsize=1 << 16)
def clopper_pearson(failures: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact two-sided interval for a binomial rate (alpha / 2 in each tail)."""
    k, n = int(failures), int(n)
    if n == 0:
        return 0.0, 1.0
    if k == 0:  # closed forms at the edges: the common case of a step that always fails or never
        return 0.0, 1.0 - (alpha / 2) ** (1 / n)
    if k == n:
        return (alpha / 2) ** (1 / n), 1.0
    return float(betaincinv(k, n - k + 1, alpha / 2)), float(betaincinv(k + 1, n - k, 1 - alpha / 2))


def paired_difference(up: int, down: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact interval for E[held - redecided] from n pairs: `up` pairs where only the held arm
    failed, `down` where only the re-decided arm failed (see the module docstring)."""
    if n == 0:
        return -1.0, 1.0
    differ = up + down
    s_low, s_high = clopper_pearson(differ, n, alpha / 2)
    if differ == 0:
        return -s_high, s_high
    t_low, t_high = clopper_pearson(up, differ, alpha / 2)
    high = s_high * (2 * t_high - 1) if t_high >= 0.5 else s_low * (2 * t_high - 1)
    low = s_high * (2 * t_low - 1) if t_low <= 0.5 else s_low * (2 * t_low - 1)
    return max(-1.0, low), min(1.0, high)


def mean_interval(values: np.ndarray, alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean, low, high) by Student's t; fewer than two values give (mean, -1, 1)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return 0.0, -1.0, 1.0
    mean = float(x.mean())
    if x.size < 2:
        return mean, -1.0, 1.0
    half = _t(alpha, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, max(-1.0, mean - half), min(1.0, mean + half)


@functools.lru_cache(maxsize=4096)
def _t(alpha: float, df: int) -> float:
    """The 1 - alpha/2 quantile of Student's t with df degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(1 - alpha / 2, df))
