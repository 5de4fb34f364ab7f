"""`attribute`, `jobs`, `aggregate`, `report`: causal attribution as resumable batch jobs."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from otel_replay.api import make_job, run
from otel_replay.attribution import AttributionError, AttributionResult, Job, VerifierError
from otel_replay.attribution.executors import EngineError
from otel_replay.attribution.job import JobInterrupted, resume_hint, select_traces
from otel_replay.attribution.result import Report, as_result
from otel_replay.attribution.sequential import DEFAULT_ALPHA, DEFAULT_EPSILON, DEFAULT_MAX_ROLLOUTS
from otel_replay.cli.options import engine_options, export_options, verifier_options
from otel_replay.cli.output import (
    StoreCommand,
    cell,
    console,
    echo,
    output_options,
    print_rows,
    text_table,
    visible,
    write_file,
    writing_to,
)
from otel_replay.cli.privacy import redaction_options, redactor_from
from otel_replay.export.html import render_html
from otel_replay.export.report import report_json
from otel_replay.store import StoreError
from otel_replay.store.catalog import check_predicate
from otel_replay.trajectory import Store


def _verifier_spec(verifier: str | None, contains: str | None, regex: str | None, schema: Path | None) -> str:
    given = [v for v in (verifier, contains, regex, schema) if v is not None]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --verifier, --expect-contains, --expect-regex, --expect-json-schema")
    if contains is not None:
        return f"contains:{contains}"
    if regex is not None:
        return f"regex:{regex}"
    return f"json-schema:{schema}" if schema is not None else str(verifier)


def run_job(store: Store, job: Job) -> list[AttributionResult]:
    """Run with a progress bar on stderr: rollouts done, policy calls spent, the leading step."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("rollouts · {task.fields[calls]} policy calls · leading: {task.fields[leading]}"),
                  TimeElapsedColumn(), console=console_err(), transient=True) as bar:
        task = bar.add_task("attributing", total=None, calls=0, leading="—")
        job.on_progress = lambda p: bar.update(task, completed=p.rollouts, calls=p.policy_calls,
                                               leading=escape(visible(p.leading or "—")),  # a step name: no markup
                                               description=f"trace {p.trace[:8]}")
        click.echo(f"job {job.job_id} (if interrupted, continue it with --resume {job.job_id})", err=True)
        try:
            with writing_to(store), stopping_on_signals(lambda name: job.request_stop(f"interrupted ({name})")):
                results = run(job)
        except (JobInterrupted, KeyboardInterrupt):
            bar.stop()
            click.echo(f"interrupted: job {job.job_id} keeps the rollouts it ran; {resume_hint(job.job_id)}", err=True)
            raise click.exceptions.Exit(130) from None
        except (AttributionError, VerifierError) as exc:
            raise click.ClickException(str(exc)) from exc
    if job.errored:
        click.echo(f"warning: {job.errored} rollouts errored (a policy raised or timed out) and were left out of the "
                   "estimates; see: otel-replay sql \"select reason from rollouts where errored\"", err=True)
    return results


