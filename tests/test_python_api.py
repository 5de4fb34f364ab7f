"""`otel_replay.attribute` from Python, on a real agent run (the support agent: the real openai SDK
and OpenAI instrumentation against the simulated model): the same job rows and verdict as the
CLI, callables as verifier and policies (and what a resume then needs), the HTML and JSON reports,
`attribute_async` inside a running event loop, stored reports as results."""

from __future__ import annotations

import asyncio
import html
import json
import re
import stat

import jsonschema
import pytest
from click.testing import CliRunner

import otel_replay
from otel_replay import AttributionResult, Store
from otel_replay.api import AttributionBatch, make_job
from otel_replay.attribution import AttributionError
from otel_replay.attribution.executors import EngineError
from otel_replay.cli import main as cli
from otel_replay.export.html import render_html
from otel_replay.export.report import report_json, report_schema
from otel_replay.replay import policies as global_policies
from otel_replay.replay.builtin.openai_policy import openai_policy
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.support_agent import (
    TOOL_FUNCTIONS,
    TOOLS,
    record_support_run,
    refunded,
    support_model,
)
from tests.helpers import REPO, needs_openai_v2

POLICIES = "otel_replay.testing.support_policies"
VERIFIER = "otel_replay.testing.support_agent:refunded"
SEED = 5
ROLLOUT_COLUMNS = ("plan, step_index, role, rollout, seed, score, failed, unreplayable, errored, reason, policy_calls, "
                   "tokens, diverged_at, final_output, digest, detail")
RESULT_COLUMNS = ("step_index, span_id, name, kind, agent_name, method, estimate, ci_low, ci_high, fail_held, "
                  "fail_resampled, n_held, n_resampled, verdict, culprit, rank")


def owed_a_refund(final_output: str, rollout: object) -> float:
    """The verifier as a plain function (not given by its path)."""
    return refunded(final_output)


def callable_policies(base_url: str) -> dict[str, object]:
    """The support agent's policies as a dict of callables; the tools async."""
    def tool(fn):
        async def run(arguments, rng):
            return fn(**arguments)
        return run

    return {"llm": openai_policy(base_url=base_url, api_key="sim", tools=TOOLS),
            **{f"tool:{name}": tool(fn) for name, fn in TOOL_FUNCTIONS.items()}}


def rows(root, table: str, columns: str, job_id: str) -> list[dict[str, object]]:
    return Store(root).sql(f"select {columns} from {table} where job_id = ? order by all", [job_id]).to_pylist()


