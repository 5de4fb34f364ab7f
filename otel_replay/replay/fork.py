"""A rollout stored as a new trace: GenAI-convention spans linked to the parent trace.

The child is an ordinary trace in the store (so `show`, SQL and further forks work on it), with
`otel_replay.fork.*` attributes on its root naming the parent trace, the fork step, the plan and
the seed, and a span link to the parent's root span.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import xxhash

from otel_replay.normalize.records import SpanRecord
from otel_replay.replay.run import ReplayRun
from otel_replay.store.ingest import ingest
from otel_replay.store.location import StoreLike
from otel_replay.trajectory import Trajectory


def child_trace_id(parent: str, run: ReplayRun, extra: str = "") -> str:
    return xxhash.xxh3_128_hexdigest(f"{parent}:{run.plan}:{run.seed}:{run.digest}:{extra}".encode())


def fork_spans(parent: Trajectory, run: ReplayRun, fork_step: int | None) -> list[SpanRecord]:
    trace_id = child_trace_id(parent.trace_id, run)
    root_id = xxhash.xxh3_64_hexdigest(f"{trace_id}:root".encode())
    now = time.time_ns()
    agent = next((s.agent for s in parent.steps if s.agent), None) or parent.root_name or "agent"
    root_attrs = {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent,
        "otel_replay.fork.parent_trace_id": parent.trace_id, "otel_replay.fork.plan": run.plan,
        "otel_replay.fork.seed": run.seed, "otel_replay.fork.policy_calls": run.policy_calls,
    }
    if fork_step is not None:
        root_attrs["otel_replay.fork.step"] = fork_step
    if run.diverged_at is not None:
        root_attrs["otel_replay.fork.diverged_at"] = run.diverged_at
    parent_root = next((a.span_id for a in parent.agents if a.parent_span_id is None), None)
    spans = [SpanRecord(trace_id=trace_id, span_id=root_id, parent_span_id=None, name=f"invoke_agent {agent} (fork)",
                        start_ns=now, end_ns=now + (len(run.steps) + 1) * 1000, attributes=root_attrs,
                        links=[{"trace_id": parent.trace_id, "span_id": parent_root, "attributes": {"otel_replay.fork": True}}]
                        if parent_root else [],
                        resource={"service.name": parent.service_name or "otel-replay"}, scope_name="otel-replay.fork")]
    recorded = {s.index: s for s in parent.steps}
    last_llm = next((s for s in reversed(parent.steps) if s.kind == "llm"), None)
    for n, outcome in enumerate(run.steps):
        if outcome.source == "skipped":
            continue
        template = recorded.get(outcome.index) or (last_llm if outcome.kind == "llm" else None)
        span_id = xxhash.xxh3_64_hexdigest(f"{trace_id}:{n}".encode())
        start = now + (n + 1) * 1000
        attrs: dict[str, object] = {"otel_replay.fork.source": outcome.source}
        if outcome.index is not None:
            attrs["otel_replay.fork.parent_step"] = outcome.index
        if outcome.kind == "llm":
            model = template.model if template else None
            attrs |= {"gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(list(outcome.inputs)),
                      "gen_ai.output.messages": json.dumps(list(outcome.outputs))}
            if model:
                attrs["gen_ai.request.model"] = model
            if template and template.system:
                attrs["gen_ai.system_instructions"] = json.dumps(list(template.system))
            if template and template.tools:
                attrs["gen_ai.tool.definitions"] = json.dumps(list(template.tools))
            name = f"chat {model}" if model else "chat"
        else:
            call: Mapping[str, Any] = next((p for m in outcome.inputs for p in m.get("parts", []) if p.get("type") == "tool_call"), {})
            result = next((p.get("response") for m in outcome.outputs for p in m.get("parts", [])
                           if p.get("type") == "tool_call_response"), None)
            attrs |= {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": outcome.name}
            if call.get("id"):
                attrs["gen_ai.tool.call.id"] = call["id"]
            if call:
                attrs["gen_ai.tool.call.arguments"] = json.dumps(call.get("arguments"))
            if result is not None:
                attrs["gen_ai.tool.call.result"] = result if isinstance(result, str) else json.dumps(result)
            name = f"execute_tool {outcome.name}"
        spans.append(SpanRecord(trace_id=trace_id, span_id=span_id, parent_span_id=root_id, name=name,
                                start_ns=start, end_ns=start + 500, attributes=attrs,
                                resource={"service.name": parent.service_name or "otel-replay"},
                                scope_name="otel-replay.fork"))
    return spans


def store_fork(root: StoreLike, parent: Trajectory, run: ReplayRun, fork_step: int | None) -> str:
    """Write the rollout as a child trace; returns its trace id."""
    spans = fork_spans(parent, run, fork_step)
    ingest(root, spans, source="fork")
    return spans[0].trace_id