@contextlib.contextmanager
def stopping_on_signals(stop: Callable[[str], None]) -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM call `stop` with the signal's name: the job stops at its next
    checkpoint, resumable. A second Ctrl-C raises KeyboardInterrupt at once (still resumable)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    asked: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        asked.append(signum)
        if signum == signal.SIGINT and asked.count(signal.SIGINT) > 1:
            raise KeyboardInterrupt
        stop(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def console_err() -> Any:
    from rich.console import Console

    return Console(stderr=True)


EXIT_CODES = {"culprit-found": 0, "no-culprit": 3, "undecided": 4, "partial": 4, "unreplayable": 5}
"""`attribute`'s exit status by trace verdict (a batch takes the first that applies of 4, 5, 3, 0); 1 is an
error, 2 a usage error."""


def exit_code(verdicts: Iterable[str]) -> int:
    """The exit status of a job whose traces have these verdicts."""
    codes = {EXIT_CODES.get(v, 1) for v in verdicts}
    return next((c for c in (4, 5, 3) if c in codes), 0)


def _number(value: float | None, sign: bool = True) -> str:
    return "" if value is None else f"{value:+.2f}" if sign else f"{value:.2f}"


def print_result(store: Store, report: Report) -> None:
    """The result as the terminal shows it: the steps' table, the Shapley values' table, the explanation."""
    result = as_result(report)
    verdict: str = result.verdict
    if result.candidates and verdict != "culprit-found":
        verdict += " between steps " + ", ".join(str(i) for i in result.candidates)
    if result.steps:
        table = text_table(f"attribution of {result.trace_id} · {verdict}", (
            "#", "kind", "name", "effect", _interval_header(result), "P(fail|held)", "P(fail|re-decided)", "n", "verdict"))
        for s in result.steps:
            interval = f"[{s.ci_low:+.2f}, {s.ci_high:+.2f}]" if s.ci_low is not None and s.ci_high is not None else ""
            table.add_row(*map(cell, (s.index, s.kind, s.name, _number(s.estimate), interval,
                                      _number(s.fail_held, False), _number(s.fail_resampled, False),
                                      s.n_held or "", ("★ " if s.culprit else "") + s.verdict)))
        console().print(table)
    if result.shapley:
        names = {s.index: (s.kind, s.name) for s in result.steps}
        table = text_table(f"Shapley values of {result.trace_id}" + ("" if result.steps else f" · {verdict}"),
                           ("#", "kind", "name", "value", _interval_header(result), "pairs", "rank", "verdict"))
        for v in sorted(result.shapley, key=lambda v: v.index):
            kind, name = names.get(v.index, ("", ""))
            table.add_row(*map(cell, (v.index, kind, name, _number(v.value), f"[{v.ci_low:+.2f}, {v.ci_high:+.2f}]",
                                      v.samples, v.rank, ("★ " if v.culprit else "") + v.verdict)))
        console().print(table)
    echo(result.explanation)
    click.echo(f"{result.rollouts} rollouts, {result.policy_calls} policy calls, job {result.job_id}")


def _predicate(value: str | None) -> str | None:
    """`--where`: one SQL expression over the traces view, nothing more (no `)` closing the WHERE)."""
    if value is not None:
        try:
            check_predicate(value)
        except StoreError as exc:
            raise click.BadParameter(str(exc), param_hint="--where") from None
    return value


def _interval_header(result: AttributionResult) -> str:
    return f"{100 * (1 - result.alpha):.0f}% interval"


def write_outputs(store: Store, reports: Sequence[Report], json_path: Path | None, html_path: Path | None,
                  trace_url: str | None = None) -> None:
    """The reports (results, or stored documents) as files, 0600 like the store: they quote its prompts
    and outputs. The JSON is the results' report (`to_json`), one or {"reports": [...]}."""
    results = [as_result(r) for r in reports]
    if json_path:
        write_file(json_path, results[0].to_json() if len(results) == 1 else
                   report_json({"reports": [r.report() for r in results]}))
        click.echo(f"wrote {json_path}")
    if html_path:
        write_file(html_path, render_html(results[0], store.trajectory(results[0].trace_id), trace_url=trace_url))
        click.echo(f"wrote {html_path}")


def _trace_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value and (not value.startswith(("http://", "https://")) or "{trace_id}" not in value):
        raise click.BadParameter(f"{value!r}: give an http(s) URL with {{trace_id}} where the trace id goes, e.g. "
                                 "'http://localhost:16686/trace/{trace_id}'")
    return value or None


trace_url_option = click.option(
    "--trace-url", envvar="OTEL_REPLAY_TRACE_URL", metavar="URL", callback=_trace_url,
    help="Link the HTML report to the trace in Jaeger or Tempo: a URL with {trace_id} in it "
         "(default: $OTEL_REPLAY_TRACE_URL).")


@click.command(cls=StoreCommand)
@click.option("--trace-id", "trace_ids", multiple=True, help="A trace to attribute (repeatable).")
@click.option("--where", callback=lambda ctx, param, value: _predicate(value),
              help="A batch job: every trace matching this SQL predicate over the traces view.")
@click.option("--resume", "resume", metavar="JOB_ID", help="Resume a job; finished rollouts are skipped.")
@verifier_options
@click.option("--method", type=click.Choice(["contrastive", "shapley", "both"]), default="contrastive", show_default=True,
              help="contrastive: each step re-decided against its prefix (the point of commitment); shapley: "
              "credit shared over random orders of steps; both.")
@click.option("--shapley-permutations", default=20, show_default=True, type=click.IntRange(min=1),
              help="--method shapley or both: antithetic permutation pairs.")
@click.option("--rollouts", type=click.IntRange(min=1),
              help="A fixed number of rollouts per plan (default: add rollouts until each step is decided).")
@click.option("--max-rollouts", default=DEFAULT_MAX_ROLLOUTS, show_default=True, type=click.IntRange(min=2),
              help="The cap per plan when rollouts are added until a decision.")
@click.option("--epsilon", default=DEFAULT_EPSILON, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="Effects within ±epsilon count as no effect (a step is passed over only when its whole "
                   "interval is inside).")
@click.option("--alpha", default=DEFAULT_ALPHA, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="Error rate, over every step the search tests.")
@click.option("--adaptive", is_flag=True, hidden=True, help="The default now; with --rollouts N, N is the cap.")
@click.option("--target-width", type=float, hidden=True, help="No longer used: steps are sampled until decided.")
@click.option("--full", is_flag=True, help="Profile every step instead of stopping at the culprit.")
@click.option("--search", type=click.Choice(["scan", "gallop"]), default="scan", show_default=True,
              help="scan: test each step backwards from the last; gallop: test blocks of 1, 2, 4, ... steps, then "
                   "bisect (fewer calls when the culprit is early or absent; assumes effects in a block do not cancel).")
@click.option("--repair", is_flag=True, help="Search a validated repair for the culprit.")
@click.option("--credit", is_flag=True, help="Attribute a passing run: which step secured the success.")
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(min=1),
              help="Rollouts run at once (policy calls in flight).")
