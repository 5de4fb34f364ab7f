"""Write a RowBatch as Parquet segments: messages first, then spans, then steps.

That order means a reader that sees a step also sees the payloads it addresses, even if the
process dies between two files.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from otel_replay.store.layout import day_of, write_segment
from otel_replay.store.location import StoreLike, StoreLocation
from otel_replay.store.rows import RowBatch, valid_text
from otel_replay.store.schema import schema_of

ARROW_CHUNK = 1000  # rows per Arrow conversion: short GIL holds while the service runs


def _chunk(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, UnicodeEncodeError):  # a string with lone surrogates: repair the chunk
        return pa.Table.from_pylist([valid_text(r) for r in rows], schema=schema)


def to_arrow(rows: list[dict[str, Any]], table: str) -> pa.Table:
    schema = schema_of(table)
    chunks = [_chunk(rows[i : i + ARROW_CHUNK], schema) for i in range(0, len(rows), ARROW_CHUNK)]
    return pa.concat_tables(chunks) if chunks else schema.empty_table()


def write_batch(root: StoreLike, batch: RowBatch) -> list[Path | str]:
    """Write every table of the batch; returns the segment paths (or URLs) in write order."""
    root = StoreLocation.of(root)
    written: list[Path | str] = []
    if batch.messages:
        written.append(write_segment(root, "message_rows", day_of(None), to_arrow(batch.messages, "message_rows")))
    for day, rows in sorted(batch.spans.items()):
        written.append(write_segment(root, "span_rows", day, to_arrow(rows, "span_rows")))
    for day, rows in sorted(batch.steps.items()):
        written.append(write_segment(root, "step_rows", day, to_arrow(rows, "step_rows")))
    return written


def write_stats(root: StoreLike, stats: dict[str, Any]) -> Path | str:
    row = {"written_ns": time.time_ns(), **stats}
    return write_segment(root, "capture_stats", day_of(None), to_arrow([row], "capture_stats"))


def write_rows(root: StoreLike, table: str, rows: list[dict[str, Any]]) -> Path | str | None:
    """Append rows to one of the job tables as one segment (today's partition)."""
    if not rows:
        return None
    return write_segment(root, table, day_of(None), to_arrow(rows, table))
