"""`import`: bring traces from LangSmith, Langfuse, OTLP files, Jaeger and Who&When into the store."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click

from otel_replay.cli.output import StoreCommand, echo, writing_to
from otel_replay.cli.privacy import privacy_from, privacy_options
from otel_replay.normalize.privacy import Privacy
from otel_replay.normalize.sources.files import SourceBatch, UnreadableFile
from otel_replay.store.import_files import import_files
from otel_replay.store.ingest import IngestResult
from otel_replay.trajectory import Store

FORMATS = ("otlp", "langsmith", "langfuse", "jaeger", "whowhen", "auto")


def _summary(batches: list[SourceBatch], result: IngestResult) -> int:
    """Print what was stored and skipped; returns how many records were skipped."""
    stored, already, steps, problems, unmatched = (result.spans, result.already_stored, result.steps,
                                                   result.problems, result.unmatched_logs)
    echo(f"imported {result.traces} traces: {stored} spans stored ({steps} steps), {already} already in the store")
    if result.redacted_steps:
        click.echo(f"redacted before storage: content of {result.redacted_steps} steps (`otel-replay show` marks them)")
    skipped = [(loc, why) for b in batches for loc, why in b.skipped]
    if skipped:
        click.echo(f"skipped {len(skipped)} records:")
        for reason, n in Counter(why for _, why in skipped).most_common(10):  # reasons quote the input: visible
            first = next(loc for loc, why in skipped if why == reason)
            echo(f"  {n} × {reason} (first at {first})")
    for problem in problems[:10]:
        echo(f"  stored without payload: {problem}")
    if unmatched:
        click.echo(f"{unmatched} log events matched no span of this import; import them with their trace file")
    return len(skipped)


def make_import(fmt: str) -> click.Command:
    @click.command(name=fmt, cls=StoreCommand)
    @click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
    @privacy_options
    @click.option("--jobs", "-j", type=click.IntRange(min=0), default=0, show_default=True,
                  help="Worker processes for large imports (0: one per core, up to 8); each takes whole traces, "
                       "and reads them itself from OTLP/JSON trace files.")
    @click.pass_obj
    def command(store: Store, paths: tuple[Path, ...], redact_rules: Path | None, no_redact: bool,
                payloads: str, jobs: int) -> None:
        privacy = Privacy(*privacy_from(redact_rules, no_redact, payloads))
        try:
            with writing_to(store, "rerun the import once it is writable (what is already stored is not "
                                   "stored twice)"):
                store.root.ensure()
                batches, result = import_files(store.root, fmt, paths, jobs=jobs, privacy=privacy)
        except UnreadableFile as exc:
            raise click.ClickException(str(exc)) from exc
        skipped = _summary(batches, result)
        if skipped and not result.spans and not result.already_stored:  # a script must not take this for success
            raise click.ClickException(f"nothing imported: all {skipped} records read were skipped (reasons above)")

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
