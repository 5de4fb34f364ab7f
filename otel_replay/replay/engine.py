"""The trace-driven replay engine: one rollout of a trajectory under a plan, as a pure function
of (trajectory, plan, seed).

It walks the recorded steps in order. A held step whose live inputs hash-match a recorded step
of the same kind and name is served from the recording (a cassette keyed by kind + name +
inputs hash, so a branching agent binds correctly; see `cassette`). A changed output is carried
downstream (`carry`): the recorded message is replaced in every later history (by hash), a tool
result by its tool-call id, and a tool call's arguments into the tool step. A step whose inputs
changed is re-run by its policy even when held. The GenAI message protocol is the agent loop, so
the engine also goes past the recording (`loop`): a new tool call runs that tool's policy; an
output without tool calls ends the run; tool calls after the recording's end keep the loop going
up to `max_steps`.

Policies are user code, so every call is guarded: one that raises, returns something that is not
an output, or runs past `policy_timeout_s` ends the rollout as errored (neither a pass nor a
fail); see `guard` for how a hanging call is cut off.

What a rollout costs beyond its policies is a few µs a step: the recording's keys, hashes and
bindings are computed once per trajectory (`cassette.Prepared`), and a policy's repeated outputs
are canonicalized and hashed once (`outputs`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_replay.normalize.message_types import MessagePart
from otel_replay.normalize.messages import canonical_bytes
from otel_replay.replay import policies as policy_registry
from otel_replay.replay.carry import Carrying
from otel_replay.replay.cassette import key_of, prepared, without_call_ids
from otel_replay.replay.guard import CallRefused, PolicyTimeout, run_coroutine, supervise
from otel_replay.replay.loop import Looping
from otel_replay.replay.outputs import EMPTY_HASH, NO_OUTPUT, Output, llm_output, tool_output
from otel_replay.replay.plan import Action, ReplayPlan
from otel_replay.replay.run import Message, ReplayRun, StepOutcome, Unreplayable
from otel_replay.replay.seeding import SeededOnUse
from otel_replay.trajectory import Step, Trajectory

DEFAULT_MAX_STEPS = 64
DEFAULT_POLICY_TIMEOUT_S = 60.0
"""Per-call policy timeout of attribution jobs (`--policy-timeout`); `replay()` has none unless asked."""
_NEVER_AWAITABLE = frozenset({str, dict, list, tuple, int, float, bool, type(None)})
_HOLD, _DO, _OBSERVE, _REMOVE = Action.HOLD, Action.DO, Action.OBSERVE, Action.REMOVE


@dataclass(slots=True)
class LLMInputs:
    """What an llm policy gets besides the recorded step: the live request (read it; a rollout
    builds a fresh one per call, so changing it changes nothing)."""

    messages: list[Message]
    system: list[MessagePart] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    model: str | None = None


class _Stop(Exception):
    def __init__(self, why: Unreplayable) -> None:
        super().__init__(str(why))
        self.why = why


class _Coincides(Exception):
    """The rollout from here on is the rollout of the plan holding this step (see `replay(reuse=True)`)."""


_current = threading.local()


def report_tokens(count: int) -> None:
    """Called by a policy to add the tokens its model call used to the running rollout's total."""
    replayer = getattr(_current, "replayer", None)
    if replayer is not None and count:
        replayer.tokens = (replayer.tokens or 0) + int(count)


