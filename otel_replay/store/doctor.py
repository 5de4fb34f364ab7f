"""Damaged segments: found, skipped by readers, and quarantined by `otel-replay doctor`.

A segment damaged on disk (truncated, a flipped bit, a file that is not Parquet) must not stop
queries over the rest of the store. Readers stay cheap: DuckDB reads every segment's footer when
a view is bound, and an error that names a segment marks it damaged for this process, so the
catalog leaves it out and retries (with one warning naming the file). `doctor` does the full
check: every page of every segment (page checksums, written since this version, catch most bit
flips; older segments are checked by decoding and UTF-8 validation), then moves a damaged one
to `<root>/quarantine/<its relative path>` with a note saying why, out of every read glob. It
also finds batches torn by a crash (`otel_replay.store.batches`) and rolls them back.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otel_replay.store.batches import read_batch_manifests, settle
from otel_replay.store.layout import cleanup_temp
from otel_replay.store.location import DIR_MODE, Segment, StoreLike, StoreLocation
from otel_replay.store.schema import TABLES, schema_of

logger = logging.getLogger("otel_replay")

QUARANTINE_DIR = "quarantine"
TEMP_GRACE_S = 3600.0  # a younger temp file may belong to a writer that is still running
LOCATE_BUDGET_BYTES = 256 * 1024 * 1024  # how much a reader checks to find a segment an error did not name
_DAMAGED: dict[str, str] = {}  # uri -> error, for this process
_FOOTER_OK: set[str] = set()  # footers this process read without error (not read again by `note_damage`)
_WHOLE_OK: set[str] = set()  # segments this process read whole without error
_QUOTED = re.compile(r"""["']([^"']+\.parquet)["']""")
# DuckDB errors that come from undecodable Parquet rather than from the query
_CORRUPTION = re.compile(r"parquet file|failed to read file|thrift|tprotocol|ttype|corrupt|decompress|magic bytes|"
                         r"out of buffer|don't know what type|dictionary offset|could not read enough bytes|"
                         r"invalid string encoding|checksum|requires length to be set|unsupported converted type",
                         re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Damage:
    """One damaged segment, where it went (if moved) and why."""

    rel: str
    error: str
    quarantined_to: str | None = None


@dataclass(slots=True)
class DoctorReport:
    root: str
    checked: int = 0
    checked_bytes: int = 0
    damaged: list[Damage] = field(default_factory=list)
    temp_removed: int = 0
    temp_stale: int = 0  # stale temp files found (and left, in check mode)
    temp_recent: int = 0  # temp files younger than the grace: a running writer may own them
    torn: list[TornBatch] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def problems(self) -> int:
        """Damaged segments, torn batches and stale temp files (what `--check` exits nonzero for)."""
        return len(self.damaged) + len(self.torn) + self.temp_stale


@dataclass(frozen=True, slots=True)
class TornBatch:
    """A batch a crash cut short: the segments it wrote (hidden from readers), how many it meant to."""

    manifest: str
    written: tuple[str, ...]
    planned: int
    rolled_back: bool


# -- the full check -------------------------------------------------------------------------------
def check_segment(location: StoreLocation, segment: Segment, con: duckdb.DuckDBPyConnection | None = None
                  ) -> str | None:
    """Read every page of a segment with pyarrow, then with DuckDB (as the views will); the error
    that stops either, or None if it reads whole."""
    error = _check_pyarrow(location, segment)
    if error is None and con is not None:
        try:
            con.execute("SELECT * FROM read_parquet(?)", [location.uri(segment.rel)]).fetchall()
        except duckdb.Error as exc:
            error = f"DuckDB: {str(exc).splitlines()[0]}"
    return error


def _check_pyarrow(location: StoreLocation, segment: Segment) -> str | None:
    try:
        if location.local is not None:
            source: str | pa.BufferReader = str(location.local / segment.rel)
        else:
            source = pa.BufferReader(location.read_bytes(segment.rel))
        with pq.ParquetFile(source, page_checksum_verification=True) as parquet:
            rows = 0
            for group in range(parquet.num_row_groups):
                table = parquet.read_row_group(group)
                table.validate(full=True)  # e.g. invalid UTF-8 in a string column
                rows += table.num_rows
                error = _statistics_damage(parquet.metadata.row_group(group), parquet.schema, table)
                if error is not None:
                    return f"row group {group}: {error}"
            if rows != parquet.metadata.num_rows:
                return f"the footer declares {parquet.metadata.num_rows} rows, the row groups hold {rows}"
            return schema_damage(segment.table, parquet.schema_arrow)
    except FileNotFoundError:
        return None  # removed by a compaction since the listing: not damage
    except (pa.ArrowException, OSError, ValueError, EOFError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _statistics_damage(group: pq.RowGroupMetaData, schema: pq.ParquetSchema, table: pa.Table) -> str | None:
    """Min/max and null counts in the footer must match the values: readers skip row groups by them,
    so a flipped bit there silently hides rows from a filtered query."""
    for i in range(group.num_columns):
        meta = group.column(i)
        declared = schema.column(i).physical_type
        if meta.physical_type != declared:  # checked first: pyarrow aborts the process reading such statistics
            return f"column {meta.path_in_schema!r}: chunk type {meta.physical_type}, schema type {declared}"
        stats = meta.statistics
        name = meta.path_in_schema
        if stats is None or name not in table.column_names:
            continue  # nested columns' leaves: their values are checked by decoding
        column = table.column(name)
        counted = stats.has_null_count  # type: ignore[attr-defined]  # pyarrow 26 has it; its stubs do not
        if counted and stats.null_count != column.null_count:
            return f"column {name!r}: the footer counts {stats.null_count} nulls, the values hold {column.null_count}"
        if stats.has_min_max and column.null_count < len(column):
            low, high = pc.min_max(column).values()
            if (low.as_py(), high.as_py()) != (stats.min, stats.max):
                return f"column {name!r}: the footer's min/max differ from the values"
    return None


def _one_bit_apart(a: str, b: str) -> bool:
    if len(a) != len(b):
        return False
    diff = [x ^ y for x, y in zip(a.encode(), b.encode(), strict=True) if x != y]
    return len(diff) == 1 and diff[0] & (diff[0] - 1) == 0


def schema_damage(table: str, schema: pa.Schema) -> str | None:
    """A flipped bit in the footer's schema reads fine but renames a column or turns a string
    column into bytes. Only those signatures count: a column added or removed by another version
    of otel-replay is not damage."""
    try:
        declared = schema_of(table)
    except (KeyError, ValueError):
        return None
    missing = [n for n in declared.names if n not in schema.names]
    for column in schema:
        if column.name not in declared.names:
            near = [n for n in missing if _one_bit_apart(n, column.name)]
            if near:
                return f"column {column.name!r} is one flipped bit from the declared column {near[0]!r}"
            continue
        want = declared.field(column.name).type
        if {str(want), str(column.type)} in ({"string", "binary"}, {"large_string", "large_binary"}):
            return f"column {column.name!r} is {column.type}, declared {want} (its type annotation is damaged)"
    return None


def quarantine(location: StoreLocation, rel: str, error: str) -> str:
    """Move a segment to `quarantine/<rel>` (a free name) with a note; returns where it went."""
    dest = f"{QUARANTINE_DIR}/{rel}"
    note = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} quarantined by otel-replay doctor\n{rel}\n{error}\n"
    if location.local is not None:
        target = location.local / dest
        target.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        for n in range(1, 1000):
            if not target.exists():
                break
            target = target.with_name(f"{Path(rel).stem}.{n}.parquet")
        os.replace(location.local / rel, target)
        target.with_name(target.name + ".error.txt").write_text(note, encoding="utf-8")
        dest = target.relative_to(location.local).as_posix()
    else:
        data = location.read_bytes(rel)
        location.write(dest, lambda handle: handle.write(data))
        location.write(dest + ".error.txt", lambda handle: handle.write(note.encode()))
        location.delete(rel)
    _DAMAGED.pop(location.uri(rel), None)
    # the rest of its batch stays readable: a batch manifest naming it would hide them all
    location.delete_many([m.rel for m in read_batch_manifests(location) if rel in m.segments])
    return dest


def _count_temp(root: Path, older_than_s: float) -> tuple[int, int]:
    cutoff = time.time() - older_than_s
    stale = recent = 0
    for path in root.glob("*/*/.*.tmp"):
        try:
            if path.stat().st_mtime < cutoff:
                stale += 1
            else:
                recent += 1
        except OSError:
            continue
    return stale, recent


def doctor(root: StoreLike, *, fix: bool = True, temp_grace_s: float = TEMP_GRACE_S,
           tables: Iterable[str] = TABLES, on_damage: Callable[[Damage], None] | None = None) -> DoctorReport:
    """Check every segment; with `fix`, quarantine the damaged ones, roll back torn batches (a crash
    cut them short: their segments are deleted, they were never visible) and remove stale temp files.

    :param on_damage: called with each damaged segment as it is found (and moved, with `fix`).
    """
    location = StoreLocation.of(root)
    if not location.exists():
        raise FileNotFoundError(f"no store at {location}")
    started = time.perf_counter()
    report = DoctorReport(root=location.display())
    settled = settle(location, torn_after_s=temp_grace_s, fix=fix)
    report.torn = [TornBatch(m.rel, tuple(written), len(m.segments), fix) for m, written in settled.torn]
    con = duckdb.connect()
    location.register(con)
    for table in tables:
        for segment in location.segments(table):
            error = check_segment(location, segment, con)
            report.checked += 1
            report.checked_bytes += segment.size
            if error is None:
                continue
            damage = Damage(segment.rel, error, quarantine(location, segment.rel, error) if fix else None)
            report.damaged.append(damage)
            if on_damage is not None:
                on_damage(damage)
    if location.local is not None:
        report.temp_stale, report.temp_recent = _count_temp(location.local, temp_grace_s)
        if fix:
            report.temp_removed = cleanup_temp(location, temp_grace_s)
            report.temp_stale -= report.temp_removed
    con.close()
    report.seconds = time.perf_counter() - started
    return report


# -- what readers use -----------------------------------------------------------------------------
def usable(uris: list[str]) -> list[str]:
    """The segments a reader should read: all but those found damaged in this process."""
    if not _DAMAGED:
        return uris
    return [u for u in uris if u not in _DAMAGED]


def damaged() -> dict[str, str]:
    """Segments this process found damaged (uri -> error) and skips."""
    return dict(_DAMAGED)


def forget_damage() -> None:
    """Forget which segments this process found damaged or sound (they are checked again)."""
    _DAMAGED.clear()
    _FOOTER_OK.clear()
    _WHOLE_OK.clear()


def _mark(uri: str, error: str) -> None:
    if uri not in _DAMAGED:
        _DAMAGED[uri] = error
        logger.warning(f"otel-replay: skipping damaged segment {uri} ({error}); queries run over the rest of the "
                       f"store. Run `otel-replay doctor` to check every segment and quarantine the damaged ones.")


def looks_damaged(exc: BaseException) -> bool:
    """Whether a DuckDB error comes from undecodable Parquet rather than from the query itself."""
    return bool(_CORRUPTION.search(str(exc)))


def note_damage(exc: BaseException, uris: Iterable[str], location: StoreLocation | None = None) -> bool:
    """After a read error, mark damaged segments so a retry leaves them out; True if any was newly marked.

    The segment the error names, then every segment whose footer does not read (cheap, so a store
    with many damaged segments costs one retry, not one per segment); if neither finds one, full
    checks (within `LOCATE_BUDGET_BYTES`) look for the segment the error did not name.
    """
    if not looks_damaged(exc):
        return False
    readable = [u for u in uris if u not in _DAMAGED]
    text = str(exc)
    named = {u for u in readable if u in text} | {u for u in _QUOTED.findall(text) if u in readable}
    for uri in named:
        _mark(uri, text.splitlines()[0][:300])
    if location is None:
        return bool(named)
    found = _footers(location, [u for u in readable if u not in named])
    return bool(named or found or locate_damage(location, readable))


def _footers(location: StoreLocation, uris: list[str]) -> list[str]:
    found = []
    for table, segment in _segments(location, uris):
        uri = location.uri(segment.rel)
        if uri in _FOOTER_OK:
            continue
        try:
            pq.read_metadata(uri if location.local is not None else pa.BufferReader(location.read_bytes(segment.rel)))
            _FOOTER_OK.add(uri)
        except FileNotFoundError:
            continue
        except (pa.ArrowException, OSError, ValueError) as exc:
            _mark(uri, f"{table} footer: {type(exc).__name__}: {exc}")
            found.append(uri)
    return found


def _segments(location: StoreLocation, uris: Iterable[str]) -> list[tuple[str, Segment]]:
    wanted = set(uris)
    return [(t, s) for t in TABLES for s in location.segments(t) if location.uri(s.rel) in wanted]


def locate_damage(location: StoreLocation, uris: Iterable[str], budget_bytes: int = LOCATE_BUDGET_BYTES) -> list[str]:
    """Full-check segments (up to `budget_bytes`) to find the damaged ones an error did not name."""
    found: list[str] = []
    spent = 0
    con = duckdb.connect()
    try:
        location.register(con)
        for _, segment in _segments(location, uris):
            uri = location.uri(segment.rel)
            if uri in _WHOLE_OK:
                continue
            spent += segment.size
            if spent > budget_bytes:
                break
            error = check_segment(location, segment, con)
            if error is None:
                _WHOLE_OK.add(uri)
            else:
                _mark(uri, error)
                found.append(uri)
    finally:
        con.close()
    return found
