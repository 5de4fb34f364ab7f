"""`collect`: an OTLP receiver, so any service in any language can send its traces to the store."""

from __future__ import annotations

import signal
import threading

import click

from otel_replay.capture.receiver import DEFAULT_MAX_BODY_MB, TOKEN_ENV, OtlpReceiver, ReceiverError
from otel_replay.cli.output import StoreCommand
from otel_replay.trajectory import Store

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def wait_for_stop_signal() -> None:
    """Block until Ctrl-C or SIGTERM."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@click.command(cls=StoreCommand)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--http-port", type=click.IntRange(0, 65535), default=4318, show_default=True, help="OTLP/HTTP port (0: any free port).")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=4317, show_default=True, help="OTLP/gRPC port (0: any free port).")
@click.option("--token", envvar=TOKEN_ENV, show_envvar=True, help="Accept only requests with 'Authorization: Bearer TOKEN'.")
@click.option("--max-body-mb", type=click.FloatRange(0, 2047, min_open=True), default=DEFAULT_MAX_BODY_MB,
              show_default=True, help="Largest request body, compressed or decompressed.")
@click.pass_obj
def collect(store: Store, host: str, http_port: int, grpc_port: int, token: str | None, max_body_mb: float) -> None:
    """Receive OTLP traces and logs (HTTP and gRPC) from any service into the store.

    Example: otel-replay collect --token s3cret
    """
    receiver = OtlpReceiver(store.root, host=host, http_port=http_port, grpc_port=grpc_port, token=token,
                            max_body_mb=max_body_mb)
    try:
        receiver.start()
    except ReceiverError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"OTLP/HTTP  {receiver.http_endpoint}  (/v1/traces, /v1/logs)")
    click.echo(f"OTLP/gRPC  {receiver.grpc_endpoint}")
    click.echo(f"store      {store.root.resolve()}")
    if host not in LOOPBACK and not token:
        click.echo(f"warning: listening on {host} without a token; anyone who can reach it can write to the store "
                   f"(set --token or {TOKEN_ENV})", err=True)
    wait_for_stop_signal()
    click.echo("stopping: writing what was accepted ...")
    receiver.stop()
    c = receiver.counts
    click.echo(f"spans: {c['accepted_traces']} accepted, {c['refused_traces']} refused (queue full), "
               f"{c['malformed_traces']} malformed")
    click.echo(f"log records: {c['accepted_logs']} accepted, {c['refused_logs']} refused (queue full), "
               f"{c['malformed_logs']} malformed")


COMMANDS = [collect]
