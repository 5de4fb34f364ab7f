"""kill -9 of `otel-replay import` at an exact write boundary: after the segment of one table.

The child runs the real CLI (`otel-replay --store STORE import otlp FILE`) with the store's file
writer wrapped so that the process SIGKILLs itself right after the first segment of TABLE is in
place: the moment between two segments of one batch that a crash can hit.

    python -m tests.harness.torn STORE FILE TABLE
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.imports import _trace, write_otlp_json
from tests.harness.workload import REPO


def otlp_file(path: Path, traces: int, first: int = 0) -> int:
    """An OTLP/JSON file of `traces` synthetic agent runs (numbered from `first`); returns its span count."""
    spans = [span for i in range(first, first + traces) for span in _trace(i)]
    write_otlp_json(spans, path)
    return len(spans)


def import_killed_after(store: Path, file: Path, table: str) -> int:
    """Run the import in a child that is killed after it writes `table`'s segment; its exit code."""
    child = subprocess.run([sys.executable, "-m", "tests.harness.torn", str(store), str(file), table],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    return child.returncode


def _child(store: str, file: str, table: str) -> None:
    from otel_replay.cli import main
    from otel_replay.store.location import StoreLocation

    write = StoreLocation.write

    def write_then_die(self: StoreLocation, rel: str, produce):  # noqa: ANN001, ANN202 - StoreLocation.write's own
        written = write(self, rel, produce)
        if rel.startswith(f"{table}/"):
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    StoreLocation.write = write_then_die  # type: ignore[method-assign]
    main(["--store", store, "import", "otlp", "--jobs", "1", file])


if __name__ == "__main__":
    _child(*sys.argv[1:4])


def torn_trials(root: Path, traces: int = 40) -> dict[str, Any]:
    """`import` killed after each table's segment in turn: what readers saw, what a rerun stored,
    and what `doctor --check` reported before the rerun."""
    from otel_replay import Store
    from otel_replay.store.doctor import doctor

    file = root / "runs.json"
    root.mkdir(parents=True, exist_ok=True)
    spans = otlp_file(file, traces)
    out: dict[str, Any] = {"spans": spans, "kills": []}
    for n, table in enumerate(("message_rows", "span_rows")):
        store = root / f"store-{n}"
        code = import_killed_after(store, file, table)
        visible = Store(store).sql("select (select count(*) from spans) + (select count(*) from steps) n"
                                   ).column("n")[0].as_py()
        check = doctor(store, fix=False)
        rerun = subprocess.run([sys.executable, "-c", "from otel_replay.cli import main; main()", "--store", str(store),
                                "import", "otlp", "--jobs", "1", str(file)], cwd=REPO, capture_output=True, text=True,
                               timeout=300)
        counts = Store(store).sql("select (select count(*) from spans) s, (select count(*) from steps) t").to_pylist()[0]
        out["kills"].append({"after": table, "killed": code == -signal.SIGKILL, "visible_rows": visible,
                             "torn_found": len(check.torn), "rerun_ok": rerun.returncode == 0,
                             "stored_spans": counts["s"], "stored_steps": counts["t"]})
    return out
