"""Verdicts and explanations true to what ran, on real agent runs (the real openai SDK, the real
instrumentation, the simulated model over HTTP): the point of commitment behind a bigger earlier
effect, undecided when the data cannot tell, exit statuses a CI step can gate on, one
explanation per verdict, old reports still readable."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import get_args

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from otel_replay import Store
from otel_replay.attribution import Job, JobParams
from otel_replay.attribution.contrastive import StepVerdict
from otel_replay.attribution.result import STEP_VERDICTS, TRACE_VERDICTS, TraceVerdict
from otel_replay.cli import main as cli
from otel_replay.cli.attribute import EXIT_CODES, exit_code, print_result
from otel_replay.export.html import render_html
from otel_replay.export.report import report_schema
from otel_replay.replay.policies import Registry
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.planted import (
    TOPOLOGIES,
    planted_registry,
    record_planted,
    replay_model,
    true_effects,
)
from tests.helpers import needs_openai_v2

REPO = Path(__file__).resolve().parent.parent
ISSUE = "bigger-effect-earlier"  # model -> stock tool that glitched (+0.375) -> answer that could catch it (+0.25)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("verdicts")
    return root, {name: record_planted(root, TOPOLOGIES[name]) for name in (ISSUE, "single-late", "hopeless")}


def attribute(root, name, trace_id, **params):
    topology = TOPOLOGIES[name]
    with SimulatedModelServer(replay_model(topology)) as server:
        job = Job(Store(root), JobParams([trace_id], "otel_replay.testing.planted:ok", **{"concurrency": 8, **params}),
                  planted_registry(topology, server.base_url))
        (result,) = job.run()
    return result


def policies_module(tmp_path: Path, name: str) -> str:
    module = f"planted_{name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(
        "from otel_replay.replay import policies\n"
        "from otel_replay.testing import SimulatedModelServer\n"
        "from otel_replay.testing.planted import TOPOLOGIES, planted_registry, replay_model\n"
        f"topology = TOPOLOGIES[{name!r}]\n"
        "server = SimulatedModelServer(replay_model(topology)).start()\n"
        "planted_registry(topology, server.base_url, policies.registry)\n")
    return module


@pytest.fixture
def cli_policies(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield lambda name: policies_module(tmp_path, name)
    from otel_replay.replay import policies

    policies.registry.clear()


@needs_openai_v2
def test_the_point_of_commitment_is_named_behind_a_bigger_earlier_effect(recorded):
    root, traces = recorded
    assert {i: round(e, 3) for i, e in true_effects(TOPOLOGIES[ISSUE]).items() if e} == {1: 0.375, 2: 0.25}
    result = attribute(root, ISSUE, traces[ISSUE])
    assert result.verdict == "culprit-found" and result.culprit["index"] == 2
    assert result.culprit["ci_low"] > 0 and result.culprit["ci_low"] <= 0.25 <= result.culprit["ci_high"]
    assert [s["verdict"] for s in result.steps] == ["not scored", "not scored", "decisive"]
    assert result.sequential and result.tests == 3


@needs_openai_v2
def test_too_few_rollouts_never_name_the_bigger_earlier_effect(recorded):
    """At 30 rollouts a plan (the old default) the answer step's interval may hold both 0 and real
    effects: then the result is undecided between step 2 and step 1, with what it would take."""
    root, traces = recorded
    for seed in range(4):
        result = attribute(root, ISSUE, traces[ISSUE], rollouts=30, seed=seed)
        assert result.culprit is None or result.culprit["index"] == 2
        if result.culprit is None:
            assert result.verdict == "undecided" and result.candidates[0] == 2
            assert "Undecided between step 2" in result.explanation["where"]
            assert "needs about" in result.explanation["fix"] or "--max-rollouts" in result.explanation["fix"]
            assert all(s["verdict"] != "decisive" for s in result.steps)


@needs_openai_v2
def test_exit_status_tells_the_verdict(recorded, cli_policies, tmp_path):
    root, traces = recorded
    base = ["--store", str(root), "attribute", "--expect-contains", "OK"]
    found = CliRunner().invoke(cli, [*base, "--trace-id", traces["single-late"], "--policies",
                                     cli_policies("single-late")])
    assert found.exit_code == 0 and "★ decisive" in found.output, found.output
    broke = CliRunner().invoke(cli, [*base, "--trace-id", traces["single-late"], "--policies",
                                     cli_policies("single-late"), "--max-policy-calls", "30"])
    assert broke.exit_code == 4 and "undecided" in broke.output and "★" not in broke.output, broke.output
    assert "The budget of 30 policy calls ran out" in broke.output
    nothing = CliRunner().invoke(cli, [*base, "--trace-id", traces["hopeless"], "--policies",
                                       cli_policies("hopeless")])
    assert nothing.exit_code == 3 and "no-culprit" in nothing.output, nothing.output
    from otel_replay.replay import policies

    policies.registry.clear()  # what the modules above registered in this process
    bare = CliRunner().invoke(cli, [*base, "--trace-id", traces["single-late"]])
    assert bare.exit_code == 5 and "unreplayable" in bare.output, bare.output
    assert exit_code(["culprit-found", "undecided", "no-culprit"]) == 4
    assert set(EXIT_CODES) >= set(TRACE_VERDICTS)
    help_text = CliRunner().invoke(cli, ["attribute", "--help"]).output
    assert "0 culprit found, 3 no culprit, 4 undecided" in " ".join(help_text.split())


@needs_openai_v2
def test_without_policies_the_explanation_says_which_are_missing_not_to_add_rollouts(recorded):
    root, traces = recorded
    job = Job(Store(root), JobParams([traces["single-late"]], "otel_replay.testing.planted:ok"), Registry())
    (result,) = job.run()
    assert result.verdict == "unreplayable"
    text = " ".join(result.explanation.values())
    assert "no policy for step(s) 0, 1, 2, 3, 4, 5, 6, 7, 8" in text
    assert "@policies.llm" in text and '@policies.tool("work")' in text and "--policies" in text
    assert "rollouts" not in result.explanation["fix"]
    message = Store(root).sql("select message from jobs where job_id = ? order by updated_ns desc limit 1",
                              [job.job_id]).column("message")[0].as_py()
    assert "1 unreplayable" in message


@needs_openai_v2
def test_shapley_alone_prints_its_values_and_names_what_they_support(recorded, cli_policies):
    root, traces = recorded
    out = CliRunner().invoke(cli, ["--store", str(root), "attribute", "--trace-id", traces["single-late"],
                                   "--policies", cli_policies("single-late"), "--expect-contains", "OK",
                                   "--method", "shapley", "--shapley-permutations", "6"])
    assert out.exit_code in (0, 4), out.output
    assert "Shapley values of" in out.output and "add rollouts" not in out.output
    lines = [line for line in out.output.splitlines() if line.startswith("│ 6 ")]
    assert lines and ("contributing" in lines[0] or "undecided" in lines[0])
    if out.exit_code == 0:
        assert "★ contributing" in out.output and "Shapley value" in out.output


@needs_openai_v2
def test_every_verdict_string_is_declared_and_old_reports_still_load(recorded):
    schema = report_schema()
    assert set(TRACE_VERDICTS) <= set(schema["properties"]["verdict"]["enum"])
    assert set(STEP_VERDICTS) == set(schema["properties"]["steps"]["items"]["properties"]["verdict"]["enum"])
    # the Literal types mypy checks the code against name the same strings
    assert set(get_args(StepVerdict)) == set(STEP_VERDICTS)
    assert set(get_args(TraceVerdict)) == {*TRACE_VERDICTS, "partial"}  # partial: reports older than undecided
    assert "partial" in schema["properties"]["verdict"]["enum"]
    registry = yaml.safe_load((REPO / "schemas" / "registry.yaml").read_text())
    brief = {a["id"]: a["brief"] for g in registry["groups"] for a in g["attributes"]}
    assert all(v in brief["otel_replay.blame.verdict"] for v in STEP_VERDICTS)
    assert all(v in brief["otel_replay.attribution.verdict"] for v in TRACE_VERDICTS)
    root, traces = recorded
    old = json.loads((REPO / "tests" / "agents" / "report_v0.json").read_text())  # see tests/agents/record_report_v0.py
    jsonschema.validate(old, schema)
    page = render_html(old, Store(root).trajectory(traces["single-late"]))
    assert "Verdict: partial" in page or "Culprit" in page
    print_result(Store(root), old)


def test_attribution_modules_import_one_way():
    """No import cycle inside otel_replay/attribution (function-level imports included)."""
    package = REPO / "otel_replay" / "attribution"
    edges: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("otel_replay.attribution"):
                if node.module == "otel_replay.attribution":
                    names |= {a.name for a in node.names if (package / f"{a.name}.py").exists()}
                else:
                    names.add(node.module.rsplit(".", 1)[1])
        edges[path.stem] = names - {path.stem, "__init__"}
    seen: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        if seen.get(module) == 1:
            raise AssertionError(f"import cycle: {' -> '.join([*trail, module])}")
        if seen.get(module) == 2:
            return
        seen[module] = 1
        for target in sorted(edges.get(module, ())):
            visit(target, [*trail, module])
        seen[module] = 2

    for module in sorted(edges):
        visit(module, [])


@needs_openai_v2
def test_the_old_adaptive_spelling_still_works_as_a_cap(recorded, cli_policies, tmp_path):
    root, traces = recorded
    out = CliRunner().invoke(cli, ["--store", str(root), "attribute", "--trace-id", traces["single-late"],
                                   "--policies", cli_policies("single-late"), "--expect-contains", "OK", "--adaptive",
                                   "--rollouts", "60", "--target-width", "0.3", "--json", str(tmp_path / "r.json")])
    assert out.exit_code in (0, 4), out.output
    assert "--target-width is no longer used" in out.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["sequential"] and report["max_rollouts"] == 60
    assert max(s["n_held"] for s in report["steps"]) <= 60
