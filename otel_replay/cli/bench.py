"""`bench`: performance measured as ratios against a baseline in the same run."""

from __future__ import annotations

import importlib
from pathlib import Path

import click

from otel_replay.cli.output import dumps

# name -> (module, run function, table function, one-line help)
BENCHMARKS = {
    "capture": ("capture", "run_capture_bench", "format_capture_table",
                "Capture hot path and writer versus BatchSpanProcessor with a no-op exporter."),
    "import": ("imports", "run_import_bench", "format_import_table",
               "Import throughput (steps/s) per format on the same generated traces."),
    "receiver": ("receiver", "run_receiver_bench", "format_receiver_table",
                 "OTLP/HTTP receiver throughput from one client, against a server that discards the body."),
    "replay": ("replay", "run_replay_bench", "format_replay_table",
               "Replay engine cost per step with instant policies, beside agent_replay."),
    "accuracy": ("accuracy", "run_accuracy_bench", "format_accuracy_table",
                 "Top-1 culprit accuracy across planted fault topologies, beside simple baselines."),
    "whowhen": ("whowhen", "run_whowhen_bench", "format_whowhen_table",
                "Who&When: frozen-log baselines per subset, exact match (and the upstream substring rule)."),
    "attribution": ("attribution", "run_attribution_bench", "format_attribution_table",
                    "Policy calls and time to a correct verdict beside agent_replay; statistics share; concurrency."),
}


@click.group()
def bench() -> None:
    """Benchmarks (ratios against a baseline measured in the same run)."""


def _command(name: str, module: str, run: str, table: str, summary: str) -> click.Command:
    @click.command(name=name, help=summary)
    @click.option("--quick", is_flag=True, help="Small sizes, seconds instead of minutes (numbers are noisier).")
    @click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write results here.")
    def command(quick: bool, json_path: Path | None) -> None:
        bench_module = importlib.import_module(f"otel_replay.bench.{module}")
        result = getattr(bench_module, run)(quick=quick)
        click.echo(getattr(bench_module, table)(result))
        if json_path:
            json_path.write_text(dumps(result, indent=2))

    return command


for _name, _spec in BENCHMARKS.items():
    bench.add_command(_command(_name, *_spec))

COMMANDS = [bench]
