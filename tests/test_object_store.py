"""The store on object storage and on any fsspec URL: a real S3-compatible server (moto) on
127.0.0.1, s3fs, the real ReplayProcessor writing to it, the CLI and DuckDB reading it back."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from otel_replay import ReplayProcessor, Store
from otel_replay.cli import main as cli
from otel_replay.store import StoreLocation
from otel_replay.store.compact import compact_store
from otel_replay.store.ingest import ingest
from otel_replay.store.layout import write_segment
from otel_replay.store.schema import TABLES, schema_of
from tests.helpers import REPO, chat_attributes, local_s3, needs_openai_v2, provider_with
from tests.test_store import _chat_span

s3fs = pytest.importorskip("s3fs", reason="the s3 extra: pip install 'otel-replay[s3,s3-test]'")
pytest.importorskip("moto.server", reason="the s3-test extra: pip install 'otel-replay[s3-test]'")


@pytest.fixture(scope="module")
def s3_env(tmp_path_factory):
    """An S3-compatible server on 127.0.0.1 and the environment a client needs to reach it."""
    with local_s3(tmp_path_factory.mktemp("aws")) as env:
        yield env


@pytest.fixture()
def bucket(s3_env):
    """A fresh bucket; the store is a prefix inside it."""
    name = f"b-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(name)
    return name


def _keys(bucket: str, prefix: str = "store") -> list[str]:
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return [p.split("/", 1)[1] for p in fs.find(f"{bucket}/{prefix}")]


def test_locations_parse_paths_file_urls_and_remote_urls(tmp_path):
    assert StoreLocation(tmp_path).local == tmp_path
    assert StoreLocation(f"file://{tmp_path}/a%20b").local == tmp_path / "a b"
    remote = StoreLocation("s3://bucket/some/prefix/")
    assert remote.local is None and remote.protocol == "s3" and str(remote) == "s3://bucket/some/prefix/"
    assert remote.uri("span_rows/day=2026-01-01/x.parquet") == "s3://bucket/some/prefix/span_rows/day=2026-01-01/x.parquet"
    with pytest.raises(ValueError, match="file:///abs/path"):
        StoreLocation("file://otherhost/x")
    assert StoreLocation.of(remote) is remote and Store("s3://bucket/p").root == remote.of("s3://bucket/p")


def test_a_file_url_store_is_a_local_store_end_to_end(tmp_path):
    url = f"file://{tmp_path}/store"
    processor = ReplayProcessor(url)
    tracer = provider_with(processor).get_tracer("t")
    with tracer.start_as_current_span("chat m", attributes=chat_attributes("where is my order?", "on its way")) as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
    processor.shutdown()
    files = list((tmp_path / "store").glob("*/*/*.parquet"))
    assert files and all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    assert (tmp_path / "store" / "span_rows").stat().st_mode & 0o777 == 0o700
    listed = CliRunner().invoke(cli, ["--store", url, "traces", "--json"], catch_exceptions=False)
    assert [json.loads(line)["trace_id"] for line in listed.output.splitlines()] == [trace_id]
    shown = CliRunner().invoke(cli, ["--store", url, "show", trace_id[:8], "--json"], catch_exceptions=False)
    assert json.loads(shown.output)["steps"][0]["outputs"][0]["parts"][0]["content"] == "on its way"


def _memory(tmp_path) -> StoreLocation:
    return StoreLocation(f"memory://otel-replay-{uuid.uuid4().hex[:8]}")


def _pyarrow_local(tmp_path) -> StoreLocation:
    import pyarrow.fs

    return StoreLocation(str(tmp_path / "arrow-store"), filesystem=pyarrow.fs.LocalFileSystem())


@pytest.mark.parametrize("make", [_memory, _pyarrow_local], ids=["fsspec-memory", "pyarrow-local"])
def test_any_fsspec_or_pyarrow_filesystem_holds_a_store(tmp_path, make):
    """Filesystems with directories and renames (not object stores) get temp name + mv."""
    location = make(tmp_path)
    for batch in range(3):
        ingest(location, [_chat_span(t * 7 + batch, t + 1, []) for t in range(10)], source="test")
    store = Store(location)
    assert store.sql("select count(*) n from spans").column("n")[0].as_py() == 30
    results = compact_store(location)
    assert {r.table for r in results} == {"span_rows", "step_rows", "message_rows"}
    assert [len(store.snapshot().live[t]) for t in ("span_rows", "step_rows")] == [1, 1]
    assert store.sql("select count(*) n from span_rows").column("n")[0].as_py() == 30
    left = location.fs.find(location.path)
    assert left and not [p for p in left if p.endswith(".tmp") or "/_compactions/" in p]


def test_segments_on_s3_are_one_put_under_the_final_name(bucket):
    url = f"s3://{bucket}/store"
    written = write_segment(url, "span_rows", "2026-01-01", schema_of("span_rows").empty_table())
    assert isinstance(written, str) and written.startswith(f"s3://{bucket}/store/span_rows/day=2026-01-01/")
    assert _keys(bucket) == [written.removeprefix("s3://").split("/", 1)[1]]  # no temp object, no directory marker
    with pytest.raises(AttributeError):  # serialization fails before anything is sent
        write_segment(url, "span_rows", "2026-01-01", "not a table")  # type: ignore[arg-type]
    assert len(_keys(bucket)) == 1
    with pytest.raises(OSError, match="s3://no-such-bucket-x/store"):
        write_segment("s3://no-such-bucket-x/store", "span_rows", "2026-01-01", schema_of("span_rows").empty_table())


def test_capture_with_an_unwritable_bucket_never_reaches_the_service(s3_env):
    processor = ReplayProcessor("s3://no-such-bucket-y/store", flush_interval_s=0.05)
    tracer = provider_with(processor).get_tracer("t")
    with tracer.start_as_current_span("chat m", attributes=chat_attributes()):
        pass
    processor.force_flush(5_000)
    processor.shutdown()
    assert processor._writer.skipped["spans lost: store not writable"] == 1  # noqa: SLF001 - counted, not raised


def _otel_replay(*args: str, env: dict[str, str]) -> str:
    """The installed command in a fresh process: configuration only through the environment."""
    exe = shutil.which("otel-replay", path=str(Path(sys.executable).parent))
    command = [exe, *args] if exe else [sys.executable, "-c", "from otel_replay.cli import main; main()", *args]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@needs_openai_v2
def test_s3_store_end_to_end_capture_cli_compact_and_attribution(bucket, s3_env, tmp_path):
    from otel_replay.attribution import Job, JobParams
    from otel_replay.testing import SimulatedModelServer
    from otel_replay.testing.planted import (
        TOPOLOGIES,
        planted_registry,
        record_planted,
        replay_model,
    )

    url = f"s3://{bucket}/store"
    topology = TOPOLOGIES["single-late"]
    trace_id = record_planted(url, topology)  # the real ReplayProcessor, writing to S3
    local_trace = record_planted(tmp_path, topology)  # the same run into a local store, to compare
    keys = _keys(bucket)
    assert any(k.startswith("store/step_rows/day=") for k in keys) and not any(k.endswith(".tmp") for k in keys)

    listed = CliRunner().invoke(cli, ["--store", url, "traces", "--json"], catch_exceptions=False)
    assert [json.loads(line)["trace_id"] for line in listed.output.splitlines()] == [trace_id]
    shown = _otel_replay("show", trace_id[:10], env={**s3_env, "OTEL_REPLAY_STORE": url, "COLUMNS": "200"})
    assert f"trace {trace_id}" in shown and "final output: FAIL" in shown and " tool " in shown

    def content(store: Store, tid: str) -> list[tuple]:
        return [(s.kind, s.name, json.dumps(s.outputs, sort_keys=True)) for s in store.trajectory(tid).steps]

    assert content(Store(url), trace_id) == content(Store(tmp_path), local_trace)

    with SimulatedModelServer(replay_model(topology)) as server:
        job = Job(Store(url), JobParams([trace_id], "otel_replay.testing.planted:ok", concurrency=8),
                  planted_registry(topology, server.base_url))
        (result,) = job.run()
    assert result.verdict == "culprit-found" and result.culprit["index"] == topology.culprit
    assert {k.split("/")[1] for k in _keys(bucket)} >= {"job_rows", "rollout_rows", "result_rows", "report_rows"}
    store = Store(url)
    rollouts = store.sql("select count(*) n from rollout_rows").column("n")[0].as_py()
    before = content(store, trace_id)

    compacted = CliRunner().invoke(cli, ["--store", url, "compact", "--grace", "0"], catch_exceptions=False)
    assert compacted.exit_code == 0 and "segments -> 1" in compacted.output, compacted.output
    snap = store.snapshot()
    by_partition: dict[tuple[str, str], int] = {}
    for table in TABLES:
        for segment in snap.live[table]:
            by_partition[table, segment.day] = by_partition.get((table, segment.day), 0) + 1
    assert set(by_partition.values()) == {1} and not snap.manifests
    assert not any(k.startswith("store/_compactions/") for k in _keys(bucket))
    assert content(store, trace_id) == before
    assert store.sql("select count(*) n from rollout_rows").column("n")[0].as_py() == rollouts
    jobs = CliRunner().invoke(cli, ["--store", url, "jobs", "--json"], catch_exceptions=False)
    assert [(json.loads(line)["job_id"], json.loads(line)["status"]) for line in jobs.output.splitlines()] == [
        (job.job_id, "done")]
    status = CliRunner().invoke(cli, ["--store", url, "status"], catch_exceptions=False)
    assert re.search(r"span_rows\s+1 segments", status.output), status.output


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_writes_to_s3_with_its_own_connection(bucket):
    """fsspec's async filesystems refuse to run in a forked child; the child makes its own."""
    url = f"s3://{bucket}/store"
    processor = ReplayProcessor(url, flush_interval_s=0.05)
    tracer = provider_with(processor).get_tracer("t")
    with tracer.start_as_current_span("chat m", attributes=chat_attributes("from the parent")):
        pass
    assert processor.force_flush(10_000)
    pid = os.fork()
    if pid == 0:  # the child: a pre-fork server worker, say
        with tracer.start_as_current_span("chat m", attributes=chat_attributes("from the child")):
            pass
        os._exit(0 if processor.force_flush(10_000) else 3)
    _, status = os.waitpid(pid, 0)
    processor.shutdown()
    assert os.waitstatus_to_exitcode(status) == 0
    assert Store(url).sql("select count(*) n from spans").column("n")[0].as_py() == 2


