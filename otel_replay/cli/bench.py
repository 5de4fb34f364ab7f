"""`bench`: performance measured as ratios against a baseline in the same run."""

from __future__ import annotations

from pathlib import Path

import click

from otel_replay.cli.output import dumps


@click.group()
def bench() -> None:
    """Benchmarks (ratios against a baseline measured in the same run)."""


@bench.command("capture")
@click.option("--quick", is_flag=True, help="Small sizes, a few seconds (numbers are noisier).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write results here.")
def bench_capture(quick: bool, json_path: Path | None) -> None:
    """Capture hot path and writer versus BatchSpanProcessor with a no-op exporter."""
    from otel_replay.bench.capture import format_capture_table, run_capture_bench

    result = run_capture_bench(quick=quick)
    click.echo(format_capture_table(result))
    if json_path:
        json_path.write_text(dumps(result, indent=2))


@bench.command("import")
@click.option("--quick", is_flag=True, help="500 traces instead of 10,000.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write results here.")
def bench_import(quick: bool, json_path: Path | None) -> None:
    """Import throughput (steps/s) per format on the same generated traces."""
    from otel_replay.bench.imports import format_import_table, run_import_bench

    result = run_import_bench(quick=quick)
    click.echo(format_import_table(result))
    if json_path:
        json_path.write_text(dumps(result, indent=2))


@bench.command("receiver")
@click.option("--quick", is_flag=True, help="Small sizes, a few seconds (numbers are noisier).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write results here.")
def bench_receiver(quick: bool, json_path: Path | None) -> None:
    """OTLP/HTTP receiver throughput from one client, against a server that discards the body."""
    from otel_replay.bench.receiver import format_receiver_table, run_receiver_bench

    result = run_receiver_bench(quick=quick)
    click.echo(format_receiver_table(result))
    if json_path:
        json_path.write_text(dumps(result, indent=2))


COMMANDS = [bench]
