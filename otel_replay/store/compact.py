"""Compaction: rewrite a day's segments as one file sorted by trace id, with small row groups.

Safe while writers write and readers read: it rewrites only the segments live when it started,
records them in a manifest before the compacted segment appears, and deletes exactly those inputs
(then the manifest) after a grace period. Readers leave out the inputs of a compaction whose
output they can see, so each row counts once at every moment; `otel_replay.store.snapshot` has
the protocol and why it holds. One compaction runs at a time per store (`otel_replay.store.lease`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from otel_replay.store import queries
from otel_replay.store.batches import TORN_AFTER_S, read_batch_manifests, settle
from otel_replay.store.catalog import StoreError
from otel_replay.store.layout import segment_name, write_segment
from otel_replay.store.lease import CompactionRunning, CompactorLease
from otel_replay.store.location import Segment, StoreLike, StoreLocation
from otel_replay.store.schema import TABLES, schema_of
from otel_replay.store.snapshot import (
    Manifest,
    ManifestError,
    committed,
    read_manifests,
    take,
    write_manifest,
)

# Sorted by trace id, one trace reads one or two row groups. Smaller groups read less per trace,
# but every connection parses every group's statistics in the footers: at 1,024 rows a day of
# 10^7 spans had ~10k groups and a 30 MB footer to parse per query (`otel-replay bench scale`).
ROW_GROUP = 8192
DEFAULT_GRACE_S = 2.0  # a reader that listed the inputs just before the output appeared has read them (else it retries)
_QUERY = {"span_rows": "compact_spans", "step_rows": "compact_steps", "message_rows": "compact_messages",
          "capture_stats": "compact_stats"}
_SORTED = ("span_rows", "step_rows", "message_rows")


@dataclass(slots=True)
class CompactResult:
    table: str
    day: str
    files_in: int
    rows_out: int
    bytes_in: int
    bytes_out: int


def days(root: StoreLike) -> list[str]:
    """Every day that has a live segment in some table."""
    snap = take(root, TABLES)
    return sorted({s.day for segments in snap.live.values() for s in segments})


def rewrite_partition(root: StoreLike, table: str, day: str, inputs: list[Segment]) -> CompactResult:
    """Steps 2 and 3 of a compaction: the manifest, then the compacted segment; inputs stay (see `finish`)."""
    location = StoreLocation.of(root)
    con = duckdb.connect()
    try:
        location.register(con, inputs, read_all=True)
        con.read_parquet([location.uri(s.rel) for s in inputs], union_by_name=True).create_view("segment_input")
        data = con.sql(queries.query(_QUERY.get(table, "compact_rows"))).to_arrow_table()
    finally:
        con.close()
    schema = schema_of(table)
    for field in schema:  # a column added after these segments were written: null, as the views read it
        if field.name not in data.column_names:
            data = data.append_column(field.name, pa.nulls(data.num_rows, field.type))
    data = data.select(schema.names).cast(schema)
    sorting = [pq.SortingColumn(0)] if table in _SORTED else None
    name = segment_name()
    output = f"{table}/day={day}/{name}"
    write_manifest(location, table, day, output, [s.rel for s in inputs])  # before the output can be seen
    write_segment(location, table, day, data, row_group_size=ROW_GROUP, sorting_columns=sorting, name=name)
    return CompactResult(table, day, len(inputs), data.num_rows, sum(s.size for s in inputs), location.size(output))


def finish(root: StoreLike, *, older_than_s: float = 0.0) -> int:
    """Delete the inputs of committed compactions older than `older_than_s`, then their manifests.

    A manifest whose output never appeared (its compactor died) is removed once that old. A
    compaction whose output is the input of another finishes first, so the chain stays readable.
    Returns how many manifests were finished.
    """
    location = StoreLocation.of(root)
    manifests = read_manifests(location)
    if not manifests:
        return 0
    batches = read_batch_manifests(location)
    listed = {s.rel for t in {m.table for m in manifests} for s in location.segments(t)}
    done_ids = {m.name for m in committed(manifests, listed)}
    cutoff = time.time_ns() - int(older_than_s * 1e9)
    by_output = {m.output: m for m in manifests}
    finished: set[str] = set()

    def complete(m: Manifest) -> None:
        if m.name in finished or m.created_ns > cutoff:
            return
        for rel in m.inputs:  # an input that is the output of an older compaction: finish that one first
            if rel in by_output:
                complete(by_output[rel])
        if m.name in done_ids:
            if any(rel in by_output and by_output[rel].name not in finished for rel in m.inputs):
                return  # its predecessor is too young to finish: keep the chain for now
            inputs = set(m.inputs)  # a batch that loses a segment here is whole in the output: its manifest goes first
            location.delete_many([b.rel for b in batches if inputs.intersection(b.segments)])
            location.delete_many(m.inputs)
        location.delete(m.rel)
        finished.add(m.name)

    for m in manifests:
        complete(m)
    return len(finished)


def compact_store(root: StoreLike, only_days: list[str] | None = None, *, grace_s: float = 0.0,
                  tables: tuple[str, ...] = TABLES) -> list[CompactResult]:
    """Compact every table's live segments per day; partitions with fewer than two are left alone.

    Then, `grace_s` after the last compacted segment appeared, deletes the inputs. StoreError
    when the store cannot be read or written, or another compaction of it is running.
    """
    location = StoreLocation.of(root)
    try:
        if not location.exists():
            raise StoreError(f"no store at {location}: nothing to compact")
        with CompactorLease(location):
            return _compact(location, only_days, grace_s, tables)
    except CompactionRunning as exc:
        raise StoreError(str(exc)) from exc
    except (OSError, ManifestError) as exc:
        raise StoreError(f"cannot compact the store at {root}: {exc}") from exc
    except duckdb.Error as exc:  # a segment that cannot be read: nothing was deleted
        raise StoreError(f"cannot compact the store at {root}: {exc} (run `otel-replay doctor` to find and "
                         "quarantine a damaged segment)") from exc


def _compact(location: StoreLocation, only_days: list[str] | None, grace_s: float,
             tables: tuple[str, ...]) -> list[CompactResult]:
    finish(location, older_than_s=grace_s)  # what an earlier, interrupted run left
    settle(location, torn_after_s=TORN_AFTER_S)  # finished batch manifests, batches torn long ago
    snap = take(location, tables)
    results = []
    for table in tables:
        by_day: dict[str, list[Segment]] = {}
        for segment in snap.live.get(table, []):
            by_day.setdefault(segment.day, []).append(segment)
        for day, inputs in sorted(by_day.items()):
            if len(inputs) >= 2 and (only_days is None or day in only_days):
                results.append(rewrite_partition(location, table, day, inputs))
    if results:
        time.sleep(grace_s)
        finish(location, older_than_s=grace_s)
    return results


def compact_day(root: StoreLike, day: str, *, grace_s: float = 0.0) -> list[CompactResult]:
    """Compact one day of every table (see `compact_store`)."""
    return compact_store(root, [day], grace_s=grace_s)
