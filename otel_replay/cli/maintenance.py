"""`status`, `compact` and `doctor`: look after the store."""

from __future__ import annotations

import json

import click

from otel_replay.cli.output import StoreCommand, echo, writing_to
from otel_replay.store.compact import DEFAULT_GRACE_S, compact_store
from otel_replay.store.doctor import TEMP_GRACE_S, Damage
from otel_replay.store.doctor import doctor as run_doctor
from otel_replay.store.layout import cleanup_temp
from otel_replay.store.schema import TABLES
from otel_replay.trajectory import Store


@click.command(cls=StoreCommand)
@click.pass_obj
def status(store: Store) -> None:
    """Store location, segment and row counts, and what capture dropped or skipped."""
    click.echo(f"store: {store.root.display()}")
    snap = store.snapshot()
    for table in TABLES:
        files, old = snap.live[table], snap.superseded[table]
        size = sum(f.size for f in files)
        line = f"  {table:14} {len(files):6} segments {size / 1e6:10.2f} MB"
        click.echo(line + (f" (+{len(old)} replaced by a compaction, deleted when it finishes)" if old else ""))
    (spans, steps, messages, traces), = store.named("table_counts")
    click.echo(f"rows: {traces} traces, {spans} spans, {steps} steps, {messages} distinct payloads")
    (scored, failed, unscored, errors), = store.named("outcome_counts")
    click.echo(f"failures: {errors} traces with a span error; {failed} of {scored} traces scored by a verifier "
               f"(attribute, watch) failed it" + (f", {unscored} could not be scored" if unscored else ""))
    for host, pid, _, accepted, dropped, skipped, reasons in store.named("capture_health_rows"):
        line = f"capture {host}/{pid}: accepted {accepted}, dropped (queue full) {dropped}, skipped {skipped}"
        echo(line + (f" {json.loads(reasons)}" if skipped else ""))  # as recorded by each process: visible


@click.command(cls=StoreCommand)
@click.option("--day", "only_day", help="Compact only this day (YYYY-MM-DD); default: every day.")
@click.option("--grace", "grace_s", type=click.FloatRange(min=0), default=DEFAULT_GRACE_S, show_default=True,
              help="Seconds between writing the compacted segments and deleting the segments they replace.")
@click.pass_obj
def compact(store: Store, only_day: str | None, grace_s: float) -> None:
    """Rewrite each day's segments as one file per table, sorted by trace id.

    Safe while services keep writing and others read (run one compaction at a time per store).
    Example: otel-replay compact --day 2026-11-30
    """
    with writing_to(store):
        removed = cleanup_temp(store.root)
        for r in compact_store(store.root, [only_day] if only_day else None, grace_s=grace_s):
            click.echo(f"{r.day} {r.table}: {r.files_in} segments -> 1 ({r.rows_out} rows, "
                       f"{r.bytes_in / 1e6:.2f} MB -> {r.bytes_out / 1e6:.2f} MB)")
    if removed:
        click.echo(f"removed {removed} temp files left by crashed writers")


@click.command(cls=StoreCommand)
@click.option("--check", "check_only", is_flag=True, help="Only report; change nothing. Exits 1 if there are problems.")
@click.option("--temp-age", "temp_age_s", type=click.FloatRange(min=0), default=TEMP_GRACE_S, show_default=True,
              help="Seconds after which a temp file is taken as left by a crashed writer.")
@click.pass_obj
def doctor(store: Store, check_only: bool, temp_age_s: float) -> None:
    """Read every segment whole; move damaged ones to <store>/quarantine; roll back batches a crash
    tore (never visible: rerun the import); remove stale temp files.

    Until then, queries skip a damaged segment with a warning. Example: otel-replay doctor --check
    """
    def say(d: Damage) -> None:
        where = f" -> moved to {d.quarantined_to}" if d.quarantined_to else ""
        echo(f"damaged segment {d.rel}: {d.error}{where}", err=True)  # the error may quote the file's bytes

    try:
        report = run_doctor(store.root, fix=not check_only, temp_grace_s=temp_age_s, on_damage=say)
    except OSError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"store: {report.root}\nchecked {report.checked} segments ({report.checked_bytes / 1e6:.2f} MB) "
               f"in {report.seconds:.2f} s: {len(report.damaged)} damaged"
               + ("" if check_only or not report.damaged else ", moved to quarantine/ (each with a note saying why)"))
    for torn in report.torn:
        done = "rolled back (its segments deleted)" if torn.rolled_back else "hidden from readers"
        echo(f"torn batch {torn.manifest}: {len(torn.written)} of {torn.planned} segments written before a "
             f"crash; {done}; rerun the import that wrote it (a capture's spans were never acknowledged)", err=True)
    click.echo(f"torn batches: {len(report.torn)}")
    click.echo(f"temp files left by crashed writers: {report.temp_removed} removed, {report.temp_stale} stale "
               f"left, {report.temp_recent} recent (younger than {temp_age_s:g} s: a writer may own them)")
    if check_only and report.problems:
        click.echo(f"{report.problems} problems: run `otel-replay doctor` to fix them", err=True)
        raise SystemExit(1)


COMMANDS = [status, compact, doctor]
