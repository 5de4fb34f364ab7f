"""`otel-replay import --jobs N`: worker processes store exactly what one process stores."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from benchmarks.imports import _trace, write_otlp_json
from otel_replay import Store
from otel_replay.cli import main as cli
from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.store.ingest_parallel import (
    can_fork,
    ingest_parallel,
    jobs_for,
    partition_of,
    split,
)
from tests.helpers import FIXTURES

OTEL = FIXTURES / "otel"
pytestmark = [
    pytest.mark.skipif(not can_fork(), reason="parallel import needs the fork start method"),
]


def imp(store, *args):
    return CliRunner().invoke(cli, ["--store", str(store), "import", "otlp", *map(str, args)])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Every OTLP fixture (traces and their log events) plus 150 generated agent traces."""
    work = tmp_path_factory.mktemp("inputs")
    generated = work / "generated.json"
    write_otlp_json([s for i in range(150) for s in _trace(i)], generated)
    return [generated, *sorted(OTEL.glob("*.otlp.json"))]


def table(store, sql):
    return sorted(json.dumps(row, sort_keys=True, default=str) for row in Store(store).sql(sql).to_pylist())


@pytest.mark.slow  # ~15 s on every fixture; test_import_split.py compares three workers with one on a messy file in the default suite
def test_three_workers_store_the_same_rows_as_one_process(tmp_path, inputs):
    one, three = tmp_path / "one", tmp_path / "three"
    first = imp(one, "--jobs", "1", *inputs)
    assert first.exit_code == 0, first.output
    second = imp(three, "--jobs", "3", *inputs)
    assert second.exit_code == 0, second.output
    assert first.output == second.output  # the same summary: traces, spans, steps, skipped records
    for sql in ("select * exclude (ingested_ns) from steps",
                "select * exclude (ingested_ns) from spans",
                "select distinct hash, kind, role, body from messages"):
        assert table(one, sql) == table(three, sql), sql
    # the log events of the fixtures reached their spans in whichever worker had the trace
    assert Store(three).sql("select count(*) as n from steps where has_payload").column("n")[0].as_py() > 0
    store_one, store_three = Store(one), Store(three)
    for tid in store_one.sql("select trace_id from traces order by trace_id limit 40").column("trace_id").to_pylist():
        a, b = store_one.trajectory(tid), store_three.trajectory(tid)
        assert [(s.kind, s.name, s.inputs, s.outputs) for s in a.steps] == \
               [(s.kind, s.name, s.inputs, s.outputs) for s in b.steps]
    writers = {p.name.split("-")[-3] for p in (three / "step_rows").rglob("*.parquet")}  # name: time-host-pid-tag-seq
    assert len(writers) == 3


def test_a_second_parallel_import_stores_nothing_twice(tmp_path, inputs):
    assert imp(tmp_path, "--jobs", "2", *inputs).exit_code == 0
    spans = Store(tmp_path).sql("select count(*) as n from spans").column("n")[0].as_py()
    again = imp(tmp_path, "--jobs", "2", *inputs)
    assert again.exit_code == 0 and f"0 spans stored (0 steps), {spans} already in the store" in again.output
    assert Store(tmp_path).sql("select count(*) as n from spans").column("n")[0].as_py() == spans


def test_a_failing_worker_fails_the_import(tmp_path):
    spans = [SpanRecord(f"{t:032x}", f"{t:016x}", None, "chat m", "CLIENT", 1, 2, "unset", None,
                        {"gen_ai.operation.name": "chat"}, [], [], {}, None, None) for t in range(1, 9)]

    def refuse(item):
        raise RuntimeError(f"refused {item.span.trace_id}")

    with pytest.raises(RuntimeError, match="refused"):
        ingest_parallel(tmp_path, spans, source="test", jobs=2, privacy=refuse)


def test_log_events_go_with_the_span_they_name():
    spans = [SpanRecord(f"{t:032x}", f"{t:016x}", None, "chat m", "CLIENT", 1, 2, "unset", None, {}, [], [], {},
                        None, None) for t in range(1, 40)]
    logs = [LogEvent("gen_ai.choice", None, f"{t:016x}", 1, {}) for t in range(1, 40)]  # no trace id on the log
    logs.append(LogEvent("gen_ai.choice", f"{99:032x}", None, 1, {}))  # no span: by its trace
    span_parts, log_parts = split(spans, logs, 4)
    for part, (these_spans, these_logs) in enumerate(zip(span_parts, log_parts, strict=True)):
        assert {s.span_id for s in these_spans} >= {g.span_id for g in these_logs if g.span_id}
        assert all(partition_of(s.trace_id, 4) == part for s in these_spans)
    assert sum(map(len, log_parts)) == len(logs)
    assert logs[-1] in log_parts[partition_of(f"{99:032x}", 4)]


def test_worker_count():
    assert jobs_for(100, 3, 8) == 3  # never more workers than traces
    assert jobs_for(100, 50, 4) == 4
    assert jobs_for(100, 50, None) == 1  # automatic: small imports stay in-process
    assert 1 <= jobs_for(1_000_000, 100_000, 0) <= 8
