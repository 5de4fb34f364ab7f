"""`otel_replay.attribute`: the attribution job the command line runs, from Python.

    import otel_replay

    result = otel_replay.attribute(trace_id, policies="myproj.policies", verifier="myproj:ok")
    result.verdict, result.culprit, result.repair
    print(result.explanation)               # WHAT / WHERE / WHY / FIX, as the CLI prints them
    result.to_html("report.html")           # the page `attribute --html` writes

This module sits at the command line's level (it may import attribution and export): the CLI's
`attribute` builds its job with `make_job` and runs it, so both write the same job, rollout and
result rows and return the same results. Verifier and policies may be callables
(`verifier(final_output, rollout) -> float`, a `Registry`, or `{"llm": fn, "tool:get_weather": fn}`);
such a job can only be resumed from Python, giving them again.
"""

from __future__ import annotations

import asyncio
import html
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, overload

from otel_replay.attribution import AttributionError, AttributionResult, Job, JobParams
from otel_replay.attribution.executors import EngineError, make_executor
from otel_replay.attribution.job import (
    JobProgress,
    build_verifier,
    describe,
    load_params,
    not_resumable,
    select_traces,
)
from otel_replay.attribution.result import HtmlWriter
from otel_replay.attribution.verifiers import Verifier
from otel_replay.attribution.watch import Event, Watcher, WatchOptions, fingerprint
from otel_replay.replay import policies as policy_registry
from otel_replay.replay.policies import Policy, Registry
from otel_replay.trajectory import Store

Policies = str | Registry | Mapping[str, Policy] | None
"""A module spec (`myproj.policies` or `module:function`, as `--policies`), a `Registry`, or a dict
of `kind` / `kind:name` to policy function; None: the global registry (`@policies.llm` ...)."""

OPTIONS = tuple(f.name for f in fields(JobParams) if f.name not in ("trace_ids", "verifier", "policies", "in_process"))
"""The keyword options of `attribute`, as in JobParams (`threshold`, `repair`, `max_policy_calls`, ...)."""


