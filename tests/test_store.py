"""The store: one declared schema, atomic segments, compaction, and a lossless round trip."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_replay import Store
from otel_replay.normalize.messages import canonical_messages
from otel_replay.normalize.pipeline import normalize_span
from otel_replay.normalize.records import SpanRecord
from otel_replay.store import compact
from otel_replay.store.compact import compact_day, days
from otel_replay.store.ingest import existing_span_ids, ingest
from otel_replay.store.layout import write_segment
from otel_replay.store.rows import RowBatch, RowBuilder
from otel_replay.store.schema import arrow_schemas, schema_of
from otel_replay.store.writer import to_arrow, warm_up


def _chat_span(trace: int, span: int, messages: list, answer: str = "ok", start: int = 1_700_000_000_000_000_000) -> SpanRecord:
    return SpanRecord(
        trace_id=f"{trace:032x}", span_id=f"{span:016x}", parent_span_id=None, name="chat m",
        start_ns=start + span, end_ns=start + span + 1000,
        attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                    "gen_ai.input.messages": json.dumps(messages),
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": answer}]}])},
    )


def _step_json_schema() -> dict:
    return json.loads(resources.files("otel_replay").joinpath("schemas/step-row.schema.json").read_text())


def test_code_rows_match_the_declared_schema():
    batch = RowBatch()
    RowBuilder("test").add(batch, normalize_span(_chat_span(1, 1, [{"role": "user", "parts": [{"type": "text", "content": "q"}]}])))
    (span_row,) = next(iter(batch.spans.values()))
    (step_row,) = next(iter(batch.steps.values()))
    assert list(span_row) == schema_of("span_rows").names
    assert list(step_row) == schema_of("step_rows").names
    assert list(batch.messages[0]) == schema_of("message_rows").names
    json_schema = _step_json_schema()
    assert sorted(json_schema["properties"]) == sorted(schema_of("step_rows").names)
    assert set(json_schema["required"]) == {f.name for f in schema_of("step_rows") if not f.nullable}
    jsonschema.validate(json.loads(json.dumps(step_row)), json_schema)  # the row as JSON (tuples are arrays)


def test_views_expose_every_declared_column(tmp_path):
    ingest(tmp_path, [_chat_span(1, 1, [])], source="test")
    store = Store(tmp_path)
    for view, table in (("spans", "span_rows"), ("steps", "step_rows")):
        columns = store.sql(f"select * from {view} limit 0").column_names
        assert set(schema_of(table).names) <= set(columns)
    assert store.sql("select * from messages limit 0").column_names == ["hash", "kind", "role", "body"]
    assert set(arrow_schemas()) == {"span_rows", "step_rows", "message_rows", "capture_stats", "job_rows",
                                    "rollout_rows", "result_rows", "report_rows", "outcome_rows", "skip_rows",
                                    "group_links", "budget_rows"}


def test_segments_are_atomic_and_a_failed_write_leaves_nothing(tmp_path):
    good = write_segment(tmp_path, "span_rows", "2026-01-01", schema_of("span_rows").empty_table())
    assert good.exists() and not list(tmp_path.glob("**/*.tmp"))
    with pytest.raises(AttributeError):  # the writer fails after the temp file was opened
        write_segment(tmp_path, "span_rows", "2026-01-01", "not a table")  # type: ignore[arg-type]
    files = sorted(p.name for p in (tmp_path / "span_rows" / "day=2026-01-01").iterdir())
    assert files == [good.name]  # the failed write left no partial or temp file
    assert (good.stat().st_mode & 0o777) == 0o600


def test_payloads_are_stored_once_per_message(tmp_path):
    system = {"role": "system", "parts": [{"type": "text", "content": "be brief " * 100}]}
    history = [system]
    spans = []
    for turn in range(10):
        history = history + [{"role": "user", "parts": [{"type": "text", "content": f"question {turn} " * 50}]}]
        spans.append(_chat_span(7, turn + 1, history, answer=f"answer {turn}"))
        history = history + [{"role": "assistant", "parts": [{"type": "text", "content": f"answer {turn}"}]}]
    ingest(tmp_path, spans, source="test")
    store = Store(tmp_path)
    # 1 system + 10 questions + 10 answers: each stored once although histories resend them
    assert store.sql("select count(*) n from messages").column("n")[0].as_py() == 21
    traj = store.trajectory(f"{7:032x}")
    assert [len(s.inputs) for s in traj.steps] == [2 * t + 2 for t in range(10)]
    assert traj.steps[-1].inputs[0] == system


def test_compaction_keeps_results_and_sorts_by_trace(tmp_path):
    for batch in range(5):
        ingest(tmp_path, [_chat_span(t * 7 + batch, t + 1, []) for t in range(40)], source="test")
    ingest(tmp_path, [_chat_span(3, 1, [])], source="test")  # a duplicate of an existing span
    store = Store(tmp_path)
    query = "select trace_id, span_id, kind, name from steps order by 1, 2"
    before = store.sql(query)
    assert before.num_rows == 200
    results = [r for day in days(tmp_path) for r in compact_day(tmp_path, day)]
    assert {r.table for r in results} == {"span_rows", "step_rows", "message_rows"}
    day = next(r.day for r in results if r.table == "span_rows")
    assert store.sql(query).equals(before)
    (segment,) = (tmp_path / "span_rows" / f"day={day}").glob("*.parquet")
    data = pq.read_table(segment)
    assert data.num_rows == 200 and data.column("trace_id").to_pylist() == sorted(data.column("trace_id").to_pylist())
    assert pq.ParquetFile(segment).metadata.row_group(0).num_rows <= compact.ROW_GROUP


messages = st.lists(
    st.fixed_dictionaries({
        "role": st.sampled_from(["user", "assistant", "system", "tool"]),
        "parts": st.lists(st.one_of(
            st.fixed_dictionaries({"type": st.just("text"), "content": st.text(max_size=200)}),
            st.fixed_dictionaries({"type": st.just("tool_call"), "id": st.text(min_size=1, max_size=12),
                                   "name": st.text(min_size=1, max_size=12),
                                   "arguments": st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=20), max_size=3)}),
        ), min_size=1, max_size=3),
    }),
    min_size=1, max_size=5,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=messages)
def test_round_trip_through_parquet_and_duckdb(tmp_path_factory, history):
    root = tmp_path_factory.mktemp("rt")
    ingest(root, [_chat_span(99, 1, history)], source="test", privacy=None)  # storage, not redaction (a key
    (step,) = Store(root).trajectory(f"{99:032x}").steps                     # named PASS is redacted, rightly)
    expected = canonical_messages(json.loads(json.dumps(history)))
    # canonical form drops empty text parts beside other parts; compare against that same rule
    assert list(step.inputs) == json.loads(json.dumps(expected, ensure_ascii=False).encode("utf-8", "replace"))


def test_what_is_already_stored_is_asked_only_of_a_store_with_spans(tmp_path):
    """Payloads alone (a crash between the message and span segments leaves that) hold no span;
    once spans are stored, the same question finds exactly them."""
    warm_up()  # writes nothing anywhere
    assert not tmp_path.joinpath("store").exists()
    root = tmp_path / "store"
    row = {"hash": "h1", "kind": "message", "role": "user", "body": "{}"}
    write_segment(root, "message_rows", "2026-01-01", to_arrow([row], "message_rows"))
    assert existing_span_ids(root, [f"{1:032x}"]) == set()
    ingest(root, [_chat_span(1, 1, [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}])], source="test")
    assert existing_span_ids(root, [f"{1:032x}", f"{2:032x}"]) == {(f"{1:032x}", f"{1:016x}")}


def test_integers_past_64_bits_keep_every_digit_through_the_store(tmp_path):
    """orjson reads such an integer as a float; the parse falls back to the json module for it."""
    history = [{"role": "assistant", "parts": [{"type": "tool_call", "id": "a", "name": "f",
                "arguments": {"big": 2**70, "low": -(2**64), "small": 5, "real": 1e300}}]}]
    ingest(tmp_path, [_chat_span(7, 1, history)], source="test", privacy=None)
    (step,) = Store(tmp_path).trajectory(f"{7:032x}").steps
    arguments = step.inputs[0]["parts"][0]["arguments"]
    assert arguments == {"big": 2**70, "low": -(2**64), "small": 5, "real": 1e300}
    assert type(arguments["big"]) is int and type(arguments["low"]) is int
