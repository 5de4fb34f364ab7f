"""Compaction: rewrite a day's segments as one file sorted by trace id, with small row groups.

Safe beside running writers: the input file list is taken first, the compacted segment is
renamed into place before any input is deleted, and the views collapse the moment when both
are visible (a span stored twice counts once).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from otel_replay.store import queries
from otel_replay.store.layout import write_segment
from otel_replay.store.schema import TABLES, schema_of

ROW_GROUP = 1024  # small groups + sort by trace id: one trace reads one or two groups
_QUERY = {"span_rows": "compact_spans", "step_rows": "compact_steps", "message_rows": "compact_messages",
          "capture_stats": "compact_stats"}


@dataclass(slots=True)
class CompactResult:
    table: str
    day: str
    files_in: int
    rows_out: int
    bytes_in: int
    bytes_out: int


def days(root: Path) -> list[str]:
    found = {p.name.removeprefix("day=") for t in TABLES for p in (root / t).glob("day=*") if p.is_dir()}
    return sorted(found)


def compact_day(root: Path, day: str) -> list[CompactResult]:
    """Compact every table's segments for one day; tables with fewer than two files are left alone."""
    results = []
    for table in TABLES:
        files = sorted((root / table / f"day={day}").glob("*.parquet"))
        if len(files) < 2:
            continue
        con = duckdb.connect()
        try:
            con.read_parquet([str(f) for f in files], union_by_name=True).create_view("segment_input")
            data = con.sql(queries.query(_QUERY[table])).to_arrow_table()
        finally:
            con.close()
        data = data.select(schema_of(table).names).cast(schema_of(table))
        sorting = [pq.SortingColumn(0)] if table in ("span_rows", "step_rows", "message_rows") else None
        out = write_segment(root, table, day, data, row_group_size=ROW_GROUP, sorting_columns=sorting)
        bytes_in = sum(f.stat().st_size for f in files)
        for f in files:
            f.unlink(missing_ok=True)
        results.append(CompactResult(table, day, len(files), data.num_rows, bytes_in, out.stat().st_size))
    return results
