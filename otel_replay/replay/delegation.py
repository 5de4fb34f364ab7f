"""Sub-agents behind a tool: a parent agent's tool step whose result a nested agent produced.

In a multi-agent handoff the parent calls a tool (`delegate`, `ask_researcher`, ...) and the
tool's implementation runs another agent, whose spans nest under the tool's span. The tool's
recorded result carries the sub-agent's answer, so when a rollout re-decides the sub-agent's last
llm step, the tool's result must carry the new answer to the parent. The engine does that by
content: the recorded answer text is replaced by the new one inside the recorded result. A result
that does not contain the answer verbatim cannot be re-derived, and the rollout says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from otel_replay.normalize.messages import Message, message_text
from otel_replay.trajectory import Step, Trajectory

_MAX_DEPTH = 64


def delegated_answers(trajectory: Trajectory) -> dict[int, Step]:
    """llm step index -> the tool step it answers for: the last llm step nested under each tool span."""
    parent_of = {s.span_id: s.parent_span_id for s in (*trajectory.steps, *trajectory.agents)}
    tools = {s.span_id: s for s in trajectory.steps if s.kind in ("tool", "retrieval")}
    answer: dict[str, Step] = {}  # tool span id -> its last nested llm step
    for step in trajectory.steps:
        if step.kind != "llm" or step.index is None:
            continue
        span, depth = step.parent_span_id, 0
        while span is not None and depth < _MAX_DEPTH and span not in tools:
            span, depth = parent_of.get(span), depth + 1
        if span in tools:
            answer[span] = step
    return {llm.index: tools[span] for span, llm in answer.items() if llm.index is not None}


def answer_text(outputs: Sequence[Message]) -> str:
    return "".join(message_text(m) for m in outputs if m.get("role") == "assistant")


def rederived_result(recorded: object, old_answer: str, new_answer: str) -> str | None:
    """The tool's result with the sub-agent's new answer in place of the recorded one; None when
    the recorded result does not contain the recorded answer verbatim."""
    if not isinstance(recorded, str) or not old_answer or old_answer not in recorded:
        return None
    return recorded.replace(old_answer, new_answer)
