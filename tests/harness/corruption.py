"""Segments damaged on disk: truncated or bit-flipped, then found by readers and by `doctor`.

`corruption_trials` captures real spans into a store (one segment set per flush), damages some
segments, and records: whether queries still answer over the rest (or refuse, pointing at
`otel-replay doctor`), how many damaged segments `doctor --check` finds, and, for a flip it
does not find, whether the data still reads back identical (a flip in bytes nothing reads).
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tests.harness.workload import Producer, tracer_for

MODES = ("truncate", "flip")
READ_EVERYTHING = ("select * from span_rows", "select * from step_rows", "select * from message_rows",
                   "select * from traces")


def truncate(path: Path, rng: random.Random) -> None:
    """Cut the file somewhere (a writer without the temp-and-rename protocol, a disk that lost the tail)."""
    data = path.read_bytes()
    path.write_bytes(data[: rng.randrange(0, len(data))])


def flip(path: Path, rng: random.Random) -> None:
    """Flip one bit anywhere in the file (bit rot, a bad sector)."""
    data = bytearray(path.read_bytes())
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def build_store(root: Path, flushes: int, spans_per_flush: int = 20) -> None:
    """A store with `flushes` segment sets of GenAI spans (each flush writes spans, steps, payloads)."""
    from otel_replay import ReplayProcessor

    processor = ReplayProcessor(root, flush_interval_s=3600)
    provider, tracer = tracer_for(processor, service="corruption")
    producer = Producer(tracer)
    for f in range(flushes):
        for i in range(spans_per_flush):
            producer.span(f"chat {f}-{i}", f"question {f}-{i} " + "lorem ipsum " * 40, f"answer {f}-{i}")
        processor.force_flush(60_000)
    provider.shutdown()


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def corruption_trials(root: Path, damaged: int, seed: int = 0) -> dict[str, Any]:
    """Damage `damaged` segments (half truncated, half flipped) of a fresh store; see the module doc."""
    from otel_replay import Store
    from otel_replay.store import StoreError
    from otel_replay.store import doctor as doc

    shutil.rmtree(root, ignore_errors=True)
    build_store(root, flushes=max(damaged // 2, 4))
    rng = random.Random(seed)
    segments = sorted(p for table in ("span_rows", "step_rows", "message_rows") for p in (root / table).glob("*/*.parquet"))
    chosen = rng.sample(segments, min(damaged, len(segments)))
    originals = {p: pq.read_table(p) for p in chosen}
    modes: dict[Path, str] = {}
    for n, path in enumerate(chosen):
        modes[path] = MODES[n % len(MODES)]
        (truncate if modes[path] == "truncate" else flip)(path, rng)
    warnings = _Count()
    logging.getLogger("otel_replay").addHandler(warnings)
    try:
        doc.forget_damage()  # a fresh process's view: nothing known to be damaged yet
        try:
            catalog = Store(root)
            steps = catalog.sql("select count(*) n from steps").column("n")[0].as_py()
            for sql in READ_EVERYTHING:  # every column of every row: page damage surfaces here, not at bind
                catalog.sql(sql)
            query = {"answered": True, "steps": steps, "refused": None}
        except StoreError as exc:
            query = {"answered": False, "steps": None, "refused": str(exc)}
        report = doc.doctor(root, fix=False)
    finally:
        logging.getLogger("otel_replay").removeHandler(warnings)
    found = {root / d.rel for d in report.damaged}
    undetected = [p for p in chosen if p not in found]
    harmless = 0
    for path in undetected:
        with contextlib.suppress(Exception):  # unreadable yet not found: a miss, counted as harmful
            harmless += pq.read_table(path).equals(originals[path])
    fixed = doc.doctor(root, fix=True)
    after = doc.doctor(root, fix=False)
    return {
        "segments": len(segments), "damaged": len(chosen),
        "by_mode": {m: sum(v == m for v in modes.values()) for m in MODES},
        "detected": len(found & set(chosen)),
        "detected_by_mode": {m: sum(1 for p in found if modes.get(p) == m) for m in MODES},
        "undetected_harmless": harmless, "undetected_harmful": len(undetected) - harmless,
        "false_positives": len(found - set(chosen)),
        "query": query, "skip_warnings": sum("skipping damaged segment" in m for m in warnings.messages),
        "quarantined": sum(d.quarantined_to is not None for d in fixed.damaged),
        "clean_after_doctor": after.problems == 0, "doctor_seconds": report.seconds,
    }
