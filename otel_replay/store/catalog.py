"""DuckDB over the store's Parquet segments: a fresh in-memory connection per use, no lock files.

A running service, a batch job and an engineer's query can all read the store at once, because
the only shared state is immutable Parquet files.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import duckdb
import pyarrow as pa

from otel_replay.store import queries
from otel_replay.store.doctor import looks_damaged, note_damage, usable
from otel_replay.store.layout import STORE_ENV
from otel_replay.store.location import StoreLike, StoreLocation
from otel_replay.store.schema import TABLES, schema_of
from otel_replay.store.snapshot import ManifestError, Snapshot, take

T = TypeVar("T")
ATTEMPTS = 5  # snapshots tried when a compaction removes segments between listing and reading


def _configure(con: duckdb.DuckDBPyConnection) -> None:
    """No progress bar (a library's connection prints nothing); Parquet footers parsed once per
    connection (a compacted day has thousands of small row groups, for fast single-trace reads,
    and each query of a trajectory load would parse the footer again)."""
    con.execute("set enable_progress_bar = false")
    with contextlib.suppress(duckdb.Error):  # needs the parquet extension loaded; if not, go without
        con.execute("set parquet_metadata_cache = true")


class StoreError(Exception):
    """A store operation failed in a way the user can act on."""


class UnknownTrace(StoreError):
    """No trace with that id is in the store."""


def _empty_with_day(table: str) -> pa.Table:
    schema = schema_of(table).append(pa.field("day", pa.date32()))
    return schema.empty_table()


def _doctor_hint(exc: BaseException) -> str:
    if not looks_damaged(exc):
        return ""
    return " (a segment may be damaged: run `otel-replay doctor` to check every segment and quarantine it)"


class Catalog:
    """Read access to a store (a directory or a URL) through DuckDB views.

    Each connection reads one snapshot of the store: the segments listed when it opened, minus
    those a finished compaction replaced (`otel_replay.store.snapshot`). `sql`, `named` and
    `list_traces` retry on a fresh snapshot when a compaction removed a segment meanwhile.
    """

    def __init__(self, root: StoreLike | None = None) -> None:
        self.root = StoreLocation.of(root)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A new in-memory connection with the views `spans`, `steps`, `messages`, `traces`."""
        return self._open()[0]

    def _open(self) -> tuple[duckdb.DuckDBPyConnection, Snapshot]:
        for attempt in range(ATTEMPTS):
            snap = self._snapshot()
            con = duckdb.connect()
            try:
                _configure(con)
                self.root.register(con, snap.segments())
                for table in TABLES:
                    uris = usable(snap.uris(table))  # minus segments found damaged (doctor.py)
                    if uris:
                        con.read_parquet(uris, hive_partitioning=True, union_by_name=True).create_view(table)
                    else:
                        con.register(table, _empty_with_day(table))
                for sql in queries.views().values():
                    con.execute(sql)
                return con, snap
            except duckdb.Error as exc:
                con.close()
                if attempt + 1 < ATTEMPTS and (self._vanished(snap) or self._damaged(exc, snap)):
                    continue
                raise StoreError(f"cannot open the store at {self.root}: {exc}{_doctor_hint(exc)}") from exc
            except OSError as exc:  # a remote store that cannot be reached
                con.close()
                raise StoreError(f"cannot read the store at {self.root}: {exc}") from exc
        raise AssertionError("unreachable")

    def snapshot(self) -> Snapshot:
        """The store's live segments now (and the ones a pending compaction replaced)."""
        return self._snapshot()

    def _snapshot(self) -> Snapshot:
        try:
            if not self.root.exists():
                raise StoreError(
                    f"no store at {self.root}: point --store (or ${STORE_ENV}) at the directory or URL "
                    "ReplayProcessor writes to"
                )
            return take(self.root, TABLES)
        except (OSError, ManifestError) as exc:
            raise StoreError(f"cannot read the store at {self.root}: {exc}") from exc

    def _damaged(self, exc: duckdb.Error, snap: Snapshot) -> bool:
        """Whether the error came from a damaged segment, now left out (worth a retry)."""
        try:
            return note_damage(exc, [u for t in TABLES for u in snap.uris(t)], self.root)
        except OSError:
            return False

    def _vanished(self, snap: Snapshot) -> bool:
        try:
            return snap.vanished()
        except OSError:
            return False

    def read(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """Run `fn` on a fresh connection; again on a fresh snapshot if a compaction removed a
        segment it was reading (the rows are then in the compacted segment)."""
        for attempt in range(ATTEMPTS):
            con, snap = self._open()
            try:
                return fn(con)
            except duckdb.Error as exc:
                if attempt + 1 < ATTEMPTS and (self._vanished(snap) or self._damaged(exc, snap)):
                    continue
                if looks_damaged(exc):
                    raise StoreError(f"reading the store at {self.root} failed: {exc}{_doctor_hint(exc)}") from exc
                raise
            finally:
                con.close()
        raise AssertionError("unreachable")

    def sql(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        """Run any SQL over the views; results as an Arrow table."""
        return self.read(lambda con: con.sql(sql, params=params or []).to_arrow_table())

    def named(self, name: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.read(lambda con: con.execute(queries.query(name), params or []).fetchall())

    def resolve_trace_id(self, trace_id: str, con: duckdb.DuckDBPyConnection | None = None) -> str:
        """A full trace id from an id or a unique prefix (at least 6 hex digits); on `con` when
        given (opening a connection reads every segment's footer: one is enough)."""
        tid = trace_id.strip().lower()

        def ask(name: str) -> list[tuple[Any, ...]]:
            return con.execute(queries.query(name), [tid]).fetchall() if con is not None else self.named(name, [tid])

        if ask("trace_exists")[0][0]:
            return tid
        if len(tid) >= 6:
            matches = [row[0] for row in ask("trace_ids_with_prefix")]
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                raise UnknownTrace(f"trace id prefix {trace_id!r} is ambiguous: {', '.join(matches)}")
        raise UnknownTrace(f"no trace {trace_id!r} in the store at {self.root} (list them with `otel-replay traces`)")

    def list_traces(self, *, failed: bool = False, since_ns: int = 0, limit: int = 50) -> pa.Table:
        return self.read(lambda con: con.sql(queries.query("list_traces"),
                                             params=[failed, since_ns, limit]).to_arrow_table())

    def capture_totals(self) -> dict[str, int]:
        accepted, dropped, skipped = self.named("capture_totals")[0]
        return {"accepted": int(accepted), "dropped_queue_full": int(dropped), "skipped": int(skipped)}
