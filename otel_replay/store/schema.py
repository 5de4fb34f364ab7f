"""Arrow schemas of the stored tables, built from the one DDL declaration in `schemas/store.sql`.

The DDL is read here rather than by DuckDB: the few column types it uses map one to one onto
Arrow, and a DuckDB connection to read it cost every writing process ~45 ms before its first
segment (an import's parent, before it can fork its workers). `duckdb_arrow_schemas` is DuckDB's
own reading, which the tests hold this one to.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

import pyarrow as pa

from otel_replay.errors import OtelReplayError

TABLES = ("span_rows", "step_rows", "message_rows", "capture_stats", "job_rows", "rollout_rows", "result_rows", "report_rows",
          "outcome_rows", "skip_rows", "group_links", "budget_rows")

_TYPES: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
}
_LIST_ITEM = "l"  # the item field's name in DuckDB's Arrow lists, so both readings agree
_TABLE = re.compile(r"CREATE TABLE (\w+) \((.*?)\n\);", re.DOTALL)
_COLUMN = re.compile(r"(\w+)\s+([A-Z]+)(\[\])?(\s+NOT NULL)?")


class SchemaError(OtelReplayError, ValueError):
    """The DDL declares something this reader does not map (a new type, a constraint)."""


def ddl() -> str:
    return resources.files("otel_replay").joinpath("schemas/store.sql").read_text(encoding="utf-8")


@functools.cache
def arrow_schemas() -> dict[str, pa.Schema]:
    """Table name -> Arrow schema, read from the DDL."""
    return parse_ddl(ddl())


def parse_ddl(text: str) -> dict[str, pa.Schema]:
    """Every `CREATE TABLE` of `text` as an Arrow schema; raises `SchemaError` naming the line it cannot map."""
    schemas = {}
    for table in _TABLE.finditer(_without_comments(text)):
        fields = []
        for line in table.group(2).split(","):
            column = line.strip()
            if not column:
                continue
            found = _COLUMN.fullmatch(column)
            if found is None or found.group(2) not in _TYPES:
                raise SchemaError(f"store.sql, table {table.group(1)}: cannot map column {column!r}")
            name, kind, is_list, not_null = found.groups()
            arrow = pa.list_(pa.field(_LIST_ITEM, _TYPES[kind])) if is_list else _TYPES[kind]
            fields.append(pa.field(name, arrow, nullable=not not_null))
        schemas[table.group(1)] = pa.schema(fields)
    return schemas


def _without_comments(text: str) -> str:
    return "\n".join(line.split("--", 1)[0].rstrip() for line in text.splitlines())


def duckdb_arrow_schemas(text: str) -> dict[str, pa.Schema]:
    """Table name -> Arrow schema as DuckDB reads the DDL (the reference `parse_ddl` must match)."""
    import duckdb

    con = duckdb.connect()
    try:
        con.execute(text)
        not_null = set(con.execute("SELECT table_name, column_name FROM duckdb_columns() WHERE NOT is_nullable").fetchall())
        out = {}
        for (table,) in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY table_name").fetchall():
            schema = con.sql(f'SELECT * FROM "{table}" LIMIT 0').to_arrow_table().schema  # noqa: S608 (names from the DDL)
            out[table] = pa.schema([f.with_nullable((table, f.name) not in not_null) for f in schema])
        return out
    finally:
        con.close()


def schema_of(table: str) -> pa.Schema:
    return arrow_schemas()[table]
