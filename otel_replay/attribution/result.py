"""`AttributionResult`: everything a report shows, and the trace-level verdict.

Trace verdicts: `culprit-found` (one step is the point of commitment: its effect is real and
every later re-decidable step was decided), `undecided` (the data do not single out one step:
`candidates` are the latest harmful step and the undecided steps after it, or the budget ran out
first), `no-culprit` (every re-decidable step was decided, none harmful), `unreplayable` (no step
could be re-decided). Reports written before `undecided` existed may say `partial` (the budget
ran out).

Read from Python: `result.verdict`, `.culprit` (a `Culprit`: the step's index, name, effect and
interval, or None), `.steps` (one `StepBlame` per step), `.repair` (a `Repair`, or None),
`.shapley` (`ShapleyValue`s), `.explanation` (WHAT / WHERE / WHY / FIX: a dict, printed as the CLI
prints it), `str(result)`. The report document is `.report()` (its JSON text `.to_json()`), read
back by `AttributionResult.from_report()` (`.from_json()`): the one way to and from the report. `.to_html(path)` and a notebook's
`_repr_html_` need the HTML renderer, which lives in the export layer: `otel_replay.attribute`
attaches it (this layer renders nothing itself).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from html import escape
from pathlib import Path
from typing import Any, Literal

from otel_replay.attribution.contrastive import Finding, StepEstimate, StepVerdict
from otel_replay.attribution.model import Culprit, Repair, ShapleyValue, StepBlame, as_rows
from otel_replay.normalize.messages import message_text
from otel_replay.trajectory import Trajectory

REPORT_SCHEMA = "otel-replay/attribution-report/1"
TraceVerdict = Literal["culprit-found", "no-culprit", "undecided", "unreplayable", "partial"]
"""A trace's verdict: one of TRACE_VERDICTS, or `partial` in a report written before `undecided` existed."""
TRACE_VERDICTS: tuple[TraceVerdict, ...] = ("culprit-found", "no-culprit", "undecided", "unreplayable")
STEP_VERDICTS: tuple[StepVerdict, ...] = ("decisive", "contributing", "locked-in", "no effect", "protective", "undecided",
                 "observation-only", "no policy", "unreplayable", "not scored")


EXPLANATION_KEYS = ("what", "where", "why", "fix")

Method = Literal["contrastive", "shapley", "both"]
"""How a job attributes: contrastive (the point of commitment), Shapley values, or both."""

HtmlWriter = Callable[["AttributionResult", Path | None], str]
"""Renders a result as the HTML page `attribute --html` writes (and writes it to the path when one
is given); attached by the layer that owns rendering."""


class Explanation(dict[str, str]):
    """WHAT / WHERE / WHY / FIX (and `causal_trace`): a dict, whose `str` is the four lines the
    command line prints."""

    def __str__(self) -> str:
        return "\n".join(f"{key.upper():5} {self.get(key, '')}" for key in EXPLANATION_KEYS)


@dataclass(slots=True)
class AttributionResult:
    """One trace's attribution: the report's fields, its rows typed (`StepBlame`, `Culprit`, `Repair`,
    `ShapleyValue`); `report()` / `from_report()` convert to and from the report document."""

    job_id: str
    trace_id: str
    method: Method
    verdict: TraceVerdict
    recorded_score: float
    threshold: float
    credit: bool
    steps: list[StepBlame]
    culprit: Culprit | None
    rollouts: int
    policy_calls: int
    repair: Repair | None
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
    shapley: list[ShapleyValue] = field(default_factory=list)
    _html: HtmlWriter | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.explanation, Explanation):
            self.explanation = Explanation(self.explanation)

    @classmethod
    def from_report(cls, document: dict[str, Any]) -> AttributionResult:
        """A result from its report document (`report()`, `--json`, the `reports` view), those of
        older versions included (`adaptive` instead of `sequential`, verdict `partial`, rows without
        the keys added since)."""
        known = {f.name for f in fields(cls) if f.init}
        data = {k: v for k, v in document.items() if k in known}
        data.setdefault("sequential", bool(document.get("adaptive", True)))
        data.setdefault("tests", max(1, len(document.get("steps") or [])))  # older reports: alpha over every step
        data["steps"] = as_rows(StepBlame, data.get("steps"))
        data["shapley"] = as_rows(ShapleyValue, data.get("shapley"))
        culprit, repair = data.get("culprit"), data.get("repair")
        data["culprit"] = None if culprit is None else Culprit.from_dict(culprit)
        data["repair"] = None if repair is None else Repair.from_dict(repair)
        return cls(**data)

    @classmethod
    def from_json(cls, text: str | bytes) -> AttributionResult:
        """A result from its JSON report (`to_json()`, `attribute --json`, a stored report)."""
        return cls.from_report(json.loads(text))

    def report(self) -> dict[str, Any]:
        """The report document (schemas/attribution-report.schema.json): the one place its keys are
        spelled, in the order reports have always had (the culprit last)."""
        data: dict[str, Any] = {"schema": REPORT_SCHEMA}
        for f in fields(self):
            if f.init and f.name != "culprit":
                data[f.name] = _document(getattr(self, f.name))
        data["culprit"] = None if self.culprit is None else self.culprit.to_dict()
        return data

    def to_dict(self) -> dict[str, Any]:
        """The report document (as `report()`)."""
        return self.report()

    def to_json(self, indent: int | None = 2) -> str:
        """The JSON report, as `attribute --json` writes it (schemas/attribution-report.schema.json);
        `indent=None`: on one line, as the store keeps it."""
        return json.dumps(self.report(), indent=indent, ensure_ascii=False)

    def to_html(self, path: str | Path | None = None) -> str:
        """The HTML report `attribute --html` writes (self-contained, no network); with `path`, also
        written there, 0600 like the store."""
        if self._html is None:
            raise RuntimeError("this result has no HTML renderer: results from otel_replay.attribute() have one; "
                            "otherwise use otel_replay.export.html.render_html(result, trajectory)")
        return self._html(self, None if path is None else Path(path))

    def _repr_html_(self) -> str | None:
        """In a notebook: the HTML report, in an iframe so its styles stay out of the notebook's."""
        if self._html is None:
            return None
        page = self._html(self, None)
        return (f'<iframe srcdoc="{escape(page, quote=True)}" style="width:100%;height:640px;border:0" '
                f'title="otel-replay attribution of {escape(self.trace_id)}"></iframe>')

    @property
    def headline(self) -> str:
        """One line: the culprit with its effect and interval, or the verdict (and the candidates)."""
        c = self.culprit
        if c is not None:
            interval = (f", {100 * (1 - self.alpha):.0f}% interval [{c.ci_low:+.2f}, {c.ci_high:+.2f}]"
                        if c.ci_low is not None else "")
            return f"culprit: step {c.index} ({c.kind} {c.name}), effect {c.estimate:+.2f}{interval}"
        if self.candidates:
            return f"{self.verdict}: between steps {', '.join(str(i) for i in self.candidates)}"
        return f"{self.verdict}: no culprit named"

    @property
    def repair_line(self) -> str:
        """The repair in one line: the forced output, its failure rate and interval, its drift."""
        r = self.repair
        if r is None:
            return "REPAIR none: no culprit to repair" if self.culprit is None else "REPAIR not searched (repair=True)"
        return (f"REPAIR {r.verdict}: step {r.step_index} forced to {preview(r.output)!r} fails "
                f"{100 * r.fail_rate:.0f}% [{100 * r.ci_low:.0f}%, {100 * r.ci_high:.0f}%] of "
                f"{r.rollouts} rollouts, drift {r.drift:.2f}")

    def __str__(self) -> str:
        return f"{self.headline}\n{self.explanation}"