class Replayer(Carrying, Looping):
    """One rollout. Use `replay()`; this class holds the rollout's state."""

    def __init__(self, trajectory: Trajectory, plan: ReplayPlan, seed: int,
                 registry: policy_registry.Registry, max_steps: int, policy_timeout_s: float | None = None,
                 reuse: bool = False) -> None:
        if policy_timeout_s is not None and not policy_timeout_s > 0:
            raise ValueError(f"policy_timeout_s must be a positive number of seconds or None, got {policy_timeout_s!r}")
        self.traj = trajectory
        self.plan = plan
        self.seed = seed
        self.registry = registry
        self.max_steps = max_steps
        self.subst = {}
        self.results = {}
        self.live = {}
        self.live_in = {}
        self.outcomes = []
        self.answer = ""  # the text of the last llm step that had one: the final output
        self.policy_calls = 0
        self.diverged_at: int | None = None
        self.ended = False
        self.truncated = False
        self.policy_timeout_s = policy_timeout_s
        self.reuse = reuse and not plan.model  # a swapped model re-runs held steps: no rollout coincides
        self.coincides_at: int | None = None
        self.tokens: int | None = None  # what policies reported with `report_tokens`
        self.call_started: float | None = None  # monotonic start of the policy call in progress
        self._calling: Step | None = None
        self._abandoned = False
        self._finished = False
        self._state_lock = threading.Lock()  # the watcher's abandon() against the walk's end
        self.prep = prepared(trajectory)
        self.actions, self.plan_key = self.prep.plan(plan)
        self.cassette = self.prep.cassette  # read-only, shared by every rollout of the trajectory

    # -- helpers ----------------------------------------------------------------------------------
    def _stop(self, step: Step | None, cause: str, reason: str) -> _Stop:
        return _Stop(Unreplayable(step.index if step else None, step.kind if step else "llm",
                                  step.name if step else "", reason, cause))

    def _policy(self, kind: str, step: Step) -> Any:
        fn = self.registry.resolve(kind, step.tool_name or step.name, self.plan.model or step.model)
        if fn is None:
            hint = f'@policies.{kind}("{step.tool_name or step.name}")' if kind != "llm" else "@policies.llm"
            raise self._stop(step, "missing-policy", f"no {kind} policy for {step.name!r}; register one with {hint}")
        return fn

    def _llm_inputs(self, step: Step, messages: list[Message]) -> LLMInputs:
        return LLMInputs(messages, list(step.system), list(step.tools), dict(step.request_params),
                         self.plan.model or step.model)

    def _record(self, step: Step | None, source: str, inputs: Sequence[Message], outputs: Sequence[Message],
                changed: bool, output_hash: str, kind: str | None = None, name: str | None = None) -> None:
        index = step.index if step is not None else None
        if changed and index is not None and self.diverged_at is None:
            self.diverged_at = index
        self.outcomes.append(StepOutcome(index, kind or (step.kind if step else "llm"), name or (step.name if step else ""),
                                         source, tuple(inputs), tuple(outputs), changed, output_hash))

    # -- guarded policy calls -----------------------------------------------------------------------
    def _invoke(self, step: Step, fn: Any, *args: Any) -> Any:
        """Call a policy; the watcher (`guard.supervise`) reads `call_started` to time it."""
        if self.policy_timeout_s is None:  # not watched: nothing to time, nobody to abandon it
            result = fn(*args)
            if type(result) not in _NEVER_AWAITABLE and inspect.isawaitable(result):
                result = run_coroutine(result, None)
            return result
        if self._abandoned:  # given up on by the watcher: no further calls, no further budget
            raise self._stop(step, "policy-timeout", "abandoned after an earlier policy call timed out")
        self._calling, self.call_started = step, time.monotonic()
        try:
            result = fn(*args)
            if type(result) not in _NEVER_AWAITABLE and inspect.isawaitable(result):
                result = run_coroutine(result, self.policy_timeout_s)  # an async policy, on its own loop
        finally:
            self.call_started = None
        if self._abandoned:
            raise self._stop(step, "policy-timeout", "abandoned after the policy call timed out")
        return result

    def _policy_failed(self, step: Step, what: str, exc: Exception) -> _Stop:
        if isinstance(exc, CallRefused):
            return self._stop(step, "refused", str(exc))
        if isinstance(exc, PolicyTimeout):
            return self._stop(step, "policy-timeout", f"the {what} policy {exc}")
        return self._stop(step, "policy-error", f"the {what} policy raised {type(exc).__name__}: {exc}")

    def _call_llm(self, fn: Any, step: Step, inputs: LLMInputs, position: int | str) -> Output:
        self.policy_calls += 1
        try:
            value = self._invoke(step, fn, step, inputs, SeededOnUse(self.seed, position))
            return llm_output(value, "the llm policy for step", step.index)
        except _Stop:
            raise
        except Exception as exc:  # noqa: BLE001 - a policy failure marks the rollout, it does not crash it
            raise self._policy_failed(step, "llm", exc) from exc

    def _call_tool(self, fn: Any, step: Step, arguments: Any, position: int | str) -> Any:
        self.policy_calls += 1
        try:
            result = self._invoke(step, fn, arguments, SeededOnUse(self.seed, position))
        except _Stop:
            raise
        except Exception as exc:  # noqa: BLE001 - a policy failure marks the rollout, it does not crash it
            raise self._policy_failed(step, "tool", exc) from exc
        try:
            if not isinstance(result, str):  # a string always is one
                json.dumps(result)
        except (TypeError, ValueError) as exc:
            raise self._stop(step, "policy-error", f"the tool policy returned {type(result).__name__}, "
                                                   "which is not a string or a JSON value") from exc
        return result

    def abandon(self) -> ReplayRun | None:
        """Give up on this rollout (called by the watcher when a policy call outlasts the timeout):
        the errored run as it stands, or None if the walk finished meanwhile."""
        with self._state_lock:
            if self._finished:
                return None
            self._abandoned = True
        step = self._calling
        why = self._stop(step, "policy-timeout", f"the {step.kind if step else 'llm'} policy did not return within "
                                                 f"{self.policy_timeout_s:g} s (abandoned; its thread runs on until "
                                                 "the policy returns)").why
        return ReplayRun(self.traj.trace_id, self.plan_key, self.seed, tuple(self.outcomes), "",
                         self.policy_calls, self.diverged_at, why, self.truncated, self.tokens)

    # -- the walk ---------------------------------------------------------------------------------
    def run(self) -> ReplayRun:
        """The rollout; with a policy timeout it walks on a watched worker thread (`guard`)."""
        if self.policy_timeout_s is None:
            return self.walk()
        return supervise(self, self.policy_timeout_s)

    def walk(self) -> ReplayRun:
        unreplayable = None
        _current.replayer = self
        try:
            for step in self.traj.steps:
                if self.ended:
                    self._record(step, "skipped", (), (), True, EMPTY_HASH)
                elif step.kind == "llm":
                    self._llm(step)
                elif step.kind in ("tool", "retrieval"):
                    self._tool(step)
                else:
                    self._record(step, "recording", step.inputs, step.outputs, False,
                                 self.prep.output_hash[step.index])
            if not self.ended:
                self._continue_loop()
        except _Stop as stop:
            unreplayable = stop.why
        except _Coincides:
            pass
        finally:
            _current.replayer = None
            with self._state_lock:
                self._finished = True
        return ReplayRun(self.traj.trace_id, self.plan_key, self.seed, tuple(self.outcomes), self.answer,
                         self.policy_calls, self.diverged_at, unreplayable, self.truncated, self.tokens,
                         self.coincides_at)

    def _coincide_if_reproduced(self, step: Step, action: Action, changed: bool, outputs: Sequence[Message]) -> None:
        """With `reuse`: a re-decided step that reproduced its recorded output (tool-call ids aside,
        as the cassette compares them), nothing having changed before it, leaves the rest of the
        rollout a rollout of the plan with the step held, from the same seed, so the walk stops
        and says so (`coincides_at`)."""
        if not self.reuse or action is not Action.RESAMPLE or self.diverged_at is not None:
            return
        if changed and canonical_bytes(without_call_ids(list(outputs))) != \
                canonical_bytes(without_call_ids(list(step.outputs))):
            return
        self.coincides_at = step.index
        raise _Coincides

    def _llm(self, step: Step) -> None:
        index: int = step.index  # type: ignore[assignment]  # a step of Trajectory.steps: its index is never None
        prep = self.prep
        intervention = self.actions[index]
        action = intervention.action
        if self.subst or self.results:
            live = self._apply(index)
            inputs = tuple(live)
        else:  # nothing changed upstream: the live request is the recorded one
            live, inputs = None, tuple(step.inputs)
        self.live_in[index] = inputs
        held = None
        if action is _HOLD and not self.plan.model:  # the cassette is read for a held step only
            key = prep.request_keys[index] if live is None else key_of(step, inputs)
            held = self.cassette.get((step.kind, step.name, key))
        if action is _DO or action is _OBSERVE:
            output, source = llm_output(intervention.value, "do() for step", index), "forced"
        elif action is _REMOVE:
            output, source = NO_OUTPUT, "removed"
        elif held:
            output, source = held[0], "recording"
        elif step.observation_only:
            raise self._stop(step, "observation-only", "its content was not captured, so it cannot be re-decided")
        else:
            fn = self._policy("llm", step)
            request = self._llm_inputs(step, list(inputs) if live is None else live)
            output, source = self._call_llm(fn, step, request, index), "policy"
        self.live[index] = output
        outputs, live_hash, calls, text = output
        changed = live_hash != prep.output_hash[index]
        self._coincide_if_reproduced(step, action, changed, outputs)
        if changed and self.diverged_at is None:
            self.diverged_at = index
        self.outcomes.append(StepOutcome(index, step.kind, step.name, source, inputs, outputs, changed, live_hash))
        if text:
            self.answer = text
        if not changed:
            return
        if index in prep.delegated:
            self._redeliver(prep.delegated[index], step, outputs)
        replacement = list(outputs)
        if calls:
            replacement += self._run_new_calls(step, calls)
        for i, digest in enumerate(step.output_hashes):
            self.subst[digest] = replacement if i == 0 else []
        if prep.recorded[index].calls and not calls:
            self.ended = True  # the agent answers instead of calling a tool: the run ends here

    def _tool(self, step: Step) -> None:
        index: int = step.index  # type: ignore[assignment]  # a step of Trajectory.steps: its index is never None
        call = self._live_call(step)
        if call is None:  # the model no longer makes this call: the step does not happen
            self._drop_tool_output(step)
            self._record(step, "skipped", (), (), True, EMPTY_HASH)
            return
        call_id = call.get("id")
        arguments = call.get("arguments")
        inputs: tuple[Message, ...] = ({"role": "assistant", "parts": [call]},)
        intervention = self.actions[index]
        action = intervention.action
        held = None
        if action is _HOLD:  # the cassette is read for a held step only
            held = self.cassette.get((step.kind, step.name, self.prep.tool_key(step, arguments)))
        if action is _DO or action is _OBSERVE:
            result, source = intervention.value, "forced" if action is _DO else "observed"
        elif action is _REMOVE:
            self._drop_tool_output(step)
            self._record(step, "removed", inputs, (), True, EMPTY_HASH)
            return
        elif held and held[0] is None:  # the recorded call produced no result (it failed): so does this one
            self._record(step, "recording", inputs, (), bool(step.outputs), EMPTY_HASH)
            if step.outputs:
                self._drop_tool_output(step)
            return
        elif held:
            result, source = held[0], "recording"
        elif step.observation_only:
            raise self._stop(step, "observation-only", "its result was not captured, so it cannot be re-run")
        else:
            result, source = self._call_tool(self._policy(step.kind, step), step, arguments, index), "policy"
        message, live_hash = tool_output(call_id, result)
        changed = live_hash != self.prep.output_hash[index]
        self._coincide_if_reproduced(step, action, changed, (message,))
        if changed and self.diverged_at is None:
            self.diverged_at = index
        self.outcomes.append(StepOutcome(index, step.kind, step.name, source, inputs, (message,), changed, live_hash))
        if changed:
            replacement = [message]
            for digest in step.output_hashes:
                self.subst[digest] = replacement
            if step.tool_call_id is not None:
                self.results[step.tool_call_id] = (call_id, message["parts"][0].get("response"))


