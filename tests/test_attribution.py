"""Causal attribution on planted-culprit agents (real openai SDK, real instrumentation, the
simulated model over real HTTP), resumable jobs, reports and bad input."""

from __future__ import annotations

import json

import jsonschema
import pytest
from click.testing import CliRunner

from otel_replay import Store
from otel_replay.attribution import AttributionError, Job, JobParams, VerifierError
from otel_replay.attribution.plans import rollout_seed
from otel_replay.cli import main as cli
from otel_replay.export.html import render_html
from otel_replay.export.report import report_schema
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.planted import (
    TOPOLOGIES,
    by_chance,
    planted_registry,
    record_planted,
    replay_model,
)
from tests.helpers import needs_openai_v2

pytestmark = needs_openai_v2  # every test here records or runs the demo's agent (openai-v2)

# the true effect of the culprit's recorded decision, by construction (P_BAD = 0.1)
TRUE_EFFECT = {name: t.effect for name, t in TOPOLOGIES.items()}
QUICK = ("single-late", "butterfly", "and", "or", "echo", "non-resamplable", "corrupted-tool-output")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    return root, {name: record_planted(root, TOPOLOGIES[name]) for name in (*QUICK, "control")}


def attribute(root, topology_name, trace_id, **params):
    topology = TOPOLOGIES[topology_name]
    with SimulatedModelServer(replay_model(topology)) as server:
        registry = planted_registry(topology, server.base_url)
        verifier = params.pop("verifier", "otel_replay.testing.planted:ok")
        job = Job(Store(root), JobParams([trace_id], verifier, **{"concurrency": 8, **params}), registry)
        (result,) = job.run()
    return result, job


@pytest.mark.parametrize("name", QUICK)
def test_the_planted_culprit_is_found_with_an_interval_covering_its_effect(planted, name):
    root, traces = planted
    result, _ = attribute(root, name, traces[name])
    assert result.verdict == "culprit-found"
    culprit = result.culprit
    assert culprit["index"] == TOPOLOGIES[name].culprit, [(s["index"], s["verdict"], s["estimate"]) for s in result.steps]
    assert culprit["ci_low"] <= TRUE_EFFECT[name] <= culprit["ci_high"]
    tokens = Store(root).sql("select sum(tokens) t from rollouts where job_id = ? and role = 'boundary'", [result.job_id])
    assert tokens.column("t")[0].as_py() > 0  # the built-in policy reports the simulated model's usage
    verdicts = {s["index"]: s["verdict"] for s in result.steps}
    assert all(v == "locked-in" for i, v in verdicts.items() if i > culprit["index"] and v != "no policy")
    assert all(v == "not scored" for i, v in verdicts.items() if i < culprit["index"] and i in (0, 2, 4)
               and name not in ("or", "corrupted-tool-output"))
    if name == "non-resamplable":
        assert verdicts[5] == "no policy"  # the audit tool has no policy: never scored zero


def test_no_culprit_control_blames_no_step(planted):
    root, traces = planted
    trace_id = traces["control"]
    # a job seed whose factual rollout the chance verifier fails (the recorded run "failed by chance")
    seed = next(s for s in range(200) if by_chance("OK", type("R", (), {"seed": rollout_seed(s, trace_id, 0)})()) == 0)
    result, _ = attribute(root, "control", trace_id, verifier="otel_replay.testing.planted:by_chance", seed=seed,
                          full=True)
    assert result.verdict == "no-culprit" and result.culprit is None
    assert all(s["verdict"] in ("no effect", "no policy") for s in result.steps)
    assert all(s["ci_low"] >= -0.1 and s["ci_high"] <= 0.1 for s in result.steps if s["verdict"] == "no effect")


def test_resume_after_an_interruption_equals_an_uninterrupted_run(planted):
    root, traces = planted
    whole, _ = attribute(root, "echo", traces["echo"], seed=3)
    topology = TOPOLOGIES["echo"]
    with SimulatedModelServer(replay_model(topology)) as server:
        registry = planted_registry(topology, server.base_url)
        params = JobParams([traces["echo"]], "otel_replay.testing.planted:ok", concurrency=2, seed=3)
        job = Job(Store(root), params, registry)

        def interrupt(progress):
            if progress.rollouts >= 25:
                raise KeyboardInterrupt

        job.on_progress = interrupt
        with pytest.raises(KeyboardInterrupt):
            job.run()
        stored = Store(root).sql("select count(*) n from rollouts where job_id = ?", [job.job_id]).column("n")[0].as_py()
        assert stored >= 25
        resumed = Job(Store(root), params, registry, job_id=job.job_id)
        (again,) = resumed.run()
    assert [(s["index"], s["estimate"], s["verdict"]) for s in again.steps] == \
        [(s["index"], s["estimate"], s["verdict"]) for s in whole.steps]
    state = Store(root).sql("select status, rollouts_done from jobs where job_id = ?", [job.job_id]).to_pylist()
    assert state[0]["status"] == "done"