class AttributionBatch(list[AttributionResult]):
    """The results of a job over several traces (a list, in the job's trace order); `skipped`: the
    traces it skipped (they pass the verifier, or cannot be replayed) and why."""

    def __init__(self, results: Iterable[AttributionResult], job_id: str,
                 skipped: Mapping[str, str] | None = None) -> None:
        super().__init__(results)
        self.job_id = job_id
        self.skipped = dict(skipped or {})

    def to_json(self) -> str:
        """The JSON document `attribute --json` writes for a batch: {"reports": [...]}."""
        from otel_replay.export.report import report_json

        return report_json({"reports": [r.report() for r in self]})

    def to_html(self, directory: str | Path) -> list[Path]:
        """One HTML report per trace, `<trace id>.html` in `directory` (created if need be)."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        paths = [folder / f"{r.trace_id}.html" for r in self]
        for result, path in zip(self, paths, strict=True):
            result.to_html(path)
        return paths

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td><code>{html.escape(r.trace_id)}</code></td><td>{html.escape(r.verdict)}</td>"
                       f"<td>{html.escape(r.headline)}</td></tr>" for r in self)
        return (f"<table><caption>job {html.escape(self.job_id)}: {len(self)} trace(s)</caption>"
                f"<tr><th>trace</th><th>verdict</th><th>result</th></tr>{rows}</table>")


@overload
def attribute(trace_id_or_ids: str, *, policies: Policies = None,
              verifier: str | Verifier | None = None, store: Store | str | os.PathLike[str] | None = None,
              where: str | None = None, resume: None = None, engine: str = "local",
              address: str | None = None, worker_cpus: float = 0.25,
              on_progress: Callable[[JobProgress], None] | None = None,
              **options: Any) -> AttributionResult: ...


@overload
def attribute(trace_id_or_ids: str | Sequence[str] | None = None, *, policies: Policies = None,
              verifier: str | Verifier | None = None, store: Store | str | os.PathLike[str] | None = None,
              where: str | None = None, resume: str | None = None, engine: str = "local",
              address: str | None = None, worker_cpus: float = 0.25,
              on_progress: Callable[[JobProgress], None] | None = None,
              **options: Any) -> AttributionResult | AttributionBatch: ...


def attribute(trace_id_or_ids: str | Sequence[str] | None = None, *, policies: Policies = None,
              verifier: str | Verifier | None = None, store: Store | str | os.PathLike[str] | None = None,
              where: str | None = None, resume: str | None = None, engine: str = "local",
              address: str | None = None, worker_cpus: float = 0.25,
              on_progress: Callable[[JobProgress], None] | None = None,
              **options: Any) -> AttributionResult | AttributionBatch:
    """Find the step that made a run fail: the job `otel-replay attribute` runs, its rows in `store`.

    One trace id (or unique prefix) gives an `AttributionResult`; a list of ids, `where` (SQL over
    the traces view) or a resumed job gives an `AttributionBatch`. `verifier`: "pkg.mod:fn",
    "contains:TEXT", "regex:RE", "json-schema:FILE" or a function `(final_output, rollout) -> float`.
    `options`: threshold, method, rollouts, max_rollouts, epsilon, alpha, full, search, repair,
    credit, concurrency, max_policy_calls, policy_timeout_s, seed, shapley_permutations, redact,
    redact_rules. Raises AttributionError (a passing run, a run that cannot be replayed, ...).
    """
    job = make_job(trace_id_or_ids, policies=policies, verifier=verifier, store=store, where=where, resume=resume,
                   engine=engine, address=address, worker_cpus=worker_cpus, **options)
    job.on_progress = on_progress
    results = run(job)
    if isinstance(trace_id_or_ids, str) and resume is None:
        return results[0]
    return AttributionBatch(results, job.job_id, job.skipped)


async def attribute_async(trace_id_or_ids: str | Sequence[str] | None = None, **arguments: Any
                          ) -> AttributionResult | AttributionBatch:
    """`attribute` on a worker thread, so the event loop keeps running (async policies run on the
    job's own threads' loops). Cancelling the task stops the job after the rollouts in flight; it
    is left resumable (`attribute(resume=job_id, ...)`)."""
    cancelled = threading.Event()
    report = arguments.pop("on_progress", None)

    def progress(state: JobProgress) -> None:
        if cancelled.is_set():
            raise AttributionError("cancelled")
        if report is not None:
            report(state)

    try:
        return await asyncio.to_thread(attribute, trace_id_or_ids, on_progress=progress, **arguments)
    except asyncio.CancelledError:
        cancelled.set()
        raise


def make_job(trace_id_or_ids: str | Sequence[str] | None = None, *, policies: Policies = None,
             verifier: str | Verifier | None = None, store: Store | str | os.PathLike[str] | None = None,
             where: str | None = None, resume: str | None = None, engine: str = "local",
             address: str | None = None, worker_cpus: float = 0.25, job_id: str | None = None,
             **options: Any) -> Job:
    """The job `attribute` runs, not yet run (the CLI runs it under its progress bar). `job_id`: a
    new job's id (default: a random one); a stored job of that id continues (`watch` names its jobs)."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"attribute() got unknown option(s) {', '.join(unknown)}; options are {', '.join(OPTIONS)}")
    store = store if isinstance(store, Store) else Store(store)
    if resume is not None:
        if trace_id_or_ids is not None or where is not None or options:
            raise TypeError("resume= runs the job with its own traces and options: give none")
        job = _resumed(store, resume, policies, verifier)
    else:
        job = _new(store, trace_id_or_ids, where, policies, verifier, options, job_id)
    if engine != "local" and job.params.in_process:
        raise EngineError(f"--engine {engine} rebuilds the policies and the verifier in its workers from importable "
                          f"paths; the {' and '.join(sorted(job.params.in_process))} given as Python callables "
                          "cannot reach them: give module paths (policies='pkg.policies', verifier='pkg.mod:fn')")
    # ignore: another engine gets here only with nothing in_process (checked above), so both are importable
    # strings; the local engine reads neither
    job.executor = make_executor(engine, address, job.params.policies, job.params.verifier,  # type: ignore[arg-type]
                                 job.registry, job.params.concurrency, worker_cpus)
    return job


