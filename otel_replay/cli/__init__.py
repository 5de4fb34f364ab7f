"""The `otel-replay` command: a thin, friendly face over the library."""

from __future__ import annotations

import click

from otel_replay._version import __version__
from otel_replay.cli import attribute, bench, collect, demo, imports, maintenance, replaying, traces
from otel_replay.store.layout import STORE_ENV
from otel_replay.trajectory import Store


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--store", "store_path", envvar=STORE_ENV, default="otel-replay-store", show_default=True,
              show_envvar=True, help="Store directory or URL (s3://bucket/prefix, gs://..., file:///...): "
              "what ReplayProcessor writes to.")
@click.version_option(__version__, prog_name="otel-replay")
@click.pass_context
def main(ctx: click.Context, store_path: str) -> None:
    """Find which step made an agent run fail, from its OpenTelemetry trace.

    Example: otel-replay traces --failed --since 1h
    """
    ctx.obj = Store(store_path)


for module in (demo, traces, imports, replaying, attribute, maintenance, bench, collect):
    for command in module.COMMANDS:
        main.add_command(command)
