"""One safe read path: every read of the store retries after a compaction and fails as a StoreError.

`Catalog.read` (and `sql`, `named`, `list_traces` on it) and `Catalog.session()` run again on a fresh
snapshot when a compaction removed a segment under them, and raise a DuckDB error as a StoreError
with a one-line message (`QueryError.detail` keeps DuckDB's whole text). Every reader outside the
store layer goes through them: a query error through each call site is an OtelReplayError, never a
raw `duckdb.Error`, and no new bare `.connect()` appears in the package.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import duckdb
import pytest
from click.testing import CliRunner

from otel_replay import Store
from otel_replay.attribution.job import Job, load_params
from otel_replay.cli import main as cli
from otel_replay.errors import OtelReplayError
from otel_replay.export.job import _root_and_rows, stored_reports
from otel_replay.store import QueryError, StoreError, queries
from otel_replay.store.catalog import ForbiddenSQL
from tests.helpers import FIXTURES, REPO

SOURCE = FIXTURES / "otel" / "genai-openai_span_and_event.otlp.json"
PACKAGE = REPO / "otel_replay"
# bare connections outside otel_replay/store/, each with its reason
ALLOWED = {
    # the receiver's dedup reuses one snapshot across batches for SNAPSHOT_REUSE_S (opening one costs
    # ~60 ms); any error there closes it and the spans are stored again (the views read each once)
    "otel_replay/capture/receiver_durable.py": 1,
}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    root = tmp_path_factory.mktemp("read-paths") / "store"
    done = CliRunner().invoke(cli, ["--store", str(root), "import", "otlp", str(SOURCE)])
    assert done.exit_code == 0, done.output
    return Store(root)


@pytest.fixture()
def trace_id(store) -> str:
    return store.list_traces().column("trace_id")[0].as_py()


def _one_line_store_error(info: pytest.ExceptionInfo) -> None:
    exc = info.value
    assert isinstance(exc, StoreError) and isinstance(exc, OtelReplayError), repr(exc)
    assert not isinstance(exc, duckdb.Error)
    assert "\n" not in str(exc), str(exc)
    assert isinstance(exc.__cause__, duckdb.Error)  # DuckDB's error is kept as the cause


def test_a_bad_query_through_each_catalog_method_is_a_one_line_store_error(store):
    bad = "SELECT no_such_column FROM traces"
    with pytest.raises(QueryError) as info:
        store.sql(bad)
    _one_line_store_error(info)
    assert "no_such_column" in str(info.value) and "Candidate bindings" in info.value.detail  # DuckDB's hint kept
    with pytest.raises(QueryError) as info:
        store.named("trace_exists", [])  # a parameter missing
    _one_line_store_error(info)
    with pytest.raises(QueryError) as info:
        store.read(lambda con: con.execute(bad).fetchall())
    _one_line_store_error(info)
    with store.session() as s:
        for read in (s.fetchall, s.arrow):
            with pytest.raises(QueryError) as info:
                read(bad)
            _one_line_store_error(info)
        assert s.fetchall("SELECT count(*) FROM traces")[0][0] >= 1  # the session goes on after an error
    with pytest.raises(ForbiddenSQL):
        store.sql("SELECT * FROM read_text('/etc/hostname')")


def test_every_call_site_fails_as_an_otel_replay_error(store, trace_id, monkeypatch):
    """Each reader outside the store layer, with every named query broken."""
    monkeypatch.setattr(queries, "query", lambda name: "SELECT no_such_column FROM traces")
    reads = [
        lambda: store.trajectory(trace_id),
        lambda: store.resolve_trace_id(trace_id),
        lambda: store.list_traces(),
        lambda: store.capture_totals(),
        lambda: load_params(store, "j000000000000"),
        lambda: Job._finished_rollouts(SimpleNamespace(store=store, job_id="j000000000000")),
        lambda: stored_reports(store, "j000000000000"),
        lambda: stored_reports(store, "j000000000000", trace_id),
        lambda: _root_and_rows(store, trace_id),
    ]
    for read in reads:
        with pytest.raises(OtelReplayError) as info:
            read()
        _one_line_store_error(info)


@pytest.mark.parametrize("args", [["jobs"], ["jobs", "--skipped"], ["aggregate"],
                                  ["report", "--job", "j000000000000", "--trace-id", "TRACE"],
                                  ["show", "TRACE"]])
def test_the_cli_reports_a_failed_read_in_one_line(store, trace_id, monkeypatch, args):
    real = queries.query
    monkeypatch.setattr(queries, "query", lambda name: real(name) if name in ("trace_exists",) else
                        "SELECT no_such_column FROM traces")
    args = [trace_id if a == "TRACE" else a for a in args]
    result = CliRunner().invoke(cli, ["--store", str(store.root), *args])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: query over the store at "), result.output
    assert "Traceback" not in result.output


def test_a_session_query_runs_again_on_a_fresh_snapshot_after_a_compaction(store, monkeypatch):
    calls = []

    def flaky(con):
        calls.append(con)
        if len(calls) == 1:
            raise duckdb.IOException("IO Error: No files found that match the pattern \"gone.parquet\"")
        return con.execute("SELECT count(*) FROM traces").fetchall()

    monkeypatch.setattr(type(store), "_vanished", lambda self, snap: True)  # a compaction removed a segment
    with store.session() as s:
        assert s._run(flaky)[0][0] >= 1
    assert len(calls) == 2 and calls[0] is not calls[1]  # the second attempt on a new connection
    monkeypatch.setattr(type(store), "_vanished", lambda self, snap: False)
    calls.clear()
    with store.session() as s, pytest.raises(QueryError):
        s._run(flaky)  # not a compaction: no retry
    assert len(calls) == 1


def test_no_new_bare_connection_outside_the_store_layer():
    found: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith("otel_replay/store/"):
            continue
        hits = len(re.findall(r"\.connect\(\)", path.read_text(encoding="utf-8")))
        if hits:
            found[relative] = hits
    assert found == ALLOWED, (
        "read the store through store.session(), store.sql(...), store.named(...) or store.read(fn): "
        "they retry after a compaction and raise StoreError, a bare .connect() does neither "
        f"(found {found})")

