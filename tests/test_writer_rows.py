"""Rows as tuples in each table's column order: the same Arrow tables as rows by column name."""

from __future__ import annotations

import json

import pyarrow as pa

from otel_replay.normalize.pipeline import normalize_span
from otel_replay.normalize.records import SpanEvent, SpanRecord
from otel_replay.store.rows import COLUMNS, RowBatch, RowBuilder
from otel_replay.store.schema import schema_of
from otel_replay.store.writer import ArrowParts, to_arrow


def _span(i: int, user: str, day_ns: int = 1_700_000_000_000_000_000) -> SpanRecord:
    history = [{"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
               {"role": "user", "parts": [{"type": "text", "content": user}]}]
    return SpanRecord(
        trace_id=f"{i:032x}", span_id=f"{i:016x}", parent_span_id=None, name="chat m",
        start_ns=day_ns + i, end_ns=day_ns + i + 1000, events=[SpanEvent("retry", day_ns + i, {"n": 1})],
        attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                    "gen_ai.response.finish_reasons": ["stop"],
                    "gen_ai.input.messages": json.dumps(history),
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": f"a{i}"}]}])},
        resource={"service.name": "svc"},
    )


def _batch(spans: list[SpanRecord]) -> RowBatch:
    batch = RowBatch()
    RowBuilder("test").add_all(batch, [normalize_span(s) for s in spans])
    return batch


def test_each_tables_columns_are_the_declared_ones_in_order():
    for table, names in COLUMNS.items():
        assert list(names) == schema_of(table).names, table


def test_tuple_rows_convert_to_the_tables_their_named_rows_convert_to():
    # two days, so rows are grouped by day as well as by table
    batch = _batch([_span(i, f"question {i}") for i in range(5)] + [_span(9, "later", 1_700_100_000_000_000_000)])
    assert len(batch) == 6 and len(batch.span_rows) == 2 and len(batch.message_rows) == 13  # the system message once
    for day, rows in batch.span_rows.items():
        assert to_arrow(rows, "span_rows").equals(pa.Table.from_pylist(batch.spans[day], schema=schema_of("span_rows")))
    for day, rows in batch.step_rows.items():
        assert to_arrow(rows, "step_rows").equals(pa.Table.from_pylist(batch.steps[day], schema=schema_of("step_rows")))
    messages = to_arrow(batch.message_rows, "message_rows")
    assert messages.equals(pa.Table.from_pylist(batch.messages, schema=schema_of("message_rows")))
    step = batch.steps[min(batch.steps)][0]
    assert step["finish_reasons"] == ("stop",) and step["has_payload"] is True and len(step["input_hashes"]) == 2


def test_paced_conversion_in_small_chunks_gives_the_same_table():
    batch = _batch([_span(i, f"q{i}") for i in range(600)])
    (rows,) = batch.step_rows.values()
    paced = to_arrow(rows, "step_rows", pace=lambda: None)  # ARROW_CHUNK rows at a time
    assert paced.num_rows == 600 and paced.equals(to_arrow(rows, "step_rows"))


def test_a_lone_surrogate_in_a_tuple_row_is_stored_replaced_not_refused():
    batch = _batch([_span(1, "fine")])
    (rows,) = batch.step_rows.values()
    names = COLUMNS["step_rows"]
    row = list(rows[0])
    row[names.index("name")] = "chat \ud800"
    row[names.index("finish_reasons")] = ("stop\udc00",)
    table = to_arrow([tuple(row)], "step_rows")
    assert table.column("name").to_pylist() == ["chat ?"]
    assert table.column("finish_reasons").to_pylist() == [["stop?"]]


def test_arrow_parts_take_all_of_a_batch():
    parts = ArrowParts()
    batch = _batch([_span(i, f"q{i}") for i in range(3)])
    parts.take(batch)
    assert sum(t.num_rows for tables in parts.spans.values() for t in tables) == 3
    assert sum(t.num_rows for tables in parts.steps.values() for t in tables) == 3
    assert sum(t.num_rows for t in parts.messages) == len(batch.message_rows) == 7  # the system message once
