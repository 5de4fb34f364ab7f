"""`bench`: performance measured as ratios against a baseline in the same run."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import click

from otel_replay.cli.output import dumps, write_file


def _sizes(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    """`1e5,1e6` or `100000,1000000` -> (100000, 1000000)."""
    if not value:
        return None
    try:
        sizes = tuple(int(float(v)) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: give sizes like 1e5,1e6") from None
    if not sizes or min(sizes) < 10:
        raise click.BadParameter(f"{value!r}: give sizes of at least 10 spans, like 1e5,1e6")
    return sizes


# name -> (module, run function, table function, one-line help[, extra options passed to the run function])
BENCHMARKS: dict[str, tuple[Any, ...]] = {
    "capture": ("capture", "run_capture_bench", "format_capture_table",
                "Capture hot path and writer versus BatchSpanProcessor with a no-op exporter."),
    "import": ("imports", "run_import_bench", "format_import_table",
               "Import throughput (steps/s) per format on the same generated traces."),
    "receiver": ("receiver", "run_receiver_bench", "format_receiver_table",
                 "OTLP/HTTP receiver throughput from one client, against a server that discards the body.",
                 [click.option("--workers", type=click.IntRange(min=1), help="The receiver's worker processes "
                               "(default: as `collect`, one per core; 1: decode and store in the receiver's process)."),
                  click.option("--client", type=click.Choice(["encoded", "exporter"]), default="encoded",
                               show_default=True, help="encoded: requests encoded before the clock (a compiled "
                               "sender such as the Collector); exporter: the Python SDK's OTLP/HTTP exporter.")]),
    "replay": ("replay", "run_replay_bench", "format_replay_table",
               "Replay engine cost per step with instant policies, beside agent_replay."),
    "accuracy": ("accuracy", "run_accuracy_bench", "format_accuracy_table",
                 "Top-1 culprit accuracy across planted fault topologies, beside simple baselines.",
                 [click.option("--workers", type=click.IntRange(min=1), help="Cases run in this many processes "
                               "at once (default: one per CPU); the results are the same for any number.")]),
    "whowhen": ("whowhen", "run_whowhen_bench", "format_whowhen_table",
                "Who&When: frozen-log baselines per subset, exact match (and the upstream substring rule)."),
    "attribution": ("attribution", "run_attribution_bench", "format_attribution_table",
                    "Policy calls and time to a correct verdict beside agent_replay; statistics share; concurrency."),
    "scale": ("scale", "run_scale_bench", "format_scale_table",
              "Rollouts/s with 200 ms policies, local and on Ray; store query time and bytes per span by size.",
              [click.option("--sizes", callback=_sizes, help="Store sizes in spans, comma-separated "
                            "(default 1e5,1e6,1e7; with --quick 1e4,1e5).")]),
    "redaction": ("redaction", "run_redaction_bench", "format_redaction_table",
                  "Redaction per 4 KB message and per span, with its gates and without (the exact path)."),
    "reliability": ("reliability", "run_reliability_bench", "format_reliability_table",
                    "Overload, store failures, kill -9 crashes, damaged segments: what capture and the store survive."),
}


# the benchmarks live in the repository (benchmarks/, beside otel_replay/), not in the installed package
SOURCE = Path(__file__).resolve().parents[2]
NOT_HERE = ("the benchmarks are not in the installed package: clone the otel-replay repository, "
            "`pip install -e '.[dev]'` in it and run `otel-replay bench` from that checkout")


def _bench_module(module: str) -> Any:
    """`benchmarks.MODULE` from the source checkout this package runs from (its root on sys.path)."""
    if not (SOURCE / "benchmarks" / "__init__.py").is_file():
        raise click.ClickException(NOT_HERE)
    if str(SOURCE) not in sys.path:
        sys.path.insert(0, str(SOURCE))
    return importlib.import_module(f"benchmarks.{module}")


@click.group()
def bench() -> None:
    """Benchmarks (ratios against a baseline measured in the same run)."""


def _command(name: str, module: str, run: str, table: str, summary: str, options: Any = ()) -> click.Command:
    @click.command(name=name, help=summary)
    @click.option("--quick", is_flag=True, help="Small sizes, seconds instead of minutes (numbers are noisier).")
    @click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Also write results here.")
    def command(quick: bool, json_path: Path | None, **extra: Any) -> None:
        bench_module = _bench_module(module)
        result = getattr(bench_module, run)(quick=quick, **extra)
        click.echo(getattr(bench_module, table)(result))
        if json_path:
            write_file(json_path, dumps(result, indent=2))

    for option in options:
        option(command)
    return command


for _name, _spec in BENCHMARKS.items():
    bench.add_command(_command(_name, *_spec))

COMMANDS = [bench]