def replay(trajectory: Trajectory, plan: ReplayPlan | None = None, seed: int = 0, *,
           policies: policy_registry.Registry | None = None, max_steps: int = DEFAULT_MAX_STEPS,
           policy_timeout_s: float | None = None, reuse: bool = False) -> ReplayRun:
    """One rollout of `trajectory` under `plan` (default: factual), deterministic in `seed`.

    :param policy_timeout_s: cut off a policy call after this many seconds (the rollout is then
        errored, cause `policy-timeout`); None runs policies on this thread without a limit. A
        timed-out sync policy's thread cannot be killed: it is abandoned (see `guard`).
    :param reuse: stop at the first re-decided step if it reproduces its recorded output while
        nothing changed before it: from there the rollout is the rollout of
        `plan.holding(run.coincides_at)` with the same seed, which the caller may already have.
    """
    registry = policies if policies is not None else policy_registry.registry
    return Replayer(trajectory, plan or ReplayPlan.factual(), seed, registry, max_steps, policy_timeout_s,
                    reuse).run()


async def replay_async(trajectory: Trajectory, plan: ReplayPlan | None = None, seed: int = 0, *,
                       policies: policy_registry.Registry | None = None, max_steps: int = DEFAULT_MAX_STEPS,
                       policy_timeout_s: float | None = None) -> ReplayRun:
    """`replay` on a worker thread, so neither sync nor async policies block the caller's event loop."""
    return await asyncio.to_thread(replay, trajectory, plan, seed, policies=policies, max_steps=max_steps,
                                   policy_timeout_s=policy_timeout_s)