@pytest.fixture(scope="module")
def support(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    trace_id, _ = record_support_run(root)
    with SimulatedModelServer(support_model()) as server:
        yield root, trace_id, server
    global_policies.registry.clear()  # what the policies module registered


@pytest.fixture(scope="module")
def jobs(support, tmp_path_factory):
    """The same attribution three ways: the CLI, the API with the CLI's specs, the API with callables."""
    root, trace_id, server = support
    out = tmp_path_factory.mktemp("cli") / "report.json"
    run = CliRunner().invoke(cli, ["--store", str(root), "attribute", "--trace-id", trace_id, "--policies", POLICIES,
                                   "--verifier", VERIFIER, "--seed", str(SEED), "--repair", "--json", str(out)])
    by_spec = otel_replay.attribute(trace_id, policies=POLICIES, verifier=VERIFIER, store=root, seed=SEED, repair=True)
    by_callables = otel_replay.attribute(trace_id, policies=callable_policies(server.base_url), verifier=owed_a_refund,
                                         store=str(root), seed=SEED, repair=True)
    return run, json.loads(out.read_text()), by_spec, by_callables


@needs_openai_v2
def test_the_api_and_the_cli_write_the_same_rows_and_verdict(support, jobs):
    root, trace_id, _ = support
    run, cli_report, by_spec, by_callables = jobs
    assert run.exit_code == 0, run.output  # culprit found
    assert isinstance(by_spec, AttributionResult) and by_spec.verdict == cli_report["verdict"] == "culprit-found"
    cli_job = cli_report["job_id"]
    assert by_spec.job_id != cli_job
    for result in (by_spec, by_callables):
        assert rows(root, "rollouts", ROLLOUT_COLUMNS, result.job_id) == rows(root, "rollouts", ROLLOUT_COLUMNS, cli_job)
        assert rows(root, "results", RESULT_COLUMNS, result.job_id) == rows(root, "results", RESULT_COLUMNS, cli_job)
        assert {**result.report(), "job_id": cli_job} == cli_report
    params = {r["job_id"]: r["params"] for r in Store(root).sql("select job_id, params from jobs").to_pylist()}
    assert params[by_spec.job_id] == params[cli_job]  # one job record, whoever started it
    assert json.loads(params[by_callables.job_id])["in_process"] == {
        "policies": "llm, tool:issue_refund, tool:lookup_order",
        "verifier": "tests.test_python_api:owed_a_refund"}
    culprit = by_callables.culprit
    assert culprit is not None and by_callables.repair is not None
    assert (culprit.index, culprit.kind) == (0, "llm") and culprit.ci_low > 0.1
    assert by_callables.steps[0].verdict == "decisive" and by_callables.repair.valid
    assert culprit["index"] == culprit.index and culprit.get("agent") == culprit.agent  # the dict rows' spelling
    assert "A-1042" in by_callables.explanation["fix"]
    assert str(by_callables.explanation) == "\n".join(
        line for line in run.output.splitlines() if line[:5] in ("WHAT ", "WHERE", "WHY  ", "FIX  "))
    assert str(by_callables).splitlines()[0] == (
        f"culprit: step 0 (llm chat sim-gpt), effect {culprit.estimate:+.2f}, 95% interval "
        f"[{culprit.ci_low:+.2f}, {culprit.ci_high:+.2f}]")
    again = AttributionResult.from_json(by_callables.to_json())  # the one way to and from the report
    assert again == by_callables and again.to_json() == by_callables.to_json()


@needs_openai_v2
def test_a_job_from_callables_resumes_only_from_python_given_them_again(support, jobs):
    root, _, server = support
    job_id = jobs[3].job_id
    global_policies.registry.clear()  # as in another process: nothing registered by the jobs above
    run = CliRunner().invoke(cli, ["--store", str(root), "attribute", "--resume", job_id])
    assert run.exit_code == 1 and "Traceback" not in run.output
    said = " ".join(run.output.split())
    assert f"job {job_id} was started from Python with callables that have no importable path" in said
    assert "the verifier tests.test_python_api:owed_a_refund" in said
    assert "the policies llm, tool:issue_refund, tool:lookup_order" in said
    assert f"otel_replay.attribute(resume='{job_id}', policies=..., verifier=...)" in said
    with pytest.raises(AttributionError, match="the verifier tests.test_python_api:owed_a_refund"):
        otel_replay.attribute(resume=job_id, store=root, policies=callable_policies(server.base_url))
    with pytest.raises(AttributionError, match="was started with the verifier tests.test_python_api:owed_a_refund"):
        otel_replay.attribute(resume=job_id, store=root, policies=callable_policies(server.base_url), verifier=refunded)
    before = len(rows(root, "rollouts", ROLLOUT_COLUMNS, job_id))
    resumed = otel_replay.attribute(resume=job_id, store=root, policies=callable_policies(server.base_url),
                                    verifier=owed_a_refund)
    assert isinstance(resumed, AttributionBatch) and resumed.job_id == job_id
    assert resumed[0].steps == jobs[3].steps and resumed[0].verdict == "culprit-found"
    assert len(rows(root, "rollouts", ROLLOUT_COLUMNS, job_id)) == before  # every rollout was already there


@needs_openai_v2
def test_the_reports_are_the_ones_the_cli_writes(support, jobs, tmp_path):
    root, trace_id, _ = support
    result = jobs[3]
    page = result.to_html(tmp_path / "report.html")
    assert page == render_html(result.report(), Store(root).trajectory(trace_id))
    assert page == render_html(result, Store(root).trajectory(trace_id))
    assert (tmp_path / "report.html").read_text() == page
    assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o600
    cli_page = tmp_path / "cli.html"
    shown = CliRunner().invoke(cli, ["--store", str(root), "report", "--job", result.job_id, "--trace-id", trace_id,
                                     "--html", str(cli_page)])
    assert shown.exit_code == 0 and cli_page.read_text() == page
    frame = result._repr_html_()
    srcdoc = re.fullmatch(r'<iframe srcdoc="([^"]*)" .*</iframe>', frame, re.S)
    assert srcdoc and html.unescape(srcdoc.group(1)) == page
    assert result.to_json() == report_json(result.report())
    jsonschema.validate(json.loads(result.to_json()), report_schema())


@needs_openai_v2
def test_attribute_async_runs_inside_a_running_event_loop(support, jobs):
    root, trace_id, server = support

    async def attribute_while_the_loop_runs():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        ticker = asyncio.create_task(tick())
        result = await otel_replay.attribute_async(trace_id, policies=callable_policies(server.base_url),
                                                   verifier=owed_a_refund, store=root, seed=SEED, repair=True)
        ticker.cancel()
        return result, ticks

    result, ticks = asyncio.run(attribute_while_the_loop_runs())
    assert ticks > 1  # the loop kept running while the job did
    assert result.steps == jobs[3].steps and result.repair == jobs[3].repair
    assert rows(root, "rollouts", ROLLOUT_COLUMNS, result.job_id) == rows(root, "rollouts", ROLLOUT_COLUMNS, jobs[3].job_id)


@needs_openai_v2
def test_cancelling_attribute_async_leaves_a_resumable_job(support, jobs):
    root, trace_id, server = support

    async def cancel_after_the_first_rollout():
        loop = asyncio.get_running_loop()
        started = asyncio.Event()
        task = asyncio.create_task(otel_replay.attribute_async(
            trace_id, policies=callable_policies(server.base_url), verifier=owed_a_refund, store=root, seed=SEED,
            repair=True, concurrency=1, on_progress=lambda progress: loop.call_soon_threadsafe(started.set)))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_after_the_first_rollout())  # returns once the job's thread has stopped
    (job_id,) = Store(root).sql("select job_id from jobs where status = 'failed' and message like '%cancelled%'"
                                ).column("job_id").to_pylist()
    (resumed,) = otel_replay.attribute(resume=job_id, store=root, policies=callable_policies(server.base_url),
                                       verifier=owed_a_refund)
    assert resumed.steps == jobs[3].steps and resumed.verdict == "culprit-found"


