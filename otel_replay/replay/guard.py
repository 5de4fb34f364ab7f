"""Guarding policy calls: a per-call timeout, and refusals (a spent budget) that are not errors.

A sync policy that hangs cannot be interrupted in Python: a thread cannot be killed, and an
exception injected into it waits for the next bytecode, which a blocked socket read never
reaches. So a rollout with a timeout walks its steps on a worker thread while the caller
watches the policy call in progress; when one runs past the timeout the caller gives up on
the rollout (an errored `ReplayRun`, cause `policy-timeout`) and returns. The abandoned thread
runs on until the policy returns, then stops before calling another (it holds no lock and
writes nothing the caller reads); a policy that never returns keeps its thread for the life of
the process. Async policies are cancelled at the timeout instead (`asyncio.wait`), so their
thread comes back at once.

Workers are kept and reused (a handoff costs ~20 µs; a new thread ~130 µs), and one idle for
`IDLE_S` exits.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

IDLE_S = 30.0
ASYNC_GRACE_S = 0.25  # the watcher waits this much longer than an async policy's own timeout
_CANCEL_WAIT_S = 1.0  # how long a cancelled coroutine gets to finish its cleanup

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class CallRefused(Exception):  # noqa: N818 - a refusal, not an error
    """Raised by a policy wrapper to refuse a call (a spent budget): the rollout stops and is
    discarded, neither an error nor a result."""


class PolicyTimeout(Exception):  # noqa: N818 - named for what happened
    """A policy call ran past its timeout."""


class Watched(Protocol[R_co]):
    """What the watcher reads of a running rollout (`engine.Replayer`, whose result is a `ReplayRun`)."""

    @property
    def call_started(self) -> float | None: ...  # time.monotonic() when the policy call in progress began

    def walk(self) -> R_co: ...
    def abandon(self) -> R_co | None: ...  # the errored result, or None if the walk already finished


def run_coroutine(awaitable: Awaitable[Any], timeout_s: float | None) -> Any:
    """Run an async policy's awaitable on a new event loop, cancelled after `timeout_s`."""
    loop = asyncio.new_event_loop()
    try:
        if timeout_s is None:
            return loop.run_until_complete(awaitable)
        return loop.run_until_complete(_bounded(awaitable, timeout_s))
    finally:
        loop.close()


async def _bounded(awaitable: Awaitable[Any], timeout_s: float) -> Any:
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if done:
        return task.result()  # the policy's own TimeoutError, if it raised one, stays a policy error
    task.cancel()
    await asyncio.wait({task}, timeout=_CANCEL_WAIT_S)
    raise PolicyTimeout(f"did not return within {timeout_s:g} s (cancelled)")


def supervise(rollout: Watched[R], timeout_s: float) -> R:
    """`rollout.walk()` on a worker thread, abandoned when a policy call outlasts `timeout_s`."""
    box: _Box[R] = _Box()
    _WORKERS.submit(lambda: box.run(rollout.walk))
    limit = timeout_s + ASYNC_GRACE_S
    while True:
        started = rollout.call_started
        wait = limit if started is None else started + limit - time.monotonic()
        if box.done.wait(max(wait, 0.0)):
            return box.result()
        started = rollout.call_started
        if started is not None and time.monotonic() - started >= limit:
            abandoned = rollout.abandon()
            if abandoned is not None:
                return abandoned


class _Box(Generic[R]):
    """The result (or exception) of a function run on a worker."""

    _value: R  # set by run(), before `done`

    def __init__(self) -> None:
        self.done = threading.Event()
        self._error: BaseException | None = None

    def run(self, fn: Callable[[], R]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who re-raises it
            self._error = exc
        self.done.set()

    def result(self) -> R:
        if self._error is not None:
            raise self._error
        return self._value


class _Workers:
    """Daemon threads that run one task at a time; idle ones are reused, then exit after IDLE_S."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._work, args=(inbox,), name="otel-replay-rollout", daemon=True).start()
        inbox.put(task)

    def _work(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            try:
                task = inbox.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # nobody picked this worker meanwhile: exit
                        self._idle.remove(inbox)
                        return
                task = inbox.get()  # picked just now: its task is on the way
            task()
            with self._lock:
                self._idle.append(inbox)


_WORKERS = _Workers()
