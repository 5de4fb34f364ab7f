"""`watch`: continuous blame over the store (the loop is `otel_replay.attribution.watch.Watcher`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import click

from otel_replay.api import make_watcher
from otel_replay.attribution.sequential import DEFAULT_ALPHA, DEFAULT_EPSILON, DEFAULT_MAX_ROLLOUTS
from otel_replay.cli.attribute import _predicate, _verifier_spec, parse_headers, stopping_on_signals
from otel_replay.cli.options import engine_options, export_options, verifier_options
from otel_replay.cli.output import StoreCommand, dumps, echo, writing_to
from otel_replay.trajectory import Store


def _line(event: dict[str, Any]) -> str:
    """One event as a line a person reads."""
    kind, trace = event["event"], event.get("trace_id", "")
    if kind == "scored":
        return f"scored {event['traces']} new trace(s) with {event['verifier']}: {event['failed']} failed"
    if kind == "attributing":
        return f"attributing {trace} (job {event['job_id']}{', resumed' if event['resumed'] else ''})"
    if kind == "attributed":
        return f"{trace}: {event['headline']} (job {event['job_id']}, {event['policy_calls']} policy calls)"
    if kind == "linked":
        return f"{trace}: same failure as {event['representative']}, linked to its result (job {event['job_id']})"
    if kind == "exported":
        return f"{trace}: {event['spans']} blame spans sent into the trace (job {event['job_id']})"
    if kind == "skipped":
        return f"skipped {', '.join(event['trace_ids'])}: {event['reason']}"
    if kind == "status":
        budget = "" if event["calls_per_hour"] is None else f" of {event['calls_per_hour']}"
        frees = event.get("frees_at_ns")
        then = f", more at {dt.datetime.fromtimestamp(frees / 1e9):%H:%M:%S}" if frees else ""
        return (f"poll: {event['attributed']} attributed, {event['linked']} linked, {event['skipped']} skipped, "
                f"{event['busy_groups']} group(s) left to another watcher · {event['calls_last_hour']}{budget} "
                f"policy calls in the last hour{then}")
    if kind == "stopped":
        return f"stopped ({event['reason']}); unfinished jobs resume when a watcher starts again"
    said = event.get("reason") or event.get("spans")
    return f"{kind} {trace or event.get('signature', '')} {event.get('job_id') or ''}: {said}".replace("  ", " ")


@click.command(cls=StoreCommand)
@click.option("--where", callback=lambda ctx, param, value: _predicate(value),
              help="Only traces matching this SQL predicate over the traces view (default: every trace); "
                   "of those, the ones the verifier fails are attributed.")
@verifier_options
@click.option("--method", type=click.Choice(["contrastive", "shapley", "both"]), default="contrastive",
              show_default=True, help="As for attribute.")
@click.option("--rollouts", type=click.IntRange(min=1), help="A fixed number of rollouts per plan (as attribute).")
@click.option("--max-rollouts", default=DEFAULT_MAX_ROLLOUTS, show_default=True, type=click.IntRange(min=2),
              help="The cap per plan when rollouts are added until a decision.")
@click.option("--epsilon", default=DEFAULT_EPSILON, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="Effects within ±epsilon count as no effect.")
@click.option("--alpha", default=DEFAULT_ALPHA, show_default=True,
              type=click.FloatRange(0, 1, min_open=True, max_open=True), help="Error rate, over every step tested.")
@click.option("--repair", is_flag=True, help="Search a validated repair for each culprit.")
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(min=1),
              help="Rollouts run at once within a job.")
@engine_options
@click.option("--max-policy-calls", type=click.IntRange(min=1), help="Hard budget of each job (over its whole life).")
@click.option("--max-policy-calls-per-hour", "per_hour", type=click.IntRange(min=1),
              help="Hard budget of every watcher of this store together, over any sliding hour.")
@click.option("--policy-timeout", "policy_timeout_s", default=60.0, show_default=True, type=click.FloatRange(0),
              metavar="SECONDS", help="Cut off a policy call after this long (0: no limit).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of every rollout.")
@click.option("--interval", "interval_s", default=30.0, show_default=True, type=click.FloatRange(0, min_open=True),
              metavar="SECONDS", help="Seconds between polls; one representative per failure group per interval.")
@click.option("--settle", "settle_s", default=10.0, show_default=True, type=click.FloatRange(0), metavar="SECONDS",
              help="A trace is scored once it ended this long ago (its last spans have arrived).")
@click.option("--batch", default=100, show_default=True, type=click.IntRange(min=1),
              help="Traces scored, and failures handled, per poll (bounds memory).")
@click.option("--once", is_flag=True, help="Handle the backlog, then exit.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event, for programs.")
@export_options("Send each result's blame into its trace.")
@click.pass_obj
def watch(store: Store, where: str | None, policies_spec: str | None, verifier: str | None,
          expect_contains: str | None, expect_regex: str | None, expect_json_schema: Path | None, interval_s: float,
          settle_s: float, per_hour: int | None, batch: int, once: bool, as_json: bool, export_to: str | None,
          otlp_endpoint: str | None, otlp_protocol: str | None, otlp_headers: tuple[str, ...], service_name: str,
          engine: str, address: str | None, worker_cpus: float, **options: Any) -> None:
    """Attribute new failing traces as they arrive, once each, within a policy-call budget.

    Scores new traces with the verifier, attributes one trace per group of identical failures (the
    others link to its result) with attribute's jobs and defaults, and, with --export otlp, sends
    the blame into each trace. SIGTERM or Ctrl-C stops it; unfinished jobs resume on restart.

    Example: otel-replay watch --policies myproj.policies --verifier myproj:ok --export otlp
    """
    export = None if not export_to else {"protocol": otlp_protocol, "endpoint": otlp_endpoint,
                                          "headers": parse_headers(otlp_headers), "service_name": service_name}

    def show(event: dict[str, Any]) -> None:
        now = dt.datetime.now()
        click.echo(dumps({"time": now.isoformat(timespec="seconds"), **event})) if as_json \
            else echo(f"{now:%H:%M:%S} {_line(event)}")

    options["policy_timeout_s"] = options["policy_timeout_s"] or None  # 0: no limit
    watcher = make_watcher(policies=policies_spec, store=store, where=where, interval_s=interval_s, settle_s=settle_s,
                           verifier=_verifier_spec(verifier, expect_contains, expect_regex, expect_json_schema),
                           max_policy_calls_per_hour=per_hour, batch=batch, export=export, on_event=show,
                           engine=engine, address=address, worker_cpus=worker_cpus, **options)
    with writing_to(store), stopping_on_signals(watcher.stop):
        watcher.run(once=once)


COMMANDS = [watch]