Report = AttributionResult | Mapping[str, Any]
"""What renders and exports take: a result, or its report document (as stored, or from `--json`)."""


def as_result(report: Report) -> AttributionResult:
    """The typed result of a result or of its report document (older versions' included)."""
    return report if isinstance(report, AttributionResult) else AttributionResult.from_report(dict(report))


def _document(value: Any) -> Any:
    """A field's value in the report document: rows as their JSON objects, the explanation a dict."""
    if isinstance(value, (StepBlame, ShapleyValue, Repair, Culprit)):
        return value.to_dict()
    if isinstance(value, list):
        return [_document(v) for v in value]
    if isinstance(value, dict):
        return dict(value)
    return value


def preview(outputs: Any) -> str:
    parts = []
    for message in outputs or []:
        text = message_text(message)
        calls = [f"{p.get('name')}({p.get('arguments')})" for p in message.get("parts", []) if p.get("type") == "tool_call"]
        parts.append(" ".join(x for x in [text, *calls] if x))
    return " ".join(parts)[:300]


def step_rows(trajectory: Trajectory, estimates: list[StepEstimate]) -> list[StepBlame]:
    """One row per estimate, ranked by estimate (1: the largest), with the step's identity."""
    ranked = sorted((e for e in estimates if e.estimate is not None), key=lambda e: -(e.estimate or 0))
    rank = {e.index: n + 1 for n, e in enumerate(ranked)}
    out = []
    for est in estimates:
        step = trajectory.step(est.index)
        out.append(StepBlame.of(est, span_id=step.span_id, name=step.name, kind=step.kind, agent=step.agent,
                                rank=rank.get(est.index), output=preview(step.outputs)))
    return out


def shapley_finding(shapley: list[ShapleyValue], resamplable: list[int]) -> Finding:
    """What Shapley values alone say: a culprit when one step's value is clearly above the band and
    above every other step's interval; candidates when several steps share the failure or are
    undecided."""
    contributing = [s for s in shapley if s.verdict == "contributing"]
    undecided = [s for s in shapley if s.verdict == "undecided"]
    if len(contributing) >= 1:
        lead = max(contributing, key=lambda s: s.value)
        if all(lead.ci_low > s.ci_high for s in shapley if s is not lead) and not undecided:
            return Finding(lead.index, (), ())
    candidates = tuple(sorted((s.index for s in contributing + undecided), reverse=True))
    return Finding(None, candidates, tuple(i for i in resamplable if not any(s.index == i for s in shapley)))


def mark_culprit(shapley: list[ShapleyValue], index: int | None) -> list[ShapleyValue]:
    """The values with the one at `index` marked as the culprit (Shapley alone named it)."""
    return [replace(s, culprit=True) if s.index == index else s for s in shapley]


def finding_verdict(finding: Finding, resamplable: list[int], estimates: list[StepEstimate],
                    shapley: list[ShapleyValue]) -> TraceVerdict:
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
            any(s.verdict == "undecided" for s in shapley):
        return "undecided"
    return "no-culprit"