@engine_options
@click.option("--max-policy-calls", type=click.IntRange(min=1),
              help="Hard budget; steps it leaves undecided are reported as such.")
@click.option("--policy-timeout", "policy_timeout_s", default=60.0, show_default=True, type=click.FloatRange(0),
              metavar="SECONDS", help="Cut off a policy call after this long; its rollout is errored, and a hung "
                                      "sync policy's thread is abandoned, not killed (0: no limit).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of every rollout: the same seed, the same results.")
@redaction_options
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the JSON report.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the HTML report.")
@export_options("Send the blame into the original trace.")
@trace_url_option
@click.pass_obj
def attribute(store: Store, trace_ids: tuple[str, ...], where: str | None, resume: str | None, policies_spec: str | None,
              verifier: str | None, expect_contains: str | None, expect_regex: str | None,
              expect_json_schema: Path | None, json_path: Path | None, html_path: Path | None, trace_url: str | None,
              export_to: str | None,
              otlp_endpoint: str | None, otlp_protocol: str | None, otlp_headers: tuple[str, ...],
              service_name: str, engine: str, address: str | None, worker_cpus: float, **options: Any) -> None:
    """Find the step that made a run fail: counterfactual rollouts, intervals, a repair.

    Exit status: 0 culprit found, 3 no culprit, 4 undecided (also: the budget ran out first),
    5 unreplayable, 1 error, 2 usage error; a batch exits with the first of 4, 5, 3 that any trace has.

    Example: otel-replay attribute --trace-id 4bf92f --policies myproj.policies --verifier myproj:ok --repair
    """
    redact_rules, no_redact = options.pop("redact_rules"), options.pop("no_redact")
    if options.pop("adaptive") and options["rollouts"] is not None:  # the old spelling: --rollouts capped each plan
        options["max_rollouts"], options["rollouts"] = max(2, options["rollouts"]), None
    if options.pop("target_width") is not None:
        click.echo("warning: --target-width is no longer used: each step is sampled until its interval decides it "
                   "(see --epsilon and --max-rollouts)", err=True)
    if resume and (redact_rules is not None or no_redact):
        raise click.UsageError("--resume redacts as the job did: give no --redact-rules or --no-redact")
    if not resume:
        if bool(trace_ids) == bool(where):
            raise click.UsageError("give --trace-id (one or more) or --where, or --resume a job")
        redactor_from(redact_rules, no_redact)  # bad rules: a usage error now, not mid-job
        options.update(policies=policies_spec, where=where, redact=not no_redact, redact_rules=redact_rules,
                       verifier=_verifier_spec(verifier, expect_contains, expect_regex, expect_json_schema),
                       policy_timeout_s=options["policy_timeout_s"] or None)  # 0: no limit
    try:
        job = make_job(list(trace_ids) or None, store=store, resume=resume, engine=engine, address=address,
                       worker_cpus=worker_cpus, **({} if resume else options))
    except EngineError as exc:
        raise click.ClickException(str(exc)) from exc
    results = run_job(store, job)
    for result in results:
        print_result(store, result)
    for trace_id, reason in job.skipped.items():
        echo(f"skipped {trace_id}: {reason}")
    if job.skipped:
        click.echo(f"{len(job.skipped)} trace(s) skipped; list them again with: otel-replay jobs --skipped --job "
                   f"{job.job_id}")
    if not results:
        return
    write_outputs(store, results, json_path, html_path, trace_url)
    if export_to:
        from otel_replay.export.job import export_reports

        count = export_reports(store, results, export_to, protocol=otlp_protocol, endpoint=otlp_endpoint,
                               headers=parse_headers(otlp_headers), service_name=service_name)
        click.echo(f"exported {count} blame spans into the original trace(s)")
    code = exit_code(r.verdict for r in results)
    if code:
        raise click.exceptions.Exit(code)


