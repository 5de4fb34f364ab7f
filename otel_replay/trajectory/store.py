"""`Store`: the store as users see it, a catalog that also builds trajectories."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from otel_replay.store import Catalog
from otel_replay.trajectory.dataflow import dataflow_edges
from otel_replay.trajectory.model import Step, Trajectory


def _owning_agent(row: Mapping[str, Any], parents: Mapping[str, str | None], agents: Mapping[str, Mapping[str, Any]]
                  ) -> Mapping[str, Any] | None:
    """The nearest agent ancestor, else the innermost agent span whose time window holds the step."""
    seen: set[str] = set()
    current = parents.get(row["span_id"])
    while current and current not in seen:
        if current in agents:
            return agents[current]
        seen.add(current)
        current = parents.get(current)
    start = row["start_ns"] or 0
    holders = [a for a in agents.values() if a["span_id"] != row["span_id"]
               and (a["start_ns"] or 0) <= start <= (a["end_ns"] or 0)]
    return max(holders, key=lambda a: a["start_ns"] or 0) if holders else None


def _step(row: Mapping[str, Any], bodies: Mapping[str, Any], agent: Mapping[str, Any] | None) -> Step:
    def load(digests: list[str] | None) -> tuple[Any, ...]:
        return tuple(bodies[d] for d in digests or [] if d in bodies)

    params = json.loads(row["request_params"]) if row["request_params"] else {}
    return Step(
        index=row["step_index"],
        span_id=row["span_id"],
        parent_span_id=row["parent_span_id"],
        kind=row["kind"],
        operation=row["operation"],
        name=row["name"],
        status=row["status"],
        start_ns=row["start_ns"],
        end_ns=row["end_ns"],
        inputs=load(row["input_hashes"]),
        outputs=load(row["output_hashes"]),
        system=tuple(bodies.get(row["system_hash"], ())) if row["system_hash"] else (),
        tools=tuple(bodies.get(row["tools_hash"], ())) if row["tools_hash"] else (),
        input_hashes=tuple(row["input_hashes"] or ()),
        output_hashes=tuple(row["output_hashes"] or ()),
        request_params=params,
        finish_reasons=tuple(row["finish_reasons"] or ()),
        error_type=row["error_type"],
        error_message=row["error_message"],
        provider=row["provider"],
        model=row["request_model"],
        response_model=row["response_model"],
        input_tokens=row["input_tokens"],
        output_tokens=row["output_tokens"],
        agent=row["agent_name"] or (agent["agent_name"] or agent["name"] if agent else None),
        agent_span_id=agent["span_id"] if agent else None,
        tool_name=row["tool_name"],
        tool_call_id=row["tool_call_id"],
        observation_only=bool(row["observation_only"]),
        convention=row["convention"],
        redacted=tuple(row.get("redacted") or ()),
        span_ids=tuple(row.get("span_ids") or (row["span_id"],)),
    )


class Store(Catalog):
    """A store directory: SQL over its views, and trajectories of its traces."""

    def trajectory(self, trace_id: str) -> Trajectory:
        """The ordered steps of one trace (an id or unique prefix), with payloads and dataflow."""
        with self.session() as s:
            tid = self.resolve_trace_id(trace_id, s)
            rows = s.named_arrow("trajectory_steps", [tid]).to_pylist()
            trace = s.named_arrow("trajectory_trace", [tid]).to_pylist()
            parents = dict(s.named("trace_span_parents", [tid]))
            digests = sorted({d for r in rows for d in (r["input_hashes"] or []) + (r["output_hashes"] or [])}
                             | {r[k] for r in rows for k in ("system_hash", "tools_hash") if r[k]})
            bodies = {h: json.loads(b) for h, b in s.named("messages_by_hash", [digests])}
        agent_rows = {r["span_id"]: r for r in rows if r["kind"] == "agent"}
        built = [_step(r, bodies, _owning_agent(r, parents, agent_rows)) for r in rows]
        steps = tuple(s for s in built if s.kind != "agent")
        info = trace[0] if trace else {}
        return Trajectory(
            trace_id=tid,
            steps=steps,
            agents=tuple(s for s in built if s.kind == "agent"),
            edges=tuple(dataflow_edges(steps)),
            root_name=info.get("root_name"),
            service_name=info.get("service_name"),
            status=info.get("status", "ok"),
        )
