"""Scans of known effects without an agent: boundary outcomes drawn from given failure rates.

`SimulatedOutcomes` stands in for real rollouts under `ContrastiveScan`, so the statistics of the
search itself (error rates, power, policy calls) can be measured over thousands of scans in
seconds. Rollout r of boundary k fails with probability f(k); how the boundaries' outcomes of one
rollout are tied together is the coupling:

- `independent`: each boundary's outcome is its own draw (re-deciding a step never reproduces
  the recording: the hardest case, every pair as noisy as two separate runs);
- `shared`: one uniform draw per rollout decides every boundary (U < f(k)): arms that share the
  same fate agree whenever their rates allow, as when a re-decided step mostly reproduces the
  recording.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from otel_replay.attribution.contrastive import (
    ContrastiveScan,
    Finding,
    ScanOptions,
    StepEstimate,
    label,
)
from otel_replay.attribution.sequential import Design


class SimulatedOutcomes:
    def __init__(self, rates: dict[int, float], coupling: str, rng: np.random.Generator,
                 calls: dict[int, float] | None = None, budget: int | None = None) -> None:
        self.rates = rates
        self.coupling = coupling
        self.rng = rng
        self.calls = calls or {}
        self.budget = budget
        self.spent = 0.0
        self.drawn: dict[int, list[bool]] = {}
        self.uniforms: list[float] = []

    def _uniform(self, r: int) -> float:
        while len(self.uniforms) <= r:
            self.uniforms.append(float(self.rng.random()))
        return self.uniforms[r]

    def sample(self, boundaries: Sequence[int], count: int) -> None:
        for k in boundaries:
            have = self.drawn.setdefault(k, [])
            while len(have) < count and not self.exhausted:
                u = self._uniform(len(have)) if self.coupling == "shared" else float(self.rng.random())
                have.append(u < self.rates[k])
                self.spent += self.calls.get(k, 1.0)

    def outcomes(self, boundary: int, count: int) -> list[bool | None] | None:
        have = self.drawn.get(boundary, [])
        return None if len(have) < count else list(have[:count])

    def calls_per_rollout(self, boundary: int) -> float | None:
        return self.calls.get(boundary, 1.0)

    @property
    def exhausted(self) -> bool:
        return self.budget is not None and self.spent >= self.budget


@dataclass(frozen=True, slots=True)
class Case:
    """A trajectory of `len(rates) - 1` re-decidable steps 0..n-1: `rates[k]` is f(k), the failure
    rate with steps before k held and the rest re-decided (`rates[n]`: every step held)."""

    name: str
    rates: tuple[float, ...]

    @property
    def effects(self) -> list[float]:
        return [self.rates[i + 1] - self.rates[i] for i in range(len(self.rates) - 1)]


def simulate(case: Case, seed: int, coupling: str = "independent", design: Design | None = None,
             search: str = "scan", budget: int | None = None) -> tuple[list[StepEstimate], Finding, float]:
    """One scan of `case`: step estimates, what they add up to, and the rollouts it drew."""
    steps = list(range(len(case.rates) - 1))
    source = SimulatedOutcomes(dict(enumerate(case.rates)), coupling, np.random.default_rng(seed), budget=budget)
    scan = ContrastiveScan(steps, len(steps), steps, source, ScanOptions(design or Design(), search=search))
    estimates = scan.run()
    return estimates, label({e.index: e for e in estimates}, steps), source.spent


def false_claims(case: Case, estimates: list[StepEstimate], epsilon: float) -> list[str]:
    """Every verdict the true effects contradict: decisive or contributing says the effect is beyond
    +epsilon, locked-in or no effect that it is inside ±epsilon, protective that it is below 0."""
    wrong = []
    for est in estimates:
        effect = case.effects[est.index]
        contradicted = {"decisive": effect <= epsilon, "contributing": effect <= epsilon, "locked-in": abs(effect) > epsilon,
                        "no effect": abs(effect) > epsilon, "protective": effect >= 0}
        if contradicted.get(est.verdict):
            wrong.append(f"step {est.index} {est.verdict} with effect {effect:+.3f}")
    return wrong
