"""Repair: candidate outputs for the culprit, each forced with do() and re-checked.

Candidates come from the culprit's outputs in re-decided rollouts that passed (and from an
optional proposer policy). Each is forced at the culprit with later steps re-decided; a candidate
is valid when its failure rate's exact (Clopper-Pearson) upper bound is below 0.5 (it fixes the run more often than not,
with confidence). Among valid ones the least drift from the original output wins.

Candidates from rollouts are their stored (redacted) outputs; a proposer's candidates are
redacted too before a repair keeps them, so no repair carries a secret a policy produced.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from otel_replay.attribution import stats
from otel_replay.attribution.contrastive import boundary_plan
from otel_replay.attribution.rollouts import RolloutRunner, RolloutSpec
from otel_replay.normalize.messages import canonical_bytes
from otel_replay.replay import ReplayPlan
from otel_replay.replay.plan import Action, Intervention
from otel_replay.trajectory import Trajectory

MAX_CANDIDATES = 3


@dataclass(frozen=True, slots=True)
class Repair:
    step_index: int
    output: list[dict[str, Any]]
    fail_rate: float
    ci_low: float
    ci_high: float
    rollouts: int
    drift: float
    valid: bool


def drift(original: Any, candidate: Any) -> float:
    """1 - similarity of the two outputs' canonical JSON text (0: identical)."""
    a, b = canonical_bytes(original).decode(), canonical_bytes(candidate).decode()
    return round(1 - difflib.SequenceMatcher(None, a, b).ratio(), 4)


def candidates(rows: list[dict], proposals: list[Any] = ()) -> list[list[dict[str, Any]]]:
    outputs = [json.loads(r["detail"])["step_output"] for r in rows
               if r.get("detail") and r["failed"] is False and not r["unreplayable"]]
    counted = Counter(canonical_bytes(o) for o in outputs)
    by_bytes = {canonical_bytes(o): o for o in outputs}
    ranked = [by_bytes[b] for b, _ in counted.most_common()]
    return [list(p) for p in proposals] + ranked


def search(trajectory: Trajectory, runner: RolloutRunner, culprit: int, resamplable: list[int],
           rows: list[dict], rollouts: int, proposals: list[Any] = ()) -> list[Repair]:
    original = list(trajectory.step(culprit).outputs)
    later = boundary_plan(resamplable, culprit + 1).interventions
    tried = []
    for n, candidate in enumerate(candidates(rows, proposals)[:MAX_CANDIDATES]):
        plan = ReplayPlan(((culprit, Intervention(Action.DO, candidate)), *later), label=f"repair({culprit}.{n})")
        results = runner.run(trajectory, [RolloutSpec(plan, culprit, "repair", r) for r in range(rollouts)])
        scored = [r for r in results if r["failed"] is not None]  # not unreplayable, not errored
        if not scored:
            continue
        k = sum(1 for r in scored if r["failed"])
        low, high = stats.clopper_pearson(k, len(scored))
        output = runner.redact(candidate)  # what the report stores
        tried.append(Repair(culprit, output, k / len(scored), float(low), float(high), len(scored),
                            drift(original, candidate), bool(high < 0.5)))
    return sorted(tried, key=lambda r: (not r.valid, r.drift, r.fail_rate))
