"""Many writers, one store, compaction while they write: every row is seen exactly once, always.

Real subprocesses with the real ReplayProcessor write without coordinating; compaction runs over
and over meanwhile; a reader thread checks each snapshot it reads: no row twice, no row lost
since the previous read, and at the end exactly the rows the writers reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pyarrow.parquet as pq
import pytest

from otel_replay import Store
from otel_replay.store import StoreLocation
from otel_replay.store.catalog import StoreError
from otel_replay.store.compact import compact_store, finish, rewrite_partition
from otel_replay.store.ingest import ingest
from otel_replay.store.lease import CompactorLease
from otel_replay.store.snapshot import MANIFEST_DIR, write_manifest
from tests.helpers import REPO
from tests.test_store import _chat_span

ID = "select trace_id || ':' || span_id as id from span_rows"


def _ids(store: Store) -> list[str]:
    return store.sql(ID).column("id").to_pylist()


def _fill(root, batches: int, per_batch: int = 25, offset: int = 0) -> None:
    for b in range(batches):
        ingest(root, [_chat_span(1000 * (b + offset) + t, t + 1, []) for t in range(per_batch)], source="test")


def _raw_rows(root) -> int:
    """Rows in every span_rows file on disk, superseded or not (what a naive glob would count)."""
    return sum(pq.ParquetFile(p).metadata.num_rows for p in root.glob("span_rows/*/*.parquet"))


def test_each_row_counts_once_at_every_step_of_a_compaction(tmp_path):
    _fill(tmp_path, 4)
    store, location = Store(tmp_path), StoreLocation(tmp_path)
    expected = sorted(_ids(store))
    assert len(expected) == 100
    (day,) = {s.day for s in store.snapshot().live["span_rows"]}
    inputs = store.snapshot().live["span_rows"]

    # a compactor that died after its manifest, before its output: nothing is left out
    write_manifest(location, "span_rows", day, f"span_rows/day={day}/never-written.parquet", [s.rel for s in inputs])
    assert sorted(_ids(store)) == expected
    assert finish(location) == 1 and not list((tmp_path / MANIFEST_DIR).iterdir())

    # output written, inputs not yet deleted: both are on disk, each row still counts once
    first = rewrite_partition(location, "span_rows", day, inputs)
    assert first.files_in == 4 and _raw_rows(tmp_path) == 200
    assert sorted(_ids(store)) == expected

    # a writer adds a segment; a second compaction consumes the first one's output before it finished
    _fill(tmp_path, 1, offset=9)
    expected = sorted(_ids(store))
    assert len(expected) == 125
    live = store.snapshot().live["span_rows"]
    assert len(live) == 2  # the first output and the new segment; the four inputs are left out
    rewrite_partition(location, "span_rows", day, live)
    assert _raw_rows(tmp_path) == 100 + 100 + 125 + 25
    assert sorted(_ids(store)) == expected

    # finishing deletes exactly the inputs, oldest compaction first, and the manifests last
    assert finish(location) == 2
    (left,) = store.snapshot().live["span_rows"]
    assert sorted(p.name for p in (tmp_path / "span_rows" / f"day={day}").iterdir()) == [left.name]
    assert not list((tmp_path / MANIFEST_DIR).iterdir())
    assert sorted(_ids(store)) == expected and _raw_rows(tmp_path) == 125


def test_a_reader_whose_segments_vanish_mid_query_reads_a_fresh_snapshot(tmp_path):
    _fill(tmp_path, 4)
    store = Store(tmp_path)
    attempts = []

    def count(con) -> int:
        if not attempts:  # between this reader's listing and its read, a compaction runs to the end
            compact_store(tmp_path, grace_s=0)
        attempts.append(1)
        return con.sql("select count(*) from span_rows").fetchall()[0][0]

    assert store.read(count) == 100 and len(attempts) == 2


def test_a_second_compaction_at_the_same_time_is_refused(tmp_path):
    _fill(tmp_path, 3)
    location = StoreLocation(tmp_path)
    with CompactorLease(location), pytest.raises(StoreError, match="another compaction of .* is running"):
        compact_store(tmp_path)
    assert len(Store(tmp_path).snapshot().live["span_rows"]) == 3  # the refused run touched nothing
    assert len(compact_store(tmp_path)) == 3  # once the first one is done, the next runs


def _start_writers(root: str, count: int, tags: str, env: dict[str, str] | None, pace: tuple[float, float],
                   ) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-m", "tests.agents.steady_writer", root, str(count), tag,
                              *map(str, pace)], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
            for tag in tags]


class Reader(threading.Thread):
    """Reads the span ids over and over; records any snapshot that double counts or loses a row."""

    def __init__(self, store: Store) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.stop = threading.Event()
        self.reads: list[int] = []
        self.problems: list[str] = []

    def run(self) -> None:
        seen: set[str] = set()
        while not self.stop.is_set():
            try:
                ids = _ids(self.store)
            except Exception as exc:  # noqa: BLE001 - a failed read is a finding, reported below
                if "no store at" not in str(exc):
                    self.problems.append(f"read failed: {exc}")
                time.sleep(0.02)
                continue
            now = set(ids)
            if len(now) != len(ids):
                self.problems.append(f"read {len(self.reads)}: {len(ids) - len(now)} rows counted twice")
            if not seen <= now:
                self.problems.append(f"read {len(self.reads)}: {len(seen - now)} rows seen before are missing")
            seen = now
            self.reads.append(len(ids))


def _run_many_writers(store_url: str, writers: str, spans_each: int, env: dict[str, str] | None = None,
                      pace: tuple[float, float] = (0.01, 0.03)) -> dict:
    """Writers (each: a span every pace[0] s, a flush every pace[1] s), compaction in a loop, a reader."""
    procs = _start_writers(store_url, spans_each, writers, env, pace)
    reader = Reader(Store(store_url))
    reader.start()
    compactions = rewritten = 0
    try:
        while any(p.poll() is None for p in procs):
            try:
                results = compact_store(store_url, grace_s=0.05 * (compactions % 2))  # alternate: none, 50 ms
            except Exception as exc:  # noqa: BLE001
                if "no store at" in str(exc) or not StoreLocation(store_url).exists():
                    time.sleep(0.05)
                    continue
                raise
            compactions += 1
            rewritten += sum(r.files_in for r in results if r.table == "span_rows")
            time.sleep(0.05)
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    compact_store(store_url, grace_s=0)
    time.sleep(0.2)
    reader.stop.set()
    reader.join(timeout=60)
    written = [i for out, _ in outputs for i in json.loads(out.strip().splitlines()[-1])]
    final = _ids(Store(store_url))
    return {"written": written, "final": final, "reader": reader, "compactions": compactions, "rewritten": rewritten}


def test_four_writer_processes_and_repeated_compaction_never_lose_or_double_a_row(tmp_path):
    run = _run_many_writers(str(tmp_path / "store"), "abcd", 300)
    reader = run["reader"]
    assert not reader.problems, reader.problems[:5]
    assert len(run["written"]) == 4 * 300 == len(set(run["written"]))
    assert sorted(run["final"]) == sorted(run["written"])  # exactly the rows written, each once
    assert reader.reads == sorted(reader.reads) and reader.reads[-1] == 1200  # monotonic, complete
    assert run["compactions"] >= 3 and run["rewritten"] > 0, run  # compaction really ran beside the writers
    assert any(0 < n < 1200 for n in reader.reads), reader.reads  # it read while the writers wrote
    live = Store(tmp_path / "store").snapshot().live
    assert len(live["span_rows"]) == len({s.day for s in live["span_rows"]})  # one segment per day at the end
    steps = Store(tmp_path / "store").sql("select count(*) n, count(distinct span_id) d from step_rows").to_pylist()
    assert steps == [{"n": 1200, "d": 1200}]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_many_writers_on_s3_with_compaction(tmp_path):
    """The same on an S3-compatible server (its own process): writers PUT segments, compaction
    deletes objects, the reader lists and reads through s3fs."""
    import urllib.request

    from tests.test_object_store import s3fs  # skips without the s3 extras

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                urllib.request.urlopen(endpoint, timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            s3fs.S3FileSystem.clear_instance_cache()
            s3fs.S3FileSystem().mkdir("writers")
            run = _run_many_writers("s3://writers/store", "abcd", 300, env, pace=(0.03, 0.2))
            s3fs.S3FileSystem.clear_instance_cache()
    finally:
        server.terminate()
        server.wait(timeout=30)
    reader = run["reader"]
    assert not reader.problems, reader.problems[:5]
    assert sorted(run["final"]) == sorted(run["written"]) and len(run["written"]) == 1200
    assert reader.reads == sorted(reader.reads) and reader.reads[-1] == 1200
    assert any(0 < n < 1200 for n in reader.reads), reader.reads  # it read while the writers wrote
    assert run["compactions"] >= 2 and run["rewritten"] > 0, run
