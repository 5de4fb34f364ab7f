"""Store failures under a running service: disk full, read-only, permission denied, deleted.

Each scenario runs in a child process with a real `TracerProvider` and `ReplayProcessor`:
spans before the fault (flushed), spans during it (the service must see no exception and no
wait; capture drops and counts them and warns once, naming the store and the reason), then the
fault is undone and capture must resume. The child prints one JSON line with what it saw.

How each fault is made, best first (`mechanism`):

- disk full: a private 8 MB tmpfs (`unshare -rm`, no root needed) filled by another file, so
  writes fail with ENOSPC; else RLIMIT_FSIZE at 0, so writes fail with EFBIG.
- read-only: that tmpfs remounted read-only (EROFS, which holds even for root); else the store's
  directories made read-only with chmod.
- permission denied: the store directory made inaccessible with chmod.
- deleted: the store directory removed (and later recreated).
- not a directory: the store directory replaced by a regular file.

chmod does not deny root, so a child started as root first hands the scratch directory to
`nobody` and drops its privileges (setgid/setuid) before it creates the processor.

    python -m tests.harness.faults KIND MECHANISM SCRATCH_DIR FAULT_SECONDS
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness.workload import Producer, run_child, tracer_for, user_namespaces

KINDS = ("disk_full", "read_only", "permission_denied", "deleted", "not_a_directory")
NOBODY = 65534
TMPFS_SIZE = "8m"
BEFORE = AFTER = 50


def mechanism_for(kind: str) -> str:
    """The most realistic way to make this fault on this machine."""
    if kind == "disk_full":
        return "tmpfs" if user_namespaces() else "rlimit"
    if kind == "read_only":
        return "tmpfs-ro" if user_namespaces() else "chmod"
    return {"permission_denied": "chmod", "deleted": "rmtree", "not_a_directory": "file"}[kind]


def run_fault_scenario(kind: str, fault_s: float = 1.5, mechanism: str | None = None) -> dict[str, Any]:
    """Run one scenario in a child process; returns what the child measured (see `_scenario`)."""
    mechanism = mechanism or mechanism_for(kind)
    scratch = Path(tempfile.mkdtemp(prefix="otel-replay-fault-"))  # under /tmp: `nobody` can reach it
    try:
        return run_child("tests.harness.faults", [kind, mechanism, str(scratch), str(fault_s)],
                         namespace=mechanism.startswith("tmpfs"), timeout=120)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- the child --------------------------------------------------------------------------------------
def _warm_up(scratch: Path) -> None:
    """One capture, write and query, so every module they import lazily is loaded while it still can
    be (the interpreter's own files may be unreadable to `nobody`)."""
    from otel_replay import ReplayProcessor, Store

    processor = ReplayProcessor(scratch / "warm-up", flush_interval_s=0.1)
    provider, tracer = tracer_for(processor)
    Producer(tracer).span("chat warm-up", "warm up")
    provider.shutdown()
    Store(scratch / "warm-up").sql("select count(*) from spans")
    Store(scratch / "warm-up").list_traces()
    shutil.rmtree(scratch / "warm-up")


def _drop_privileges(scratch: Path) -> None:
    _warm_up(scratch)
    for path in [scratch, *scratch.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _fill(path: Path) -> None:
    """Write zeros until the filesystem is full."""
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(chunk)
        except OSError:
            pass


def _chmod_tree(root: Path, mode: int) -> None:
    for path in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        os.chmod(path, mode)


def _apply(kind: str, mechanism: str, store: Path, scratch: Path) -> Callable[[], None]:
    """Make the fault; returns what undoes it."""
    if mechanism == "tmpfs":
        filler = scratch / "filler"
        _fill(filler)
        return lambda: filler.unlink()
    if mechanism == "rlimit":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
        return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    if mechanism == "tmpfs-ro":
        subprocess.run(["mount", "-o", "remount,ro", str(scratch)], check=True)
        return lambda: subprocess.run(["mount", "-o", "remount,rw", str(scratch)], check=True)
    if mechanism == "chmod":
        if kind == "read_only":
            _chmod_tree(store, 0o555)
            return lambda: _chmod_tree(store, 0o700)
        os.chmod(store, 0)
        return lambda: os.chmod(store, 0o700)
    shutil.rmtree(store)
    if mechanism == "file":
        store.write_text("not a store directory\n")
        return lambda: (store.unlink(), store.mkdir(mode=0o700))
    return lambda: store.mkdir(mode=0o700, exist_ok=True)


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _scenario(kind: str, mechanism: str, scratch: Path, fault_s: float) -> dict[str, Any]:
    from otel_replay import ReplayProcessor, Store

    if mechanism.startswith("tmpfs"):
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0755", "tmpfs", str(scratch)], check=True)
    if mechanism == "chmod" and os.geteuid() == 0:
        _drop_privileges(scratch)
    store = scratch / "store"
    warnings = _Warnings()
    logging.getLogger("otel_replay").addHandler(warnings)
    processor = ReplayProcessor(store, flush_interval_s=0.1)
    provider, tracer = tracer_for(processor, service=f"fault-{kind}")
    producer = Producer(tracer)
    for i in range(BEFORE):
        producer.span(f"chat before-{i}", f"before {i}")
    flushed_before = processor.force_flush(10_000)
    undo = _apply(kind, mechanism, store, scratch)
    during = 0
    deadline = time.monotonic() + fault_s
    while time.monotonic() < deadline:
        for _ in range(20):
            producer.span(f"chat during-{during}", f"during {during} " + "x" * 2000)
            during += 1
        time.sleep(0.01)
    flushed_during = processor.force_flush(10_000)
    stats_during = processor.stats
    undo()
    for i in range(AFTER):
        producer.span(f"chat after-{i}", f"after {i}")
    flushed_after = processor.force_flush(10_000)
    provider.shutdown()
    names = Store(store).sql("select name from spans").column("name").to_pylist()
    store_messages = [m for m in warnings.messages if str(store) in m]
    return {
        "kind": kind, "mechanism": mechanism, "euid": os.geteuid(), "store": str(store),
        "exceptions": producer.exceptions, "max_end_ms": producer.max_end_s * 1000, "produced": producer.produced,
        "during": during, "flushed_before": flushed_before, "flushed_during": flushed_during,
        "flushed_after": flushed_after, "store_error": stats_during["store_error"],
        "lost": stats_during["lost_store_unwritable"], "dropped_queue_full": stats_during["dropped_queue_full"],
        "internal_errors": stats_during["internal_errors"],
        "failure_warnings": [m for m in store_messages if "cannot write" in m],
        "resume_warnings": [m for m in store_messages if "capture resumed" in m],
        "other_warnings": [m for m in warnings.messages if str(store) not in m],
        "visible": {phase: sum(n.startswith(f"chat {phase}-") for n in names) for phase in ("before", "during", "after")},
    }


def main() -> None:
    kind, mechanism, scratch, fault_s = sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
    print(json.dumps(_scenario(kind, mechanism, scratch, fault_s)), flush=True)


if __name__ == "__main__":
    main()