def test_a_budget_too_small_to_decide_gives_undecided_never_a_culprit(planted):
    root, traces = planted
    result, job = attribute(root, "single-late", traces["single-late"], max_policy_calls=40)
    assert job.budget.spent <= 40 and result.verdict == "undecided" and result.culprit is None
    assert result.budget_exhausted and (result.candidates or result.untested)
    assert not any(s["verdict"] in ("decisive", "locked-in") for s in result.steps)
    assert "budget of 40 policy calls ran out" in result.explanation["why"]
    assert "--max-policy-calls" in result.explanation["fix"] and "--resume" in result.explanation["fix"]
    spent = Store(root).sql("select sum(policy_calls) s from rollouts where job_id = ?", [job.job_id]).column("s")[0].as_py()
    assert spent <= 40
    assert Store(root).sql("select status from jobs where job_id = ?", [job.job_id]).column("status")[0].as_py() == "partial"


def test_concurrency_does_not_change_the_result(planted):
    root, traces = planted
    one, _ = attribute(root, "single-late", traces["single-late"], concurrency=1, seed=9, rollouts=8)
    many, _ = attribute(root, "single-late", traces["single-late"], concurrency=8, seed=9, rollouts=8)
    assert [(s["estimate"], s["ci_low"]) for s in one.steps] == [(s["estimate"], s["ci_low"]) for s in many.steps]


def test_passing_runs_need_credit(planted, tmp_path):
    root, traces = planted
    with pytest.raises(AttributionError, match="passed the verifier.*--credit"):
        attribute(root, "single-late", traces["single-late"], verifier="contains:FAIL")
    credit, _ = attribute(root, "single-late", traces["single-late"], verifier="contains:FAIL", credit=True)
    assert credit.credit and credit.culprit["index"] == 6  # the step that "secured" the FAIL answer


def test_verifiers_that_break_their_contract_are_named(planted, tmp_path, monkeypatch):
    root, traces = planted
    (tmp_path / "bad_verifiers.py").write_text(
        "def word(out, rollout):\n    return 'yes'\n\ndef boom(out, rollout):\n    raise ValueError('no')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(VerifierError, match="must return a number in \\[0, 1\\]"):
        attribute(root, "single-late", traces["single-late"], verifier="bad_verifiers:word")
    with pytest.raises(ValueError, match="no"):
        attribute(root, "single-late", traces["single-late"], verifier="bad_verifiers:boom")
    with pytest.raises(VerifierError, match="pkg.module:function"):
        attribute(root, "single-late", traces["single-late"], verifier="no_colon")


def test_reports_validate_and_render_offline(planted):
    root, traces = planted
    result, _ = attribute(root, "single-late", traces["single-late"], repair=True)
    report = result.report()
    jsonschema.validate(report, report_schema())
    assert report["repair"]["valid"] and report["repair"]["step_index"] == 6
    page = render_html(report, Store(root).trajectory(traces["single-late"]))
    assert "decisive" in page and "<svg" in page and report["trace_id"] in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page
    stored = json.loads(Store(root).sql("select report from reports where job_id = ?", [result.job_id]).column("report")[0].as_py())
    assert stored == json.loads(json.dumps(report))


def test_cli_batch_job_aggregate_jobs_and_report(planted, tmp_path, monkeypatch):
    root, traces = planted
    (tmp_path / "planted_policies.py").write_text(
        "from otel_replay.replay import policies\n"
        "from otel_replay.testing import SimulatedModelServer\n"
        "from otel_replay.testing.planted import TOPOLOGIES, planted_registry, replay_model\n"
        "topology = TOPOLOGIES['single-late']\n"
        "server = SimulatedModelServer(replay_model(topology)).start()\n"
        "planted_registry(topology, server.base_url, policies.registry)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = CliRunner().invoke(cli, ["--store", str(root), "attribute", "--where", "service_name in ('planted-single-late', 'planted-butterfly')",
                                   "--policies", "planted_policies", "--expect-contains", "OK",
                                   "--json", str(tmp_path / "out.json")])
    assert run.exit_code == 0, run.output
    assert run.output.count("★ decisive") == 2
    assert len(json.loads((tmp_path / "out.json").read_text())["reports"]) == 2
    job_id = run.output.split("job ")[-1].split()[0]
    agg = CliRunner().invoke(cli, ["--store", str(root), "aggregate", "--job", job_id, "--json"])
    rows = [json.loads(line) for line in agg.output.splitlines()]
    assert rows[0]["name"] == "chat sim-gpt" and rows[0]["culprit_in"] == 2
    where = CliRunner().invoke(cli, ["--store", str(root), "aggregate", "--where", "service_name = 'planted-butterfly'", "--json"])
    assert [json.loads(line)["culprit_in"] for line in where.output.splitlines()][0] >= 1
    jobs = CliRunner().invoke(cli, ["--store", str(root), "jobs", "--json"])
    assert any(json.loads(line)["job_id"] == job_id and json.loads(line)["status"] == "done" for line in jobs.output.splitlines())
    html = tmp_path / "r.html"
    rendered = CliRunner().invoke(cli, ["--store", str(root), "report", "--job", job_id, "--trace-id",
                                        traces["butterfly"], "--html", str(html)])
    assert rendered.exit_code == 0 and html.read_text().startswith("<!doctype html>")
    from otel_replay.replay import policies
    policies.registry.clear()


