"""Dataflow edges between steps, read from the payloads themselves.

- a tool step's result reaches every later history that holds its tool-call id;
- an assistant message reaches every later history that holds the same message (by hash);
- a tool-call part in a model output becomes the arguments of the tool step with that call id
  (or, when the tool step has no id, the first later call of that tool with equal arguments).
"""

from __future__ import annotations

from collections.abc import Sequence

from otel_replay.normalize.message_types import ToolCallRequestPart
from otel_replay.normalize.messages import tool_calls
from otel_replay.trajectory.model import Edge, Step


def _response_ids(step: Step) -> set[str]:
    return {
        str(p.get("id"))
        for m in step.inputs
        for p in m.get("parts", [])
        if p.get("type") == "tool_call_response" and p.get("id") is not None
    }


def _calls(step: Step) -> list[ToolCallRequestPart]:
    return tool_calls(step.outputs)


def _tool_arguments(step: Step) -> object:
    for m in step.inputs:
        for p in m.get("parts", []):
            if p.get("type") == "tool_call":
                return p.get("arguments")
    return None


def dataflow_edges(steps: Sequence[Step]) -> list[Edge]:
    edges: list[Edge] = []
    claimed_tools: set[int] = set()
    for i, source in enumerate(steps):
        later = steps[i + 1 :]
        if source.kind == "tool" and source.tool_call_id:
            edges += [
                Edge(source.position, t.position, "tool_result", source.tool_call_id)
                for t in later if t.kind == "llm" and source.tool_call_id in _response_ids(t)
            ]
        if source.kind != "llm":
            continue
        for digest in source.output_hashes:
            edges += [Edge(source.position, t.position, "message", digest)
                      for t in later if t.kind == "llm" and digest in t.input_hashes]
        for call in _calls(source):
            target = next(
                (t for t in later if t.kind == "tool" and t.index not in claimed_tools and (
                    (call.get("id") is not None and t.tool_call_id == call.get("id"))
                    or (t.tool_call_id is None and t.tool_name == call.get("name")
                        and _tool_arguments(t) == call.get("arguments")))),
                None,
            )
            if target is not None:
                claimed_tools.add(target.position)
                edges.append(Edge(source.position, target.position, "tool_call", str(call.get("id") or call.get("name"))))
    return edges
