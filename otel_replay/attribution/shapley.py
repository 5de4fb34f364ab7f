"""Shapley values of each step's recorded decision for the failure, by antithetic permutations.

v(S) = P(fail | the steps in S held as recorded, every other resamplable step re-decided).
Each permutation adds steps one at a time; every coalition value is a fresh rollout (never
cached, so the estimate stays unbiased), and each permutation is paired with its reverse
(antithetic sampling lowers the variance). The interval on each value is Student's t over the
per-pair marginal contributions, at alpha split over the steps (Bonferroni): an approximation
(the contributions are bounded, so it improves quickly with more pairs), stated as such. A value
is `contributing` when its interval is above +epsilon, `protective` below 0, `no effect` inside
±epsilon, else `undecided`.
"""

from __future__ import annotations

import random

import numpy as np

from otel_replay.attribution import stats
from otel_replay.attribution.model import ShapleyValue, ShapleyVerdict
from otel_replay.attribution.plans import RolloutSpec, coalition_plan
from otel_replay.attribution.rollouts import RolloutRunner
from otel_replay.attribution.sequential import HARMFUL, NEGLIGIBLE, PROTECTIVE, classify
from otel_replay.trajectory import Trajectory

VERDICTS: dict[str, ShapleyVerdict] = {HARMFUL: "contributing", PROTECTIVE: "protective", NEGLIGIBLE: "no effect"}


def _value(trajectory: Trajectory, runner: RolloutRunner, resamplable: list[int], held: frozenset[int],
           draw: int) -> float | None:
    rows = runner.run(trajectory, [RolloutSpec(coalition_plan(resamplable, held), None, "shapley", draw)])
    if not rows or rows[0]["failed"] is None:  # unreplayable or errored: no value
        return None
    return 1.0 if rows[0]["failed"] else 0.0


def shapley_values(trajectory: Trajectory, runner: RolloutRunner, resamplable: list[int], pairs: int,
                   alpha: float = 0.05, epsilon: float = 0.1) -> list[ShapleyValue]:
    rng = random.Random(f"shapley:{trajectory.trace_id}:{runner.seed}")
    contributions: dict[int, list[float]] = {i: [] for i in resamplable}
    draw = 0
    for _ in range(pairs):
        order = list(resamplable)
        rng.shuffle(order)
        pair: dict[int, list[float]] = {i: [] for i in resamplable}
        for permutation in (order, order[::-1]):
            held: frozenset[int] = frozenset()
            before = _value(trajectory, runner, resamplable, held, draw)
            for step in permutation:
                draw += 1
                after = _value(trajectory, runner, resamplable, held | {step}, draw)
                if before is not None and after is not None:
                    pair[step].append(after - before)
                held, before = held | {step}, after
            draw += 1
        for step, values in pair.items():
            if values:
                contributions[step].append(float(np.mean(values)))  # one antithetic pair -> one sample
        if runner.budget.exhausted:
            break
    each = alpha / max(1, len(resamplable))
    intervals = {step: stats.mean_interval(np.array(contributions[step]), each) for step in resamplable}
    ranked = sorted(resamplable, key=lambda step: -intervals[step][0])  # stable: ties keep the step order
    rank = {step: n for n, step in enumerate(ranked, start=1)}
    out: list[ShapleyValue] = []
    for step in resamplable:
        value, low, high = intervals[step]
        recorded = trajectory.step(step)
        out.append(ShapleyValue(index=step, span_id=recorded.span_id, name=recorded.name, kind=recorded.kind,
                                value=value, ci_low=low, ci_high=high, samples=len(contributions[step]),
                                verdict=VERDICTS.get(classify(low, high, epsilon), "undecided"), culprit=False,
                                rank=rank[step]))
    return out
