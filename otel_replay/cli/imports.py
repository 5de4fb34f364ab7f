"""`import`: bring traces from LangSmith, Langfuse, OTLP files, Jaeger and Who&When into the store."""

from __future__ import annotations

import functools
import re
from collections import Counter
from pathlib import Path
from typing import Any

import click

from otel_replay.cli.output import StoreCommand
from otel_replay.cli.privacy import privacy_from, privacy_options
from otel_replay.normalize.privacy import Privacy
from otel_replay.normalize.records import LogEvent, SpanRecord, TracePart, partition_of
from otel_replay.normalize.sources.files import (
    ParsedOtlpJson,
    SourceBatch,
    UnreadableFile,
    decode_otlp_json,
    read,
    read_otlp_parsed,
)
from otel_replay.store.ingest import IngestResult
from otel_replay.store.ingest_parallel import can_fork, ingest_decoded, ingest_parallel, jobs_for
from otel_replay.trajectory import Store

FORMATS = ("otlp", "langsmith", "langfuse", "jaeger", "whowhen", "auto")


def _summary(batches: list[SourceBatch], result: IngestResult) -> None:
    stored, already, steps, problems, unmatched = (result.spans, result.already_stored, result.steps,
                                                   result.problems, result.unmatched_logs)
    click.echo(f"imported {result.traces} traces: {stored} spans stored ({steps} steps), {already} already in the store")
    if result.redacted_steps:
        click.echo(f"redacted before storage: content of {result.redacted_steps} steps (`otel-replay show` marks them)")
    skipped = [(loc, why) for b in batches for loc, why in b.skipped]
    if skipped:
        click.echo(f"skipped {len(skipped)} records:")
        for reason, n in Counter(why for _, why in skipped).most_common(10):
            first = next(loc for loc, why in skipped if why == reason)
            click.echo(f"  {n} × {reason} (first at {first})")
    for problem in problems[:10]:
        click.echo(f"  stored without payload: {problem}")
    if unmatched:
        click.echo(f"{unmatched} log events matched no span of this import; import them with their trace file")


def _parse_otlp(paths: tuple[Path, ...]) -> list[ParsedOtlpJson] | None:
    """Every file parsed (OTLP/JSON), or None if one is protobuf (those are decoded whole, as before)."""
    parsed = []
    for path in paths:
        try:
            item = read_otlp_parsed(path)
        except UnreadableFile as exc:
            raise click.ClickException(str(exc)) from exc
        if not isinstance(item, ParsedOtlpJson):
            return None
        parsed.append(item)
    return parsed


def _decode_part(traces: list[ParsedOtlpJson], logs: list[list[LogEvent]],
                 part: TracePart | None) -> tuple[list[SpanRecord], list[LogEvent], Any]:
    """One worker's spans (decoded here) and log events (decoded and assigned in the parent), and per
    file the records it skipped, or the reason a file is unreadable."""
    try:
        batches = [decode_otlp_json(p, part) for p in traces]
    except UnreadableFile as exc:  # a request-level error: every part finds it alike
        return [], [], str(exc)
    return [s for b in batches for s in b.spans], logs[part[0] if part else 0], [b.skipped for b in batches]


def _import_parsed(store: Store, parsed: list[ParsedOtlpJson], jobs: int,
                   privacy: Privacy) -> tuple[list[SourceBatch], IngestResult]:
    """Spans decoded by every worker, each its share of the traces; log events decoded here (they
    are few) and sent with the span they name, else by their trace, as `split` does."""
    traces = [p.of_signal(logs=False) for p in parsed]
    spans = sum(p.span_count() for p in traces)
    workers = jobs_for(spans, spans, jobs)
    try:
        log_batches = [decode_otlp_json(p.of_signal(logs=True)) for p in parsed]
    except UnreadableFile as exc:
        raise click.ClickException(str(exc)) from exc
    owner = {span: part for p in traces for span, part in p.span_owners(workers).items()}
    logs: list[list[LogEvent]] = [[] for _ in range(workers)]
    for log in (g for b in log_batches for g in b.logs):
        part = owner.get(log.span_id or "")
        logs[partition_of(log.trace_id, workers) if part is None else part].append(log)
    extras, result = ingest_decoded(store.root, functools.partial(_decode_part, traces, logs), spans,
                                    source="import:otlp", skip_existing=True, privacy=privacy, jobs=workers)
    unreadable = next((extra for extra in extras if isinstance(extra, str)), None)
    if unreadable is not None:
        raise click.ClickException(unreadable)
    batches = []
    for i, p in enumerate(parsed):  # each record's error came from one part, a request's from each
        found = {entry for extra in extras for entry in extra[i]} | set(log_batches[i].skipped)
        batches.append(SourceBatch(p.path, "otlp", skipped=p.skipped + sorted(found, key=_in_file_order)))
    return batches, result


def _in_file_order(entry: tuple[str, str]) -> tuple[int, ...]:
    """A skipped record's place in its file: its line, then the indices of its path in the request."""
    return tuple(int(n) for n in re.findall(r"(?::|\[)(\d+)", entry[0]))


def make_import(fmt: str) -> click.Command:
    @click.command(name=fmt, cls=StoreCommand)
    @click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
    @privacy_options
    @click.option("--jobs", "-j", type=click.IntRange(min=0), default=0, show_default=True,
                  help="Worker processes for large imports (0: one per core, up to 8); each takes whole traces.")
    @click.pass_obj
    def command(store: Store, paths: tuple[Path, ...], redact_rules: Path | None, no_redact: bool,
                payloads: str, jobs: int) -> None:
        privacy = Privacy(*privacy_from(redact_rules, no_redact, payloads))
        store.root.ensure()
        if fmt == "otlp" and jobs != 1 and can_fork():
            parsed = _parse_otlp(paths)
            if parsed is not None:  # OTLP/JSON only: every core decodes its share of the traces
                _summary(*_import_parsed(store, parsed, jobs, privacy))
                return
        batches = []
        for path in paths:
            try:
                batches.append(read(fmt, path))
            except UnreadableFile as exc:
                raise click.ClickException(str(exc)) from exc
        spans = [s for b in batches for s in b.spans]
        logs = [g for b in batches for g in b.logs]
        source = "import:" + ",".join(sorted({b.format for b in batches}))
        result = ingest_parallel(store.root, spans, logs, source=source, skip_existing=True, privacy=privacy,
                                 jobs=jobs)
        _summary(batches, result)

    command.help = {
        "otlp": "OTLP/JSON or protobuf ExportTraceServiceRequest / ExportLogsServiceRequest files (one request per file or per line).",
        "langsmith": "LangSmith runs: list_runs dumps (JSON or JSON lines), v1/v2 runs-query pages, ingest ops.",
        "langfuse": "Langfuse exports: trace get (with observations), Observations v2 pages, or its OTLP spans.",
        "jaeger": "Jaeger query API / UI download JSON.",
        "whowhen": "Who&When failure logs: a directory (searched recursively) or single .json files.",
        "auto": "Any of the above; the format is read from each file's content.",
    }[fmt] + ("\n\nImporting the same file twice stores nothing twice. Secrets (API keys, bearer tokens, emails, "
              "card numbers) are redacted before storage unless --no-redact.")
    return command


@click.group(name="import")
def import_group() -> None:
    """Import traces from LangSmith, Langfuse, OTLP files, Jaeger or Who&When.

    Example: otel-replay import langsmith runs.jsonl
    """


for _fmt in FORMATS:
    import_group.add_command(make_import(_fmt))

COMMANDS = [import_group]
