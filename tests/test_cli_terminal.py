"""Stored text reaches the terminal visible, never as control sequences or rich markup.

A span, tool, agent or model name is whatever the traced service (or an imported file) said. The
store made here by the real OTLP importer carries names with an OSC window title, BEL, a CSI that
clears the screen, an 8-bit CSI (U+009B), a right-to-left override and rich markup (`[/]` alone
used to crash rich). Every command that prints them shows `\\x1b`-style escapes instead.
"""

from __future__ import annotations

import json
import os
import re
import stat

import pytest
from click.testing import CliRunner

from otel_replay.cli import main as cli
from tests.helpers import FIXTURES

PAYLOAD = "\x1b]0;pwned\x07\x1b[2J[bold]x[/]\x9b31m\u202e"
SHOWN = "\\x1b]0;pwned\\x07"  # the start of PAYLOAD as printed (the rest may fold onto the next line)
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # anything a terminal would act on
SOURCE = FIXTURES / "otel" / "genai-openai_span_and_event.otlp.json"
POLICIES = '''
from otel_replay.replay import policies

PAYLOAD = {payload!r}


@policies.llm
def chat(step, inputs, rng):
    return "sunny " + PAYLOAD


@policies.tool
def tool(arguments, rng):
    return {{"temperature_c": 30}}


def judge(final_output, rollout):
    raise ValueError("verifier broke on " + PAYLOAD)
'''


def _hostile(document: dict) -> dict:
    """The fixture with PAYLOAD in front of every span, tool, agent, model and service name."""
    for resource_spans in document["resourceSpans"]:
        for attr in resource_spans["resource"]["attributes"]:
            if attr["key"] == "service.name":
                attr["value"]["stringValue"] = PAYLOAD + attr["value"]["stringValue"]
        for scope in resource_spans["scopeSpans"]:
            for span in scope["spans"]:
                span["name"] = PAYLOAD + span["name"]
                for attr in span["attributes"]:
                    if attr["key"] in ("gen_ai.tool.name", "gen_ai.agent.name", "gen_ai.request.model"):
                        attr["value"]["stringValue"] = PAYLOAD + attr["value"]["stringValue"]
    return document


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A store imported from the hostile file, and the id of its tool-loop trace."""
    tmp = tmp_path_factory.mktemp("hostile")
    source = tmp / "hostile.otlp.json"
    source.write_text(json.dumps(_hostile(json.loads(SOURCE.read_text()))))
    store = tmp / "store"
    imported = CliRunner().invoke(cli, ["--store", str(store), "import", "otlp", str(source)])
    assert imported.exit_code == 0, imported.output
    rows = [json.loads(line) for line in run(store, "traces", "--json").output.splitlines()]
    assert all(PAYLOAD in r["root_name"] for r in rows)  # stored exactly as sent; only the display escapes it
    return store, next(r["trace_id"] for r in rows if r["tool_steps"] == 1)


def run(store, *args, code: int = 0):
    result = CliRunner().invoke(cli, ["--store", str(store), *args])
    assert result.exit_code == code, result.output
    return result


def assert_visible(output: str) -> None:
    assert not RAW.search(output), repr(RAW.search(output).group())
    assert SHOWN in output


def test_visible_escapes_controls_and_keeps_lines():
    from otel_replay.cli.output import visible

    assert visible(PAYLOAD) == "\\x1b]0;pwned\\x07\\x1b[2J[bold]x[/]\\x9b31m\\u202e"
    assert visible("two\nlines\tand a tab\r") == "two\nlines\tand a tab\\x0d"
    assert visible("Paris 18°C ✓ 東京") == "Paris 18°C ✓ 東京"  # printable text is left alone


@pytest.mark.parametrize("args", [
    ["traces"], ["traces", "--csv"], ["traces", "--json"],
    ["show", "TRACE"], ["show", "TRACE", "--json"],
    ["sql", "select name, request_model, agent_name, tool_name from steps"], ["sql", "select name from steps", "--csv"],
    ["diff", "TRACE", "TRACE"],
])
def test_commands_show_stored_names_escaped(hostile, args):
    store, trace = hostile
    out = run(store, *[trace if a == "TRACE" else a for a in args]).output
    if "--json" in args:  # JSON escapes them itself (\u001b), and the value is exact
        assert not RAW.search(out) and "\\u001b]0;pwned\\u0007" in out and "\\u009b31m\\u202e" in out
        first = json.loads(out.splitlines()[0] if args[0] == "traces" else out)
        assert PAYLOAD in (first.get("root_name") or "")
    else:
        assert_visible(out)
    if args[0] in ("show", "diff", "sql") and "--csv" not in args and "--json" not in args:
        assert "[/]" in out  # rich markup in a name is printed, not interpreted


def test_attribute_table_explanation_and_jobs_show_names_escaped(hostile, tmp_path, monkeypatch):
    store, trace = hostile
    (tmp_path / "hostile_policies.py").write_text(POLICIES.format(payload=PAYLOAD))
    monkeypatch.syspath_prepend(str(tmp_path))
    report = tmp_path / "report.html"
    out = run(store, "attribute", "--trace-id", trace, "--policies", "hostile_policies", "--expect-contains", "sunny",
              "--html", str(report)).output
    assert_visible(out)
    assert re.search(r"WHERE Step 2 \(llm chat \\x1b\]0;pwned\\x07", out), out  # the explanation line
    assert "★ decisive" in out
    assert stat.S_IMODE(os.stat(report).st_mode) == 0o600
    failed = run(store, "attribute", "--trace-id", trace, "--policies", "hostile_policies",
                 "--verifier", "hostile_policies:judge", code=1)
    assert failed.exception is not None  # the user's verifier raised; its message is now stored in the job
    jobs = run(store, "jobs").output
    assert_visible(jobs)
    assert "ValueError: verifier broke on \\x1b]0;pwned" in jobs
    from otel_replay.replay import policies

    policies.registry.clear()


def test_doctor_shows_a_hostile_segment_name_escaped(tmp_path):
    store = tmp_path / "store"
    assert run(tmp_path / "store", "import", "otlp", str(SOURCE)).exit_code == 0
    day = next((store / "span_rows").iterdir())
    (day / f"{PAYLOAD.replace('/', '')}.parquet").write_bytes(b"not parquet at all")  # a file name is stored text too
    result = run(store, "doctor", "--check", code=1)
    assert_visible(result.output)
    assert "damaged segment span_rows/" in result.output
