"""Store files are created 0600 and directories 0700, whatever the umask lets through.

A store holds prompts and tool results: nobody but its owner may read it. One store goes through
every path that writes to it (capture, import, an attribution job, compaction, doctor), then
every file and directory under it is checked. The files the CLI writes outside the store (reports,
exports, benchmark results) quote the same prompts and outputs, so they are 0600 too.
"""

from __future__ import annotations

import json
import os
import stat

from click.testing import CliRunner

from otel_replay import ReplayProcessor, Store
from otel_replay.cli import main as cli
from tests.helpers import FIXTURES, chat_attributes, needs_openai_v2, provider_with

pytestmark = needs_openai_v2  # every test here records or runs the demo's agent (openai-v2)


def _modes(root) -> dict[str, list[str]]:
    wrong: dict[str, list[str]] = {"dirs": [], "files": []}
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_dir() and mode != 0o700:
            wrong["dirs"].append(f"{oct(mode)} {path.relative_to(root.parent)}")
        elif path.is_file() and mode != 0o600:
            wrong["files"].append(f"{oct(mode)} {path.relative_to(root.parent)}")
    return wrong


def test_every_path_that_writes_creates_0600_files_and_0700_directories(tmp_path):
    root = tmp_path / "nested" / "store"  # created by otel-replay, parents and all
    previous = os.umask(0o022)  # the usual umask: group and others could read whatever we forget
    try:
        provider = provider_with(ReplayProcessor(root, flush_interval_s=60))  # capture
        with provider.get_tracer("t").start_as_current_span("chat m", attributes=chat_attributes()):
            pass
        provider.shutdown()
        runner = CliRunner()
        for args in (["import", "otlp", str(FIXTURES / "otel" / "genai-openai_span_and_event.otlp.json")],
                     ["demo", "--rollouts", "4", "--html", str(tmp_path / "report.html")],  # capture + attribution job
                     ["compact", "--grace", "0"],
                     ["doctor"]):
            out = runner.invoke(cli, ["--store", str(root), *args])
            assert out.exit_code == 0, (args, out.output)
            if args[0] == "compact":
                assert "segments -> 1" in out.output  # compaction output is checked too
    finally:
        os.umask(previous)
    tables = {p.name for p in root.iterdir()}
    assert {"span_rows", "step_rows", "message_rows", "job_rows", "rollout_rows", "result_rows", "report_rows"} <= tables
    assert Store(root).sql("select count(*) n from traces").column("n")[0].as_py() >= 3
    assert _modes(root) == {"dirs": [], "files": []}
    assert stat.S_IMODE((tmp_path / "nested").stat().st_mode) == 0o700  # a parent it had to create, too


POLICIES = """
from otel_replay.replay import policies


@policies.llm
def chat(step, inputs, rng):
    return "sunny"


@policies.tool
def tool(arguments, rng):
    return {"temperature_c": 30}
"""


def test_every_file_the_cli_writes_outside_the_store_is_0600(tmp_path, monkeypatch):
    root, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    (tmp_path / "file_mode_policies.py").write_text(POLICIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("demo.html", "attribute.json"):  # already there and readable by all: replaced, not kept 0644
        (out / name).write_text("old")
        (out / name).chmod(0o644)
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(cli, ["--store", str(root), *args])
        assert result.exit_code == 0, (args, result.output)
        return result.output

    previous = os.umask(0o022)
    try:
        run("demo", "--rollouts", "4", "--html", str(out / "demo.html"))
        run("import", "otlp", str(FIXTURES / "otel" / "genai-openai_span_and_event.otlp.json"))
        loop = next(r["trace_id"] for r in map(json.loads, run("traces", "--json").splitlines()) if r["tool_steps"] == 1)
        run("attribute", "--trace-id", loop, "--policies", "file_mode_policies", "--expect-contains", "sunny",
            "--json", str(out / "attribute.json"), "--html", str(out / "attribute.html"))
        job = json.loads(run("jobs", "--json").splitlines()[0])["job_id"]
        run("report", "--job", job, "--trace-id", loop, "--json", str(out / "report.json"),
            "--html", str(out / "report.html"))
        for target in ("jaeger-json", "otlp-json"):
            run("export", "--job", job, "--to", target, "--out", str(out / f"{target}.json"))
        run("bench", "replay", "--quick", "--json", str(out / "bench.json"))
    finally:
        os.umask(previous)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in out.iterdir()}
    assert modes == {name: "0o600" for name in ("demo.html", "attribute.json", "attribute.html", "report.json",
                                                "report.html", "jaeger-json.json", "otlp-json.json", "bench.json")}
    assert json.loads((out / "attribute.json").read_text())["trace_id"] == loop  # whole files, not placeholders
    assert (out / "demo.html").read_text().startswith("<!doctype html>")
    assert _modes(root) == {"dirs": [], "files": []}
