"""The `otel-replay` command: a thin, friendly face over the library.

Each command's module loads when that command runs, so `otel-replay --help` (and a mistyped
command) answers without importing DuckDB, pyarrow or the attribution engine.
"""

from __future__ import annotations

import click

from otel_replay._version import __version__
from otel_replay.store.location import STORE_ENV

# name -> (module, attribute, one-line help shown by `otel-replay --help`; a test keeps it equal to the command's)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "aggregate": ("attribute", "aggregate",
                  "The systematic weak step: how often each step name is the culprit across failing runs."),
    "attribute": ("attribute", "attribute",
                  "Find the step that made a run fail: counterfactual rollouts, intervals, a repair."),
    "bench": ("bench", "bench", "Benchmarks (ratios against a baseline measured in the same run)."),
    "collect": ("collect", "collect", "Receive OTLP traces and logs (HTTP and gRPC) from any service into the store."),
    "compact": ("maintenance", "compact", "Rewrite each day's segments as one file per table, sorted by trace id."),
    "demo": ("demo", "demo",
             "Record a failing run of the example support agent, find its culprit, repair it, report."),
    "diff": ("replaying", "diff", "Compare two traces step by step: the first divergence and what changed."),
    "doctor": ("maintenance", "doctor",
               "Read every segment whole; move damaged ones to <store>/quarantine; roll back batches a crash tore "
               "(never visible: rerun the import); remove stale temp files."),
    "export": ("attribute", "export",
               "Blame back into the original trace: OTLP to Jaeger/Tempo/Grafana, or Jaeger/OTLP JSON files."),
    "fork": ("replaying", "fork", "Re-run a trace with one step changed and store the result as a child trace."),
    "import": ("imports", "import_group", "Import traces from LangSmith, Langfuse, OTLP files, Jaeger or Who&When."),
    "jobs": ("attribute", "jobs", "Attribution jobs with their status, progress and policy calls spent."),
    "replay": ("replaying", "replay",
               "Replay a trace with every step held and prove, by hash, that it reproduces the recording."),
    "report": ("attribute", "report",
               "Re-render a stored attribution report (terminal, JSON, HTML) without re-running anything."),
    "show": ("traces", "show", "Show one trace as a trajectory: each step with a preview of inputs → output."),
    "sql": ("traces", "sql",
            "Run one SELECT over the store's views: spans, steps, messages, traces (and rollouts, jobs, ...)."),
    "status": ("maintenance", "status",
               "Store location, segment and row counts, and what capture dropped or skipped."),
    "traces": ("traces", "traces", "List traces, newest first: steps, model and tool calls, status, tokens."),
    "watch": ("watch", "watch",
              "Attribute new failing traces as they arrive, once each, within a policy-call budget."),
}


class LazyGroup(click.Group):
    """A group whose commands are imported when one is run (or its help asked for)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        import importlib

        module, attribute, _ = COMMANDS[cmd_name]
        return getattr(importlib.import_module(f"otel_replay.cli.{module}"), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        # a Command's short help shortens `summary` as click.utils.make_default_short_help did (deprecated in click
        # 8.5, reached only through a module __getattr__ that mypy types as object)
        rows = [(name, click.Command(name, help=summary).get_short_help_str(limit)) for name, (_, _, summary)
                in sorted(COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--store", "store_path", envvar=STORE_ENV, default="otel-replay-store", show_default=True,
              show_envvar=True, help="Store directory or URL (s3://bucket/prefix, gs://..., file:///...): "
              "what ReplayProcessor writes to.")
@click.version_option(__version__, prog_name="otel-replay")
@click.pass_context
def main(ctx: click.Context, store_path: str) -> None:
    """Find which step made an agent run fail, from its OpenTelemetry trace.

    Example: otel-replay traces --failed --since 1h
    """
    from otel_replay.trajectory import Store

    _current_directory_importable()
    ctx.obj = Store(store_path)


def _current_directory_importable() -> None:
    """`--policies mypolicies` and `--verifier mycheck:ok` find modules beside the user, as `python -m`,
    pytest and uvicorn do (an installed console script's path does not hold the current directory)."""
    import os
    import sys

    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