def run(job: Job) -> list[AttributionResult]:
    """Run (or resume) a job; its results can render their HTML report from the job's store."""
    results = job.run()
    writer = html_writer(job.store)
    for result in results:
        result._html = writer
    return results


def html_writer(store: Store) -> HtmlWriter:
    """Renders a result with its trajectory from `store`, and writes it (0600) when given a path."""
    from otel_replay.export.html import render_html
    from otel_replay.export.private import write_private

    def write(result: AttributionResult, path: Path | None) -> str:
        page = render_html(result, store.trajectory(result.trace_id))
        if path is not None:
            write_private(path, page)
        return page
    return write


def _new(store: Store, trace_id_or_ids: str | Sequence[str] | None, where: str | None, policies: Policies,
         verifier: str | Verifier | None, options: dict[str, Any], job_id: str | None = None) -> Job:
    if (trace_id_or_ids is None) == (where is None):
        raise TypeError("give trace ids or where=, or resume= a job")
    if verifier is None:
        raise TypeError("give verifier=: 'pkg.mod:fn', 'contains:TEXT', 'regex:RE', 'json-schema:FILE' or a function")
    ids = [trace_id_or_ids] if isinstance(trace_id_or_ids, str) else list(trace_id_or_ids or ())
    ids = [store.resolve_trace_id(t) for t in ids] if where is None else select_traces(store, where)
    if not ids:
        raise AttributionError(f"no trace matches --where {where!r}")
    if options.get("redact_rules") is not None:  # a resume reads them from anywhere
        options["redact_rules"] = str(Path(options["redact_rules"]).resolve())
    if where is not None:  # a batch: a trace that passes is skipped and listed, not the end of the job
        options.setdefault("skip_unattributable", True)
    registry, spec, named = _registry(policies)
    params = JobParams(ids, verifier, policies=spec, **options)
    if named:
        params.in_process["policies"] = named
    if job_id is None:
        return Job(store, params, registry)
    try:
        created = load_params(store, job_id)[1]  # a stored job goes on under its id
    except AttributionError:
        created = time.time_ns()
    return Job(store, params, registry, job_id=job_id, created_ns=created)


