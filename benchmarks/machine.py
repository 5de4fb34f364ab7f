"""The machine a benchmark ran on, recorded beside its numbers."""

from __future__ import annotations

import functools
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import orjson


def load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


@functools.cache
def _probe_lines() -> tuple[bytes, ...]:
    """2,000 JSON lines of ~2 KB, span-shaped (ids, times, nested attributes, message text)."""
    text = "The weather in the city is cloudy with a light wind from the west. " * 8
    return tuple(orjson.dumps({
        "traceId": f"{i:032x}", "spanId": f"{i:016x}", "name": f"chat {i % 7}", "startTimeUnixNano": str(i * 1000),
        "attributes": [{"key": f"gen_ai.attr.{k}", "value": {"stringValue": f"{text[: 40 + k * 20]} {i}"}}
                       for k in range(8)],
    }) for i in range(2_000))


def _record_work() -> int:
    """A fixed miniature of an import without this project's code: parse JSON lines, pick fields
    into fresh dicts, join strings, serialize again (allocation-heavy, as the real work is)."""
    total = 0
    for line in _probe_lines():
        span = orjson.loads(line)
        attrs = {a["key"]: a["value"].get("stringValue") for a in span["attributes"]}
        row = {"trace_id": span["traceId"], "name": span["name"], "start_ns": int(span["startTimeUnixNano"]),
               "attributes": attrs, "key": "|".join((span["traceId"], span["spanId"], span["name"]))}
        total += len(orjson.dumps(row))
    return total


def record_work_ms(rounds: int = 9) -> float:
    """Milliseconds a fixed miniature of record work takes (`_record_work`), median of `rounds`:
    how fast this machine runs such work at this moment. Shared virtual machines differ by up to
    2x between days and hours; recorded beside benchmark numbers so that runs from different
    moments can be compared."""
    _probe_lines()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        _record_work()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


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
        "load_avg_start": load_average(), "record_work_ms": record_work_ms(),
    }


def speed_note(machine: dict[str, Any]) -> str:
    """The machine-speed reference (`record_work_ms`) as the end of a benchmark's Machine line."""
    speed = machine.get("record_work_ms")
    return f"; a fixed miniature of record work took {speed:.1f} ms (`record_work_ms`, lower is faster)" if speed else ""
