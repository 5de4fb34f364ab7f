"""`AttributionResult`: everything a report shows, and the trace-level verdict.

Trace verdicts: `culprit-found` (one step is the point of commitment: its effect is real and
every later re-decidable step was decided), `undecided` (the data do not single out one step:
`candidates` are the latest harmful step and the undecided steps after it, or the budget ran out
first), `no-culprit` (every re-decidable step was decided, none harmful), `unreplayable` (no step
could be re-decided). Reports written before `undecided` existed may say `partial` (the budget
ran out).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from otel_replay.attribution.contrastive import Finding, StepEstimate
from otel_replay.normalize.messages import message_text
from otel_replay.trajectory import Trajectory

REPORT_SCHEMA = "otel-replay/attribution-report/1"
TRACE_VERDICTS = ("culprit-found", "no-culprit", "undecided", "unreplayable")
STEP_VERDICTS = ("decisive", "contributing", "locked-in", "no effect", "protective", "undecided",
                 "observation-only", "no policy", "unreplayable", "not scored")


@dataclass(slots=True)
class AttributionResult:
    job_id: str
    trace_id: str
    method: str
    verdict: str  # one of TRACE_VERDICTS
    recorded_score: float
    threshold: float
    credit: bool
    steps: list[dict[str, Any]]
    culprit: dict[str, Any] | None
    rollouts: int
    policy_calls: int
    repair: dict[str, Any] | None
    explanation: dict[str, str]
    alpha: float = 0.05
    epsilon: float = 0.1
    sequential: bool = True  # rollouts added look by look; False: a fixed number per plan
    max_rollouts: int = 400  # the cap per plan (sequential) or the fixed number
    tests: int = 1  # contrasts the search could test; alpha is split over them
    candidates: list[int] = field(default_factory=list)
    untested: list[int] = field(default_factory=list)
    budget_exhausted: bool = False
    max_policy_calls: int | None = None
    shapley: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def report(self) -> dict[str, Any]:
        """The report document (schemas/attribution-report.schema.json)."""
        data = self.to_dict()
        culprit = data.pop("culprit")
        data["culprit"] = None if culprit is None else {k: culprit[k] for k in (
            "index", "span_id", "name", "kind", "agent", "estimate", "ci_low", "ci_high", "fail_held", "fail_resampled")}
        return {"schema": REPORT_SCHEMA, **data}


def preview(outputs: Any) -> str:
    parts = []
    for message in outputs or []:
        text = message_text(message)
        calls = [f"{p.get('name')}({p.get('arguments')})" for p in message.get("parts", []) if p.get("type") == "tool_call"]
        parts.append(" ".join(x for x in [text, *calls] if x))
    return " ".join(parts)[:300]


def step_rows(trajectory: Trajectory, estimates: list[StepEstimate]) -> list[dict[str, Any]]:
    out = []
    ranked = sorted((e for e in estimates if e.estimate is not None), key=lambda e: -(e.estimate or 0))
    rank = {e.index: n + 1 for n, e in enumerate(ranked)}
    for est in estimates:
        step = trajectory.step(est.index)
        out.append({
            "index": est.index, "span_id": step.span_id, "name": step.name, "kind": step.kind, "agent": step.agent,
            "estimate": est.estimate, "ci_low": est.ci_low, "ci_high": est.ci_high,
            "fail_held": est.fail_held, "fail_resampled": est.fail_resampled,
            "held_ci": list(est.held_ci) if est.held_ci else None,
            "resampled_ci": list(est.resampled_ci) if est.resampled_ci else None,
            "n_held": est.n_held, "n_resampled": est.n_resampled, "verdict": est.verdict, "culprit": est.culprit,
            "rank": rank.get(est.index), "output": preview(step.outputs), "stopped": est.stopped,
            "to_decide": est.to_decide, "calls_per_rollout": est.calls_per_rollout,
        })
    return out


def shapley_finding(shapley: list[dict[str, Any]], resamplable: list[int]) -> Finding:
    """What Shapley values alone say: a culprit when one step's value is clearly above the band and
    above every other step's interval; candidates when several steps share the failure or are
    undecided."""
    contributing = [s for s in shapley if s["verdict"] == "contributing"]
    undecided = [s for s in shapley if s["verdict"] == "undecided"]
    if len(contributing) >= 1:
        lead = max(contributing, key=lambda s: s["value"])
        if all(lead["ci_low"] > s["ci_high"] for s in shapley if s is not lead) and not undecided:
            lead["culprit"] = True
            return Finding(lead["index"], (), ())
    candidates = tuple(sorted((s["index"] for s in contributing + undecided), reverse=True))
    return Finding(None, candidates, tuple(i for i in resamplable if not any(s["index"] == i for s in shapley)))


def finding_verdict(finding: Finding, resamplable: list[int], estimates: list[StepEstimate],
                    shapley: list[dict[str, Any]]) -> str:
    if not resamplable:
        return "unreplayable"
    if finding.culprit is not None:
        return "culprit-found"
    if finding.candidates or finding.untested:
        return "undecided"
    tested = [e for e in estimates if e.index in resamplable]
    if tested and all(e.verdict == "unreplayable" for e in tested):
        return "unreplayable"
    if any(e.verdict in ("undecided", "unreplayable") for e in tested) or \
            any(s["verdict"] == "undecided" for s in shapley):
        return "undecided"
    return "no-culprit"
