"""The machine a benchmark ran on, recorded beside its numbers."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


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
        "load_avg_start": load_average(),
    }
