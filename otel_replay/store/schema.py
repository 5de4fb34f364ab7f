"""Arrow schemas of the stored tables, built from the one DDL declaration in `schemas/store.sql`."""

from __future__ import annotations

import functools
from importlib import resources

import duckdb
import pyarrow as pa

TABLES = ("span_rows", "step_rows", "message_rows", "capture_stats", "job_rows", "rollout_rows", "result_rows", "report_rows")


def ddl() -> str:
    return resources.files("otel_replay").joinpath("schemas/store.sql").read_text(encoding="utf-8")


@functools.cache
def arrow_schemas() -> dict[str, pa.Schema]:
    """Table name -> Arrow schema, via DuckDB's own reading of the DDL."""
    con = duckdb.connect()
    try:
        con.execute(ddl())
        out = {}
        for table in TABLES:
            schema = con.sql(f"SELECT * FROM {table} LIMIT 0").to_arrow_table().schema  # noqa: S608 (fixed names)
            not_null = {
                row[0]
                for row in con.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE table_name = ? AND NOT is_nullable", [table]
                ).fetchall()
            }
            out[table] = pa.schema(
                [f.with_nullable(f.name not in not_null) for f in schema]
            )
        return out
    finally:
        con.close()


def schema_of(table: str) -> pa.Schema:
    return arrow_schemas()[table]