@pytest.mark.parametrize(("args", "message"), [
    (["attribute", "--trace-id", "0" * 32, "--expect-contains", "OK"], "no trace"),
    (["attribute", "--expect-contains", "OK"], "give --trace-id"),
    (["attribute", "--trace-id", "x", "--expect-contains", "OK", "--verifier", "a:b"], "give exactly one of"),
    (["attribute", "--where", "nonsense ===", "--expect-contains", "OK"], "SQL"),
    (["attribute", "--where", "stauts = 'error'", "--expect-contains", "OK"], 'Candidate bindings: "status"'),
    (["attribute", "--resume", "jnope"], "no job 'jnope'"),
    (["report", "--job", "jnope", "--trace-id", "TRACE"], "has no report"),
])
def test_cli_bad_input(planted, args, message):
    root, traces = planted
    args = [traces["single-late"] if a == "TRACE" else a for a in args]
    out = CliRunner().invoke(cli, ["--store", str(root), *args])
    assert out.exit_code in (1, 2) and message in out.output, out.output
    assert "Traceback" not in out.output


def test_demo_runs_offline_end_to_end(tmp_path):
    out = CliRunner().invoke(cli, ["--store", str(tmp_path / "store"), "demo", "--html", str(tmp_path / "demo.html")])
    assert out.exit_code == 0, out.output
    assert "★ decisive" in out.output and "FIX   Replace step 0's output" in out.output
    assert (tmp_path / "demo.html").read_text().count("decisive") >= 1


def test_shapley_values_are_efficient_and_share_a_conjunction_between_its_causes(planted):
    root, traces = planted
    result, _ = attribute(root, "and", traces["and"], method="both", shapley_permutations=6, rollouts=12)
    values = {s["index"]: s for s in result.shapley}
    assert set(values) == {0, 1, 2, 3, 4, 5, 6, 7, 8}  # every resamplable step (llm and tool) has a value
    # efficiency: each permutation's marginals telescope to v(all held) - v(none held) = 1 - P(both re-decided bad)
    assert abs(sum(v["value"] for v in values.values()) - 0.99) < 0.1
    assert values[2]["value"] > 0.2 and values[6]["value"] > 0.2  # both halves of the AND get credit
    assert {values[2]["rank"], values[6]["rank"]} == {1, 2}
    assert all(abs(v["value"]) < 0.3 for i, v in values.items() if i not in (2, 6))
    stored = Store(root).sql("select count(*) n from results where job_id = ? and method = 'shapley'", [result.job_id])
    assert stored.column("n")[0].as_py() == 9


@pytest.mark.parametrize("name", ("or", "single-late", "corrupted-tool-output"))
def test_gallop_search_finds_the_same_culprit(planted, name):
    root, traces = planted
    result, _ = attribute(root, name, traces[name], search="gallop")
    assert result.culprit is not None and result.culprit["index"] == TOPOLOGIES[name].culprit
    assert result.culprit["ci_low"] <= TRUE_EFFECT[name] <= result.culprit["ci_high"]


def test_gallop_search_clears_a_control_in_blocks(planted):
    root, traces = planted
    trace_id = traces["control"]
    seed = next(s for s in range(200) if by_chance("OK", type("R", (), {"seed": rollout_seed(s, trace_id, 0)})()) == 0)
    common = {"verifier": "otel_replay.testing.planted:by_chance", "seed": seed}
    scan, _ = attribute(root, "control", trace_id, **common)
    gallop, _ = attribute(root, "control", trace_id, search="gallop", **common)
    assert scan.verdict == gallop.verdict == "no-culprit" and scan.culprit is None and gallop.culprit is None
    # blocks of 1, 2, 4, 2 steps, each cleared whole: only the last step (a block of one) is scored on its own
    assert gallop.steps[-1]["verdict"] == "no effect"
    assert all(s["verdict"] in ("not scored", "no policy") for s in gallop.steps[:-1])
    assert gallop.tests == 2 * 9 - 4  # alpha is split over every block and half the search may test
