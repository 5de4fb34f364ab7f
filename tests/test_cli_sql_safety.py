"""`otel-replay sql` and `--where` read the store and nothing else.

The user's SQL runs as one SELECT on a DuckDB connection that may read the store's segments only
(`Catalog.sql`): hostile statements each fail with one line and write nothing, a `--where` that
closes its parenthesis is refused before anything runs, and the documented queries (README and
docs/) still work, on a local store and on S3 (moto).
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from click.testing import CliRunner

from otel_replay import Store
from otel_replay.cli import main as cli
from tests.helpers import FIXTURES, REPO, local_s3

SOURCE = FIXTURES / "otel" / "genai-openai_span_and_event.otlp.json"


@pytest.fixture()
def store(tmp_path):
    root = tmp_path / "store"
    done = CliRunner().invoke(cli, ["--store", str(root), "import", "otlp", str(SOURCE)])
    assert done.exit_code == 0, done.output
    return root


def _tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line_error(result, starts: str) -> None:
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(starts), result.output
    assert "Traceback" not in result.output


HOSTILE = [
    "COPY (SELECT * FROM messages) TO '{out}' (FORMAT csv)",
    "COPY steps TO '{out}'",
    "EXPORT DATABASE '{dir}'",
    "SELECT * FROM read_csv('{secret}')",
    "SELECT * FROM read_text('{secret}')",
    "SELECT * FROM '{secret}'",
    "SELECT * FROM read_text('{store}/.otel-replay')",  # a file in the store that is not a segment
    "SELECT count(*) FROM glob('/etc/*')",
    "ATTACH '{dir}/x.duckdb' AS x",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "RESET lock_configuration",
    "SET allowed_directories = ['/']",
    "SELECT 1; COPY (SELECT 1) TO '{out}'",
    "CREATE TABLE t AS SELECT * FROM steps",
    "PRAGMA enable_profiling",
]


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_sql_fails_in_one_line_and_writes_nothing(store, tmp_path, query):
    secret = tmp_path / "secret.csv"
    secret.write_text("api_key\nsk-outside-the-store\n")
    (store / ".otel-replay").write_text("not a segment\n")
    out = tmp_path / "out.csv"
    before = _tree(tmp_path)
    text = query.format(out=out, dir=tmp_path / "exported", secret=secret, store=store)
    result = CliRunner().invoke(cli, ["--store", str(store), "sql", text])
    _one_line_error(result, "Error: not allowed: ")
    assert "sk-outside-the-store" not in result.output
    assert _tree(tmp_path) == before  # no file written, none changed, in the store or beside it


@pytest.mark.parametrize("command", [
    ["attribute", "--expect-contains", "OK", "--where"],
    ["aggregate", "--where"],
])
@pytest.mark.parametrize("predicate", [
    "true) ORDER BY 1; COPY (SELECT * FROM messages) TO '{out}' (FORMAT csv); SELECT (1",
    "true); COPY (SELECT * FROM messages) TO '{out}'; SELECT * FROM (SELECT 1",
    "true) UNION ALL (SELECT 'x'",
    "status = 'error') OR (true",
    "true --",
    "true ORDER BY 1",
])
def test_a_where_predicate_cannot_close_its_parenthesis(store, tmp_path, command, predicate):
    out = tmp_path / "out.csv"
    before = _tree(tmp_path)
    result = CliRunner().invoke(cli, ["--store", str(store), *command, predicate.format(out=out)])
    assert result.exit_code == 2, result.output  # a usage error, before any SQL runs
    assert "--where" in result.output and "Traceback" not in result.output
    assert _tree(tmp_path) == before


def test_where_predicates_that_are_one_expression_still_select(store):
    rows = CliRunner().invoke(cli, ["--store", str(store), "aggregate", "--where",
                                    "status = 'error' or exists (select 1 from steps s where s.trace_id = "
                                    "traces.trace_id and s.name = ')')", "--json"])
    assert rows.exit_code == 0, rows.output
    bad = CliRunner().invoke(cli, ["--store", str(store), "aggregate", "--where", "stauts = 'error'"])
    assert bad.exit_code == 1 and 'Candidate bindings: "status"' in bad.output  # DuckDB's own hint, as before


def _documented_queries() -> list[str]:
    """The example queries of the README and of the documentation site (docs/)."""
    docs = "\n".join(path.read_text() for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))])
    found = [m.replace('\\"', '"') for m in re.findall(r'otel-replay sql "((?:[^"\\]|\\.)*)"', docs)]
    found += re.findall(r'store\.sql\("([^"]*)"\)', docs)
    return list(dict.fromkeys(" ".join(q.split()) for q in found if q != "select ..."))


@pytest.mark.parametrize("query", _documented_queries())
def test_the_documented_queries_still_run(store, query):
    result = CliRunner().invoke(cli, ["--store", str(store), "sql", query, "--json"])
    assert result.exit_code == 0, result.output
    assert all(isinstance(json.loads(line), dict) for line in result.output.splitlines())


def test_ordinary_queries_read_every_view_and_segment(store):
    views = ["spans", "steps", "messages", "traces", "span_rows", "rollouts", "jobs", "results", "reports"]
    counts = Store(store).sql(" union all ".join(f"select '{v}' as v, count(*) as n from {v}" for v in views))
    assert dict(zip(*counts.to_pydict().values(), strict=True))["steps"] == 11
    segment = next((store / "span_rows").rglob("*.parquet"))
    direct = Store(store).sql("select count(*) as n from read_parquet(?)", [str(segment)])  # a segment: allowed
    assert direct.column("n")[0].as_py() > 0
    for text in ("with t as (select * from traces) select count(*) from t", "describe steps", "show tables",
                 "summarize traces", "from steps limit 1", "values (1)"):
        assert Store(store).sql(text).num_rows >= 1, text
    from otel_replay.store.catalog import ForbiddenSQL

    with pytest.raises(ForbiddenSQL, match="COPY"):
        Store(store).sql("copy steps to 'x.csv'")


def test_a_store_on_s3_reads_its_views_and_nothing_else(tmp_path):
    s3fs = pytest.importorskip("s3fs", reason="the s3 extra: pip install 'otel-replay[s3,s3-test]'")
    pytest.importorskip("moto.server", reason="the s3-test extra: pip install 'otel-replay[s3-test]'")
    with local_s3(tmp_path):
        bucket = f"b-{uuid.uuid4().hex[:12]}"
        fs = s3fs.S3FileSystem()
        fs.mkdir(bucket)
        fs.pipe(f"{bucket}/secret.txt", b"sk-outside-the-store")
        url = f"s3://{bucket}/store"
        assert CliRunner().invoke(cli, ["--store", url, "import", "otlp", str(SOURCE)]).exit_code == 0
        ok = CliRunner().invoke(cli, ["--store", url, "sql", "select count(*) as n from steps", "--json"])
        assert ok.exit_code == 0 and json.loads(ok.output) == {"n": 11}, ok.output
        for text in (f"select * from read_text('s3://{bucket}/secret.txt')",
                     f"copy steps to 's3://{bucket}/stolen.csv'"):
            refused = CliRunner().invoke(cli, ["--store", url, "sql", text])
            _one_line_error(refused, "Error: not allowed: ")
            assert "sk-outside-the-store" not in refused.output
        fs.invalidate_cache()
        assert not fs.exists(f"{bucket}/stolen.csv")
