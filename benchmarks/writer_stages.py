"""Where the capture writer's time goes: each stage timed alone on the writer benchmark's spans.

The stages are the functions the writer thread calls, in its order, each over the whole set of
spans before the next starts: SDK span to record, normalize, redact (the built-in detectors),
rows with content addresses, Arrow conversion, Parquet (zstd) write. Each stage's thread CPU time
per span is reported, best of a few rounds (CPU time is disturbed far less by other work on a
shared machine than wall time). The Parquet write alone bounds the writer's rate: whatever the
other stages cost, it cannot store these spans faster than `1 / parquet_write` per second.
"""

from __future__ import annotations

import gc
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from otel_replay.normalize.pipeline import normalize_span
from otel_replay.normalize.privacy import DEFAULT_PRIVACY
from otel_replay.normalize.sources.sdk import span_from_sdk
from otel_replay.store.layout import day_of, write_segment
from otel_replay.store.rows import RowBatch, RowBuilder
from otel_replay.store.writer import to_arrow

STAGES = ("read", "normalize", "redact", "rows", "arrow", "parquet_write")


def _one_round(spans: Sequence[ReadableSpan], store: Path) -> dict[str, float]:
    clock = time.thread_time
    seconds: dict[str, float] = {}
    started = clock()
    records = [span_from_sdk(span) for span in spans]
    seconds["read"], started = clock() - started, clock()
    normalized = [normalize_span(record, ()) for record in records]
    seconds["normalize"], started = clock() - started, clock()
    redacted = [DEFAULT_PRIVACY(item) for item in normalized]
    seconds["redact"], started = clock() - started, clock()
    builder, batch, now = RowBuilder(source="bench"), RowBatch(), time.time_ns()
    for item in redacted:
        builder.add(batch, item, now)
    seconds["rows"], started = clock() - started, clock()
    tables = [("message_rows", day_of(None), to_arrow(batch.message_rows, "message_rows"))]
    tables += [("span_rows", day, to_arrow(rows, "span_rows")) for day, rows in sorted(batch.span_rows.items())]
    tables += [("step_rows", day, to_arrow(rows, "step_rows")) for day, rows in sorted(batch.step_rows.items())]
    seconds["arrow"], started = clock() - started, clock()
    for table, day, data in tables:
        write_segment(store, table, day, data)
    seconds["parquet_write"] = clock() - started
    return seconds


def writer_stages(spans: Sequence[ReadableSpan], rounds: int = 3) -> dict[str, Any]:
    """CPU µs per span of each writer stage (best of `rounds`), their sum, and the write-alone ceiling.

    The cyclic garbage collector is paused as in `otel-replay import`, so each stage is charged its
    own work; the live writer also pays for collections (the difference to the measured rate).
    """
    best = dict.fromkeys(STAGES, float("inf"))
    with tempfile.TemporaryDirectory(prefix="otel-replay-bench-stages-") as tmp:
        for round_no in range(rounds):
            gc.collect()
            gc.disable()
            try:
                seconds = _one_round(spans, Path(tmp) / f"round-{round_no}")
            finally:
                gc.enable()
            for stage, value in seconds.items():
                best[stage] = min(best[stage], value)
    per_span = {stage: best[stage] / len(spans) * 1e6 for stage in STAGES}
    total = sum(per_span.values())
    return {
        "us_per_span": per_span,
        "total_us_per_span": total,
        "spans_per_cpu_s": 1e6 / total,
        "parquet_write_ceiling_spans_per_s": 1e6 / per_span["parquet_write"],
        "spans": len(spans),
        "rounds": rounds,
    }


def format_stages(stages: dict[str, Any]) -> str:
    """One line: µs per span by stage and what they bound."""
    us = stages["us_per_span"]
    parts = ", ".join(f"{stage.replace('_', ' ')} {us[stage]:.1f}" for stage in STAGES)
    return (f"Writer stages, CPU µs per span ({stages['spans']} of these spans, each stage alone, best of "
            f"{stages['rounds']}): {parts}; {stages['total_us_per_span']:.0f} in all, i.e. "
            f"{stages['spans_per_cpu_s']:,.0f} spans per CPU-second. The Parquet write alone caps the writer "
            f"at {stages['parquet_write_ceiling_spans_per_s']:,.0f} spans/s.")
