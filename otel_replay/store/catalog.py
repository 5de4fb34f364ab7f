"""DuckDB over the store's Parquet segments: a fresh in-memory connection per use, no lock files.

A running service, a batch job and an engineer's query can all read the store at once, because
the only shared state is immutable Parquet files.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import duckdb
import pyarrow as pa

from otel_replay.errors import OtelReplayError
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


class StoreError(OtelReplayError):
    """A store operation failed in a way the user can act on."""


class ForbiddenSQL(StoreError):
    """The user's SQL tried to do more than read the store (write, other files, ATTACH, SET, ...)."""


class QueryError(StoreError):
    """A query over the store failed (a SQL error, a type mismatch, ...). Its message is one line;
    `detail` is DuckDB's whole text, with its hint and the caret under the error (for `otel-replay sql`)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message


def _one_line(exc: BaseException) -> str:
    """The first line of an error's text (DuckDB's go on with LINE 1: ... and a caret)."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


READ_ONLY = ("(SQL over a store is one SELECT over its views and tables, reading nothing else: no COPY, no other "
             "file or URL, no ATTACH, INSTALL, LOAD or SET)")


def _lock_down(con: duckdb.DuckDBPyConnection, uris: list[str]) -> None:
    """From here on the connection may read the store's segments behind its views, and nothing else:
    no other file or URL, no ATTACH, INSTALL or LOAD, and no setting changed back."""
    guard = queries.load("guard.sql")
    con.execute(guard["allow_paths"], [uris])
    con.execute(guard["disable_external_access"])
    con.execute(guard["lock_configuration"])


