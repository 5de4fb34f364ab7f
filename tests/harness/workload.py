"""Shared pieces of the reliability harnesses: GenAI spans to produce, child processes, memory.

Everything here runs the real thing: a real `TracerProvider` with a real `ReplayProcessor`, in
real subprocesses, writing real Parquet files.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer

REPO = Path(__file__).resolve().parents[2]
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def chat_attributes(question: str, answer: str = "ok", model: str = "m") -> dict[str, Any]:
    """A GenAI chat span's attributes (latest semconv: messages as JSON strings)."""
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model,
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": question}]}]),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": answer}], "finish_reason": "stop"}]),
    }


def tracer_for(processor: Any, service: str = "reliability") -> tuple[TracerProvider, Tracer]:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(processor)
    return provider, provider.get_tracer("otel-replay.reliability")


class Producer:
    """Ends GenAI spans on the calling thread, timing each `end()` (where `on_end` runs)."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.produced = 0
        self.exceptions: list[str] = []
        self.max_end_s = 0.0
        self.over_1ms = self.over_10ms = 0  # end() calls slower than that (GIL waits, preemption)

    def span(self, name: str, question: str, answer: str = "ok", attributes: dict[str, Any] | None = None) -> None:
        try:
            span = self.tracer.start_span(name, attributes=attributes or chat_attributes(question, answer))
            started = time.perf_counter()
            span.end()
            took = time.perf_counter() - started
            if took > self.max_end_s:
                self.max_end_s = took
            if took > 0.001:
                self.over_1ms += 1
                self.over_10ms += took > 0.01
            self.produced += 1
        except Exception as exc:  # noqa: BLE001 - what the test looks for: must never happen
            self.exceptions.append(repr(exc))


def rss_bytes() -> int:
    """Resident memory of this process now (Linux), else its peak so far."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@functools.cache
def user_namespaces() -> bool:
    """Whether `unshare -rm` works here (a private tmpfs for real ENOSPC / EROFS without root)."""
    try:
        done = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def run_child(module: str, args: list[str], *, namespace: bool = False, timeout: float = 300) -> dict[str, Any]:
    """Run `python -m module args` (in a private user+mount namespace if asked); its last stdout line as JSON."""
    command = [sys.executable, "-m", module, *args]
    if namespace:
        command = ["unshare", "-rm", *command]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{module} {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(lines[-1])
