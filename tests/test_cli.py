"""The CLI as a user meets it: output, filters, JSON, and clear errors."""

from __future__ import annotations

import json
import time

import click
import pytest
from click.testing import CliRunner

from otel_replay.cli import main as cli
from otel_replay.normalize.sources.flat_json import read_flat
from otel_replay.store.ingest import ingest
from tests.helpers import FIXTURES, REPO

FIXTURE = FIXTURES / "otel" / "openai-v2_span_and_event.json"


@pytest.fixture()
def store(tmp_path):
    spans, logs = read_flat(json.loads(FIXTURE.read_text()))
    ingest(tmp_path, spans, logs, source="test")
    return tmp_path


def run(store, *args):
    return CliRunner().invoke(cli, ["--store", str(store), *args], catch_exceptions=False)


def test_traces_lists_every_trace_and_filters_failed(store):
    rows = [json.loads(line) for line in run(store, "traces", "--json").output.splitlines()]
    assert len(rows) == 4
    assert {r["status"] for r in rows} == {"ok", "error"}
    tool_loop = [r for r in rows if r["tool_steps"] == 1]
    assert len(tool_loop) == 2 and all(r["llm_steps"] == 2 and r["tokens"] == 239 for r in tool_loop)
    failed = [json.loads(line) for line in run(store, "traces", "--failed", "--json").output.splitlines()]
    assert [r["root_name"] for r in failed] == ["invoke_agent weather-agent"]
    assert run(store, "traces", "--since", "2100-01-01", "--json").output == ""
    table = run(store, "traces").output
    assert "invoke_agent weather-agent" in table and "otel-replay-fixture" in table


def test_since_accepts_durations_and_iso_times(store):
    assert len(run(store, "traces", "--since", "3650d", "--json").output.splitlines()) == 4
    assert len(run(store, "traces", "--since", "2020-01-01T00:00:00", "--json").output.splitlines()) == 4
    bad = CliRunner().invoke(cli, ["--store", str(store), "traces", "--since", "yesterday"])
    assert bad.exit_code == 2 and "use a duration like 30m" in bad.output


def test_show_prints_the_trajectory_and_json_has_payloads(store):
    trace_id = next(json.loads(line)["trace_id"] for line in run(store, "traces", "--json").output.splitlines()
                    if json.loads(line)["tool_steps"] == 1)
    text = run(store, "show", trace_id[:10]).output
    assert "get_weather" in text and "chat gpt-4o-mini" in text
    assert "final output: It is currently 18°C and partly cloudy in Paris." in text
    doc = json.loads(run(store, "show", trace_id, "--json").output)
    assert doc["trace_id"] == trace_id and [s["kind"] for s in doc["steps"]] == ["llm", "tool", "llm"]
    assert doc["steps"][2]["outputs"][0]["parts"][0]["content"] == "It is currently 18°C and partly cloudy in Paris."
    assert {"source": 1, "target": 2, "via": "tool_result", "key": doc["steps"][1]["tool_call_id"]} in doc["edges"]


def test_sql_runs_over_the_views(store):
    out = run(store, "sql", "select kind, count(*) as n from steps group by kind order by kind", "--json").output
    assert [json.loads(line) for line in out.splitlines()] == [
        {"kind": "agent", "n": 3}, {"kind": "embedding", "n": 1}, {"kind": "llm", "n": 5}, {"kind": "tool", "n": 2}]
    csv = run(store, "sql", "select count(*) as n from messages", "--csv").output
    assert csv.splitlines()[0] == "n" and int(csv.splitlines()[1]) > 0


@pytest.mark.parametrize(("args", "message", "hint"), [
    (["show", "0123456789abcdef"], "no trace '0123456789abcdef'", ""),
    (["sql", "selec 1"], "SQL error: Parser Error", "LINE 1: selec 1"),  # DuckDB's excerpt (a caret under it)
    (["sql", "select * from nope"], "SQL error: Catalog Error", ""),
    (["sql", "select * from step"], "SQL error: Catalog Error", 'Did you mean "steps"?'),
    (["sql", "select nme from steps"], "SQL error: Binder Error", 'Candidate bindings: "name"'),
])
def test_errors_are_clear(store, args, message, hint):
    result = CliRunner().invoke(cli, ["--store", str(store), *args])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {message}") and "Traceback" not in result.output
    assert hint in result.output, result.output


def test_missing_store_says_where_to_point(tmp_path):
    result = CliRunner().invoke(cli, ["--store", str(tmp_path / "nowhere"), "traces"])
    assert result.exit_code == 1 and "no store at" in result.output and "OTEL_REPLAY_STORE" in result.output
    assert "a file" not in result.output


def test_a_store_path_that_is_a_file_is_said_to_be_one(tmp_path):
    (tmp_path / "store").write_text("not a store")
    result = CliRunner().invoke(cli, ["--store", str(tmp_path / "store"), "traces"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"no store at {tmp_path / 'store'} (a file, not a store directory)" in result.output, result.output


def test_status_and_compact(store):
    before = run(store, "sql", "select * from steps order by span_id", "--json").output
    assert "segments" in run(store, "status").output
    ingest(store, read_flat(json.loads(FIXTURE.read_text()))[0], source="again")  # a second copy of every span
    compacted = run(store, "compact").output
    assert "span_rows: 2 segments -> 1" in compacted
    after = run(store, "sql", "select * exclude (ingested_ns, source) from steps order by span_id", "--json").output
    strip = [{k: v for k, v in json.loads(line).items() if k not in ("ingested_ns", "source")}
             for line in before.splitlines()]
    assert [json.loads(line) for line in after.splitlines()] == strip


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    out = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the top group loads its commands lazily
        command = group.get_command(ctx, name)
        out.append((prefix + name, command))
        if isinstance(command, click.Group):
            out += _commands(command, prefix + name + " ")
    return out


def _documentation() -> str:
    """The README and the pages of the documentation site (docs/)."""
    return "\n".join(path.read_text() for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))])


@pytest.mark.parametrize(("name", "command"), _commands(cli))
def test_every_command_has_help_and_is_in_the_docs(name, command):
    assert command.help and command.help.strip()
    assert f"otel-replay {name}" in _documentation(), f"no page of docs/ documents `otel-replay {name}`"


def test_parse_since_relative():
    from otel_replay.cli.traces import parse_since

    assert abs(parse_since("1h") - (time.time_ns() - 3600 * 10**9)) < 5 * 10**9
