"""Intervals for failure rates and their differences, vectorized with numpy.

Assumptions, stated once: rollouts of one plan are independent Bernoulli trials (each rollout is
a fresh, differently seeded sample of the re-decided steps), and the two rates in a contrast
come from independent rollouts.

- `clopper_pearson`: the exact interval for one rate (fixed sample size); its coverage is at
  least the nominal level for every rate and size (Wilson's, also here, can dip below it).
- `cp_difference`: the two rates' Clopper-Pearson intervals at alpha/2 each, combined by the
  union bound, for a difference of rates: conservative, never below the nominal coverage.
- `newcombe`: Newcombe's hybrid score interval for a difference (narrower, nearly nominal; kept
  for comparison, not used for verdicts).
- `confidence_sequence`: an anytime-valid interval for a rate in [0, 1]: Robbins' normal-mixture
  boundary for a sub-Gaussian (variance 1/4) mean. It holds simultaneously for every sample
  size, so rollouts may be added until a decision without inflating the error rate.
- `cs_difference`: two such sequences at alpha/2 each, combined by the union bound.
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist
from typing import Any

import numpy as np

RHO = 0.5  # the mixture's tuning: tightest near n ~ 1 / rho^2 rollouts


def _z(alpha: float) -> float:
    return NormalDist().inv_cdf(1 - alpha / 2)


def wilson(failures: np.ndarray | int, n: np.ndarray | int, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    k, m = np.asarray(failures, dtype=float), np.asarray(n, dtype=float)
    z = _z(alpha)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(m > 0, k / m, 0.0)
        centre = (p + z * z / (2 * m)) / (1 + z * z / m)
        half = z / (1 + z * z / m) * np.sqrt(p * (1 - p) / m + z * z / (4 * m * m))
    low, high = np.clip(centre - half, 0, 1), np.clip(centre + half, 0, 1)
    return np.where(m > 0, low, 0.0), np.where(m > 0, high, 1.0)


def newcombe(k1: int, n1: int, k2: int, n2: int, alpha: float = 0.05) -> tuple[float, float]:
    """Interval for p1 - p2 (Newcombe 1998, method 10)."""
    if n1 == 0 or n2 == 0:
        return -1.0, 1.0
    p1, p2 = k1 / n1, k2 / n2
    (l1, l2), (u1, u2) = wilson(np.array([k1, k2]), np.array([n1, n2]), alpha)
    d = p1 - p2
    low = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return max(-1.0, low), min(1.0, high)


@functools.cache
def _log_choose(n: int) -> np.ndarray:
    lgamma = np.array([math.lgamma(x) for x in range(1, n + 2)])  # lgamma(1) .. lgamma(n + 1)
    return lgamma[n] - lgamma[: n + 1] - lgamma[n::-1]


def _log_pmf_terms(n: int, p: float) -> np.ndarray:
    i = np.arange(n + 1)
    return _log_choose(n) + i * math.log(p) + (n - i) * math.log1p(-p)


def _cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if p <= 0:
        return 1.0
    if p >= 1:
        return 1.0 if k >= n else 0.0
    return float(np.exp(_log_pmf_terms(n, p)[: k + 1]).sum())


def _solve(f: Any, target: float) -> float:
    """The p in (0, 1) where the decreasing function f(p) equals target (bisection)."""
    low, high = 0.0, 1.0
    for _ in range(48):  # 2^-48: far below any interval's meaningful digits
        mid = (low + high) / 2
        if f(mid) > target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


@functools.lru_cache(maxsize=65536)
def clopper_pearson(failures: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    k, n = int(failures), int(n)
    if n == 0:
        return 0.0, 1.0
    low = 0.0 if k == 0 else _solve(lambda p: _cdf(k - 1, n, p), 1 - alpha / 2)
    high = 1.0 if k == n else _solve(lambda p: _cdf(k, n, p), alpha / 2)
    return low, high


def cp_difference(k1: int, n1: int, k2: int, n2: int, alpha: float = 0.05) -> tuple[float, float]:
    """Interval for p1 - p2 from each rate's exact interval at alpha / 2 (union bound)."""
    l1, u1 = clopper_pearson(k1, n1, alpha / 2)
    l2, u2 = clopper_pearson(k2, n2, alpha / 2)
    return max(-1.0, l1 - u2), min(1.0, u1 - l2)


def cs_radius(n: np.ndarray | int, alpha: float = 0.05, rho: float = RHO) -> np.ndarray:
    """Half-width of the normal-mixture confidence sequence for a [0, 1] mean after n samples."""
    t = np.asarray(n, dtype=float)
    sigma2 = 0.25
    with np.errstate(invalid="ignore", divide="ignore"):
        radius = np.sqrt(2 * sigma2 * (t * rho * rho + 1) / (t * t * rho * rho)
                         * np.log(np.sqrt(t * rho * rho + 1) / alpha))
    return np.where(t > 0, radius, np.inf)


def confidence_sequence(failures: np.ndarray | int, n: np.ndarray | int, alpha: float = 0.05
                        ) -> tuple[np.ndarray, np.ndarray]:
    k, m = np.asarray(failures, dtype=float), np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(m > 0, k / m, 0.5)
    r = cs_radius(m, alpha)
    return np.clip(p - r, 0, 1), np.clip(p + r, 0, 1)


def cs_difference(k1: int, n1: int, k2: int, n2: int, alpha: float = 0.05) -> tuple[float, float]:
    """Anytime-valid interval for p1 - p2 (each rate's sequence at alpha / 2)."""
    (l1, l2), (u1, u2) = confidence_sequence(np.array([k1, k2]), np.array([n1, n2]), alpha / 2)
    return float(max(-1.0, l1 - u2)), float(min(1.0, u1 - l2))


def mean_interval(values: np.ndarray, alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean, low, high) by the normal approximation (for Shapley marginal contributions)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return 0.0, -1.0, 1.0
    mean = float(x.mean())
    if x.size < 2:
        return mean, -1.0, 1.0
    half = _z(alpha) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half
