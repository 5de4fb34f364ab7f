"""Agent traces written directly as GenAI-convention spans (for benchmarks and tests that need a
stored trajectory without running a model)."""

from __future__ import annotations

import json
from typing import Any

from otel_replay.normalize.records import SpanRecord

T0 = 1_767_225_600_000_000_000  # 2026-01-01


class TraceBuilder:
    """An invoke_agent root and, in order, its chat and execute_tool children."""

    def __init__(self, trace: int = 1, agent: str = "agent", model: str = "m") -> None:
        self.trace_id, self.root = f"{trace:032x}", f"{trace:08x}00000000"
        self._trace, self.model = trace, model
        self.spans = [SpanRecord(self.trace_id, self.root, None, f"invoke_agent {agent}", start_ns=T0, end_ns=T0 + 10**9,
                                 attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent})]

    def _add(self, name: str, attributes: dict[str, Any]) -> None:
        n = len(self.spans)
        start = T0 + n * 1_000_000
        self.spans.append(SpanRecord(self.trace_id, f"{self._trace:08x}{n:08x}", self.root, name, start_ns=start,
                                     end_ns=start + 900_000, attributes=attributes))

    def chat(self, inputs: list[dict[str, Any]], output: dict[str, Any]) -> None:
        self._add(f"chat {self.model}", {"gen_ai.operation.name": "chat", "gen_ai.request.model": self.model,
                                         "gen_ai.input.messages": json.dumps(inputs),
                                         "gen_ai.output.messages": json.dumps([output])})

    def tool(self, name: str, call_id: str, arguments: Any, result: str) -> None:
        self._add(f"execute_tool {name}", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                                           "gen_ai.tool.call.id": call_id,
                                           "gen_ai.tool.call.arguments": json.dumps(arguments),
                                           "gen_ai.tool.call.result": result})