def make_watcher(*, policies: Policies = None, verifier: str | Verifier | None = None,
                 store: Store | str | os.PathLike[str] | None = None, where: str | None = None,
                 interval_s: float = 30.0, settle_s: float = 10.0, max_policy_calls_per_hour: int | None = None,
                 batch: int = 100, export: Mapping[str, Any] | None = None,
                 on_event: Callable[[Event], None] | None = None, clock: Callable[[], int] = time.time_ns,
                 engine: str = "local", address: str | None = None, worker_cpus: float = 0.25,
                 **options: Any) -> Watcher:
    """The loop `otel-replay watch` runs (`.run(once=...)`, `.stop()`): new failing traces attributed
    with `attribute`'s jobs and defaults, once each. `options` are `attribute`'s; `max_policy_calls`
    caps each job. `export`: keyword arguments of `export_reports` (protocol, endpoint, headers,
    service_name) to send each result's blame into its trace over OTLP. `clock`: now in epoch ns.
    `engine="ray"`: each job's rollouts on Ray workers (`address`: the cluster), as `attribute`'s;
    the policies and the verifier must then be importable paths."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"watch got unknown option(s) {', '.join(unknown)}; options are {', '.join(OPTIONS)}")
    if verifier is None:
        raise TypeError("give verifier=: 'pkg.mod:fn', 'contains:TEXT', 'regex:RE', 'json-schema:FILE' or a function")
    store = store if isinstance(store, Store) else Store(store)
    name = describe(verifier) if callable(verifier) else verifier
    # built once: importing a policies module again (as each job would) reruns it (servers, clients)
    registry, spec, named = _registry(policies)
    question = fingerprint(name, spec or named, options)  # the per-job cap included: it shapes the results
    per_job = options.pop("max_policy_calls", None)
    if engine != "local" and (spec is None or callable(verifier)):
        raise EngineError(f"--engine {engine} rebuilds the policies and the verifier in its workers from importable "
                          "paths: give module paths (policies='pkg.policies', verifier='pkg.mod:fn')")
    watch = WatchOptions(build_verifier(verifier), name, question, threshold=options.get("threshold", 0.5),
                         seed=options.get("seed", 0), where=where, interval_s=interval_s, settle_s=settle_s,
                         calls_per_hour=max_policy_calls_per_hour, calls_per_job=per_job, batch=batch)

    def job(trace_id: str, job_id: str, limit: int | None) -> Job:
        made = make_job([trace_id], policies=registry, verifier=verifier, store=store, job_id=job_id,
                        max_policy_calls=limit, skip_unattributable=True, **options)
        if spec is not None or (policies is None and not named):  # as `attribute` stores it: a resume rebuilds them
            made.params.policies = spec
            made.params.in_process.pop("policies", None)
        # ignore: a non-local engine gets here only with importable policies and verifier (checked above)
        made.executor = make_executor(engine, address, made.params.policies, made.params.verifier,  # type: ignore[arg-type]
                                      made.registry, made.params.concurrency, worker_cpus)
        return made

    def run_job(job: Job) -> list[AttributionResult]:
        try:
            return run(job)
        finally:
            close = getattr(job.executor, "close", None)  # a watcher runs job after job: each job's workers go
            if close is not None:
                close()

    def send(result: AttributionResult) -> Event:
        from otel_replay.export.job import export_reports
        from otel_replay.export.otlp import ExportError

        try:
            spans = export_reports(store, [result], "otlp", **(export or {}))
        except ExportError as exc:  # the result stays in the store: `otel-replay export` sends it later
            return {"event": "export-failed", "trace_id": result.trace_id, "job_id": result.job_id, "reason": str(exc)}
        return {"event": "exported", "trace_id": result.trace_id, "job_id": result.job_id, "spans": spans}

    return Watcher(store, watch, job, run_job, send if export is not None else None, on_event, clock)


def _resumed(store: Store, job_id: str, policies: Policies, verifier: str | Verifier | None) -> Job:
    """A stored job with its own parameters; callables it was started with must be given again."""
    params, created = load_params(store, job_id)
    wanted = params.in_process
    if "policies" in wanted and policies is None and policy_registry.registry.keys():
        policies = policy_registry.registry  # decorated in this process again, as when the job started
    missing = {k: v for k, v in wanted.items() if (verifier if k == "verifier" else policies) is None}
    if missing:
        raise AttributionError(not_resumable(job_id, missing))
    if verifier is not None:
        if "verifier" not in wanted:
            raise AttributionError(f"job {job_id} rebuilds its verifier from {params.verifier!r}: give no verifier=")
        if not callable(verifier) or describe(verifier) != wanted["verifier"]:
            raise AttributionError(f"job {job_id} was started with the verifier {wanted['verifier']}, not "
                                   f"{describe(verifier) if callable(verifier) else verifier!r}")
        params.verifier = verifier
    if policies is not None and "policies" not in wanted:
        raise AttributionError(f"job {job_id} rebuilds its policies from {params.policies or 'the entry points'}: "
                               "give no policies=")
    registry, _, named = _registry(policies if policies is not None else params.policies)
    if "policies" in wanted and not set(wanted["policies"].split(", ")) <= set(registry.keys()):
        raise AttributionError(f"job {job_id} was started with policies for {wanted['policies']}; these are for "
                               f"{named or 'nothing'}")
    return Job(store, params, registry, job_id=job_id, created_ns=created)


def _registry(policies: Policies) -> tuple[Registry, str | None, str]:
    """(the registry, the module spec a stored job rebuilds it from, the names of in-process policies)."""
    if isinstance(policies, Registry):
        return policies.copy(), None, ", ".join(policies.keys()) or "none"
    if isinstance(policies, Mapping):
        registry = Registry()
        for key, fn in policies.items():
            kind, _, name = key.partition(":")
            registry.register(kind, name or None, fn)
        return registry, None, ", ".join(registry.keys()) or "none"
    decorated = policy_registry.registry.keys()  # registered in this process: no spec rebuilds them
    policy_registry.load_entry_points()  # as the CLI: the entry points, then the module's decorators
    if policies is not None:
        policy_registry.load_module(policies)
        decorated = []
    return policy_registry.registry.copy(), policies, ", ".join(decorated)
