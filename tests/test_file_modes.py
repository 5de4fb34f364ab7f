"""Store files are created 0600 and directories 0700, whatever the umask lets through.

A store holds prompts and tool results: nobody but its owner may read it. One store goes through
every path that writes to it (capture, import, an attribution job, compaction, doctor), then
every file and directory under it is checked.
"""

from __future__ import annotations

import os
import stat

from click.testing import CliRunner

from otel_replay import ReplayProcessor, Store
from otel_replay.cli import main as cli
from tests.helpers import FIXTURES, chat_attributes, provider_with


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
