"""`collect`: an OTLP receiver, so any service in any language can send its traces to the store."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import click

from otel_replay.capture.processor import ReplayProcessor
from otel_replay.capture.receiver import (
    DEFAULT_MAX_BODY_MB,
    TOKEN_ENV,
    OtlpReceiver,
    ReceiverError,
    is_loopback,
)
from otel_replay.capture.receiver_limits import DEFAULT_RATE
from otel_replay.capture.receiver_workers import MAX_AUTO_WORKERS, auto_workers
from otel_replay.cli.output import StoreCommand
from otel_replay.cli.privacy import privacy_from, privacy_options
from otel_replay.trajectory import Store

STOP_TIMEOUT_S = 300.0  # at SIGTERM, how long the writer gets to store what was acknowledged
QUEUE_BYTES = 256 * 1024 * 1024  # the queue byte cap of one `ReplayProcessor`, split among the workers
MIN_WORKER_QUEUE_BYTES = 64 * 1024 * 1024  # below ~60 MB the writer's own reserves no longer fit (sizing.py)
MAX_WORKERS = 64


@contextlib.contextmanager
def stop_signal() -> Iterator[threading.Event]:
    """An Event set by Ctrl-C or SIGTERM, caught from the moment this is entered (so a signal
    that arrives while the servers start still stops them cleanly)."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@click.command(cls=StoreCommand)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; then set --token).")
@click.option("--http-port", type=click.IntRange(0, 65535), default=4318, show_default=True, help="OTLP/HTTP port (0: any free port).")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=4317, show_default=True, help="OTLP/gRPC port (0: any free port).")
@click.option("--token", envvar=TOKEN_ENV, show_envvar=True, help="Accept only requests with 'Authorization: Bearer TOKEN'.")
@click.option("--max-body-mb", type=click.FloatRange(0, 2047, min_open=True), default=DEFAULT_MAX_BODY_MB,
              show_default=True, help="Largest request body, compressed or decompressed.")
@click.option("--max-requests-per-s", type=click.FloatRange(0), default=DEFAULT_RATE, show_default=True,
              help="Requests per second from one client address; more get 429 and a retry delay (0: no limit).")
@click.option("--workers", type=click.IntRange(0, MAX_WORKERS), default=0, show_default=True,
              help="Processes that decode and store (each trace whole in one); 0: one per core, "
                   f"at most {MAX_AUTO_WORKERS}; 1: this process alone.")
@click.option("--durable/--no-durable", default=False, show_default=True,
              help="Answer a request only once its spans are in a fsynced write-ahead log (<store>/_wal); "
                   "at start, replay what a killed receiver left there. Needs a local store.")
@privacy_options
@click.pass_obj
def collect(store: Store, host: str, http_port: int, grpc_port: int, token: str | None, max_body_mb: float,
            max_requests_per_s: float, workers: int, durable: bool, redact_rules: Path | None, no_redact: bool,
            payloads: str) -> None:
    """Receive OTLP traces and logs (HTTP and gRPC) from any service into the store.

    Example: otel-replay collect --token s3cret
    """
    redact, capture_payloads = privacy_from(redact_rules, no_redact, payloads)  # secrets redacted before storage
    workers = workers or auto_workers()
    # the queue's byte cap is shared out (down to what one worker's writer needs to run well)
    make = functools.partial(ReplayProcessor, store.root, redact=redact, capture_payloads=capture_payloads,
                             max_queue_bytes=max(QUEUE_BYTES // workers, MIN_WORKER_QUEUE_BYTES),
                             yield_gil=workers == 1)  # a worker has no request threads to yield to
    receiver = OtlpReceiver(store.root, host=host, http_port=http_port, grpc_port=grpc_port, token=token,
                            max_body_mb=max_body_mb, max_requests_per_s=max_requests_per_s or None,
                            workers=workers, processor_factory=make if workers > 1 else None,
                            processor=make() if workers == 1 else None, durable=durable)
    with stop_signal() as stop:
        try:
            receiver.start()
        except ReceiverError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(f"OTLP/HTTP  {receiver.http_endpoint}  (/v1/traces, /v1/logs)")
        click.echo(f"OTLP/gRPC  {receiver.grpc_endpoint}")
        click.echo(f"store      {store.root.display()}")
        click.echo(f"workers    {workers} {'process' if workers == 1 else 'processes'}")
        click.echo(durable_line(receiver) if durable else "durable    no (acknowledged once queued in memory; --durable)")
        if not token and not is_loopback(host):
            click.echo(f"warning: listening on {host} without a token; anyone who can reach it can write to the "
                       f"store (set --token or {TOKEN_ENV})", err=True)
        while not stop.wait(0.5):
            pass
        click.echo("stopping: writing what was accepted ...")
        receiver.stop(STOP_TIMEOUT_S)
    c = receiver.counts
    click.echo(f"spans: {c['accepted_traces']} accepted, {c['refused_traces']} refused (queue full), "
               f"{c['malformed_traces']} malformed")
    click.echo(f"log records: {c['accepted_logs']} accepted, {c['refused_logs']} refused (queue full), "
               f"{c['malformed_logs']} malformed")
    if receiver.throttled:
        click.echo(f"requests over a client's rate (429): {receiver.throttled}")
    stats = receiver.stats()
    if durable:
        click.echo(f"write-ahead log: {stats.get('wal_records', 0)} requests logged in {stats.get('wal_syncs', 0)} "
                   f"fsyncs; {stats.get('wal_lost_segments', 0)} segments logged again after the store refused a write")
    unwritten = stats.get("queued", 0)
    if unwritten:
        fate = "stay in the write-ahead log for the next start" if durable else "are lost"
        click.echo(f"warning: {unwritten} accepted records were not written within {STOP_TIMEOUT_S:g} s and {fate}",
                   err=True)


def durable_line(receiver: OtlpReceiver) -> str:
    """What `--durable` replayed at start, for the banner."""
    stats = receiver.stats()
    replayed = stats.get("wal_replayed_requests", 0)
    said = (f"; replayed {replayed} logged requests a stopped receiver left ({stats.get('wal_replayed_records', 0)} "
            f"records queued, {stats.get('wal_skipped_stored', 0)} already stored)" if replayed else "")
    return f"durable    yes (write-ahead log in {receiver.store.display()}/_wal{said})"


COMMANDS = [collect]
