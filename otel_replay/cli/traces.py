"""`traces`, `show`, `sql`: browse the store."""

from __future__ import annotations

import datetime as dt
import re
import time

import click

from otel_replay.cli.output import (
    StoreCommand,
    cell,
    console,
    dumps,
    echo,
    output_options,
    print_rows,
    text_table,
)
from otel_replay.cli.preview import shorten, step_preview
from otel_replay.trajectory import Store

_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
TRACE_COLUMNS = ["trace_id", "start", "root_name", "service_name", "steps", "llm_steps", "tool_steps", "status", "tokens"]


def parse_since(value: str | None) -> int:
    """`90s`, `30m`, `1h`, `2d`, `1w` or an ISO time -> epoch nanoseconds (0 for None)."""
    if not value:
        return 0
    match = _SPAN.match(value)
    if match:
        return time.time_ns() - int(float(match.group(1)) * _UNIT_S[match.group(2)] * 1e9)
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}: use a duration like 30m, 1h, 2d or an ISO time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1e9)


@click.command(cls=StoreCommand)
@click.option("--failed", is_flag=True, help="Only traces whose root span or last step failed.")
@click.option("--since", help="Only traces that started within this window (30m, 1h, 2d) or after an ISO time.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1), help="Newest traces shown.")
@output_options
@click.pass_obj
def traces(store: Store, failed: bool, since: str | None, limit: int, as_json: bool, as_csv: bool) -> None:
    """List traces, newest first: steps, model and tool calls, status, tokens.

    Example: otel-replay traces --failed --since 1h
    """
    rows = store.list_traces(failed=failed, since_ns=parse_since(since), limit=limit)
    print_rows(rows, as_json=as_json, as_csv=as_csv, columns=TRACE_COLUMNS, title=f"traces in {store.root}")
    totals = store.capture_totals()
    if totals["dropped_queue_full"] and not (as_json or as_csv):
        click.echo(f"warning: capture dropped {totals['dropped_queue_full']} spans (queue full); "
                   "see `otel-replay status`", err=True)


@click.command(cls=StoreCommand)
@click.argument("trace_id")
@click.option("--json", "as_json", is_flag=True, help="The full canonical trajectory, payloads included.")
@click.pass_obj
def show(store: Store, trace_id: str, as_json: bool) -> None:
    """Show one trace as a trajectory: each step with a preview of inputs → output.

    TRACE_ID may be a unique prefix (6+ hex digits). Example: otel-replay show 4bf92f
    """
    trajectory = store.trajectory(trace_id)
    if as_json:
        click.echo(dumps(trajectory.to_dict(), indent=2))
        return
    agents = {a.span_id: a for a in trajectory.agents}
    out = text_table(f"trace {trajectory.trace_id} · {trajectory.root_name} · {trajectory.status}",
                     ("#", "kind", "name", "model", "agent", "span", "ms", "status", "inputs → output"), overflow="fold")
    for step in trajectory.steps:
        agent = agents.get(step.agent_span_id or "")
        out.add_row(*map(cell, (step.index, step.kind, step.name, step.model, step.agent or (agent.name if agent else ""),
                                step.span_id, step.duration_ms, step.status + (" · redacted" if step.redacted else ""),
                                step_preview(step))))
    console().print(out)
    redacted = [f"step {s.index}: {', '.join(s.redacted)}" for s in trajectory.steps if s.redacted]
    if redacted:
        echo("redacted before storage (a policy that re-runs these steps sees placeholders): " + "; ".join(redacted))
    echo(f"final output: {shorten(trajectory.final_output, 200) or '(none)'}")


@click.command(cls=StoreCommand)
@click.argument("query")
@output_options
@click.pass_obj
def sql(store: Store, query: str, as_json: bool, as_csv: bool) -> None:
    """Run one SELECT over the store's views: spans, steps, messages, traces (and rollouts, jobs, ...).

    It reads the store's segments and nothing else: no other file or URL, COPY, ATTACH, INSTALL,
    LOAD or SET.

    Example: otel-replay sql "select name, count(*) from steps where status = 'error' group by 1"
    """
    from otel_replay.store.catalog import QueryError

    try:
        rows = store.sql(query)
    except QueryError as exc:
        raise click.ClickException(f"SQL error: {exc.detail.strip()}") from exc  # with DuckDB's hint and caret
    print_rows(rows, as_json=as_json, as_csv=as_csv)


COMMANDS = [traces, show, sql]
