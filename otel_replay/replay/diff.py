"""Two trajectories side by side: the first step where they part, and what changed per step."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest

from otel_replay.trajectory import Step, Trajectory


@dataclass(frozen=True, slots=True)
class StepChange:
    index: int
    a: str | None  # "kind name" in A, None when A has no such step
    b: str | None
    change: str  # same, inputs, output, inputs+output, kind, added, removed


@dataclass(frozen=True, slots=True)
class TrajectoryDiff:
    a: str
    b: str
    first_divergence: int | None
    changes: tuple[StepChange, ...]
    final_a: str
    final_b: str


def _label(step: Step | None) -> str | None:
    return f"{step.kind} {step.name}" if step is not None else None


def diff_trajectories(a: Trajectory, b: Trajectory) -> TrajectoryDiff:
    changes = []
    for i, (x, y) in enumerate(zip_longest(a.steps, b.steps)):
        if x is None:
            change = "added"
        elif y is None:
            change = "removed"
        elif (x.kind, x.name) != (y.kind, y.name):
            change = "kind"
        else:
            parts = [w for w, differs in (("inputs", x.input_hashes != y.input_hashes),
                                          ("output", x.output_hashes != y.output_hashes)) if differs]
            change = "+".join(parts) or "same"
        changes.append(StepChange(i, _label(x), _label(y), change))
    first = next((c.index for c in changes if c.change not in ("same", "inputs")), None)
    return TrajectoryDiff(a.trace_id, b.trace_id, first, tuple(changes), a.final_output, b.final_output)
