"""The trace-driven replay engine: one rollout of a trajectory under a plan, as a pure function
of (trajectory, plan, seed).

It walks the recorded steps in order. A held step whose live inputs hash-match a recorded step
of the same kind and name is served from the recording (a cassette keyed by kind + name +
inputs hash, so a branching agent binds correctly). A changed output is carried downstream: the
recorded message is replaced in every later history (by hash), a tool result by its tool-call id,
and a tool call's arguments into the tool step. A step whose inputs changed is re-run by its
policy even when held. The GenAI message protocol is the agent loop, so the engine also goes
past the recording: a new tool call runs that tool's policy; an output without tool calls ends
the run; tool calls after the recording's end keep the loop going up to `max_steps`.

Policies are user code, so every call is guarded: one that raises, returns something that is not
an output, or runs past `policy_timeout_s` ends the rollout as errored (neither a pass nor a
fail); see `guard` for how a hanging call is cut off.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_replay.normalize.messages import canonical_messages, message_text
from otel_replay.replay import policies as policy_registry
from otel_replay.replay.delegation import answer_text, delegated_answers, rederived_result
from otel_replay.replay.guard import CallRefused, PolicyTimeout, run_coroutine, supervise
from otel_replay.replay.plan import Action, Intervention, ReplayPlan
from otel_replay.replay.run import (
    Message,
    ReplayRun,
    StepOutcome,
    Unreplayable,
    message_hash,
    outputs_hash,
)
from otel_replay.trajectory import Step, Trajectory

DEFAULT_MAX_STEPS = 64
DEFAULT_POLICY_TIMEOUT_S = 60.0
"""Per-call policy timeout of attribution jobs (`--policy-timeout`); `replay()` has none unless asked."""
_REMOVED = object()
_NOTHING = object()
_EMPTY_HASH = outputs_hash([])


@dataclass(slots=True)
class LLMInputs:
    """What an llm policy gets besides the recorded step: the live request (read it; a rollout
    builds a fresh one per call, so changing it changes nothing)."""

    messages: list[Message]
    system: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    model: str | None = None


class _Stop(Exception):
    def __init__(self, why: Unreplayable) -> None:
        super().__init__(str(why))
        self.why = why


def _calls(messages: Iterable[Message]) -> list[dict[str, Any]]:
    return [p for m in messages for p in m.get("parts", []) if isinstance(p, dict) and p.get("type") == "tool_call"]


def _tool_message(call_id: str | None, result: Any) -> Message:
    response = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    part: dict[str, Any] = {"type": "tool_call_response", "response": response}
    if call_id is not None:
        part["id"] = call_id
    return {"role": "tool", "parts": [part]}


def _recorded_result(step: Step) -> Any:
    for message in step.outputs:
        for part in message.get("parts", []):
            if part.get("type") == "tool_call_response":
                return part.get("response")
    return None


def _recorded_arguments(step: Step) -> Any:
    calls = _calls(step.inputs)
    return calls[0].get("arguments") if calls else None


def llm_output(value: Any, where: str, index: int | None = None) -> tuple[Message, ...]:
    """An llm policy's (or do()'s) value as canonical output messages."""
    if isinstance(value, str):
        return ({"role": "assistant", "parts": [{"type": "text", "content": value}]},)
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list):
        for m in value:
            if not isinstance(m, dict):
                break
        else:
            return tuple(canonical_messages(value))  # memoized: a policy's repeated answers cost a lookup
    where = where if index is None else f"{where} {index}"
    raise TypeError(f"{where} returned {type(value).__name__}; expected output messages "
                    "(a list of {{role, parts}}), one message, or a string")


_NEVER_AWAITABLE = frozenset({str, dict, list, tuple, int, float, bool, type(None)})


def _seed_now(rng: random.Random) -> None:
    pending = rng.__dict__.pop("_seed_on_use", _NOTHING)
    if pending is not _NOTHING:
        rng.__class__ = random.Random
        seed, position = pending
        random.Random.seed(rng, f"{seed}:{position}")


class _SeededOnUse(random.Random):
    """`random.Random(seed)`, seeded on its first use.

    Seeding from a string costs ~6 µs (sha512, then the 624-word state), more than a whole
    replayed step, and most policies never draw. The first draw (or any state access) seeds it
    and turns it into a plain `random.Random`, so it gives exactly the draws `random.Random(seed)`
    gives. It defines `getrandbits`, so `_randbelow` is the same method as `random.Random`'s.
    """

    __slots__ = ()  # the same layout as random.Random, so the class can be switched in place
    gauss_next = None  # read by gauss() before its first draw, as after seed()

    def __init__(self, seed: Any = None, position: Any = None) -> None:  # no super().__init__: it seeds now
        self._seed_on_use = (seed, position)

    def random(self) -> float:
        _seed_now(self)  # a function: methods bound before the switch still call it
        return random.Random.random(self)

    def getrandbits(self, k: int) -> int:
        _seed_now(self)  # a function: methods bound before the switch still call it
        return random.Random.getrandbits(self, k)

    def randbytes(self, n: int) -> bytes:
        _seed_now(self)  # a function: methods bound before the switch still call it
        return random.Random.randbytes(self, n)

    def getstate(self) -> Any:
        _seed_now(self)  # a function: methods bound before the switch still call it
        return random.Random.getstate(self)

    def seed(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__.pop("_seed_on_use", None)
        self.__class__ = random.Random
        random.Random.seed(self, *args, **kwargs)

    def setstate(self, state: Any) -> None:
        self.__dict__.pop("_seed_on_use", None)
        self.__class__ = random.Random
        random.Random.setstate(self, state)


def _without_call_ids(messages: Any) -> list[Any]:
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


def _key_of(step: Step, payload: Any) -> str:
    """Cassette key: a tool's arguments, or an llm call's whole request (tool-call ids aside)."""
    if step.kind in ("tool", "retrieval"):
        return outputs_hash([{"arguments": payload}])
    return outputs_hash([{"system": list(step.system), "tools": list(step.tools),
                          "messages": _without_call_ids(payload)}])


def _response_ids(message: Message) -> frozenset[Any] | None:
    """The tool-call ids a message answers; None when they cannot be read ahead (then scanned live)."""
    try:
        return frozenset(p.get("id") for p in message.get("parts", []) if p.get("type") == "tool_call_response")
    except (AttributeError, TypeError):
        return None


class _Prepared:
    """What every rollout of one trajectory reads and none changes, computed once per trajectory.

    An attribution replays one trajectory hundreds of times; this keeps the per-rollout cost to
    the steps themselves. Everything here is read-only, and recorded payloads are immutable (as
    everywhere in the store layer), so a trajectory's preparation holds for its whole life.
    """

    __slots__ = ("steps", "cassette", "source_of", "request_keys", "known_hashes", "known_keys", "bound",
                 "response_ids", "recorded_calls", "llm_steps", "plans", "delegated")

    def __init__(self, trajectory: Trajectory) -> None:
        self.steps = trajectory.steps
        self.plans: dict[int, tuple[ReplayPlan, dict[int | None, Intervention], str]] = {}  # id(plan) -> ...
        self.source_of: dict[int, int] = {e.target: e.source for e in trajectory.edges if e.via == "tool_call"}
        self.cassette: dict[tuple[str, str, str], list[Any]] = {}
        self.request_keys: dict[int | None, str] = {}  # llm step -> the cassette key of its recorded request
        self.known_hashes: dict[int, tuple[Any, str]] = {}  # id(recorded outputs) -> (outputs, outputs_hash)
        self.known_keys: dict[int, tuple[Any, str]] = {}  # id(recorded tool arguments) -> (arguments, key)
        self.bound: dict[int, list[Step]] = {}  # llm step -> the tool steps answering its calls, in order
        self.response_ids: dict[int | None, tuple[frozenset[Any] | None, ...]] = {}
        self.recorded_calls: dict[int | None, list[dict[str, Any]]] = {}
        for step in trajectory.steps:
            tool_like = step.kind in ("tool", "retrieval")
            payload = _recorded_arguments(step) if tool_like else step.inputs
            key = _key_of(step, payload)
            self.cassette.setdefault((step.kind, step.name, key), []).append(
                _recorded_result(step) if tool_like else step.outputs)
            self.known_hashes[id(step.outputs)] = (step.outputs, outputs_hash(list(step.outputs)))
            if tool_like:
                self.known_keys[id(payload)] = (payload, key)
            else:
                self.request_keys[step.index] = key
            if step.kind == "llm":
                self.response_ids[step.index] = tuple(_response_ids(m) for m in step.inputs)
                self.recorded_calls[step.index] = _calls(step.outputs)
            source = self.source_of.get(step.index)  # type: ignore[arg-type]
            if source is not None:
                self.bound.setdefault(source, []).append(step)
        self.llm_steps = [s for s in trajectory.steps if s.kind == "llm"]
        self.delegated = delegated_answers(trajectory)  # a sub-agent's answer step -> the tool step it answers

    def plan(self, plan: ReplayPlan) -> tuple[dict[int | None, Intervention], str]:
        """`plan.action(i)` for every step, and `plan.key()`, once per plan (a plan is frozen; the
        rollouts of one attribution share it, and an explicit plan's `action` scans its list)."""
        entry = self.plans.get(id(plan))
        if entry is not None and entry[0] is plan:  # the entry holds the plan, so its id is not reused
            return entry[1], entry[2]
        table = {step.index: plan.action(step.index) for step in self.steps}  # type: ignore[arg-type]
        key = plan.key()
        with _PREPARED_LOCK:
            while len(self.plans) >= _PLANS_MAX:
                self.plans.pop(next(iter(self.plans)), None)
            self.plans[id(plan)] = (plan, table, key)
        return table, key


_PREPARED: dict[int, tuple[Trajectory, _Prepared]] = {}  # id(trajectory) -> (trajectory, its preparation)
_PREPARED_MAX = 16
_PLANS_MAX = 64  # plans remembered per trajectory
_PREPARED_LOCK = threading.Lock()


def _prepared(trajectory: Trajectory) -> _Prepared:
    entry = _PREPARED.get(id(trajectory))
    if entry is not None and entry[0] is trajectory:  # the entry holds the trajectory, so its id is not reused
        return entry[1]
    prepared = _Prepared(trajectory)
    with _PREPARED_LOCK:
        while len(_PREPARED) >= _PREPARED_MAX:
            _PREPARED.pop(next(iter(_PREPARED)), None)
        _PREPARED[id(trajectory)] = (trajectory, prepared)
    return prepared


_current = threading.local()


def report_tokens(count: int) -> None:
    """Called by a policy to add the tokens its model call used to the running rollout's total."""
    replayer = getattr(_current, "replayer", None)
    if replayer is not None and count:
        replayer.tokens = (replayer.tokens or 0) + int(count)


class Replayer:
    """One rollout. Use `replay()`; this class holds the rollout's state."""

    def __init__(self, trajectory: Trajectory, plan: ReplayPlan, seed: int,
                 registry: policy_registry.Registry, max_steps: int, policy_timeout_s: float | None = None) -> None:
        if policy_timeout_s is not None and not policy_timeout_s > 0:
            raise ValueError(f"policy_timeout_s must be a positive number of seconds or None, got {policy_timeout_s!r}")
        self.traj = trajectory
        self.plan = plan
        self.seed = seed
        self.registry = registry
        self.max_steps = max_steps
        self.subst: dict[str, list[Message]] = {}
        self.results: dict[str, Any] = {}  # recorded tool-call id -> (live id, response) or _REMOVED
        self.live_out: dict[int, tuple[Message, ...]] = {}
        self.live_in: dict[int, list[Message]] = {}
        self.live_hash: dict[int, str] = {}  # outputs_hash of live_out
        self.outcomes: list[StepOutcome] = []
        self.policy_calls = 0
        self.diverged_at: int | None = None
        self.ended = False
        self.truncated = False
        self.policy_timeout_s = policy_timeout_s
        self.tokens: int | None = None  # what policies reported with `report_tokens`
        self.call_started: float | None = None  # monotonic start of the policy call in progress
        self._calling: Step | None = None
        self._abandoned = False
        self._finished = False
        self._state_lock = threading.Lock()  # the watcher's abandon() against the walk's end
        self.prep = _prepared(trajectory)
        self.actions, self.plan_key = self.prep.plan(plan)
        self.source_of = self.prep.source_of  # read-only, shared by every rollout of the trajectory
        self.cassette = self.prep.cassette  # read-only, likewise

    # -- helpers ----------------------------------------------------------------------------------
    _key_of = staticmethod(_key_of)

    def _outputs_hash(self, outputs: Sequence[Message]) -> str:
        """`outputs_hash`, read from the preparation when these are a recorded step's own outputs."""
        known = self.prep.known_hashes.get(id(outputs))
        if known is not None and known[0] is outputs:
            return known[1]
        return outputs_hash(list(outputs))

    def _tool_key(self, step: Step, arguments: Any) -> str:
        known = self.prep.known_keys.get(id(arguments))
        if known is not None and known[0] is arguments:
            return known[1]
        return _key_of(step, arguments)

    def _rng(self, position: int | str) -> random.Random:
        """`random.Random(f"{seed}:{position}")`, seeded on first use."""
        return _SeededOnUse(self.seed, position)

    def _stop(self, step: Step | None, cause: str, reason: str) -> _Stop:
        return _Stop(Unreplayable(step.index if step else None, step.kind if step else "llm",
                                  step.name if step else "", reason, cause))

    def _policy(self, kind: str, step: Step) -> Any:
        fn = self.registry.resolve(kind, step.tool_name or step.name, self.plan.model or step.model)
        if fn is None:
            hint = f'@policies.{kind}("{step.tool_name or step.name}")' if kind != "llm" else "@policies.llm"
            raise self._stop(step, "missing-policy", f"no {kind} policy for {step.name!r}; register one with {hint}")
        return fn

    def _apply(self, messages: Sequence[Message], hashes: Sequence[str] = (),
               response_ids: Sequence[frozenset[Any] | None] = ()) -> list[Message]:
        """Recorded messages with every upstream change carried in.

        `response_ids[i]`, when given, holds the tool-call ids message i answers (read ahead).
        """
        if not self.subst and not self.results:
            return list(messages)
        out: list[Message] = []
        subst, results = self.subst, self.results
        for i, message in enumerate(messages):
            digest = hashes[i] if i < len(hashes) else message_hash(message)
            if digest in subst:
                out.extend(subst[digest])
                continue
            if not results:
                out.append(message)
                continue
            ids = response_ids[i] if i < len(response_ids) else None
            if ids is not None:
                answers = bool(ids) and any(x in results for x in ids)
            else:
                answers = any(p.get("type") == "tool_call_response" and p.get("id") in results
                              for p in message.get("parts", []))
            if answers:
                kept = []
                for part in message.get("parts", []):
                    live = self.results.get(part.get("id")) if part.get("type") == "tool_call_response" else None
                    if live is None:
                        kept.append(part)
                    elif live is not _REMOVED:
                        kept.append({**part, "id": live[0], "response": live[1]} if live[0] else
                                    {k: v for k, v in {**part, "response": live[1]}.items() if k != "id"})
                if kept:
                    out.append({**message, "parts": kept})
                continue
            out.append(message)
        return out

    def _record(self, step: Step | None, source: str, inputs: Sequence[Message], outputs: Sequence[Message],
                changed: bool, kind: str | None = None, name: str | None = None, output_hash: str | None = None
                ) -> None:
        index = step.index if step is not None else None
        if changed and index is not None and self.diverged_at is None:
            self.diverged_at = index
        if output_hash is None:
            output_hash = self._outputs_hash(outputs) if outputs else _EMPTY_HASH
        self.outcomes.append(StepOutcome(index, kind or (step.kind if step else "llm"), name or (step.name if step else ""),
                                         source, tuple(inputs), tuple(outputs), changed, output_hash))

    # -- guarded policy calls -----------------------------------------------------------------------
    def _invoke(self, step: Step, fn: Any, *args: Any) -> Any:
        """Call a policy; the watcher (`guard.supervise`) reads `call_started` to time it."""
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
                    self._record(step, "skipped", (), (), True)
                elif step.kind == "llm":
                    self._llm(step)
                elif step.kind in ("tool", "retrieval"):
                    self._tool(step)
                else:
                    self._record(step, "recording", step.inputs, step.outputs, False)
            if not self.ended:
                self._continue_loop()
        except _Stop as stop:
            unreplayable = stop.why
        finally:
            _current.replayer = None
            with self._state_lock:
                self._finished = True
        return ReplayRun(self.traj.trace_id, self.plan_key, self.seed, tuple(self.outcomes), self._final_output(),
                         self.policy_calls, self.diverged_at, unreplayable, self.truncated, self.tokens)

    def _final_output(self) -> str:
        for outcome in reversed(self.outcomes):
            if outcome.kind == "llm" and outcome.source != "skipped":
                text = "".join(message_text(m) for m in outcome.outputs if m.get("role") == "assistant")
                if text:
                    return text
        return ""

    def _llm(self, step: Step) -> None:
        intervention = self.actions[step.index]
        as_recorded = not self.subst and not self.results  # then the live request is the recorded one
        live = self._apply(step.inputs, step.input_hashes, self.prep.response_ids.get(step.index, ()))
        self.live_in[step.index] = live
        held = None
        if intervention.action is Action.HOLD and not self.plan.model:  # the cassette is read for a held step only
            key = self.prep.request_keys[step.index] if as_recorded else _key_of(step, live)
            held = self.cassette.get((step.kind, step.name, key))
        if intervention.action in (Action.DO, Action.OBSERVE):
            outputs, source = llm_output(intervention.value, "do() for step", step.index), "forced"
        elif intervention.action is Action.REMOVE:
            outputs, source = (), "removed"
        elif held:
            outputs, source = held[0], "recording"
        elif step.observation_only:
            raise self._stop(step, "observation-only", "its content was not captured, so it cannot be re-decided")
        else:
            fn = self._policy("llm", step)
            inputs = LLMInputs(live, list(step.system), list(step.tools), dict(step.request_params),
                               self.plan.model or step.model)
            outputs, source = self._call_llm(fn, step, inputs, step.index), "policy"
        self.live_out[step.index] = outputs
        live_hash = self.live_hash[step.index] = self._outputs_hash(outputs)
        changed = live_hash != self._outputs_hash(step.outputs)
        self._record(step, source, live, outputs, changed, output_hash=live_hash)
        if not changed:
            return
        if step.index in self.prep.delegated:
            self._redeliver(self.prep.delegated[step.index], step, outputs)
        extra = self._run_new_calls(step, outputs)
        replacement = list(outputs) + extra
        for i, digest in enumerate(step.output_hashes):
            self.subst[digest] = replacement if i == 0 else []
        if self.prep.recorded_calls[step.index] and not _calls(outputs):
            self.ended = True  # the agent answers instead of calling a tool: the run ends here

    def _call_llm(self, fn: Any, step: Step, inputs: LLMInputs, position: int | str) -> tuple[Message, ...]:
        self.policy_calls += 1
        try:
            value = self._invoke(step, fn, step, inputs, self._rng(position))
            return llm_output(value, "the llm policy for step", step.index)
        except _Stop:
            raise
        except Exception as exc:  # noqa: BLE001 - a policy failure marks the rollout, it does not crash it
            raise self._policy_failed(step, "llm", exc) from exc

    def _bound_tool_steps(self, llm_index: int) -> list[Step]:
        return self.prep.bound.get(llm_index, [])

    def _run_new_calls(self, step: Step, outputs: Sequence[Message]) -> list[Message]:
        """Tool calls the recording never made: run their policies now; their results follow the call."""
        bound = self._bound_tool_steps(step.index)
        taken = {self._live_call(s, outputs, consume=False)[1] for s in bound} - {None}
        results = []
        for n, call in enumerate(_calls(outputs)):
            if id(call) in taken:
                continue
            results.append(self._run_tool_call(step, call, f"{step.index}.{n}"))
        return results

    def _run_tool_call(self, after: Step, call: dict[str, Any], position: str) -> Message:
        name = str(call.get("name"))
        template = next((s for s in self.traj.steps if s.kind == "tool" and s.tool_name == name), None)
        probe = template or Step(index=None, span_id="", parent_span_id=None, kind="tool", operation="execute_tool",
                                 name=name, status="unset", start_ns=None, end_ns=None, tool_name=name)
        resampling = self.plan.resample_after is not None and (after.index or 0) >= self.plan.resample_after
        held = None if resampling else self.cassette.get(("tool", name, self._key_of(probe, call.get("arguments"))))
        if held:  # a call the recording made elsewhere, with the same arguments: bind to it
            result, source = held[0], "recording"
        else:
            result, source = self._call_tool(self._policy("tool", probe), probe, call.get("arguments"), position), "policy"
        message = _tool_message(call.get("id"), result)
        self._record(None, source, [{"role": "assistant", "parts": [call]}], [message], True, "tool", name)
        return message

    def _call_tool(self, fn: Any, step: Step, arguments: Any, position: int | str) -> Any:
        self.policy_calls += 1
        try:
            result = self._invoke(step, fn, arguments, self._rng(position))
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

    def _live_call(self, step: Step, outputs: Sequence[Message] | None = None, consume: bool = True
                   ) -> tuple[dict[str, Any] | None, int | None]:
        """The live tool call a recorded tool step answers (by call id, else by name and order)."""
        source = self.source_of.get(step.index)
        if source is None:
            return {"id": step.tool_call_id, "name": step.tool_name, "arguments": _recorded_arguments(step)}, None
        live = outputs if outputs is not None else self.live_out.get(source)
        if live is None:
            return None, None
        calls = _calls(live)
        match = None
        if step.tool_call_id:
            for c in calls:
                if c.get("id") == step.tool_call_id:
                    match = c
                    break
        if match is None:
            same_name = [c for c in calls if c.get("name") == step.tool_name]
            earlier = [s for s in self._bound_tool_steps(source) if s.tool_name == step.tool_name and s.index < step.index]
            match = same_name[len(earlier)] if len(same_name) > len(earlier) else None
        return match, (id(match) if match is not None else None)

    def _tool(self, step: Step) -> None:
        call, _ = self._live_call(step)
        recorded_id = step.tool_call_id
        if call is None:  # the model no longer makes this call: the step does not happen
            self._drop_tool_output(step)
            self._record(step, "skipped", (), (), True)
            return
        arguments = call.get("arguments")
        inputs = [{"role": "assistant", "parts": [call]}]
        intervention = self.actions[step.index]
        held = None
        if intervention.action is Action.HOLD:  # the cassette is read for a held step only
            held = self.cassette.get((step.kind, step.name, self._tool_key(step, arguments)))
        if intervention.action in (Action.DO, Action.OBSERVE):
            result, source = intervention.value, "forced" if intervention.action is Action.DO else "observed"
        elif intervention.action is Action.REMOVE:
            self._drop_tool_output(step)
            self._record(step, "removed", inputs, (), True)
            return
        elif held and held[0] is None:  # the recorded call produced no result (it failed): so does this one
            self._record(step, "recording", inputs, (), bool(step.outputs))
            if step.outputs:
                self._drop_tool_output(step)
            return
        elif held:
            result, source = held[0], "recording"
        elif step.observation_only:
            raise self._stop(step, "observation-only", "its result was not captured, so it cannot be re-run")
        else:
            result, source = self._call_tool(self._policy(step.kind, step), step, arguments, step.index), "policy"
        message = _tool_message(call.get("id"), result)
        live_hash = outputs_hash([message])
        changed = live_hash != self._outputs_hash(step.outputs)
        self._record(step, source, inputs, (message,), changed, output_hash=live_hash)
        if changed:
            for digest in step.output_hashes:
                self.subst[digest] = [message]
            if recorded_id is not None:
                self.results[recorded_id] = (call.get("id"), message["parts"][0]["response"])

    def _redeliver(self, tool: Step, answer: Step, outputs: Sequence[Message]) -> None:
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
        message = _tool_message(part.get("id"), result)
        self.outcomes[at] = StepOutcome(before.index, before.kind, before.name, "sub-agent", before.inputs,
                                        (message,), True, outputs_hash([message]))
        for digest in tool.output_hashes:
            self.subst[digest] = [message]
        if tool.tool_call_id is not None:
            self.results[tool.tool_call_id] = (part.get("id"), result)

    def _drop_tool_output(self, step: Step) -> None:
        for digest in step.output_hashes:
            self.subst[digest] = []
        if step.tool_call_id is not None:
            self.results[step.tool_call_id] = _REMOVED

    def _continue_loop(self) -> None:
        """Past the recording: keep the agent loop going while the model calls tools."""
        llm_steps = self.prep.llm_steps
        if not llm_steps:
            return
        last = llm_steps[-1]
        outputs = self.live_out.get(last.index, last.outputs)
        live_hash = self.live_hash[last.index] if last.index in self.live_out else self._outputs_hash(outputs)
        if live_hash == self._outputs_hash(last.outputs) or not _calls(outputs):
            return
        history = list(self.live_in.get(last.index, last.inputs)) + list(outputs)
        history += [o.outputs[0] for o in self.outcomes if o.kind == "tool" and o.outputs
                    and (o.index is None or self.source_of.get(o.index) == last.index)]
        turn = 0
        while len(self.outcomes) < self.max_steps:
            inputs = LLMInputs(list(history), list(last.system), list(last.tools), dict(last.request_params),
                               self.plan.model or last.model)
            outputs = self._call_llm(self._policy("llm", last), last, inputs, f"past.{turn}")
            self._record(None, "policy", history, outputs, True, "llm", last.name)
            history += list(outputs)
            calls = _calls(outputs)
            if not calls:
                return
            for n, call in enumerate(calls):
                history.append(self._run_tool_call(last, call, f"past.{turn}.{n}"))
            turn += 1
        self.truncated = True


def replay(trajectory: Trajectory, plan: ReplayPlan | None = None, seed: int = 0, *,
           policies: policy_registry.Registry | None = None, max_steps: int = DEFAULT_MAX_STEPS,
           policy_timeout_s: float | None = None) -> ReplayRun:
    """One rollout of `trajectory` under `plan` (default: factual), deterministic in `seed`.

    :param policy_timeout_s: cut off a policy call after this many seconds (the rollout is then
        errored, cause `policy-timeout`); None runs policies on this thread without a limit. A
        timed-out sync policy's thread cannot be killed: it is abandoned (see `guard`).
    """
    registry = policies if policies is not None else policy_registry.registry
    return Replayer(trajectory, plan or ReplayPlan.factual(), seed, registry, max_steps, policy_timeout_s).run()


async def replay_async(trajectory: Trajectory, plan: ReplayPlan | None = None, seed: int = 0, *,
                       policies: policy_registry.Registry | None = None, max_steps: int = DEFAULT_MAX_STEPS,
                       policy_timeout_s: float | None = None) -> ReplayRun:
    """`replay` on a worker thread, so neither sync nor async policies block the caller's event loop."""
    return await asyncio.to_thread(replay, trajectory, plan, seed, policies=policies, max_steps=max_steps,
                                   policy_timeout_s=policy_timeout_s)
