"""Rows out: rich tables for people, JSON lines or CSV for programs."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click
import pyarrow as pa
from rich.console import Console
from rich.table import Table

from otel_replay.store import StoreError


def json_default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def dumps(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, default=json_default, ensure_ascii=False, indent=indent)


def output_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--json / --csv for every command that prints rows."""
    fn = click.option("--csv", "as_csv", is_flag=True, help="CSV with a header row.")(fn)
    return click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")(fn)


def console() -> Console:
    """A console that does not squeeze tables to 80 columns when output is piped."""
    con = Console(soft_wrap=False)
    if not con.is_terminal:
        con = Console(soft_wrap=False, width=200)
    return con


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def print_rows(table: pa.Table, *, as_json: bool, as_csv: bool, title: str | None = None,
               columns: Sequence[str] | None = None) -> None:
    rows = table.to_pylist()
    names = list(columns or table.column_names)
    if as_json:
        for row in rows:
            click.echo(dumps({k: row[k] for k in names}))
    elif as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(names)
        writer.writerows([[row[k] for k in names] for row in rows])
    else:
        out = Table(title=title, header_style="bold")
        for name in names:
            out.add_column(name, overflow="fold")
        for row in rows:
            out.add_row(*(cell(row[k]) for k in names))
        console().print(out)


def user_errors() -> tuple[type[Exception], ...]:
    """Library errors that are the user's to fix (shown as one line, never a traceback)."""
    from otel_replay.attribution import AttributionError, VerifierError
    from otel_replay.export.otlp import ExportError
    from otel_replay.replay.policies import PolicyError

    return StoreError, AttributionError, VerifierError, PolicyError, ExportError


class StoreCommand(click.Command):
    """A command whose library errors become one-line `Error: ...` messages."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except user_errors() as exc:
            raise click.ClickException(str(exc)) from exc
