"""`demo`: the whole story offline, on the embedded default store."""

from __future__ import annotations

from pathlib import Path

import click

from otel_replay.attribution import Job, JobParams
from otel_replay.cli.attribute import print_result, run_job, trace_url_option, write_outputs
from otel_replay.cli.output import StoreCommand, ensure_writable
from otel_replay.replay.policies import Registry
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.support_agent import record_support_run, register_policies, support_model
from otel_replay.trajectory import Store

VERIFIER = "otel_replay.testing.support_agent:refunded"


@click.command(cls=StoreCommand)
@click.option("--html", "html_path", default="otel-replay-demo.html", show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="Where to write the HTML report.")
@click.option("--rollouts", type=click.IntRange(min=2),
              help="A fixed number of rollouts per plan (default: add rollouts until each step is decided).")
@trace_url_option
@click.pass_obj
def demo(store: Store, html_path: Path, rollouts: int | None, trace_url: str | None) -> None:
    """Record a failing run of the example support agent, find its culprit, repair it, report.

    Everything runs offline: the real openai SDK talks to a simulated model on 127.0.0.1, the real
    OpenTelemetry instrumentation traces it, ReplayProcessor captures it. Example: otel-replay demo
    """
    try:
        import openai  # noqa: F401
        import opentelemetry.instrumentation.openai_v2  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(f"the demo needs the openai SDK and the OpenTelemetry OpenAI instrumentation "
                                   f"({exc.name} is missing): pip install 'otel-replay[demo]'") from exc
    ensure_writable(store)  # capture drops what it cannot write: say so now, not "no trace" later
    click.echo(f"1/3 recording a run of the support agent into {store.root} ...")
    # ignore: it takes any StoreLike (it hands the store to recording(), typed Any), but its annotation in
    # otel_replay/testing (not type-checked yet) says str | PathLike; a str would drop a remote store's options
    trace_id, answer = record_support_run(store.root)  # type: ignore[arg-type]
    click.echo(f"    trace {trace_id}: {answer}")
    click.echo("2/3 attributing the failure (re-deciding steps against the simulated model) ...")
    with SimulatedModelServer(support_model()) as server:
        registry = Registry()
        register_policies(server.base_url, registry)
        params = JobParams([trace_id], VERIFIER, rollouts=rollouts, repair=True, concurrency=4)
        (result,) = run_job(store, Job(store, params, registry))
    click.echo("3/3 result")
    print_result(store, result)
    write_outputs(store, [result], None, html_path, trace_url)
    click.echo(f"next: otel-replay --store {store.root} show {trace_id}   ·   open {html_path}")


COMMANDS = [demo]
