"""Crash safety: kill -9 of a writing process leaves a store that opens, holds everything a
force_flush acknowledged, and shows readers no partial segment; readers reading while a writer
writes never see a half-written file. Real subprocesses, real SIGKILL, real Parquet files."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otel_replay import Store
from otel_replay.store.layout import write_segment
from otel_replay.store.schema import schema_of
from tests.harness.crashes import (
    concurrent_reads,
    crash_trial,
    run_crash_trials,
    verify_store,
)


def test_one_kill_9_loses_nothing_that_was_flushed(tmp_path):
    root = tmp_path / "store"
    trial = crash_trial(root, seed=3, delay_s=1.0)  # after many flushes, mid-stream
    assert trial.problems == [], trial
    assert trial.flushed > 0 and trial.lost_flushed == 0, trial
    assert trial.present >= trial.flushed, trial


@pytest.mark.slow
def test_fifty_kill_9_at_random_moments(tmp_path):
    result = run_crash_trials(tmp_path / "store", trials=50, seed=1)
    summary = {k: v for k, v in result.items() if k != "trials"}
    context = json.dumps(summary, indent=1)
    assert result["problems"] == [], context
    assert result["survived"] == 50, context
    assert result["lost_flushed_max"] == 0, context  # at most the unflushed queue is lost
    assert result["flushed_spans"] > 1000, context
    assert result["mid_write_kills"] > 0, context  # some kills did land while a segment was being written
    assert result["segments_checked"] > 100, context


def test_readers_never_see_a_half_written_segment(tmp_path):
    result = concurrent_reads(tmp_path / "store", seconds=2.5)
    assert result["errors"] == [], result
    assert result["count_went_down"] == 0, result  # a reader never sees rows disappear either
    assert result["partial_batches_seen"] == 0, result  # nor a span without its step (a batch seen in part)
    assert result["queries"] >= 3 and result["files_read"] > 5 and result["final_count"] > 0, result


def test_a_crashed_writers_temp_file_is_invisible_to_readers(tmp_path):
    table = pa.Table.from_pylist([{"trace_id": "ab" * 16, "span_id": "cd" * 8, "name": "chat m", "source": "test",
                                   "ingested_ns": 1}], schema=schema_of("span_rows"))
    good = write_segment(tmp_path, "span_rows", "2026-01-01", table)
    torn = good.parent / f".{good.stem}-x.parquet.tmp"  # what a writer killed mid-write leaves
    torn.write_bytes(good.read_bytes()[:100])
    assert Store(tmp_path).sql("select count(*) n from spans").column("n")[0].as_py() == 1
    check = verify_store(tmp_path)
    assert check.problems == [] and check.temp_files == 1
    assert pq.read_table(good).num_rows == 1
