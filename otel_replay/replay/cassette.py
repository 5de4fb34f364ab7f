"""The recording as a cassette, and everything else the rollouts of one trajectory share.

A held step is served from the recording when its live request matches a recorded one: the
cassette is keyed by kind + name + the hash of the request (a tool's arguments, or an llm call's
system, tools and messages with tool-call ids renamed by order), so a branching agent binds to
the recorded call it repeats. `Prepared` computes the cassette and the per-step constants once
per trajectory: an attribution replays one trajectory hundreds of times, and this keeps the cost
of a rollout to its steps.
"""

from __future__ import annotations

import threading
from typing import Any

from otel_replay.normalize.message_types import ToolCallRequestPart
from otel_replay.replay.delegation import delegated_answers
from otel_replay.replay.outputs import Calls, Output, output_of, recorded_arguments, recorded_result
from otel_replay.replay.plan import Intervention, ReplayPlan
from otel_replay.replay.run import Message, message_hash, outputs_hash
from otel_replay.trajectory import Step, Trajectory

_PREPARED_MAX = 16  # trajectories remembered
_PLANS_MAX = 64  # plans remembered per trajectory
_LOCK = threading.Lock()


def without_call_ids(messages: Any) -> list[Any]:
    """Messages with tool-call ids renamed by order of appearance.

    Ids are labels, not content: a re-decided step that makes the same call under a new id must
    not stop a later held step from binding to its recording.
    """
    names: dict[Any, str] = {}
    out = []
    for message in messages:
        parts = message.get("parts", []) if isinstance(message, dict) else []
        if not any(isinstance(p, dict) and "id" in p and p.get("type") in ("tool_call", "tool_call_response")
                   for p in parts):
            out.append(message)
            continue
        renamed = []
        for part in parts:
            if isinstance(part, dict) and "id" in part and part.get("type") in ("tool_call", "tool_call_response"):
                part = {**part, "id": names.setdefault(part["id"], f"#{len(names)}")}
            renamed.append(part)
        out.append({**message, "parts": renamed})
    return out


def key_of(step: Step, payload: Any) -> str:
    """Cassette key: a tool's arguments, or an llm call's whole request (tool-call ids aside)."""
    if step.kind in ("tool", "retrieval"):
        return outputs_hash([{"arguments": payload}])
    return outputs_hash([{"system": list(step.system), "tools": list(step.tools),
                          "messages": without_call_ids(payload)}])


def _response_ids(message: Message) -> frozenset[Any] | None:
    """The tool-call ids a message answers; None when they cannot be read ahead (then scanned live)."""
    try:
        return frozenset(p.get("id") for p in message.get("parts", []) if p.get("type") == "tool_call_response")
    except (AttributeError, TypeError):
        return None


