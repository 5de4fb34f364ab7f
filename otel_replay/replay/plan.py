"""`ReplayPlan`: what to do with each step of a trajectory in one rollout."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Action(str, Enum):  # noqa: UP042 - str() of a member must stay as it was (plans are stored)
    HOLD = "hold"          # serve the recording while the step's live inputs equal its recorded inputs
    RESAMPLE = "resample"  # re-decide the step with its policy
    DO = "do"              # force an output (do-intervention)
    REMOVE = "remove"      # the step's output disappears from everything downstream
    OBSERVE = "observe"    # replace what a tool or retrieval step observed


@dataclass(frozen=True, slots=True)
class Intervention:
    action: Action
    value: Any = None


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """Per-step actions; steps not named are held. `resample_after` resamples every step from there on."""

    interventions: tuple[tuple[int, Intervention], ...] = ()
    resample_after: int | None = None
    label: str = "factual"
    model: str | None = field(default=None)  # swap-model: the model the llm policy is asked to use

    def action(self, index: int) -> Intervention:
        for i, intervention in self.interventions:
            if i == index:
                return intervention
        if self.resample_after is not None and index >= self.resample_after:
            return Intervention(Action.RESAMPLE)
        return Intervention(Action.HOLD)

    @property
    def first_intervened(self) -> int | None:
        indices = [i for i, _ in self.interventions]
        if self.resample_after is not None:
            indices.append(self.resample_after)
        return min(indices) if indices else None

    # -- constructors ----------------------------------------------------------------------------
    @classmethod
    def factual(cls) -> ReplayPlan:
        """Every step held: the recorded run, served from the recording."""
        return cls()

    @classmethod
    def resample_from(cls, index: int) -> ReplayPlan:
        """Steps before `index` held; `index` and every later step re-decided."""
        return cls(resample_after=_index(index), label=f"resample_from({index})")

    @classmethod
    def resample(cls, index: int) -> ReplayPlan:
        """Only step `index` re-decided; later steps held where their inputs did not change."""
        return cls(((_index(index), Intervention(Action.RESAMPLE)),), label=f"resample({index})")

    @classmethod
    def do(cls, index: int, value: Any) -> ReplayPlan:
        """Force step `index`'s output: messages for an llm step, a result for a tool step."""
        return cls(((_index(index), Intervention(Action.DO, value)),), label=f"do({index})")

    @classmethod
    def remove(cls, index: int) -> ReplayPlan:
        return cls(((_index(index), Intervention(Action.REMOVE)),), label=f"remove({index})")

    @classmethod
    def observe(cls, index: int, value: Any) -> ReplayPlan:
        return cls(((_index(index), Intervention(Action.OBSERVE, value)),), label=f"observe({index})")

    @classmethod
    def coalition(cls, held: set[int] | frozenset[int], steps: int) -> ReplayPlan:
        """Steps in `held` held, every other of the `steps` steps resampled (Shapley coalitions)."""
        return cls(tuple((i, Intervention(Action.RESAMPLE)) for i in range(steps) if i not in held),
                   label=f"coalition({sorted(held)})")

    def holding(self, index: int) -> ReplayPlan:
        """This plan with step `index` held instead of intervened on (the other actions as they are)."""
        return ReplayPlan(tuple((i, iv) for i, iv in self.interventions if i != index), self.resample_after,
                          f"{self.label}, {index} held", self.model)

    def with_model(self, model: str | None) -> ReplayPlan:
        return ReplayPlan(self.interventions, self.resample_after, self.label, model)

    def key(self) -> str:
        """A stable text form (for rollout ids and storage)."""
        parts = [f"{i}:{iv.action.value}" for i, iv in self.interventions]
        if self.resample_after is not None:
            parts.append(f"{self.resample_after}+:resample")
        if self.model:
            parts.append(f"model={self.model}")
        return ",".join(parts) or "factual"


def _index(index: int) -> int:
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"a step index must be a non-negative integer, got {index!r}")
    return index
