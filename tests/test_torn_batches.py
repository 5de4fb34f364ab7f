"""A batch is seen whole or not at all: kill -9 of `import` between two segments of one batch."""

from __future__ import annotations

import signal

import pytest
from click.testing import CliRunner

from otel_replay import Store
from otel_replay.cli import main
from otel_replay.store.batches import read_batch_manifests, retire_own, write_batch_segments
from otel_replay.store.location import StoreLocation
from tests.harness.torn import import_killed_after, otlp_file

TRACES = 40


def _counts(store: Store) -> tuple[int, int]:
    spans = store.sql("select count(*) n from spans").column("n")[0].as_py()
    steps = store.sql("select count(*) n from steps").column("n")[0].as_py()
    return spans, steps


@pytest.fixture
def torn(tmp_path):
    """A store in which an import was killed right after its span segment (steps not yet written)."""
    file = tmp_path / "runs.json"
    spans = otlp_file(file, TRACES)
    store = tmp_path / "store"
    assert import_killed_after(store, file, "span_rows") == -signal.SIGKILL
    assert list((store / "span_rows").glob("*/*.parquet")) and not (store / "step_rows").exists()
    return store, file, spans


def test_a_torn_import_is_invisible_and_a_rerun_stores_it_whole(torn):
    store, file, spans = torn
    assert _counts(Store(store)) == (0, 0)  # the span segment is on disk, but its batch is not whole
    rerun = CliRunner().invoke(main, ["--store", str(store), "import", "otlp", "--jobs", "1", str(file)])
    assert rerun.exit_code == 0, rerun.output
    assert "already in the store" not in rerun.output or " 0 already" in rerun.output, rerun.output
    assert _counts(Store(store)) == (spans, spans)  # every span, and its step (the agent span is a step too)


def test_doctor_finds_a_torn_batch_and_rolls_it_back(torn):
    store, file, _ = torn
    runner = CliRunner()
    check = runner.invoke(main, ["--store", str(store), "doctor", "--check"])
    assert check.exit_code == 1, check.output  # the importer is gone (same host): torn at once
    assert "torn batch _batches/" in check.output and "2 of 3 segments written" in check.output, check.output
    assert list((store / "span_rows").glob("*/*.parquet"))  # --check changes nothing
    fix = runner.invoke(main, ["--store", str(store), "doctor"])
    assert fix.exit_code == 0 and "rolled back" in fix.output, fix.output
    assert not list((store / "span_rows").glob("*/*.parquet")) and not read_batch_manifests(store)
    again = runner.invoke(main, ["--store", str(store), "doctor", "--check"])
    assert again.exit_code == 0 and "torn batches: 0" in again.output, again.output


def test_a_kill_after_the_payloads_leaves_nothing_visible_either(tmp_path):
    file = tmp_path / "runs.json"
    otlp_file(file, 5)
    store = tmp_path / "store"
    assert import_killed_after(store, file, "message_rows") == -signal.SIGKILL
    assert list((store / "message_rows").glob("*/*.parquet"))
    assert Store(store).sql("select count(*) n from messages").column("n")[0].as_py() == 0


def test_compaction_leaves_a_torn_batch_out_and_keeps_whole_ones(torn, tmp_path):
    store, file, spans = torn
    other = tmp_path / "more.json"
    more = otlp_file(other, TRACES, first=TRACES)
    runner = CliRunner()
    for path in (file, other):  # two whole batches beside the torn one: something to compact
        assert runner.invoke(main, ["--store", str(store), "import", "otlp", "--jobs", "1", str(path)]).exit_code == 0
    compact = runner.invoke(main, ["--store", str(store), "compact"])
    assert compact.exit_code == 0 and "span_rows" in compact.output, compact.output
    assert _counts(Store(store)) == (spans + more, spans + more)  # the torn segment was not compacted in
    for manifest in read_batch_manifests(store):  # none left naming a compacted-away segment (it would hide the rest)
        assert all((store / rel).exists() for rel in manifest.segments), manifest


def test_a_write_retires_only_its_own_stores_manifests(tmp_path):
    """A process writing two stores: a write to one never touches (or waits on) the other's manifests."""
    first, second = StoreLocation.of(tmp_path / "first"), StoreLocation.of(tmp_path / "second")
    for location in (first, second):
        write_batch_segments(location, [(f"notes/day=2026-01-01/{n}.parquet", lambda h: h.write(b"x")) for n in "ab"],
                             f"{location.local.name}.json")
    assert [len(read_batch_manifests(s)) for s in (first, second)] == [1, 1]  # younger than LINGER_S: kept
    assert retire_own(second, older_than_s=0) == 1
    assert [len(read_batch_manifests(s)) for s in (first, second)] == [1, 0]
    assert retire_own(second, older_than_s=0) == 0
    assert retire_own(first, older_than_s=0) == 1
    assert [len(read_batch_manifests(s)) for s in (first, second)] == [0, 0]
