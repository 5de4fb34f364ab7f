"""The Arrow schemas read from `schemas/store.sql` are the ones DuckDB reads from it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_replay.store.schema import (
    TABLES,
    SchemaError,
    arrow_schemas,
    ddl,
    duckdb_arrow_schemas,
    parse_ddl,
)


def test_every_table_of_the_store_ddl_reads_as_duckdb_reads_it():
    ours, duckdbs = arrow_schemas(), duckdb_arrow_schemas(ddl())
    assert sorted(ours) == sorted(duckdbs) == sorted(TABLES)
    for table in TABLES:
        assert ours[table].equals(duckdbs[table]), table
    assert not ours["span_rows"].field("trace_id").nullable and ours["span_rows"].field("parent_span_id").nullable
    assert str(ours["step_rows"].field("input_hashes").type) == "list<l: string>"


_names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).map(lambda n: f"c_{n}")  # (no SQL keyword)
_columns = st.lists(st.tuples(_names, st.sampled_from(["VARCHAR", "BIGINT", "DOUBLE", "BOOLEAN"]), st.booleans(),
                              st.booleans(), st.sampled_from(["", "  -- a comment, with commas; and (parens)"])),
                    min_size=1, max_size=8, unique_by=lambda c: c[0])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(_names, _columns), min_size=1, max_size=3, unique_by=lambda t: t[0]))
def test_generated_ddl_reads_as_duckdb_reads_it(tables):
    text = "-- header comment\n" + "\n".join(
        f"CREATE TABLE t_{name} (\n" + "\n".join(
            f"    {column} {kind}{'[]' if is_list else ''}{' NOT NULL' if not_null else ''}"
            f"{',' if i < len(columns) - 1 else ''}{comment}"
            for i, (column, kind, is_list, not_null, comment) in enumerate(columns)) + "\n);\n"
        for name, columns in tables)
    ours, duckdbs = parse_ddl(text), duckdb_arrow_schemas(text)
    assert sorted(ours) == sorted(duckdbs)
    for table, schema in ours.items():
        assert schema.equals(duckdbs[table]), (table, schema, duckdbs[table])


@pytest.mark.parametrize("column", ["amount DECIMAL(10,2)", "at TIMESTAMP", "n INTEGER", "id VARCHAR PRIMARY KEY",
                                    "tags MAP(VARCHAR, VARCHAR)"])
def test_a_column_it_cannot_map_is_named_not_guessed(column):
    with pytest.raises(SchemaError, match=r"store.sql, table things: cannot map column"):
        parse_ddl(f"CREATE TABLE things (\n    id VARCHAR NOT NULL,\n    {column}\n);\n")
