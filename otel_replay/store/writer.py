"""Write a RowBatch as Parquet segments: messages first, then spans, then steps, as one batch.

Readers see a batch whole or not at all (`otel_replay.store.batches`), even if the process dies
between two files.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from otel_replay.store.batches import write_batch_segments
from otel_replay.store.layout import (
    day_of,
    parquet_producer,
    segment_name,
    segment_rel,
    write_parquet,
    write_pool,
    write_segment,
)
from otel_replay.store.location import StoreLike, StoreLocation
from otel_replay.store.rows import Row, RowBatch, valid_text
from otel_replay.store.schema import arrow_schemas, schema_of

ARROW_CHUNK = 256  # rows per Arrow conversion, which holds the GIL: ~1 ms at most while the service runs
UNPACED_CHUNK = 2048  # ... and with nothing to pace for: fewer, cheaper conversions (step rows ~12 %)


def _chunk(rows: Sequence[Row | dict[str, Any]], schema: pa.Schema, ordered: bool = False) -> pa.Table:
    try:
        if ordered:  # each row's values in the schema's order: columns by zip, in C (from_pylist reads them key by key)
            pool = write_pool()
            columns = zip(*(rows if rows[0].__class__ is tuple else map(dict.values, rows)), strict=True)  # type: ignore[arg-type]
            arrays = [pa.array(column, type=f.type, memory_pool=pool) for column, f in zip(columns, schema, strict=True)]
            return pa.Table.from_arrays(arrays, schema=schema)
        return pa.Table.from_pylist(rows, schema=schema)  # type: ignore[arg-type]
    except (pa.ArrowInvalid, UnicodeEncodeError):  # a string with lone surrogates: repair the chunk
        return pa.Table.from_pylist([valid_text(_named(r, schema)) for r in rows], schema=schema)
    except ValueError:  # not in the schema's order after all: by name
        if rows[0].__class__ is tuple:
            raise
        return _chunk(rows, schema)


def _named(row: Row | dict[str, Any], schema: pa.Schema) -> dict[str, Any]:
    return dict(zip(schema.names, row, strict=True)) if row.__class__ is tuple else row  # type: ignore[return-value]


Pace = Callable[[], None] | None
"""Runs between Arrow conversions (the capture writer lets a service thread that waits for the GIL
have it); None: nothing to pace for (imports, a receiver's worker), so fewer, larger conversions."""


def to_arrow(rows: Sequence[Row | dict[str, Any]], table: str, pace: Pace = None, ordered: bool = False) -> pa.Table:
    """Rows as one Arrow table, converted in chunks, `pace` between them. Rows are dicts, or tuples of
    values in the schema's order (a `RowBuilder`'s); `ordered`: every dict has every column, in the
    schema's order, so columns are cut out of the rows by position (tuples always are)."""
    schema = schema_of(table)
    size = UNPACED_CHUNK if pace is None else ARROW_CHUNK
    ordered = ordered or (bool(rows) and rows[0].__class__ is tuple)
    chunks = []
    for i in range(0, len(rows), size):
        chunks.append(_chunk(rows[i : i + size], schema, ordered))
        if pace is not None:
            pace()
    return pa.concat_tables(chunks) if chunks else schema.empty_table()


@dataclass(slots=True)
class ArrowParts:
    """Rows converted to Arrow as they are made, then written as one segment per table and day: a
    large load holds its rows as Arrow buffers, not as Python tuples (several times the memory, and
    fresh pages to fault in for every one)."""

    messages: list[pa.Table] = field(default_factory=list)
    spans: dict[str, list[pa.Table]] = field(default_factory=dict)
    steps: dict[str, list[pa.Table]] = field(default_factory=dict)

    def take(self, batch: RowBatch, pace: Pace = None) -> None:
        """Convert `batch`'s rows (the caller drops the batch when it wants the memory back); all of
        them or, if a conversion raises, none."""
        messages = to_arrow(batch.message_rows, "message_rows", pace) if batch.message_rows else None
        spans = [(day, to_arrow(rows, "span_rows", pace)) for day, rows in batch.span_rows.items()]
        steps = [(day, to_arrow(rows, "step_rows", pace)) for day, rows in batch.step_rows.items()]
        if messages is not None:
            self.messages.append(messages)
        for day, table in spans:
            self.spans.setdefault(day, []).append(table)
        for day, table in steps:
            self.steps.setdefault(day, []).append(table)

    def write(self, root: StoreLike) -> list[Path | str]:
        """Every table's segments (messages first, then spans, then steps) as one batch that readers
        see whole or not at all (`otel_replay.store.batches`); returns them in write order."""
        items = []
        if self.messages:
            items.append((segment_rel("message_rows", day_of(None)), parquet_producer(pa.concat_tables(self.messages))))
        for day, tables in sorted(self.spans.items()):
            items.append((segment_rel("span_rows", day), parquet_producer(pa.concat_tables(tables))))
        for day, tables in sorted(self.steps.items()):
            items.append((segment_rel("step_rows", day), parquet_producer(pa.concat_tables(tables))))
        name = segment_name().removesuffix(".parquet") + ".json"
        return write_batch_segments(StoreLocation.of(root), items, name)


def write_batch(root: StoreLike, batch: RowBatch, pace: Pace = None) -> list[Path | str]:
    """Write every table of the batch; returns the segment paths (or URLs) in write order."""
    parts = ArrowParts()
    parts.take(batch, pace)
    return parts.write(root)


def warm_up() -> None:
    """Pay what a process's first write costs (the Arrow schemas, the first conversion, Parquet's
    zstd codec: ~6 ms) here, once: a parent calls it before forking import workers, which then
    inherit it instead of each paying it."""
    arrow_schemas()
    for table in ("message_rows", "span_rows", "step_rows", "capture_stats"):
        row = {f.name: None if f.nullable else _blank(f.type) for f in schema_of(table)}
        write_parquet(to_arrow([row], table), io.BytesIO())


def _blank(kind: pa.DataType) -> Any:
    if pa.types.is_string(kind):
        return ""
    if pa.types.is_list(kind):
        return []
    if pa.types.is_boolean(kind):
        return False
    return 0


def write_stats(root: StoreLike, stats: dict[str, Any]) -> Path | str:
    row = {"written_ns": time.time_ns(), **stats}
    return write_segment(root, "capture_stats", day_of(None), to_arrow([row], "capture_stats"))


def write_rows(root: StoreLike, table: str, rows: list[dict[str, Any]]) -> Path | str | None:
    """Append rows to one of the job tables as one segment (today's partition)."""
    if not rows:
        return None
    return write_segment(root, table, day_of(None), to_arrow(rows, table))
