"""Carrying a changed output downstream (a part of `engine.Replayer`).

When a step's output changes, every later input that contained it must change too: the recorded
message is replaced in every later history (by its hash), a tool result by its tool-call id (also
where the history holds it in another form), a tool call's arguments reach the tool step that
answers the call, and a sub-agent's new answer reaches the tool result of the parent it ran under.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from otel_replay.normalize.message_types import ToolCallRequestPart
from otel_replay.replay.delegation import answer_text, rederived_result
from otel_replay.replay.outputs import Calls, Output, tool_output
from otel_replay.replay.run import Message, StepOutcome
from otel_replay.trajectory import Step

if TYPE_CHECKING:
    from otel_replay.replay.cassette import Prepared

REMOVED = object()
"""`results[call id]` of a tool call whose result is gone (the call was removed or not made)."""


class Carrying:
    """The rollout state a change is carried through, and the methods that carry it."""

    prep: Prepared
    subst: dict[str, list[Message]]  # recorded message hash -> the live messages that replace it
    results: dict[str, Any]  # recorded tool-call id -> (live id, response) or REMOVED
    live: dict[int, Output]  # llm step -> its live output in this rollout
    outcomes: list[StepOutcome]

    _stop: Callable[[Step | None, str, str], Exception]  # the engine's

    def _apply(self, index: int) -> list[Message]:
        """The recorded inputs of llm step `index` with every upstream change carried in."""
        subst, results = self.subst, self.results
        out: list[Message] = []
        for message, digest, ids in self.prep.inputs[index]:
            replacement = subst.get(digest)
            if replacement is not None:
                out.extend(replacement)
                continue
            if not results:
                out.append(message)
                continue
            if ids is not None:  # the tool-call ids it answers, read ahead
                for x in ids:
                    if x in results:
                        answers = True
                        break
                else:
                    answers = False
            else:
                answers = any(p.get("type") == "tool_call_response" and p.get("id") in results
                              for p in message.get("parts", []))
            if answers:
                kept: list[Any] = []
                parts: Sequence[Mapping[str, Any]] = message.get("parts", [])  # any kind: responses are read
                for part in parts:
                    live = results.get(part["id"]) if part.get("type") == "tool_call_response" and "id" in part else None
                    if live is None:
                        kept.append(part)
                    elif live is not REMOVED:
                        kept.append({**part, "id": live[0], "response": live[1]} if live[0] else
                                    {k: v for k, v in {**part, "response": live[1]}.items() if k != "id"})
                if kept:
                    out.append({**message, "parts": kept})
                continue
            out.append(message)
        return out

    def _live_call(self, step: Step, calls: Calls | None = None) -> ToolCallRequestPart | None:
        """The live tool call a recorded tool step answers (by call id, else by name and order);
        `calls`: its llm step's live calls, when not yet in `live`."""
        source = self.prep.source_of.get(step.index)  # type: ignore[arg-type]  # a step of Trajectory.steps: its index is never None
        if source is None:
            return self.prep.own_call[step.index]
        if calls is None:
            output = self.live.get(source)
            if output is None:
                return None
            calls = output.calls
        if step.tool_call_id:
            for call in calls:
                if call.get("id") == step.tool_call_id:
                    return call
        same_name = [c for c in calls if c.get("name") == step.tool_name]
        earlier = self.prep.earlier[step.index]
        return same_name[earlier] if len(same_name) > earlier else None

    def _drop_tool_output(self, step: Step) -> None:
        for digest in step.output_hashes:
            self.subst[digest] = []
        if step.tool_call_id is not None:
            self.results[step.tool_call_id] = REMOVED

    def _redeliver(self, tool: Step, answer: Step, outputs: tuple[Message, ...]) -> None:
        """A sub-agent's answer changed: the tool step it ran under now returns the new answer."""
        at = next((n for n in range(len(self.outcomes) - 1, -1, -1) if self.outcomes[n].index == tool.index), None)
        if at is None or not self.outcomes[at].outputs:
            return  # the parent no longer makes that call (or it was removed): nothing to deliver to
        before = self.outcomes[at]
        part = before.outputs[0]["parts"][0]
        result = rederived_result(part.get("response"), answer_text(answer.outputs), answer_text(outputs))
        if result is None:
            raise self._stop(tool, "sub-agent", f"the result of tool step {tool.index} does not contain the "
                                                f"answer of its sub-agent (step {answer.index}) verbatim, so it "
                                                "cannot carry a new answer")
        message, digest = tool_output(part.get("id"), result)
        self.outcomes[at] = StepOutcome(before.index, before.kind, before.name, "sub-agent", before.inputs,
                                        (message,), True, digest)
        for recorded in tool.output_hashes:
            self.subst[recorded] = [message]
        if tool.tool_call_id is not None:
            self.results[tool.tool_call_id] = (part.get("id"), result)
