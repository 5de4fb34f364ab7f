"""What one rollout produced: `ReplayRun`, `StepOutcome`, `Unreplayable`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from otel_replay.normalize.message_types import Message as Message  # re-exported
from otel_replay.normalize.messages import canonical_bytes, content_hash


@dataclass(slots=True)
class StepOutcome:
    """One step of a rollout. `index` is the recorded step's index (None past the recording).

    Not frozen only because frozen construction costs ~1 µs, a tenth of a replayed step; treat it
    as read-only like the rest of a `ReplayRun`.
    """

    index: int | None
    kind: str
    name: str
    source: str  # recording, policy, forced, observed, removed, skipped, sub-agent (a tool carrying a new answer)
    inputs: tuple[Message, ...]
    outputs: tuple[Message, ...]
    changed: bool  # the output differs from the recording (always true past the recording)
    output_hash: str


ERROR_CAUSES = frozenset({"policy-error", "policy-timeout"})
"""Causes that make a rollout errored (a policy failed at run time) rather than unreplayable."""


@dataclass(frozen=True, slots=True)
class Unreplayable:
    """Why a rollout could not be completed; it counts as neither a pass nor a fail.

    The cause tells a rollout that cannot be replayed (no policy, content not captured) from one
    whose policy failed when called (`ERROR_CAUSES`: raised, broke its contract, timed out).
    """

    index: int | None
    kind: str
    name: str
    reason: str
    cause: str  # missing-policy, observation-only, policy-error, policy-timeout, refused (a spent budget)

    def __str__(self) -> str:
        where = f"step {self.index}" if self.index is not None else "a step past the recording"
        return f"{where} ({self.kind} {self.name}): {self.reason}"


@dataclass(frozen=True, slots=True)
class ReplayRun:
    trace_id: str
    plan: str
    seed: int
    steps: tuple[StepOutcome, ...]
    final_output: str
    policy_calls: int
    diverged_at: int | None
    unreplayable: Unreplayable | None = None
    truncated: bool = False  # stopped at max_steps while the agent still called tools
    tokens: int | None = None  # what policies reported with `report_tokens` (None: none did)
    coincides_at: int | None = None  # stopped here: this re-decided step reproduced the recording (`replay(reuse=True)`)

    @property
    def ok(self) -> bool:
        return self.unreplayable is None

    @property
    def errored(self) -> bool:
        """A policy raised, broke its contract or timed out (the rollout has no outcome)."""
        return self.unreplayable is not None and self.unreplayable.cause in ERROR_CAUSES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def digest(self) -> str:
        """Content hash of the rollout: every step's source and output hash, the final output and
        the outcome. Inputs are not hashed again: they are a function of the recording and the
        earlier outputs, so equal digests mean byte-identical runs."""
        steps = [(o.index, o.kind, o.name, o.source, o.changed, o.output_hash) for o in self.steps]
        why = None if self.unreplayable is None else str(self.unreplayable)
        return content_hash(canonical_bytes([self.trace_id, self.plan, self.seed, steps, self.final_output,
                                             self.policy_calls, self.diverged_at, why, self.truncated]))


def message_hash(message: Message) -> str:
    return content_hash(canonical_bytes(message))


def outputs_hash(messages: Sequence[Mapping[str, Any]]) -> str:
    """Hash of a list of messages (or of the other JSON objects a cassette key is made of)."""
    return content_hash(canonical_bytes(list(messages)))
