"""`Trajectory` and `Step`: a stored trace as the ordered steps an agent took, with dataflow."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from otel_replay.normalize.message_types import Message, MessagePart
from otel_replay.normalize.messages import message_text


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a trajectory, payloads in canonical GenAI message form."""

    index: int | None  # position among intervention targets; None for agent spans
    span_id: str
    parent_span_id: str | None
    kind: str
    operation: str | None
    name: str
    status: str
    start_ns: int | None
    end_ns: int | None
    inputs: tuple[Message, ...] = ()
    outputs: tuple[Message, ...] = ()
    system: tuple[MessagePart, ...] = ()  # system instructions, as parts
    tools: tuple[dict[str, Any], ...] = ()
    input_hashes: tuple[str, ...] = ()
    output_hashes: tuple[str, ...] = ()
    request_params: dict[str, Any] = field(default_factory=dict)
    finish_reasons: tuple[str, ...] = ()
    error_type: str | None = None
    error_message: str | None = None
    provider: str | None = None
    model: str | None = None
    response_model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    agent: str | None = None
    agent_span_id: str | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    observation_only: bool = False
    convention: str = ""
    redacted: tuple[str, ...] = ()  # "<part>:<rule>" for each redaction before storage (input:email, ...)
    # every span of the step, `span_id` first: spans that traced one model call twice (an
    # instrumentation's and the SDK's own) are one step, and blame may land on either span
    span_ids: tuple[str, ...] = ()

    @property
    def position(self) -> int:
        """`index` of a step of `Trajectory.steps`, where it is always set (only agent spans have none)."""
        if self.index is None:
            raise ValueError(f"span {self.span_id} ({self.kind} {self.name}) is not a step: it has no index")
        return self.index

    @property
    def duration_ms(self) -> float | None:
        if self.start_ns is None or self.end_ns is None:
            return None
        return (self.end_ns - self.start_ns) / 1e6

    @property
    def output_text(self) -> str:
        return "".join(message_text(m) for m in self.outputs if m.get("role") == "assistant")


@dataclass(frozen=True, slots=True)
class Edge:
    """Step `source`'s output feeds step `target`'s input (`via`: tool_result, message, tool_call)."""

    source: int
    target: int
    via: str
    key: str


@dataclass(frozen=True, slots=True)
class Trajectory:
    trace_id: str
    steps: tuple[Step, ...]
    agents: tuple[Step, ...] = ()
    edges: tuple[Edge, ...] = ()
    root_name: str | None = None
    service_name: str | None = None
    status: str = "ok"

    def __len__(self) -> int:
        return len(self.steps)

    def step(self, index: int) -> Step:
        if not 0 <= index < len(self.steps):
            raise IndexError(f"trace {self.trace_id} has steps 0..{len(self.steps) - 1}; there is no step {index}")
        return self.steps[index]

    @property
    def final_output(self) -> str:
        """The text of the last assistant message the agent produced."""
        for step in reversed(self.steps):
            if step.kind == "llm" and step.output_text:
                return step.output_text
        return ""

    def downstream_of(self, index: int) -> list[Edge]:
        return [e for e in self.edges if e.source == index]

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "root_name": self.root_name,
            "service_name": self.service_name,
            "status": self.status,
            "final_output": self.final_output,
            "steps": [asdict(s) for s in self.steps],
            "agents": [asdict(a) for a in self.agents],
            "edges": [asdict(e) for e in self.edges],
        }
