"""`otel-replay bench import` runs and reports every format (structure only, never timing)."""

from __future__ import annotations

from click.testing import CliRunner

from benchmarks.imports import run_import_bench
from otel_replay.cli import main as cli


def test_quick_import_bench_imports_every_format_completely():
    result = run_import_bench(quick=True)
    assert {r["format"] for r in result["rows"]} == {
        "otlp (JSON lines), 1 process (default)", "otlp (JSON lines), 2 processes",
        "otlp (JSON lines, 512-span batches across traces), 2 processes", "otlp (protobuf), 1 process",
        "jaeger, 1 process", "langsmith (runs JSON lines), 1 process"}
    for row in result["rows"]:
        assert row["steps"] == 3 * result["traces"] and row["skipped"] == 0
        assert row["steps_per_s"] > 0 and row["parse_only_s"] > 0 and row["cpu_us_per_step"] > 0
        assert row["segments"] == 3 * row["jobs"]  # messages, spans, steps from each worker
    assert set(result["stages"]) == {"read", "normalize", "redact", "rows", "arrow and parquet"}
    assert all(us > 0 for us in result["stages"].values())
    before, after = result["record_work_ms"]  # the interpreter-speed reference, both ends of the run
    assert 0 < before < 10_000 and 0 < after < 10_000


def test_cli_prints_the_table():
    out = CliRunner().invoke(cli, ["bench", "import", "--quick"])
    assert out.exit_code == 0 and "| otlp (JSON lines), 1 process (default) |" in out.output and "Target: >= 20,000" in out.output
    assert "CPU µs per OTLP/JSON step: read" in out.output
    assert "a fixed miniature of record work took" in out.output
