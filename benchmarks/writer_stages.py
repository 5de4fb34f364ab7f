"""Where the capture writer's time goes: each stage timed as the writer runs it, on the writer benchmark's spans.

The stages are the functions the writer thread calls, in its order: SDK span to record, normalize,
privacy (payload switches and the built-in detectors, a fresh `Privacy` as each processor has),
rows with content addresses, then the Arrow conversion and the Parquet (zstd) write of the batch.
The first four run one span at a time through all of them, as the writer does so that what a span
makes dies young, with the garbage collector on: run alone over every span, or with the collector
paused, each reads 20-35% cheaper than what the writer pays. Each stage's time per span is reported,
best of a few rounds (the clock is `perf_counter`: timing a stage of one span with the thread's CPU
clock would cost more than some stages). The Parquet write alone bounds the writer's rate: whatever
the other stages cost, it cannot store these spans faster than `1 / parquet_write` per second.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from otel_replay.normalize.pipeline import normalize_span
from otel_replay.normalize.privacy import Privacy
from otel_replay.normalize.sources.sdk import span_from_sdk
from otel_replay.store.layout import day_of, write_segment
from otel_replay.store.rows import RowBatch, RowBuilder
from otel_replay.store.writer import to_arrow

STAGES = ("read", "normalize", "redact", "rows", "arrow", "parquet_write")


def _one_round(spans: Sequence[ReadableSpan], store: Path) -> dict[str, float]:
    clock = time.perf_counter_ns
    spent = dict.fromkeys(STAGES, 0)
    privacy, builder, batch, now = Privacy(), RowBuilder(source="bench"), RowBatch(), time.time_ns()
    read_ns = normalize_ns = redact_ns = rows_ns = 0
    for span in spans:  # each span from record to rows before the next, as the writer runs them
        t0 = clock()
        record = span_from_sdk(span)
        t1 = clock()
        item = normalize_span(record, ())
        t2 = clock()
        item = privacy(item)
        t3 = clock()
        builder.add(batch, item, now)
        t4 = clock()
        read_ns += t1 - t0
        normalize_ns += t2 - t1
        redact_ns += t3 - t2
        rows_ns += t4 - t3
    spent.update(read=read_ns, normalize=normalize_ns, redact=redact_ns, rows=rows_ns)
    started = clock()
    tables = [("message_rows", day_of(None), to_arrow(batch.message_rows, "message_rows"))]
    tables += [("span_rows", day, to_arrow(rows, "span_rows")) for day, rows in sorted(batch.span_rows.items())]
    tables += [("step_rows", day, to_arrow(rows, "step_rows")) for day, rows in sorted(batch.step_rows.items())]
    spent["arrow"], started = clock() - started, clock()
    for table, day, data in tables:
        write_segment(store, table, day, data)
    spent["parquet_write"] = clock() - started
    return {stage: ns / 1e9 for stage, ns in spent.items()}


def writer_stages(spans: Sequence[ReadableSpan], rounds: int = 3) -> dict[str, Any]:
    """µs per span of each writer stage (best of `rounds`), their sum, and the write-alone ceiling."""
    best = dict.fromkeys(STAGES, float("inf"))
    with tempfile.TemporaryDirectory(prefix="otel-replay-bench-stages-") as tmp:
        for round_no in range(rounds):
            seconds = _one_round(spans, Path(tmp) / f"round-{round_no}")
            for stage, value in seconds.items():
                best[stage] = min(best[stage], value)
    per_span = {stage: best[stage] / len(spans) * 1e6 for stage in STAGES}
    total = sum(per_span.values())
    return {
        "us_per_span": per_span,
        "total_us_per_span": total,
        "spans_per_thread_s": 1e6 / total,
        "parquet_write_ceiling_spans_per_s": 1e6 / per_span["parquet_write"],
        "spans": len(spans),
        "rounds": rounds,
    }


def format_stages(stages: dict[str, Any]) -> str:
    """One line: µs per span by stage and what they bound."""
    us = stages["us_per_span"]
    parts = ", ".join(f"{stage.replace('_', ' ')} {us[stage]:.1f}" for stage in STAGES)
    return (f"Writer stages, µs per span ({stages['spans']} of these spans, read to rows one span at a time "
            f"as the writer runs them, the collector on, best of {stages['rounds']}): {parts}; "
            f"{stages['total_us_per_span']:.0f} in all, i.e. {stages['spans_per_thread_s']:,.0f} spans per second "
            f"of one thread. The Parquet write alone caps the writer at "
            f"{stages['parquet_write_ceiling_spans_per_s']:,.0f} spans/s.")