def _one_select(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise ForbiddenSQL unless `sql` is exactly one SELECT (WITH, VALUES, DESCRIBE, SHOW and
    SUMMARIZE are SELECTs too). SQL that does not parse is left to DuckDB's own error, with its caret."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.ParserException:
        return
    kinds = [s.type.name for s in statements]
    if kinds != ["SELECT"]:
        what = f"{len(kinds)} statements ({', '.join(kinds)})" if len(kinds) != 1 else kinds[0]
        raise ForbiddenSQL(f"not allowed: {what} {READ_ONLY}")


_PROBE = "SELECT * FROM traces WHERE "  # parsed, never run: a predicate must be its WHERE and nothing else


def _tree(node: Any) -> Any:
    """A parse tree without the source positions (the same expression anywhere in the text compares equal)."""
    if isinstance(node, dict):
        return {k: _tree(v) for k, v in node.items() if not k.startswith("query_location")}
    if isinstance(node, list):
        return [_tree(v) for v in node]
    return node


def check_predicate(predicate: str) -> None:
    """Raise StoreError unless `predicate` is exactly one SQL expression (what `--where` takes).

    DuckDB parses `SELECT * FROM traces WHERE <predicate>`, bare and in parentheses: both must be
    one SELECT whose only difference from `... WHERE TRUE` is that WHERE clause, the same in both.
    So `x) OR (y`, `x; COPY ...`, `x UNION SELECT ...`, `x ORDER BY ...` or `x --` are refused
    before anything runs."""
    con = duckdb.connect()
    try:
        parsed = [json.loads(con.execute(queries.load("guard.sql")["serialize_select"], [_PROBE + text]).fetchall()[0][0])
                  for text in (predicate, f"({predicate})", "TRUE")]
    finally:
        con.close()
    not_one = StoreError(f"{predicate!r} is not one SQL expression over the traces view (a condition such "
                         "as status = 'error' AND steps > 3, with nothing closing the WHERE or added after it)")
    for doc in parsed[:2]:
        if doc.get("error"):
            said = str(doc.get("error_message"))
            if said.startswith("Only SELECT"):  # a second statement of another kind
                raise not_one
            raise StoreError(f"{predicate!r} is not valid SQL: {said}")
    shapes, wheres = [], []
    for doc in parsed:
        nodes = [_tree(s.get("node")) for s in doc.get("statements", [])]
        where = nodes[0].pop("where_clause", None) if len(nodes) == 1 and isinstance(nodes[0], dict) else None
        shapes.append(nodes)
        wheres.append(where)
    if not (shapes[0] == shapes[1] == shapes[2] and wheres[0] is not None and wheres[0] == wheres[1]):
        raise not_one


class UnknownTrace(StoreError):
    """No trace with that id is in the store."""


def _empty_with_day(table: str) -> pa.Table:
    schema = schema_of(table).append(pa.field("day", pa.date32()))
    return schema.empty_table()


def _segments_view(con: duckdb.DuckDBPyConnection, table: str, segments: duckdb.DuckDBPyRelation) -> None:
    """The table's view over its segments, with every declared column: a column no segment has
    (segments written before it was added) reads as NULL of its declared type."""
    present = set(segments.columns)  # once: on a remote store each call may bind the relation again
    missing = [f.name for f in schema_of(table) if f.name not in present]
    if not missing:
        segments.create_view(table)
        return
    segments.create_view(f"_{table}_segments")
    con.register(f"_{table}_declared", schema_of(table).empty_table().select(missing))
    con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS SELECT * FROM _{table}_segments "  # noqa: S608 - declared names
                f"UNION ALL BY NAME SELECT * FROM _{table}_declared")


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
        """A new in-memory connection with the views `spans`, `steps`, `messages`, `traces`.

        A bare connection: its queries are not retried after a compaction and raise DuckDB's own
        errors. Outside the store layer read through `session()`, `sql`, `named` or `read`
        (tests/test_read_paths.py keeps new calls out)."""
        return self._open()[0]

    def _open(self, locked: bool = False) -> tuple[duckdb.DuckDBPyConnection, Snapshot]:
        """A connection with the views over one snapshot; `locked`: able to read those segments only."""
        for attempt in range(ATTEMPTS):
            snap = self._snapshot()
            con = duckdb.connect()
            try:
                _configure(con)
                self.root.register(con, snap.segments())
                read: list[str] = []
                for table in TABLES:
                    uris = usable(snap.uris(table))  # minus segments found damaged (doctor.py)
                    if uris:
                        _segments_view(con, table, con.read_parquet(uris, hive_partitioning=True, union_by_name=True))
                    else:
                        con.register(table, _empty_with_day(table))
                    read += uris
                for sql in queries.views().values():
                    con.execute(sql)
                if locked:
                    _lock_down(con, read)
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
                local = self.root.local
                file = " (a file, not a store directory)" if local is not None and local.is_file() else ""
                raise StoreError(
                    f"no store at {self.root}{file}: point --store (or ${STORE_ENV}) at the directory or URL "
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

    def _retry(self, exc: duckdb.Error, snap: Snapshot, attempt: int) -> bool:
        """Whether a read that failed with `exc` is worth running again on a fresh snapshot: a
        compaction removed a segment it was reading, or the segment is damaged (now left out)."""
        return attempt + 1 < ATTEMPTS and (self._vanished(snap) or self._damaged(exc, snap))

    def _query_error(self, exc: duckdb.Error, locked: bool = False) -> StoreError:
        """The StoreError for a read that failed with `exc` (one line; DuckDB's text as the cause)."""
        if locked and isinstance(exc, duckdb.PermissionException):
            said = _one_line(exc).removeprefix("Permission Error: ")
            return ForbiddenSQL(f"not allowed: {said} {READ_ONLY}")
        if looks_damaged(exc):
            return StoreError(f"reading the store at {self.root} failed: {_one_line(exc)}{_doctor_hint(exc)}")
        return QueryError(f"query over the store at {self.root} failed: {_one_line(exc)}", str(exc))

    def read(self, fn: Callable[[duckdb.DuckDBPyConnection], T], *, locked: bool = False) -> T:
        """Run `fn` on a fresh connection; again on a fresh snapshot if a compaction removed a
        segment it was reading (the rows are then in the compacted segment). `locked`: the
        connection can read the store's segments and nothing else (for SQL a user wrote).
        A DuckDB error is raised as a StoreError (QueryError, ForbiddenSQL), never as itself."""
        for attempt in range(ATTEMPTS):
            con, snap = self._open(locked)
            try:
                return fn(con)
            except duckdb.Error as exc:
                if self._retry(exc, snap, attempt):
                    continue
                raise self._query_error(exc, locked) from exc
            finally:
                con.close()
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """Several reads over one connection (opening one reads every segment's footer), each with
        `read`'s safety: retried on a fresh snapshot after a compaction, errors as StoreError.

            with store.session() as s:
                tid = store.resolve_trace_id(prefix, s)
                rows = s.arrow(queries.query("trace_span_rows"), [tid])
        """
        session = Session(self)
        try:
            yield session
        finally:
            session.close()

    def sql(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        """Run one SELECT over the views; results as an Arrow table.

        The SQL may be a user's (`otel-replay sql`, `--where`), so it runs locked down: one SELECT
        statement, on a connection that reads the store's segments and nothing else (no other file
        or URL, COPY, ATTACH, INSTALL, LOAD or SET). ForbiddenSQL says what was refused."""
        def run(con: duckdb.DuckDBPyConnection) -> pa.Table:
            _one_select(con, sql)
            return con.sql(sql, params=params or []).to_arrow_table()

        return self.read(run, locked=True)

    def named(self, name: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.read(lambda con: con.execute(queries.query(name), params or []).fetchall())

    def resolve_trace_id(self, trace_id: str, session: Session | None = None) -> str:
        """A full trace id from an id or a unique prefix (at least 6 hex digits); in `session` when
        given (opening a connection reads every segment's footer: one is enough)."""
        tid = trace_id.strip().lower()

        def ask(name: str) -> list[tuple[Any, ...]]:
            return (session or self).named(name, [tid])

        if ask("trace_exists")[0][0]:
            return tid
        if len(tid) >= 6:
            matches = [row[0] for row in ask("trace_ids_with_prefix")]
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                raise UnknownTrace(f"trace id prefix {trace_id!r} is ambiguous: {', '.join(matches)}")
        elif tid and all(c in "0123456789abcdef" for c in tid):
            raise UnknownTrace(f"no trace {trace_id!r}: a trace id prefix needs at least 6 hex digits "
                               "(list ids with `otel-replay traces`)")
        raise UnknownTrace(f"no trace {trace_id!r} in the store at {self.root} (list them with `otel-replay traces`)")

    def list_traces(self, *, failed: bool = False, since_ns: int = 0, limit: int = 50) -> pa.Table:
        return self.read(lambda con: con.sql(queries.query("list_traces"),
                                             params=[failed, since_ns, limit]).to_arrow_table())

    def capture_totals(self) -> dict[str, int]:
        accepted, dropped, skipped = self.named("capture_totals")[0]
        return {"accepted": int(accepted), "dropped_queue_full": int(dropped), "skipped": int(skipped)}


class Session:
    """Reads over one connection to the store (`Catalog.session()`), each as safe as `Catalog.read`:
    a query that failed because a compaction removed a segment it was reading (or a damaged
    segment, now left out) runs again on a fresh snapshot; any other DuckDB error is raised as a
    StoreError (QueryError) with a one-line message. Results are materialized (lists, Arrow tables),
    so every error surfaces inside the session's own methods."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._con, self._snap = catalog._open()

    def _run(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        for attempt in range(ATTEMPTS):
            try:
                return fn(self._con)
            except duckdb.Error as exc:
                if not self.catalog._retry(exc, self._snap, attempt):
                    raise self.catalog._query_error(exc) from exc
            self._con.close()
            self._con, self._snap = self.catalog._open()
        raise AssertionError("unreachable")

    def fetchall(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Rows of one query (the store's own SQL: not checked like `Catalog.sql`'s)."""
        return self._run(lambda con: con.execute(sql, params or []).fetchall())

    def arrow(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        return self._run(lambda con: con.sql(sql, params=params or []).to_arrow_table())

    def named(self, name: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Rows of a named query of otel_replay/store/sql (`queries.query(name)`)."""
        return self.fetchall(queries.query(name), params)

    def named_arrow(self, name: str, params: Sequence[Any] | None = None) -> pa.Table:
        return self.arrow(queries.query(name), params)

    def close(self) -> None:
        self._con.close()
