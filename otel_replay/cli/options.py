"""Options that `attribute` and `watch` share: what is a failure, and where blame is sent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])


def verifier_options(fn: F) -> F:
    """Add --policies, the verifier (--verifier or a built-in --expect-...) and --threshold; the command
    gets `policies_spec`, `verifier`, `expect_contains`, `expect_regex`, `expect_json_schema`, `threshold`."""
    for option in reversed([
        click.option("--policies", "policies_spec", metavar="MODULE", help="Module whose import registers policies."),
        click.option("--verifier", help="pkg.module:function(final_output, rollout) -> score in [0, 1]."),
        click.option("--expect-contains", help="Built-in verifier: the final output contains this text."),
        click.option("--expect-regex", help="Built-in verifier: the final output matches this regular expression."),
        click.option("--expect-json-schema", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="Built-in verifier: the final output is JSON valid against this schema."),
        click.option("--threshold", default=0.5, show_default=True, type=click.FloatRange(0, 1),
                     help="Scores below fail."),
    ]):
        fn = option(fn)
    return fn


def export_options(what: str) -> Callable[[F], F]:
    """Add --export otlp with its endpoint, protocol, headers and service name; `what`: the --export
    help. The command gets `export_to`, `otlp_endpoint`, `otlp_protocol`, `otlp_headers`, `service_name`."""
    def decorate(fn: F) -> F:
        for option in reversed([
            click.option("--export", "export_to", type=click.Choice(["otlp"]), help=what),
            click.option("--otlp-endpoint", help="With --export otlp. Default: $OTEL_EXPORTER_OTLP_ENDPOINT."),
            click.option("--otlp-protocol", type=click.Choice(["grpc", "http/protobuf"]),
                         help="With --export otlp. Default: $OTEL_EXPORTER_OTLP_PROTOCOL or http/protobuf."),
            click.option("--otlp-header", "otlp_headers", multiple=True, metavar="K=V",
                         help="With --export otlp: an extra header (repeatable)."),
            click.option("--service-name", default="otel-replay", show_default=True,
                         help="service.name of the blame spans."),
        ]):
            fn = option(fn)
        return fn
    return decorate


def engine_options(fn: F) -> F:
    """Add --engine, --address and --worker-cpus; the command gets `engine`, `address`, `worker_cpus`."""
    from otel_replay.attribution.executors import ENGINES

    for option in reversed([
        click.option("--engine", type=click.Choice(ENGINES), default="local", show_default=True,
                     help="Where rollouts run: threads here, or Ray workers (pip install 'otel-replay[ray]')."),
        click.option("--address", help="--engine ray: the cluster (auto, ray://HOST:10001); default: a new local "
                                       "instance."),
        click.option("--worker-cpus", default=0.25, show_default=True, type=click.FloatRange(0, min_open=True),
                     help="--engine ray: CPUs each of the --concurrency workers reserves (rollouts mostly wait on "
                          "models)."),
    ]):
        fn = option(fn)
    return fn
