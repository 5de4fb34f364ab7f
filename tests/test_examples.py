"""The examples, run as CI runs them: each as a subprocess from the repository root."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, needs_openai_v2

ENV = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}  # rich tables unwrapped in a pipe


def run_example(*args: str, timeout: float) -> str:
    """`python <args>` from the repo root; returns stdout, fails the test with stderr on an error."""
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{args[0]} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@needs_openai_v2
def test_support_agent_records_a_failing_run(tmp_path: Path) -> None:
    out = run_example("examples/support_agent.py", "--store", str(tmp_path / "store"), timeout=60)
    assert "FAILED" in out
    assert re.search(r"trace [0-9a-f]{32} recorded", out), out


@needs_openai_v2
def test_service_batch_names_the_lookup_decision_as_the_systematic_culprit(tmp_path: Path) -> None:
    out = run_example("examples/service/run_batch.py", "--store", str(tmp_path / "store"), timeout=120)
    answered = re.search(r"(\d+)/20 answers refunded correctly, (\d+) failed", out)
    assert answered, out
    failed = int(answered.group(2))
    assert 1 <= failed <= 6, out  # the model's own typos: a few of 20, never all
    assert f"the predicate selects the {failed} traces the verifier fails" in out
    table = out[out.index("culprits by step name"):]
    rows = re.findall(r"│\s*([\w .:/-]+?)\s*│\s*(llm|tool)\s*│\s*(\d+)\s*│\s*(\d+)\s*│", table)
    assert rows, table
    name, kind, traces, culprit_in = rows[0]  # ordered by culprit_in: the systematic weak step first
    assert (name, kind, int(traces), int(culprit_in)) == ("chat sim-gpt", "llm", failed, failed), table
    assert all(int(r[3]) == 0 for r in rows[1:]), table


@pytest.mark.slow  # ~17 s: the example service end to end; test_watch.py covers grouping in the default suite
@needs_openai_v2
def test_service_watch_attributes_each_failure_group_from_what_collect_received(tmp_path: Path) -> None:
    """run_watch.py without a backend: the service's OTLP reaches `collect`, and `watch --once`
    scores every request, attributes one trace per failure group and links the others."""
    from otel_replay import Store

    store = tmp_path / "store"
    out = run_example("examples/service/run_watch.py", "--store", str(store), timeout=180)
    answered = re.search(r"(\d+)/20 answers refunded correctly, (\d+) failed", out)
    assert answered, out
    failed = set(re.findall(r"trace ([0-9a-f]{32}) FAILED", out))
    assert len(failed) == int(answered.group(2)) and 1 <= len(failed) <= 6, out
    assert re.search(r"collect stored \d+ spans of the 20 requests", out), out
    assert "spans: 0 accepted" not in out and "0 refused (queue full)" in out, out

    db = Store(store)
    scored = db.sql("select trace_id, passed from outcomes").to_pylist()
    assert len(scored) == 20, scored  # every request's trace, scored by the verifier
    assert {r["trace_id"] for r in scored if not r["passed"]} == failed  # the verifier agrees with the load
    links = {r["trace_id"]: r for r in db.sql("select * from group_links").to_pylist()}
    assert links.keys() == failed  # every failure is attributed or linked, nothing else
    representatives = {t for t, r in links.items() if r["role"] == "representative"}
    assert representatives and all(links[t]["representative"] == t for t in representatives)
    for row in links.values():  # a member points at a representative of its own group, and its job
        assert row["representative"] in representatives
        assert links[row["representative"]]["job_id"] == row["job_id"]
        assert links[row["representative"]]["signature"] == row["signature"]
    reports = db.sql("select job_id, trace_id from report_rows").to_pylist()
    assert {(r["job_id"], r["trace_id"]) for r in reports} == {(links[t]["job_id"], t) for t in representatives}
    assert len(re.findall(r"same failure as [0-9a-f]{32}, linked to its result", out)) == len(failed) - len(representatives)
    culprits = db.sql("select trace_id, name, kind from result_rows where culprit").to_pylist()
    assert {(r["trace_id"], r["name"], r["kind"]) for r in culprits} == {(t, "chat sim-gpt", "llm") for t in representatives}


def test_import_langsmith_blames_the_final_answer(tmp_path: Path) -> None:
    out = run_example("examples/import_langsmith.py", "--store", str(tmp_path / "store"), timeout=60)
    assert "final answer: The discount is $39.78" in out
    assert re.search(r"culprit: step 4 \(llm chat gpt-4o-mini\), effect \+0\.\d\d, 95% interval \[\+0\.\d\d", out), out
    assert "FIX   Replace step 4's output with" in out and "397.80" in out
