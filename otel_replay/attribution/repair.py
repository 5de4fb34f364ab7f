"""Repair: candidate outputs for the culprit, each forced with do() and checked sequentially.

Candidates come from the culprit's outputs in re-decided rollouts that passed (and from an
optional proposer policy). Each is forced at the culprit with later steps re-decided, look by
look (the job's schedule, capped at `REPAIR_CAP` rollouts), until its failure rate's exact
interval decides it: `valid` when the upper bound is below 0.5 (the repair fixes the run more
often than not), `invalid` when the lower bound is at or above 0.5, else `undecided`. Alpha is
split over the candidates and the looks, as for the steps. Among valid ones the least drift from
the original output wins.

Candidates from rollouts are their stored (redacted) outputs; a proposer's candidates are
redacted too before a repair keeps them, so no repair carries a secret a policy produced.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from otel_replay.attribution import stats
from otel_replay.attribution.model import Repair, RepairVerdict
from otel_replay.attribution.plans import RolloutSpec, boundary_plan
from otel_replay.attribution.rollouts import RolloutRunner
from otel_replay.attribution.sequential import Design, sequential_looks
from otel_replay.normalize.messages import canonical_bytes
from otel_replay.replay import ReplayPlan
from otel_replay.replay.plan import Action, Intervention
from otel_replay.trajectory import Trajectory

MAX_CANDIDATES = 3
REPAIR_CAP = 100  # rollouts per candidate at most: "fixes the run more often than not" needs no more

__all__ = ["Repair", "RepairVerdict", "drift", "search"]  # Repair and its verdict live in model


def drift(original: Any, candidate: Any) -> float:
    """1 - similarity of the two outputs' canonical JSON text (0: identical)."""
    a, b = canonical_bytes(original).decode(), canonical_bytes(candidate).decode()
    return round(1 - difflib.SequenceMatcher(None, a, b).ratio(), 4)


def candidates(rows: list[dict[str, Any]], proposals: Sequence[Any] = ()) -> list[list[dict[str, Any]]]:
    outputs = [json.loads(r["detail"])["step_output"] for r in rows
               if r.get("detail") and r["failed"] is False and not r["unreplayable"]
               and json.loads(r["detail"]).get("step_output")]
    counted = Counter(canonical_bytes(o) for o in outputs)
    by_bytes = {canonical_bytes(o): o for o in outputs}
    ranked = [by_bytes[b] for b, _ in counted.most_common()]
    return [list(p) for p in proposals] + ranked


def repair_looks(design: Design) -> tuple[int, ...]:
    if len(design.looks) == 1:  # fixed rollouts per plan: one look at half of them, at least 10
        return (max(10, design.cap // 2),)
    return sequential_looks(min(design.cap, REPAIR_CAP))


def search(trajectory: Trajectory, runner: RolloutRunner, culprit: int, resamplable: list[int],
           rows: list[dict[str, Any]], design: Design, alpha: float, proposals: Sequence[Any] = ()) -> list[Repair]:
    original = list(trajectory.step(culprit).outputs)
    later = boundary_plan(resamplable, culprit + 1).interventions
    looks = repair_looks(design)
    each = alpha / (MAX_CANDIDATES * len(looks))
    tried = []
    recorded = canonical_bytes(original)
    options = [c for c in candidates(rows, proposals) if canonical_bytes(c) != recorded]  # not the recording itself
    for n, candidate in enumerate(options[:MAX_CANDIDATES]):
        plan = ReplayPlan(((culprit, Intervention(Action.DO, candidate)), *later), label=f"repair({culprit}.{n})")
        verdict: RepairVerdict = "undecided"
        k, scored, low, high = 0, 0, 0.0, 1.0
        for look in looks:
            results = runner.run(trajectory, [RolloutSpec(plan, culprit, "repair", r) for r in range(look)])
            if len(results) < look:  # the budget cut this look short
                break
            outcomes = [r["failed"] for r in results if r["failed"] is not None]  # not unreplayable, not errored
            if not outcomes:
                break
            k, scored = sum(outcomes), len(outcomes)
            low, high = stats.clopper_pearson(k, scored, each)
            if high < 0.5 or low >= 0.5:
                verdict = "valid" if high < 0.5 else "invalid"
                break
        if not scored:
            continue
        output = runner.redact(candidate)  # what the report stores
        tried.append(Repair(culprit, output, k / scored, float(low), float(high), scored,
                            drift(original, candidate), verdict == "valid", verdict))
    return sorted(tried, key=lambda r: (not r.valid, r.drift, r.fail_rate))