@needs_openai_v2
def test_bad_arguments_are_named(support):
    root, trace_id, server = support
    with pytest.raises(TypeError, match="unknown option.*max_policy_call\\b.*options are"):
        otel_replay.attribute(trace_id, verifier=refunded, store=root, max_policy_call=10)
    with pytest.raises(TypeError, match="give verifier="):
        otel_replay.attribute(trace_id, store=root)
    with pytest.raises(TypeError, match="trace ids or where="):
        otel_replay.attribute(trace_id, verifier=refunded, store=root, where="true")
    with pytest.raises(EngineError, match="verifier given as Python callables cannot reach them"):
        make_job(trace_id, policies=POLICIES, verifier=refunded, store=root, engine="ray")


def test_stored_reports_load_as_results():
    old = json.loads((REPO / "tests" / "agents" / "report_v0.json").read_text())  # before `undecided` existed
    result = AttributionResult.from_report(old)
    assert result.verdict == "partial" and result.culprit is None and not result.sequential
    assert result.headline == "partial: no culprit named"
    assert str(result.explanation).startswith("WHAT  The run failed (verifier score 0.00)")
    assert result.report()["explanation"] == old["explanation"] and result._repr_html_() is None
    assert result.shapley[0].span_id is None and "span_id" not in result.report()["shapley"][0]  # as v0 had it
    assert AttributionResult.from_json(result.to_json()) == result
    with pytest.raises(RuntimeError, match="render_html"):
        result.to_html()