class Prepared:
    """What every rollout of one trajectory reads and none changes, computed once per trajectory.

    Read-only after construction (but for the bounded cache of plans), and recorded payloads are
    immutable (as everywhere in the store layer), so a trajectory's preparation holds for its
    whole life.
    """

    __slots__ = ("steps", "cassette", "source_of", "request_keys", "output_hash", "recorded", "inputs",
                 "known_keys", "bound", "earlier", "own_call", "templates", "llm_steps", "plans",
                 "delegated")

    def __init__(self, trajectory: Trajectory) -> None:
        self.steps = trajectory.steps
        self.plans: dict[int, tuple[ReplayPlan, dict[int | None, Intervention], str]] = {}  # id(plan) -> ...
        self.source_of: dict[int, int] = {e.target: e.source for e in trajectory.edges if e.via == "tool_call"}
        self.cassette: dict[tuple[str, str, str], list[Any]] = {}  # -> recorded Outputs (llm) or results (tools)
        self.request_keys: dict[int | None, str] = {}  # llm step -> the cassette key of its recorded request
        self.output_hash: dict[int | None, str] = {}  # step -> outputs_hash of its recorded outputs
        self.recorded: dict[int | None, Output] = {}  # llm step -> its recorded Output
        self.inputs: dict[int | None, tuple[tuple[Message, str, frozenset[Any] | None], ...]] = {}
        self.known_keys: dict[int, tuple[Any, str]] = {}  # id(recorded tool arguments) -> (arguments, key)
        self.bound: dict[int, list[Step]] = {}  # llm step -> the tool steps answering its calls, in order
        self.earlier: dict[int | None, int] = {}  # bound tool step -> earlier steps of its name bound alike
        self.own_call: dict[int | None, ToolCallRequestPart] = {}  # unbound tool step -> its recorded call
        self.templates: dict[str, Step] = {}  # tool name -> the first tool step of that name
        outputs: dict[int, Output] = {}  # id(recorded outputs) -> Output (the cassette shares them)
        for step in trajectory.steps:
            tool_like = step.kind in ("tool", "retrieval")
            payload = recorded_arguments(step) if tool_like else step.inputs
            key = key_of(step, payload)
            if step.kind == "tool" and step.tool_name is not None:
                self.templates.setdefault(step.tool_name, step)
            recorded = outputs.get(id(step.outputs))
            if recorded is None or recorded[0] is not step.outputs:
                recorded = outputs[id(step.outputs)] = output_of(tuple(step.outputs))
            self.output_hash[step.index] = recorded.digest
            self.cassette.setdefault((step.kind, step.name, key), []).append(
                recorded_result(step) if tool_like else recorded)
            if tool_like:
                self.known_keys[id(payload)] = (payload, key)
            else:
                self.request_keys[step.index] = key
            if step.kind == "llm":
                self.recorded[step.index] = recorded
                hashes = step.input_hashes
                self.inputs[step.index] = tuple(
                    (m, hashes[i] if i < len(hashes) else message_hash(m), _response_ids(m))
                    for i, m in enumerate(step.inputs))
                self._know_arguments(recorded.calls)
            source = self.source_of.get(step.index)  # type: ignore[arg-type]  # a step of Trajectory.steps: its index is never None
            if source is not None:
                self.bound.setdefault(source, []).append(step)
            elif tool_like:
                call: ToolCallRequestPart = {"type": "tool_call", "name": step.tool_name or step.name}
                if step.tool_call_id is not None:
                    call["id"] = step.tool_call_id
                if payload is not None:
                    call["arguments"] = payload
                self.own_call[step.index] = call
        for tools in self.bound.values():
            for step in tools:
                self.earlier[step.index] = sum(1 for s in tools if s.tool_name == step.tool_name
                                               and s.position < step.position)
        self.llm_steps = [s for s in trajectory.steps if s.kind == "llm"]
        self.delegated = delegated_answers(trajectory)  # a sub-agent's answer step -> the tool step it answers

    def _know_arguments(self, calls: Calls) -> None:
        """Cassette keys of the arguments of recorded calls: a held tool step reads its live
        call's arguments, which in a factual rollout are these very objects."""
        for call in calls:
            arguments = call.get("arguments")
            if id(arguments) not in self.known_keys:
                self.known_keys[id(arguments)] = (arguments, outputs_hash([{"arguments": arguments}]))

    def tool_key(self, step: Step, arguments: Any) -> str:
        """`key_of(step, arguments)` for a tool step, read from here when they are recorded ones."""
        known = self.known_keys.get(id(arguments))
        if known is not None and known[0] is arguments:  # the entry holds them, so the id is not reused
            return known[1]
        return key_of(step, arguments)

    def plan(self, plan: ReplayPlan) -> tuple[dict[int | None, Intervention], str]:
        """`plan.action(i)` for every step, and `plan.key()`, once per plan (a plan is frozen; the
        rollouts of one attribution share it, and an explicit plan's `action` scans its list)."""
        entry = self.plans.get(id(plan))
        if entry is not None and entry[0] is plan:  # the entry holds the plan, so its id is not reused
            return entry[1], entry[2]
        table = {step.index: plan.action(step.index) for step in self.steps}  # type: ignore[arg-type]  # a step of Trajectory.steps: its index is never None
        key = plan.key()
        with _LOCK:
            while len(self.plans) >= _PLANS_MAX:
                self.plans.pop(next(iter(self.plans)), None)
            self.plans[id(plan)] = (plan, table, key)
        return table, key


_PREPARED: dict[int, tuple[Trajectory, Prepared]] = {}  # id(trajectory) -> (trajectory, its preparation)


def prepared(trajectory: Trajectory) -> Prepared:
    """The preparation of `trajectory`, made on first use and remembered for the last few."""
    entry = _PREPARED.get(id(trajectory))
    if entry is not None and entry[0] is trajectory:  # the entry holds the trajectory, so its id is not reused
        return entry[1]
    prep = Prepared(trajectory)
    with _LOCK:
        while len(_PREPARED) >= _PREPARED_MAX:
            _PREPARED.pop(next(iter(_PREPARED)), None)
        _PREPARED[id(trajectory)] = (trajectory, prep)
    return prep