@click.command(cls=StoreCommand)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=1), help="Newest rows shown.")
@click.option("--skipped", is_flag=True, help="The traces jobs skipped (passing, or not replayable), with the reason.")
@click.option("--job", "job_id", help="With --skipped: only this job's.")
@output_options
@click.pass_obj
def jobs(store: Store, limit: int, skipped: bool, job_id: str | None, as_json: bool, as_csv: bool) -> None:
    """Attribution jobs with their status, progress and policy calls spent.

    Status: running, done, partial (its budget ran out), interrupted (Ctrl-C, SIGTERM: resume it),
    paused (a watcher's hourly budget ran out: it resumes it), failed.
    """
    with store.session() as s:
        if skipped:
            rows = s.named_arrow("list_skipped", [job_id, job_id, limit])
            if job_id not in (None, "watch") and not rows.num_rows and not s.named("job_state", [job_id]):
                raise click.ClickException(f"no job {job_id!r} in the store (see `otel-replay jobs`)")
        else:
            rows = s.named_arrow("list_jobs", [limit])
    print_rows(rows, as_json=as_json, as_csv=as_csv, title="skipped traces" if skipped else "attribution jobs")


@click.command(cls=StoreCommand)
@click.option("--job", "job_id", help="Only this job's results (default: every job).")
@click.option("--where", callback=lambda ctx, param, value: _predicate(value),
              help="Only traces matching this SQL predicate over the traces view.")
