"""`replay`, `fork`, `diff`: re-run a stored trace, branch it, compare two traces."""

from __future__ import annotations

import json
from typing import Any

import click

from otel_replay.cli.output import StoreCommand, cell, console, echo, text_table, writing_to
from otel_replay.cli.preview import shorten
from otel_replay.replay import policies
from otel_replay.replay.caveats import redaction_caveats
from otel_replay.replay.diff import diff_trajectories
from otel_replay.replay.engine import replay as run_replay
from otel_replay.replay.fork import store_fork
from otel_replay.replay.plan import ReplayPlan
from otel_replay.replay.verify import verify_factual
from otel_replay.trajectory import Store


def load_policies(spec: str | None) -> None:
    """`--policies module[:function]`, plus the `otel_replay.policies` entry points."""
    try:
        policies.load_entry_points()
        if spec:
            policies.load_module(spec)
    except policies.PolicyError as exc:
        raise click.ClickException(str(exc)) from exc


policies_option = click.option("--policies", "policies_spec", metavar="MODULE",
                               help="Module whose import registers policies (module or module:function).")


@click.command(cls=StoreCommand)
@click.argument("trace_id")
@policies_option
@click.pass_obj
def replay(store: Store, trace_id: str, policies_spec: str | None) -> None:
    """Replay a trace with every step held and prove, by hash, that it reproduces the recording.

    Exits 1 naming the first step whose inputs or output differ. Example: otel-replay replay 4bf92f
    """
    load_policies(policies_spec)
    trajectory = store.trajectory(trace_id)
    check = verify_factual(trajectory)
    table = text_table(f"factual replay of {check.trace_id}",
                       ("#", "kind", "name", "served from", "recorded output", "replayed output", "inputs", "ok"))
    for s in check.steps:
        table.add_row(*map(cell, (s.index, s.kind, s.name, s.source, s.recorded[:12], s.replayed[:12],
                                  "same" if s.inputs_match else "DIFFER", "✓" if s.ok else "✗")))
    console().print(table)
    click.echo(f"final output: recorded {check.final_recorded[:12]} replayed {check.final_replayed[:12]}")
    for caveat in redaction_caveats(trajectory, check.run):
        echo(f"caveat: {caveat}")
    if check.run.unreplayable:
        raise click.ClickException(f"not replayable: {check.run.unreplayable}")
    bad = check.first_mismatch
    if bad is not None:
        raise click.ClickException(f"step {bad.index} ({bad.kind} {bad.name}) does not reproduce the recording")
    if not check.ok:
        raise click.ClickException("the final output does not reproduce the recording")
    click.echo(f"reproduced bit for bit: {len(check.steps)} steps, {check.run.policy_calls} policy calls")


def _json_value(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON ({exc.msg} at column {exc.colno}): {shorten(value, 60)}") from None


@click.command(cls=StoreCommand)
@click.argument("trace_id")
@click.option("--at", "step", type=click.IntRange(min=0), required=True, help="The step to intervene on.")
@click.option("--do", "do_value", callback=_json_value, help="Force this output (JSON: messages, a string, a result).")
@click.option("--observe", "observe_value", callback=_json_value, help="Replace what a tool step observed (JSON).")
@click.option("--remove", is_flag=True, help="The step's output disappears downstream.")
@click.option("--resample", is_flag=True, help="Re-decide the step with its policy.")
@click.option("--model", help="Ask llm policies for this model (the swap-model intervention).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the re-run: the same seed, the same run.")
@policies_option
@click.pass_obj
def fork(store: Store, trace_id: str, step: int, do_value: Any, observe_value: Any, remove: bool, resample: bool,
         model: str | None, seed: int, policies_spec: str | None) -> None:
    """Re-run a trace with one step changed and store the result as a child trace.

    Example: otel-replay fork 4bf92f --at 0 --resample --policies myproj.policies
    """
    chosen = [flag for flag, on in (("--do", do_value is not None), ("--observe", observe_value is not None),
                                    ("--remove", remove), ("--resample", resample)) if on]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --do, --observe, --remove, --resample")
    load_policies(policies_spec)
    parent = store.trajectory(trace_id)
    try:
        parent.step(step)
    except IndexError as exc:
        raise click.ClickException(str(exc)) from exc
    plan = {"--do": lambda: ReplayPlan.do(step, do_value), "--observe": lambda: ReplayPlan.observe(step, observe_value),
            "--remove": lambda: ReplayPlan.remove(step), "--resample": lambda: ReplayPlan.resample(step)}[chosen[0]]()
    try:
        run = run_replay(parent, plan.with_model(model), seed)
    except TypeError as exc:
        raise click.ClickException(str(exc)) from exc
    if run.unreplayable:
        raise click.ClickException(f"fork failed, nothing stored: {run.unreplayable}")
    with writing_to(store):
        child = store_fork(store.root, parent, run, step)
    echo(f"child trace {child} (parent {parent.trace_id}, fork at step {step}, plan {run.plan}, seed {seed})")
    click.echo(f"diverged at step {run.diverged_at}" if run.diverged_at is not None else "no step changed")
    click.echo(f"policy calls: {run.policy_calls}")
    for caveat in redaction_caveats(parent, run):
        echo(f"caveat: {caveat}")
    echo(f"final output: {run.final_output}")


@click.command(cls=StoreCommand)
@click.argument("trace_a")
@click.argument("trace_b")
@click.pass_obj
def diff(store: Store, trace_a: str, trace_b: str) -> None:
    """Compare two traces step by step: the first divergence and what changed.

    Example: otel-replay diff 4bf92f 9c01ab
    """
    result = diff_trajectories(store.trajectory(trace_a), store.trajectory(trace_b))
    table = text_table(f"{result.a} vs {result.b}", ("#", "A", "B", "change"))
    for c in result.changes:
        table.add_row(*map(cell, (c.index, c.a or "—", c.b or "—", c.change)))
    console().print(table)
    first = result.first_divergence
    click.echo("no divergence" if first is None else f"first divergence: step {first}")
    echo(f"final A: {shorten(result.final_a, 150)}")
    echo(f"final B: {shorten(result.final_b, 150)}")


COMMANDS = [replay, fork, diff]
