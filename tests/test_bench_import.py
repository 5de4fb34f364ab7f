"""`otel-replay bench import` runs and reports every format (structure only, never timing)."""

from __future__ import annotations

from click.testing import CliRunner

from otel_replay.bench.imports import run_import_bench
from otel_replay.cli import main as cli


def test_quick_import_bench_imports_every_format_completely():
    result = run_import_bench(quick=True)
    assert {r["format"] for r in result["rows"]} == {
        "otlp (JSON lines)", "otlp (protobuf)", "jaeger", "langsmith (runs JSON lines)"}
    for row in result["rows"]:
        assert row["steps"] == 3 * result["traces"] and row["skipped"] == 0
        assert row["steps_per_s"] > 0 and row["parse_only_s"] > 0


def test_cli_prints_the_table():
    out = CliRunner().invoke(cli, ["bench", "import", "--quick"])
    assert out.exit_code == 0 and "| otlp (JSON lines) |" in out.output and "Target: >= 20,000" in out.output
