"""DuckDB over the store's Parquet segments: a fresh in-memory connection per use, no lock files.

A running service, a batch job and an engineer's query can all read the store at once, because
the only shared state is immutable Parquet files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from otel_replay.store import queries
from otel_replay.store.layout import STORE_ENV, default_root, has_segments, table_glob
from otel_replay.store.schema import TABLES, schema_of


class StoreError(Exception):
    """A store operation failed in a way the user can act on."""


class UnknownTrace(StoreError):
    """No trace with that id is in the store."""


def _empty_with_day(table: str) -> pa.Table:
    schema = schema_of(table).append(pa.field("day", pa.date32()))
    return schema.empty_table()


class Catalog:
    """Read access to a store directory through DuckDB views."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A new in-memory connection with the views `spans`, `steps`, `messages`, `traces`."""
        if not self.root.is_dir():
            raise StoreError(
                f"no store at {self.root}: point --store (or ${STORE_ENV}) at the directory ReplayProcessor writes to"
            )
        con = duckdb.connect()
        try:
            for table in TABLES:
                if has_segments(self.root, table):
                    rel = con.read_parquet(table_glob(self.root, table), hive_partitioning=True, union_by_name=True)
                    rel.create_view(table)
                else:
                    con.register(table, _empty_with_day(table))
            for sql in queries.views().values():
                con.execute(sql)
        except duckdb.Error as exc:
            con.close()
            raise StoreError(f"cannot open the store at {self.root}: {exc}") from exc
        return con

    def sql(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        """Run any SQL over the views; results as an Arrow table."""
        con = self.connect()
        try:
            return con.sql(sql, params=params or []).to_arrow_table()
        finally:
            con.close()

    def named(self, name: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        con = self.connect()
        try:
            return con.execute(queries.query(name), params or []).fetchall()
        finally:
            con.close()

    def resolve_trace_id(self, trace_id: str) -> str:
        """A full trace id from an id or a unique prefix (at least 6 hex digits)."""
        tid = trace_id.strip().lower()
        if self.named("trace_exists", [tid])[0][0]:
            return tid
        if len(tid) >= 6:
            matches = [row[0] for row in self.named("trace_ids_with_prefix", [tid])]
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                raise UnknownTrace(f"trace id prefix {trace_id!r} is ambiguous: {', '.join(matches)}")
        raise UnknownTrace(f"no trace {trace_id!r} in the store at {self.root} (list them with `otel-replay traces`)")

    def list_traces(self, *, failed: bool = False, since_ns: int = 0, limit: int = 50) -> pa.Table:
        con = self.connect()
        try:
            return con.sql(queries.query("list_traces"), params=[failed, since_ns, limit]).to_arrow_table()
        finally:
            con.close()

    def capture_totals(self) -> dict[str, int]:
        accepted, dropped, skipped = self.named("capture_totals")[0]
        return {"accepted": int(accepted), "dropped_queue_full": int(dropped), "skipped": int(skipped)}
