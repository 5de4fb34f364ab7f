"""Proof that factual replay reproduces a recorded run: every step's live inputs and served
output hash-equal to the recording, and the final output too."""

from __future__ import annotations

from dataclasses import dataclass

from otel_replay.normalize.messages import canonical_bytes, content_hash
from otel_replay.replay import policies as policy_registry
from otel_replay.replay.engine import replay
from otel_replay.replay.plan import ReplayPlan
from otel_replay.replay.run import ReplayRun, outputs_hash
from otel_replay.trajectory import Trajectory


@dataclass(frozen=True, slots=True)
class StepCheck:
    index: int
    kind: str
    name: str
    source: str
    recorded: str
    replayed: str
    inputs_match: bool

    @property
    def ok(self) -> bool:
        return self.inputs_match and self.recorded == self.replayed


@dataclass(frozen=True, slots=True)
class FactualCheck:
    trace_id: str
    steps: tuple[StepCheck, ...]
    final_recorded: str
    final_replayed: str
    run: ReplayRun

    @property
    def ok(self) -> bool:
        return self.run.ok and all(s.ok for s in self.steps) and self.final_recorded == self.final_replayed

    @property
    def first_mismatch(self) -> StepCheck | None:
        return next((s for s in self.steps if not s.ok), None)


def _text_hash(text: str) -> str:
    return content_hash(canonical_bytes(text))


def verify_factual(trajectory: Trajectory, registry: policy_registry.Registry | None = None) -> FactualCheck:
    run = replay(trajectory, ReplayPlan.factual(), 0, policies=registry)
    by_index = {o.index: o for o in run.steps if o.index is not None}
    checks = []
    for step in trajectory.steps:
        outcome = by_index.get(step.position)
        recorded = outputs_hash(list(step.outputs))
        if outcome is None:
            checks.append(StepCheck(step.position, step.kind, step.name, "not reached", recorded, "", False))
            continue
        same_inputs = step.kind != "llm" or outputs_hash(list(outcome.inputs)) == outputs_hash(list(step.inputs))
        checks.append(StepCheck(step.position, step.kind, step.name, outcome.source, recorded, outcome.output_hash,
                                same_inputs))
    return FactualCheck(trajectory.trace_id, tuple(checks), _text_hash(trajectory.final_output),
                        _text_hash(run.final_output), run)
