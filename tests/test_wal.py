"""The write-ahead log of `collect --durable` (`otel_replay.capture.wal`), on real files.

- appends from many threads while another seals: every record in exactly one segment, whole,
  with fewer fsyncs than records (group commit);
- a torn tail (a kill during an append) or a damaged record ends the segment's records;
- only the directories of owners that died are claimed for replay.
"""

from __future__ import annotations

import os
import threading

from otel_replay.capture.wal import (
    WAL_DIR,
    SegmentReader,
    WriteAheadLog,
    claim_orphans,
    new_owner_dir,
)
from tests.test_collect_durable import dead_owner_log

APPENDS = 800  # ~200 bytes each, from eight threads; each append waits for an fsync


def test_concurrent_appends_share_fsyncs_and_read_back_whole(tmp_path):
    """Eight threads append while a ninth seals the log as fast as it can (and appends seal it at
    20 KB): every record is in exactly one segment, whole, and some fsyncs served several appends."""
    wal = WriteAheadLog(tmp_path / WAL_DIR / "owner", segment_bytes=20_000)
    bodies = [os.urandom(200) + i.to_bytes(2, "big") for i in range(APPENDS)]
    errors: list[BaseException] = []
    appending = threading.Event()
    appending.set()

    def append(chunk: list[bytes]) -> None:
        try:
            for body in chunk:
                wal.release(wal.append("traces", False, body))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def seal() -> None:
        while appending.is_set():
            wal.seal()

    sealer = threading.Thread(target=seal)
    sealer.start()
    threads = [threading.Thread(target=append, args=(bodies[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    appending.clear()
    sealer.join()
    wal.close()
    assert errors == []
    segments = wal.take_sealed()
    read = [r.body for segment in segments for r in SegmentReader(segment.path)]
    assert sorted(read) == sorted(bodies) and len(segments) > 1
    assert all(segment.pending == 0 for segment in segments)
    assert wal.records == APPENDS and 0 < wal.syncs < APPENDS
    print(f"{APPENDS} appends from 8 threads into {len(segments)} segments: {wal.syncs} fdatasync calls")
    for segment in segments:
        segment.path.unlink()
    wal.remove()


def test_a_torn_or_damaged_record_ends_the_segment(tmp_path):
    wal = WriteAheadLog(tmp_path / "owner")
    for i in range(3):
        wal.release(wal.append("logs" if i == 1 else "traces", i == 2, f"body {i}".encode() * 10))
    wal.close()
    path = wal.take_sealed()[0].path
    whole = path.read_bytes()
    records = list(SegmentReader(path))
    assert [(r.signal, r.as_json) for r in records] == [("traces", False), ("logs", False), ("traces", True)]
    path.write_bytes(whole[:-5])  # a kill in the middle of the last append
    reader = SegmentReader(path)
    assert [r.body for r in reader] == [r.body for r in records[:2]] and reader.torn > 0
    damaged = bytearray(whole)
    damaged[len(whole) // 2] ^= 0x40  # a bit flip in the second record
    path.write_bytes(bytes(damaged))
    assert [r.body for r in SegmentReader(path)] == [records[0].body]


def test_only_the_directories_of_dead_owners_are_claimed(tmp_path):
    live = WriteAheadLog(new_owner_dir(tmp_path, "p"))
    dead = dead_owner_log(tmp_path, [("traces", b"x", False)])
    claimed = claim_orphans(tmp_path)
    assert [c.path for c in claimed] == [dead]
    assert claim_orphans(tmp_path) == []  # held by the first claim
    claimed[0].remove()
    assert not dead.exists() and live.directory.exists()
    live.close()
    live.remove()
