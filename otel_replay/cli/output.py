"""Rows out: rich tables for people, JSON lines or CSV for programs."""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import decimal
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click
import pyarrow as pa
from rich.console import Console
from rich.table import Table
from rich.text import Text

from otel_replay.errors import OtelReplayError
from otel_replay.export.private import write_private
from otel_replay.store import Catalog

_HIDDEN = [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]  # C0 but tab and newline, DEL, C1
_REORDERING = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029]
_VISIBLE = {c: f"\\x{c:02x}" for c in _HIDDEN} | {c: f"\\u{c:04x}" for c in _REORDERING}
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in (*range(0x7F, 0xA0), *_REORDERING)}


def visible(text: Any) -> str:
    """Stored text as a terminal can show it: control characters (ESC, BEL, CR, C1 such as CSI)
    and bidirectional overrides become `\\x1b`-style escapes, so a span or tool name cannot move
    the cursor, retitle the window, clear the screen or reorder what is shown. Tabs and newlines
    stay (multi-line text keeps its lines)."""
    return ("" if text is None else str(text)).translate(_VISIBLE)


def echo(message: Any = "", err: bool = False) -> None:
    """`click.echo` of a line that may carry stored text (span, tool or model names, outputs)."""
    click.echo(visible(message), err=err)


def json_default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def dumps(value: Any, indent: int | None = None) -> str:
    """JSON with non-ASCII text as is, except what a terminal would act on: json escapes C0
    controls itself, and DEL, C1 controls and bidirectional overrides become `\\u` escapes too
    (still the same JSON value)."""
    return json.dumps(value, default=json_default, ensure_ascii=False, indent=indent).translate(_JSON_ESCAPES)


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


def cell(value: Any) -> Text:
    """A table cell: numbers and times formatted, text made visible and never read as rich markup
    (a name like `[bold]` or `[/]` is shown as written)."""
    if value is None:
        return Text("")
    if isinstance(value, float):
        return Text(f"{value:,.1f}")
    if isinstance(value, dt.datetime):
        return Text(value.strftime("%Y-%m-%d %H:%M:%S"))
    return Text(visible(value))


def text_table(title: Any, columns: Sequence[str], **options: Any) -> Table:
    """A rich table whose title and headers are plain text (no markup), made visible."""
    out = Table(title=None if title is None else cell(title), header_style="bold")
    for name in columns:
        out.add_column(cell(name), **options)
    return out


def print_rows(table: pa.Table, *, as_json: bool, as_csv: bool, title: str | None = None,
               columns: Sequence[str] | None = None) -> None:
    rows = table.to_pylist()
    names = list(columns or table.column_names)
    if as_json:
        for row in rows:
            click.echo(dumps({k: row[k] for k in names}))
    elif as_csv:  # text shown as in a table (CSV has no escapes); --json keeps every character
        writer = csv.writer(sys.stdout)
        writer.writerow([visible(k) for k in names])
        writer.writerows([[visible(row[k]) if isinstance(row[k], str) else row[k] for k in names] for row in rows])
    else:
        out = text_table(title, names, overflow="fold")
        for row in rows:
            out.add_row(*(cell(row[k]) for k in names))
        console().print(out)


def user_errors() -> tuple[type[Exception], ...]:
    """Library errors that are the user's to fix (shown as one line, never a traceback): all of them."""
    return (OtelReplayError,)


def _reason(exc: OSError) -> str:
    if exc.strerror and exc.filename:
        return f"{exc.strerror}: {exc.filename}"
    return str(exc) or type(exc).__name__


@contextlib.contextmanager
def writing_to(store: Catalog, then: str = "") -> Iterator[None]:
    """An OSError while a command writes the store (read-only, permission denied, disk full, a
    path that is a file) as one line naming the store and the reason, not a traceback. Segments
    appear whole or not at all, so what the command had not finished is simply absent."""
    try:
        yield
    except OSError as exc:
        raise click.ClickException(f"cannot write to the store at {store.root}: {_reason(exc)}"
                                   + (f"; {then}" if then else "")) from exc


def ensure_writable(store: Catalog) -> None:
    """Create the store if need be and write (then delete) an empty file in it, so a command whose
    capture would silently drop what it cannot write (`demo`) stops first, in one line."""
    with writing_to(store):
        store.root.ensure()
        probe = f"write-probe-{os.getpid()}-{os.urandom(4).hex()}"
        store.root.write(probe, lambda handle: None)
        store.root.delete(probe)


def write_file(path: Path, text: str) -> None:
    """A report or export file, 0600 (`export.private`); an OSError as one line naming the file."""
    try:
        write_private(path, text)
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {_reason(exc)}") from exc


def _store_here(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """`--store` given after the command: it wins over the one before it (and the environment)."""
    if value is not None:
        from otel_replay.trajectory import Store

        ctx.obj = Store(value)


class StoreCommand(click.Command):
    """A command whose library errors become one-line `Error: ...` messages (made visible: an error
    may quote a stored name), and that takes `--store` after its name as well as before it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(click.Option(["--store"], expose_value=False, callback=_store_here, metavar="PATH|URL",
                                        help="Store directory or URL (as `otel-replay --store ...`)."))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except user_errors() as exc:
            raise click.ClickException(visible(exc)) from exc
        except click.ClickException as exc:
            # ignore: click types `message` Final; changed in place, the exception (a UsageError, say) keeps
            # its class, exit code and context
            exc.message = visible(exc.message)  # type: ignore[misc]
            raise
