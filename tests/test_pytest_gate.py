"""The pytest gate, run as a user runs it: real pytest sessions (pytester, in a subprocess) over
examples/pytest_gate/, whose agent uses the real openai SDK and OpenAI instrumentation against the
simulated model. The failing test names its culprit; the passing test is only captured; no store
is left behind unless asked."""

from __future__ import annotations

import importlib.metadata
import shutil

import pytest

from otel_replay import Store
from tests.helpers import REPO, needs_openai_v2

pytest_plugins = ["pytester"]

EXAMPLE = REPO / "examples" / "pytest_gate"
PLUGIN = "otel_replay.pytest_plugin"


def plugin_args() -> list[str]:
    """Nothing when the installed package declares the plugin (pytest loads it); else load it by name."""
    installed = any(ep.value == PLUGIN for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", PLUGIN]


@pytest.fixture
def gate(pytester, tmp_path, monkeypatch):
    """The example copied into a fresh pytest project; the runs' temporary directory, to look in."""
    for path in EXAMPLE.glob("*.py"):
        shutil.copy(path, pytester.path / path.name)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    return pytester, temp


def test_the_plugin_is_declared_for_pytest():
    assert f'[project.entry-points.pytest11]\notel_replay = "{PLUGIN}"\n' in (REPO / "pyproject.toml").read_text()


@needs_openai_v2
def test_the_failing_example_names_its_culprit_and_leaves_no_store(gate, tmp_path):
    pytester, temp = gate
    html = tmp_path / "reports"
    result = pytester.runpytest_subprocess(*plugin_args(), "--otel-replay-html", str(html), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*- otel-replay attribution -*",
        "trace *",
        "culprit: step 0 (llm chat sim-gpt), effect +*, 95% interval [[]+*, +*]",
        "WHAT  The run failed (verifier score 0.00)*A-1024*",
        "WHERE Step 0 (llm chat sim-gpt, agent support-agent)*A-1024*",
        "WHY   *point of commitment*",
        "FIX   Replace step 0's output with*A-1042*",
        "REPAIR valid: step 0 forced to*A-1042*",
        "HTML report: *test_support_agent.py_test_a_late_order_is_refunded_on_a_bad_day.html",
    ])
    output = result.stdout.str()
    assert output.count("- otel-replay attribution -") == 1  # the passing test has no section
    summary = output[output.index("= otel-replay ="):]
    assert "test_a_late_order_is_refunded_on_a_bad_day: culprit: step 0 (llm chat sim-gpt)" in summary
    (page,) = html.iterdir()
    assert page.read_text().startswith("<!doctype html>") and "decisive" in page.read_text()
    assert list(temp.iterdir()) == []  # each test's store is gone


@needs_openai_v2
def test_a_passing_test_is_only_captured_and_keep_leaves_its_store(gate):
    pytester, temp = gate
    result = pytester.runpytest_subprocess(*plugin_args(), "--otel-replay-keep", "-rA", "-p", "no:cacheprovider",
                                           "-k", "not bad_day")
    result.assert_outcomes(passed=1)
    assert "otel-replay attribution" not in result.stdout.str()
    (kept,) = temp.iterdir()
    result.stdout.fnmatch_lines([f"*test_a_late_order_is_refunded: store kept at {kept}"])
    store = Store(str(kept))
    assert store.sql("select count(*) n from traces").column("n")[0].as_py() == 1  # the run was captured ...
    assert store.sql("select count(*) n from jobs").column("n")[0].as_py() == 0  # ... and nothing attributed


def test_a_failure_the_gate_cannot_attribute_says_why_and_keeps_the_test_failure(pytester):
    pytester.makepyfile(test_plain="""
        import pytest

        def ok(final_output, rollout):
            return 1.0

        @pytest.mark.otel_replay(verifier=ok)
        def test_no_agent_ran():
            assert 1 == 2

        @pytest.mark.otel_replay
        def test_no_verifier():
            assert 1 == 3

        def test_not_opted_in():
            assert 1 == 4
    """)
    result = pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines([
        "E       assert 1 == 2", "*- otel-replay attribution -*", "not attributed: no agent run was captured*",
        "E       assert 1 == 3", "*- otel-replay attribution -*", "not attributed: no verifier*",
        "E       assert 1 == 4",
    ])
    assert result.stdout.str().count("- otel-replay attribution -") == 2  # none for the test that did not opt in
