"""The typed rows of an attribution report: one step's blame, the culprit, the repair, a Shapley value.

Each is a frozen dataclass whose fields, in order, are the keys of its object in the JSON report
(schemas/attribution-report.schema.json), so `to_dict` is the report's object and `from_dict`
reads it back, from reports of older versions too (keys they lack take their defaults). The
report document as a whole is `AttributionResult.report()` / `AttributionResult.from_report()`.

Code written against the dict rows of earlier versions keeps working: `row["index"]` and
`row.get("agent")` read the field of that name (a name that is not a field raises KeyError, as a
missing key did). New code reads attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, TypeVar

from otel_replay.attribution.contrastive import StepEstimate, StepVerdict, Stopped

RepairVerdict = Literal["valid", "invalid", "undecided"]
"""A repair candidate's verdict: its failure rate's interval lies below 0.5 (valid), at or above 0.5
(invalid), or straddles it (undecided)."""

ShapleyVerdict = Literal["contributing", "protective", "no effect", "undecided"]
"""A Shapley value's verdict: its interval above +epsilon, below 0, inside ±epsilon, or none of these."""

R = TypeVar("R", bound="ReportRow")


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    """The dataclass's field names, in the report's key order."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


class ReportRow:
    """A report object's fields by name, read-only: `row["index"]`, `row.get("agent")` (the dict rows
    of earlier versions), and the JSON object itself (`to_dict` / `from_dict`)."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        if key not in _names(type(self)):
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in _names(type(self)) else default

    def to_dict(self) -> dict[str, Any]:
        """The report's JSON object (intervals as lists, as JSON has them)."""
        return {name: _json(getattr(self, name)) for name in _names(type(self))}

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """The row from its report object; keys it does not know are ignored (a newer report's)."""
        return cls(**{name: _typed(data[name]) for name in _names(cls) if name in data})


def _json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _typed(value: Any) -> Any:
    """A JSON interval ([low, high]) as the tuple the dataclasses hold, so loaded rows equal fresh ones."""
    return tuple(value) if isinstance(value, list) and len(value) == 2 and \
        all(isinstance(v, (int, float)) for v in value) else value


@dataclass(frozen=True, slots=True, kw_only=True)
class StepBlame(ReportRow):
    """One step's row of the report: its identity, the contrastive effect of re-deciding it (estimate
    and simultaneous interval), the failure rates behind it, its verdict and whether it is the culprit."""

    index: int
    span_id: str
    name: str
    kind: str
    agent: str | None = None
    estimate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    fail_held: float | None = None  # P(fail | steps up to this one held as recorded)
    fail_resampled: float | None = None  # P(fail | this step re-decided)
    held_ci: tuple[float, float] | None = None
    resampled_ci: tuple[float, float] | None = None
    n_held: int = 0
    n_resampled: int = 0
    verdict: StepVerdict = "not scored"
    culprit: bool = False
    rank: int | None = None  # by estimate, 1 = the largest; None: not scored
    output: str = ""  # the recorded output in one line (preview)
    stopped: Stopped | None = None
    to_decide: int | None = None  # rollouts per plan that would decide an undecided step
    calls_per_rollout: float | None = None

    @classmethod
    def of(cls, estimate: StepEstimate, *, span_id: str, name: str, kind: str, agent: str | None,
           rank: int | None, output: str) -> StepBlame:
        """The row of a scan's estimate, with the step's identity from the trajectory."""
        e = estimate
        return cls(index=e.index, span_id=span_id, name=name, kind=kind, agent=agent, estimate=e.estimate,
                   ci_low=e.ci_low, ci_high=e.ci_high, fail_held=e.fail_held, fail_resampled=e.fail_resampled,
                   held_ci=e.held_ci or None, resampled_ci=e.resampled_ci or None,
                   n_held=e.n_held, n_resampled=e.n_resampled, verdict=e.verdict, culprit=e.culprit, rank=rank,
                   output=output, stopped=e.stopped, to_decide=e.to_decide, calls_per_rollout=e.calls_per_rollout)


@dataclass(frozen=True, slots=True, kw_only=True)
class Culprit(ReportRow):
    """The step the report blames: its identity, effect and interval (the report's `culprit`)."""

    index: int
    span_id: str
    name: str
    kind: str
    agent: str | None = None
    estimate: float
    ci_low: float
    ci_high: float
    fail_held: float | None = None
    fail_resampled: float | None = None

    @classmethod
    def of(cls, step: StepBlame) -> Culprit:
        """The culprit entry of a (scored) step's row."""
        assert step.estimate is not None and step.ci_low is not None and step.ci_high is not None, step
        return cls(index=step.index, span_id=step.span_id, name=step.name, kind=step.kind, agent=step.agent,
                   estimate=step.estimate, ci_low=step.ci_low, ci_high=step.ci_high, fail_held=step.fail_held,
                   fail_resampled=step.fail_resampled)


@dataclass(frozen=True, slots=True)
class Repair(ReportRow):
    """A repair: the culprit's output replaced by `output`, and how often the run then fails."""

    step_index: int
    output: list[dict[str, Any]]
    fail_rate: float
    ci_low: float
    ci_high: float
    rollouts: int
    drift: float  # 1 - similarity to the recorded output (0: identical)
    valid: bool
    verdict: RepairVerdict = "valid"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Repair:
        """Reports older than the repair's `verdict` say only `valid`."""
        known = {name: data[name] for name in _names(cls) if name in data}
        known.setdefault("verdict", "valid" if data["valid"] else "invalid")
        return cls(**known)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapleyValue(ReportRow):
    """A step's Shapley value for the failure, its interval, verdict and rank. Reports of older
    versions lack the step's identity (`span_id`, `name`, `kind`: None, and left out of `to_dict`)."""

    index: int
    span_id: str | None = None
    name: str | None = None
    kind: str | None = None
    value: float
    ci_low: float
    ci_high: float
    samples: int  # antithetic pairs
    verdict: ShapleyVerdict
    culprit: bool = False
    rank: int

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _names(type(self))
                if not (name in ("span_id", "name", "kind") and getattr(self, name) is None)}


def as_rows(cls: type[R], items: list[Any] | None) -> list[R]:
    """Report objects (or rows already) as rows of `cls`."""
    return [item if isinstance(item, cls) else cls.from_dict(item) for item in items or []]
