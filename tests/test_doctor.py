"""Damaged segments: queries go on over the rest (with a warning naming the file), and
`otel-replay doctor` finds them (`--check` only reports, exiting 1), quarantines them keeping
their relative path with a note, and removes stale temp files."""

from __future__ import annotations

import logging
import os
import time

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from otel_replay import ReplayProcessor, Store
from otel_replay.cli import main as cli
from otel_replay.store.doctor import doctor, forget_damage
from otel_replay.store.location import StoreLocation
from tests.harness.corruption import corruption_trials
from tests.helpers import chat_attributes, provider_with

FLUSHES = 4


@pytest.fixture
def store(tmp_path):
    """A store with FLUSHES segment sets of 5 chat spans each; the process forgets damage seen before."""
    forget_damage()
    root = tmp_path / "store"
    processor = ReplayProcessor(root, flush_interval_s=3600)
    provider = provider_with(processor)
    tracer = provider.get_tracer("t")
    for f in range(FLUSHES):
        for i in range(5):
            with tracer.start_as_current_span(f"chat {f}-{i}", attributes=chat_attributes(f"q {f}-{i} " * 50)):
                pass
        assert processor.force_flush(10_000)
    provider.shutdown()
    yield root
    forget_damage()


def _steps(root) -> int:
    return Store(root).sql("select count(*) n from steps").column("n")[0].as_py()


def _segments(root, table):
    return sorted((root / table).glob("*/*.parquet"))


def _flip_in_first_data_page(path, column: str) -> None:
    """Flip a bit inside the compressed values of `column` (the page checksum covers it)."""
    meta = pq.read_metadata(path).row_group(0)
    chunk = next(meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema == column)
    start = min(o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o is not None)
    data = bytearray(path.read_bytes())
    data[start + chunk.total_compressed_size - 3] ^= 0x10  # in the last page's compressed values (its header
    # holds min/max statistics, which no reader uses and no checksum covers)
    path.write_bytes(bytes(data))


def test_queries_skip_a_truncated_segment_and_say_which(store, caplog):
    victim = _segments(store, "step_rows")[1]
    victim.write_bytes(victim.read_bytes()[:200])
    with caplog.at_level(logging.WARNING, logger="otel_replay"):
        assert _steps(store) == 5 * (FLUSHES - 1)  # the other segments still answer
        assert _steps(store) == 5 * (FLUSHES - 1)
    warnings = [r.getMessage() for r in caplog.records if "damaged segment" in r.getMessage()]
    assert len(warnings) == 1  # once per file, not once per query
    assert str(victim) in warnings[0] and "otel-replay doctor" in warnings[0]
    assert Store(store).list_traces(limit=100).num_rows == 5 * FLUSHES  # the spans of that flush are intact


def test_doctor_check_reports_and_doctor_quarantines_keeping_the_relative_path(store):
    truncated = _segments(store, "span_rows")[0]
    truncated.write_bytes(truncated.read_bytes()[:-30])
    flipped = _segments(store, "message_rows")[2]
    _flip_in_first_data_page(flipped, "body")
    runner = CliRunner()
    check = runner.invoke(cli, ["--store", str(store), "doctor", "--check"])
    assert check.exit_code == 1, check.output
    rel_truncated, rel_flipped = (p.relative_to(store).as_posix() for p in (truncated, flipped))
    assert f"damaged segment {rel_truncated}:" in check.output and f"damaged segment {rel_flipped}:" in check.output
    assert "CRC" in check.output  # the flip was caught by the page checksum
    assert truncated.exists() and flipped.exists()  # --check changes nothing
    fix = runner.invoke(cli, ["--store", str(store), "doctor"])
    assert fix.exit_code == 0, fix.output
    assert f"-> moved to quarantine/{rel_truncated}" in fix.output
    for rel in (rel_truncated, rel_flipped):
        assert not (store / rel).exists() and (store / "quarantine" / rel).exists()
        note = (store / "quarantine" / f"{rel}.error.txt").read_text()
        assert rel in note and "quarantined by otel-replay doctor" in note
    again = runner.invoke(cli, ["--store", str(store), "doctor", "--check"])
    assert again.exit_code == 0 and "0 damaged" in again.output
    assert _steps(store) == 5 * FLUSHES  # step segments were untouched; the views read the rest


def test_a_flipped_bit_in_the_footer_schema_is_damage(store):
    segment = _segments(store, "message_rows")[0]
    data = segment.read_bytes()
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    at = data.find(b"body", footer)  # the column's name in the footer's schema
    segment.write_bytes(data[:at] + b"bodx" + data[at + 4:])  # 'y' ^ 'x' is one bit
    (damage,) = doctor(store, fix=False).damaged
    assert "one flipped bit from the declared column 'body'" in damage.error


def test_doctor_removes_stale_temp_files_and_leaves_recent_ones(store):
    day = _segments(store, "span_rows")[0].parent
    stale, recent = day / ".old.parquet.tmp", day / ".new.parquet.tmp"
    stale.write_bytes(b"PAR1 torn")
    recent.write_bytes(b"PAR1 being written")
    hour_ago = time.time() - 7200
    os.utime(stale, (hour_ago, hour_ago))
    runner = CliRunner()
    check = runner.invoke(cli, ["--store", str(store), "doctor", "--check"])
    assert check.exit_code == 1 and "1 stale left" in check.output and stale.exists()
    fix = runner.invoke(cli, ["--store", str(store), "doctor"])
    assert fix.exit_code == 0 and "1 removed" in fix.output and "1 recent" in fix.output
    assert not stale.exists() and recent.exists()


def test_a_healthy_store_has_no_problems_and_a_missing_one_is_a_clear_error(store, tmp_path):
    report = doctor(store, fix=False)
    assert report.problems == 0 and report.checked == len(list(store.glob("*/*/*.parquet")))
    missing = CliRunner().invoke(cli, ["--store", str(tmp_path / "nowhere"), "doctor"])
    assert missing.exit_code == 1 and "no store at" in missing.output


def test_corruption_trials_find_every_damaging_change(tmp_path):
    result = corruption_trials(tmp_path / "store", damaged=8, seed=2)
    assert result["detected_by_mode"]["truncate"] == result["by_mode"]["truncate"] == 4
    assert result["undetected_harmful"] == 0 and result["false_positives"] == 0, result
    assert result["query"]["answered"], result
    assert result["clean_after_doctor"] and result["quarantined"] == result["detected"], result


def test_a_remote_style_location_is_checked_through_its_bytes(store):
    """The full check reads through `StoreLocation.read_bytes` when a store is not a local path."""
    from otel_replay.store.doctor import check_segment
    from otel_replay.store.location import Segment

    location = StoreLocation(store)
    path = _segments(store, "step_rows")[0]
    segment = Segment("step_rows", path.parent.name[4:], path.name, path.stat().st_size)
    assert check_segment(location, segment) is None
    path.write_bytes(path.read_bytes()[:-10])
    assert "magic" in check_segment(location, segment).lower()
