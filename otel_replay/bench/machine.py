"""The machine a benchmark ran on, recorded beside its numbers."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any


def load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _interpreter_work() -> int:
    """A fixed piece of plain-Python work shaped like normalizing records: dicts built, read and
    keyed, strings joined, small functions called."""
    total = 0
    for i in range(20_000):
        record = {"name": f"chat {i % 7}", "attrs": {"k": i, "model": "m", "tokens": i % 97}, "parts": [i, i + 1]}
        attrs = record["attrs"]
        key = "|".join((record["name"], attrs["model"], str(attrs.get("tokens"))))
        total += len(key) + sum(record["parts"]) + (1 if isinstance(attrs.get("missing"), str) else 0)
    return total


def python_speed_ms(rounds: int = 7) -> float:
    """Milliseconds one fixed piece of plain-Python work takes, best of `rounds`: how fast this
    machine runs the interpreter at this moment. On shared virtual machines it moves by 1.5x
    between hours, and every CPU-bound throughput here moves with it; recorded beside the numbers
    so runs from different moments can be compared."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        _interpreter_work()
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def machine_info() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    def package(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(), "cpu_model": cpu, "python": platform.python_version(),
        "implementation": platform.python_implementation(), "platform": platform.platform(terse=True),
        "opentelemetry_sdk": package("opentelemetry-sdk"), "pyarrow": package("pyarrow"),
        "load_avg_start": load_average(), "python_speed_ms": python_speed_ms(),
    }


def speed_note(machine: dict[str, Any]) -> str:
    """The interpreter-speed reference of `python_speed_ms`, as a README line ends it."""
    speed = machine.get("python_speed_ms")
    return f"; a fixed plain-Python workload took {speed:.1f} ms (`python_speed_ms`, lower is faster)" if speed else ""
