"""The Who&When failure-attribution logs (one JSON file per failed multi-agent run).

Every `history` item becomes one step, so `step_index` equals the dataset's `mistake_step`:
an agent's turn is an llm step (its system prompt, the history so far -> its message); the
code-execution terminal and the human are observations (tool steps). The labels
(`mistake_agent`, `mistake_step`, `mistake_reason`, question, ground truth) go on the root span
as `whowhen.*` attributes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import xxhash

from otel_replay.normalize.records import SpanRecord
from otel_replay.normalize.sources.checks import check_span
from otel_replay.normalize.sources.errors import SourceError, guarded
from otel_replay.normalize.sources.shapes import text

OBSERVERS = {"computer_terminal": "computer_terminal", "computerterminal": "computer_terminal", "human": "human"}
BASE_NS = 1_704_067_200_000_000_000  # 2024-01-01: the logs carry no times; steps are 1 ms apart
LABELS = ("mistake_agent", "mistake_step", "mistake_reason", "question", "ground_truth", "question_ID", "level")
# Step i's input repeats the history before it, so a log's steps hold ~n²/2 messages in all. The
# largest Who&When log (121 turns, 335 KB) expands to 27 MB; a log past this limit is refused.
MAX_EXPANDED_BYTES = 256 * 1024 * 1024


class WhoWhenFormatError(SourceError):
    """The file is not a Who&When log."""


def _agent(item: Mapping[str, Any]) -> str:
    return text(item.get("name") or item.get("role"), "history.name", "unknown")


def _message(item: Mapping[str, Any]) -> dict[str, Any]:
    agent = _agent(item)
    role = "user" if agent.lower() == "human" else "assistant"
    return {"role": role, "name": agent, "parts": [{"type": "text", "content": str(item.get("content") or "")}]}


@guarded
def spans_from_log(doc: Any, subset: str, name: str) -> list[SpanRecord]:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("history"), list):
        raise WhoWhenFormatError("not a Who&When log: no 'history' list", field="history")
    key = f"whowhen:{subset}/{name}"
    trace_id = xxhash.xxh3_128_hexdigest(key.encode("utf-8", "surrogatepass"))
    root_id = xxhash.xxh3_64_hexdigest(key.encode("utf-8", "surrogatepass"))
    history = [h for h in doc["history"] if isinstance(h, Mapping)]
    system_prompt = doc.get("system_prompt")
    prompts: Mapping[str, Any] = system_prompt if isinstance(system_prompt, Mapping) else {}
    root_attrs: dict[str, Any] = {"gen_ai.operation.name": "invoke_workflow", "gen_ai.agent.name": f"whowhen {subset}",
                                  "whowhen.subset": subset, "whowhen.file": name}
    for label in LABELS:
        if doc.get(label) is not None:
            root_attrs[f"whowhen.{label}"] = str(doc[label])
    spans = [SpanRecord(trace_id=trace_id, span_id=root_id, parent_span_id=None, name=f"invoke_workflow {subset}/{name}",
                        start_ns=BASE_NS, end_ns=BASE_NS + (len(history) + 1) * 1_000_000, attributes=root_attrs,
                        status_code="error", status_message="the run failed its task (every Who&When log is a failure)",
                        resource={"service.name": f"whowhen-{subset}"}, scope_name="whowhen")]
    encoded = [json.dumps(_message(h), ensure_ascii=False) for h in history]
    expanded = sum(len(m) * (len(encoded) - i) for i, m in enumerate(encoded))
    if expanded > MAX_EXPANDED_BYTES:
        raise WhoWhenFormatError(f"{len(history)} turns whose inputs repeat {expanded >> 20} MB of history; "
                                 f"the limit is {MAX_EXPANDED_BYTES >> 20} MB", field="history")
    for i, item in enumerate(history):
        agent = _agent(item)
        span_id = xxhash.xxh3_64_hexdigest(f"{key}#{i}".encode("utf-8", "surrogatepass"))
        start = BASE_NS + (i + 1) * 1_000_000
        observer = OBSERVERS.get(agent.lower())
        if observer:
            attrs: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": observer,
                                     "gen_ai.tool.call.result": str(item.get("content") or "")}
        else:
            attrs = {"gen_ai.operation.name": "chat", "gen_ai.agent.name": agent,
                     "gen_ai.input.messages": "[" + ", ".join(encoded[:i]) + "]",
                     "gen_ai.output.messages": f"[{encoded[i]}]"}
            if prompts.get(agent):
                attrs["gen_ai.system_instructions"] = json.dumps([{"type": "text", "content": str(prompts[agent])}])
        attrs["whowhen.history_index"] = i
        spans.append(SpanRecord(trace_id=trace_id, span_id=span_id, parent_span_id=root_id,
                                name=f"{'execute_tool' if observer else 'chat'} {agent}", start_ns=start,
                                end_ns=start + 500_000, attributes=attrs,
                                resource={"service.name": f"whowhen-{subset}"}, scope_name="whowhen"))
    return [check_span(span) for span in spans]

