"""`AttributionResult`: everything a report shows, and a plain-language explanation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from otel_replay.attribution.contrastive import StepEstimate
from otel_replay.attribution.repair import Repair
from otel_replay.normalize.messages import message_text
from otel_replay.trajectory import Trajectory

REPORT_SCHEMA = "otel-replay/attribution-report/1"


@dataclass(slots=True)
class AttributionResult:
    job_id: str
    trace_id: str
    method: str
    verdict: str  # culprit-found, no-culprit, unreplayable, partial
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
    adaptive: bool = False
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


def _preview(outputs: Any) -> str:
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
            "rank": rank.get(est.index), "output": _preview(step.outputs),
        })
    return out


def explain(trajectory: Trajectory, rows: list[dict[str, Any]], culprit: dict[str, Any] | None,
            repair: Repair | None, recorded_score: float, credit: bool) -> dict[str, str]:
    outcome = "succeeded" if credit else "failed"
    what = (f"The run {outcome} (verifier score {recorded_score:.2f}). Final output: "
            f"{trajectory.final_output[:200]!r}")
    if culprit is None:
        return {"what": what, "where": "No single step's decision changes the outcome significantly.",
                "why": "Re-deciding each scanned step left the failure rate within its interval of the held run; "
                       "the failure may be spread across steps or due to chance.",
                "fix": "Add rollouts (--rollouts or --adaptive) or profile every step with --full.",
                "causal_trace": ""}
    c = culprit
    where = f"Step {c['index']} ({c['kind']} {c['name']}{', agent ' + c['agent'] if c.get('agent') else ''}): {c['output']!r}"
    verb = "succeeds" if credit else "fails"
    why = (f"With steps up to {c['index']} as recorded, the run {verb} "
           f"{100 * (c['fail_held'] or 0):.0f}% of the time; re-deciding step {c['index']} brings that to "
           f"{100 * (c['fail_resampled'] or 0):.0f}% (difference {c['estimate']:.2f}, "
           f"95% interval [{c['ci_low']:.2f}, {c['ci_high']:.2f}]). Later steps cannot undo it: "
           "it is the point of no return.")
    if repair is not None and repair.valid:
        fix = (f"Replace step {repair.step_index}'s output with {_preview(repair.output)!r}: the run then fails "
               f"{100 * repair.fail_rate:.0f}% of the time ({repair.rollouts} rollouts), drift {repair.drift:.2f}.")
    else:
        fix = "No validated repair was found for this step."
    chain = [f"{r['index']}:{r['name']}[{r['verdict']}]" for r in rows if r["index"] <= c["index"]]
    return {"what": what, "where": where, "why": why, "fix": fix, "causal_trace": " → ".join(chain)}
