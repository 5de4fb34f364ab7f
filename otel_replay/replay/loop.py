"""The agent loop beyond the recording (a part of `engine.Replayer`).

The GenAI message protocol defines the loop, so a rollout need not stop where the recording
does: a changed model output that calls a tool the recording never called runs that tool's
policy (or binds to a recorded call with the same arguments), and when the last llm step's new
output still calls tools, the loop goes on past the recording's end, up to `max_steps`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from otel_replay.normalize.message_types import ToolCallRequestPart
from otel_replay.replay.outputs import Calls, Output, tool_output
from otel_replay.replay.plan import ReplayPlan
from otel_replay.replay.run import Message, StepOutcome
from otel_replay.trajectory import Step

if TYPE_CHECKING:
    from otel_replay.replay.cassette import Prepared


class Looping:
    """New tool calls and the loop past the recording; the policy calls are the engine's."""

    prep: Prepared
    plan: ReplayPlan
    max_steps: int
    truncated: bool
    answer: str
    live: dict[int, Output]
    live_in: dict[int, tuple[Message, ...]]
    outcomes: list[StepOutcome]
    _live_call: Callable[..., ToolCallRequestPart | None]
    _policy: Callable[[str, Step], Any]
    _call_tool: Callable[[Any, Step, Any, int | str], Any]
    _call_llm: Callable[[Any, Step, Any, int | str], Output]
    _llm_inputs: Callable[[Step, list[Message]], Any]
    _record: Callable[..., None]

    def _run_new_calls(self, step: Step, calls: Calls) -> list[Message]:
        """Tool calls the recording never made: run their policies now; their results follow the call."""
        taken = set()
        for bound in self.prep.bound.get(step.index, ()):  # type: ignore[arg-type]  # a step of Trajectory.steps: its index is never None
            match = self._live_call(bound, calls)
            if match is not None:
                taken.add(id(match))
        results = []
        for n, call in enumerate(calls):
            if id(call) in taken:
                continue
            results.append(self._run_tool_call(step, call, f"{step.index}.{n}"))
        return results

    def _run_tool_call(self, after: Step, call: ToolCallRequestPart, position: str) -> Message:
        name = str(call.get("name"))
        template = self.prep.templates.get(name)
        probe = template or Step(index=None, span_id="", parent_span_id=None, kind="tool", operation="execute_tool",
                                 name=name, status="unset", start_ns=None, end_ns=None, tool_name=name)
        resampling = self.plan.resample_after is not None and (after.index or 0) >= self.plan.resample_after
        held = None if resampling else self.prep.cassette.get(("tool", name, self.prep.tool_key(probe, call.get("arguments"))))
        if held:  # a call the recording made elsewhere, with the same arguments: bind to it
            result, source = held[0], "recording"
        else:
            result, source = self._call_tool(self._policy("tool", probe), probe, call.get("arguments"), position), "policy"
        message, digest = tool_output(call.get("id"), result)
        self._record(None, source, ({"role": "assistant", "parts": [call]},), (message,), True, digest, "tool", name)
        return message

    def _continue_loop(self) -> None:
        """Past the recording: keep the agent loop going while the model calls tools."""
        llm_steps = self.prep.llm_steps
        if not llm_steps:
            return
        last = llm_steps[-1]
        output = self.live.get(last.index)  # type: ignore[arg-type]  # a step of Trajectory.steps: its index is never None
        if output is None or output.digest == self.prep.output_hash[last.index] or not output.calls:
            return
        history = list(self.live_in.get(last.index, last.inputs)) + list(output.messages)  # type: ignore[arg-type]  # a step of Trajectory.steps: its index is never None
        history += [o.outputs[0] for o in self.outcomes if o.kind == "tool" and o.outputs
                    and (o.index is None or self.prep.source_of.get(o.index) == last.index)]
        turn = 0
        while len(self.outcomes) < self.max_steps:
            messages, digest, calls, text = self._call_llm(self._policy("llm", last), last,
                                                           self._llm_inputs(last, list(history)), f"past.{turn}")
            self._record(None, "policy", history, messages, True, digest, "llm", last.name)
            if text:
                self.answer = text
            history += messages
            if not calls:
                return
            for n, call in enumerate(calls):
                history.append(self._run_tool_call(last, call, f"past.{turn}.{n}"))
            turn += 1
        self.truncated = True