def test_one_compaction_at_a_time_on_s3_and_a_dead_compactors_lease_is_taken_over(bucket):
    from otel_replay.store.catalog import StoreError
    from otel_replay.store.lease import LEASE, CompactorLease

    url = f"s3://{bucket}/store"
    for batch in range(2):
        ingest(url, [_chat_span(t * 7 + batch, t + 1, []) for t in range(5)], source="test")
    with CompactorLease(StoreLocation(url)), pytest.raises(StoreError, match="another compaction .* is running"):
        compact_store(url)
    assert len(Store(url).snapshot().live["span_rows"]) == 2
    s3fs.S3FileSystem().pipe_file(f"{bucket}/store/{LEASE}", json.dumps({"host": "gone", "pid": 1, "started_ns": 0}).encode())
    assert {r.table for r in compact_store(url)} >= {"span_rows", "step_rows"}  # a lease from 1970 is stale
    assert f"store/{LEASE}" not in _keys(bucket)


def test_remote_segments_are_read_in_blocks_each_fetched_once_per_connection(monkeypatch):
    """DuckDB opens a segment several times per query; each byte range is fetched once."""
    import fsspec

    from otel_replay.store import remote

    monkeypatch.setattr(remote, "BLOCK_BYTES", 1000)
    fs = fsspec.filesystem("memory")
    blob = os.urandom(10_500)
    path = f"/blocks-{uuid.uuid4().hex[:8]}/seg.parquet"
    fs.pipe_file(path, blob)
    fetched = []
    original = fs.cat_file
    monkeypatch.setattr(fs, "cat_file", lambda p, start=None, end=None, **kw: fetched.append((start, end))
                        or original(p, start=start, end=end, **kw))
    snap = remote.SnapshotFS.over(fs, [(path, len(blob))])
    assert snap.info(f"memory://{path}")["size"] == len(blob) and snap.glob(f"memory://{path}") == [path]
    for offset, length in [(0, 10), (990, 20), (2500, 3000), (10_400, 500), (0, 20_000)]:
        with snap.open(f"memory://{path}") as handle:
            handle.seek(offset)
            assert handle.read(length) == blob[offset:offset + length]
    with snap.open(f"memory://{path}") as handle:
        handle.seek(-8, os.SEEK_END)  # where a Parquet reader starts: the footer length and magic
        assert handle.read() == blob[-8:]
    assert len(fetched) == len(set(fetched)) == 11  # 11 blocks, each fetched once, no metadata request
    fs.rm_file(path)
    with pytest.raises(FileNotFoundError):  # a removed segment is not served from memory on a new connection
        remote.SnapshotFS.over(fs, [(path, len(blob))]).open(f"memory://{path}").read()


def test_import_into_s3_is_idempotent(bucket):
    from tests.helpers import FIXTURES

    fixture = FIXTURES / "otel" / "genai-openai_span_and_event.otlp.json"
    url = f"s3://{bucket}/imported"
    first = CliRunner().invoke(cli, ["--store", url, "import", "otlp", str(fixture)], catch_exceptions=False)
    again = CliRunner().invoke(cli, ["--store", url, "import", "otlp", str(fixture)], catch_exceptions=False)
    stored = int(re.search(r"(\d+) spans stored", first.output).group(1))
    assert stored > 0 and re.search(rf"0 spans stored .* {stored} already in the store", again.output), again.output
    assert Store(url).sql("select count(*) n from span_rows").column("n")[0].as_py() == stored