@output_options
@click.pass_obj
def aggregate(store: Store, job_id: str | None, where: str | None, as_json: bool, as_csv: bool) -> None:
    """The systematic weak step: how often each step name is the culprit across failing runs.

    Example: otel-replay aggregate --job j1a2b3c4d5e6
    """
    traces = select_traces(store, where) if where else None
    with store.session() as s:
        rows = s.named_arrow("aggregate_by_step_name", [job_id, job_id, traces, traces])
    print_rows(rows, as_json=as_json, as_csv=as_csv, title="culprits by step name")


@click.command(cls=StoreCommand)
@click.option("--job", "job_id", required=True, help="The attribution job (see `otel-replay jobs`).")
@click.option("--trace-id", required=True, help="A trace of that job.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the HTML report.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the JSON report.")
@trace_url_option
@click.pass_obj
def report(store: Store, job_id: str, trace_id: str, html_path: Path | None, json_path: Path | None,
           trace_url: str | None) -> None:
    """Re-render a stored attribution report (terminal, JSON, HTML) without re-running anything.

    Example: otel-replay report --job j1a2b3c4d5e6 --trace-id 4bf92f --html report.html
    """
    trace = store.resolve_trace_id(trace_id)
    rows = store.named("job_report", [job_id, trace])
    if not rows:
        raise click.ClickException(f"job {job_id!r} has no report for trace {trace} (see `otel-replay jobs`)")
    result = AttributionResult.from_json(rows[0][0])
    print_result(store, result)
    write_outputs(store, [result], json_path, html_path, trace_url)


COMMANDS = [attribute, jobs, aggregate, report]


def parse_headers(values: tuple[str, ...]) -> dict[str, str]:
    headers = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r}: use KEY=VALUE", param_hint="--otlp-header")
        headers[key.strip()] = text.strip()
    return headers


@click.command(name="export", cls=StoreCommand)
@click.option("--job", "job_id", required=True, help="The attribution job whose blame to export.")
@click.option("--trace-id", help="Only this trace (default: every trace of the job).")
@click.option("--to", "to", type=click.Choice(["otlp", "jaeger-json", "otlp-json"]), required=True,
              help="otlp: send to a collector or backend; jaeger-json / otlp-json: write a file (--out).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="The file, for jaeger-json and otlp-json.")
@click.option("--otlp-endpoint", help="Default: $OTEL_EXPORTER_OTLP_ENDPOINT, as for any OTel exporter.")
@click.option("--otlp-protocol", type=click.Choice(["grpc", "http/protobuf"]), help="Default: $OTEL_EXPORTER_OTLP_PROTOCOL or http/protobuf.")
@click.option("--otlp-header", "headers", multiple=True, metavar="K=V", help="An extra header (repeatable).")
@click.option("--service-name", default="otel-replay", show_default=True, help="service.name of the blame spans.")
@click.option("--export-payloads", is_flag=True, help="Include the repaired output (payloads are not exported otherwise).")
@click.pass_obj
def export(store: Store, job_id: str, trace_id: str | None, to: str, out: Path | None, otlp_endpoint: str | None,
           otlp_protocol: str | None, headers: tuple[str, ...], service_name: str, export_payloads: bool) -> None:
    """Blame back into the original trace: OTLP to Jaeger/Tempo/Grafana, or Jaeger/OTLP JSON files.

    Example: otel-replay export --job j1a2b3c4d5e6 --to otlp --otlp-endpoint http://127.0.0.1:4318
    """
    from otel_replay.export.job import export_reports, stored_reports

    reports = stored_reports(store, job_id, store.resolve_trace_id(trace_id) if trace_id else None)
    count = export_reports(store, reports, to, out=out, protocol=otlp_protocol, endpoint=otlp_endpoint,
                           headers=parse_headers(headers), service_name=service_name, payloads=export_payloads)
    click.echo(f"exported {count} blame spans for {len(reports)} trace(s)" + (f" to {out}" if out else ""))


COMMANDS.append(export)
