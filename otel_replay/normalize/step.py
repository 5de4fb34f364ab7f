"""The canonical step: what every convention adapter produces, independent of storage."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_replay.normalize.messages import Message, Part

LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "completion"})
AGENT_OPERATIONS = frozenset({"invoke_agent", "create_agent", "invoke_workflow"})
STEP_KINDS = ("llm", "tool", "retrieval", "embedding", "agent")


def payload_switches(capture_payloads: bool | Mapping[str, bool]) -> dict[str, bool]:
    """`capture_payloads` as kind -> bool; kinds a mapping does not name keep their payloads."""
    if isinstance(capture_payloads, bool):
        return dict.fromkeys(STEP_KINDS, capture_payloads)
    if not isinstance(capture_payloads, Mapping):
        raise ValueError(f"capture_payloads must be True, False or a mapping of step kind to bool, "
                         f"got {capture_payloads!r}")
    unknown = set(capture_payloads) - set(STEP_KINDS)
    if unknown:
        raise ValueError(f"capture_payloads: unknown step kind(s) {', '.join(map(str, sorted(unknown, key=str)))}; "
                         f"the kinds are {', '.join(STEP_KINDS)}")
    bad = [k for k, v in capture_payloads.items() if not isinstance(v, bool)]
    if bad:
        raise ValueError(f"capture_payloads: the value for {bad[0]!r} must be True or False")
    return {kind: capture_payloads.get(kind, True) for kind in STEP_KINDS}


def kind_of_operation(operation: str | None) -> str | None:
    """Step kind for a `gen_ai.operation.name` value, or None when it is not a step."""
    if operation is None:
        return None
    if operation in LLM_OPERATIONS:
        return "llm"
    if operation == "execute_tool":
        return "tool"
    if operation in ("embeddings", "embedding"):
        return "embedding"
    if operation in ("retrieval", "retrieve", "search"):
        return "retrieval"
    if operation in AGENT_OPERATIONS:
        return "agent"
    return None


@dataclass(slots=True)
class StepContent:
    """A step's payloads in canonical form."""

    inputs: list[Message] = field(default_factory=list)
    outputs: list[Message] = field(default_factory=list)
    system: list[Part] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.inputs or self.outputs or self.system)


@dataclass(slots=True)
class NormalizedStep:
    """One step as a convention adapter sees it, before content addressing."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    kind: str
    operation: str | None
    name: str
    convention: str
    start_ns: int | None = None
    end_ns: int | None = None
    status: str = "unset"
    error_type: str | None = None
    error_message: str | None = None
    provider: str | None = None
    request_model: str | None = None
    response_model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    agent_name: str | None = None
    conversation_id: str | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    request_params: dict[str, Any] = field(default_factory=dict)
    finish_reasons: list[str] = field(default_factory=list)
    content: StepContent = field(default_factory=StepContent)
    service_name: str | None = None
    redacted: list[str] = field(default_factory=list)  # "<part>:<rule>" per redaction (normalize/redact.py)

    @property
    def has_payload(self) -> bool:
        return not self.content.is_empty()
