"""`status` and `compact`: look after the store."""

from __future__ import annotations

import json

import click

from otel_replay.cli.output import StoreCommand
from otel_replay.store.compact import compact_day, days
from otel_replay.store.layout import cleanup_temp
from otel_replay.store.schema import TABLES
from otel_replay.trajectory import Store


@click.command(cls=StoreCommand)
@click.pass_obj
def status(store: Store) -> None:
    """Store location, segment and row counts, and what capture dropped or skipped."""
    click.echo(f"store: {store.root.resolve()}")
    for table in TABLES:
        files = list((store.root / table).glob("*/*.parquet"))
        size = sum(f.stat().st_size for f in files)
        click.echo(f"  {table:14} {len(files):6} segments {size / 1e6:10.2f} MB")
    (spans, steps, messages, traces), = store.named("table_counts")
    click.echo(f"rows: {traces} traces, {spans} spans, {steps} steps, {messages} distinct payloads")
    for host, pid, _, accepted, dropped, skipped, reasons in store.named("capture_health_rows"):
        line = f"capture {host}/{pid}: accepted {accepted}, dropped (queue full) {dropped}, skipped {skipped}"
        click.echo(line + (f" {json.loads(reasons)}" if skipped else ""))


@click.command(cls=StoreCommand)
@click.option("--day", "only_day", help="Compact only this day (YYYY-MM-DD); default: every day.")
@click.pass_obj
def compact(store: Store, only_day: str | None) -> None:
    """Rewrite each day's segments as one file per table, sorted by trace id.

    Safe while services keep writing. Example: otel-replay compact --day 2026-11-30
    """
    removed = cleanup_temp(store.root)
    for day in [only_day] if only_day else days(store.root):
        for r in compact_day(store.root, day):
            click.echo(f"{r.day} {r.table}: {r.files_in} segments -> 1 ({r.rows_out} rows, "
                       f"{r.bytes_in / 1e6:.2f} MB -> {r.bytes_out / 1e6:.2f} MB)")
    if removed:
        click.echo(f"removed {removed} temp files left by crashed writers")


COMMANDS = [status, compact]
