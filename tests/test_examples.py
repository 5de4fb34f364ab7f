"""The examples, run as CI runs them: each as a subprocess from the repository root."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

ENV = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}  # rich tables unwrapped in a pipe


def run_example(*args: str, timeout: float) -> str:
    """`python <args>` from the repo root; returns stdout, fails the test with stderr on an error."""
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{args[0]} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_support_agent_records_a_failing_run(tmp_path: Path) -> None:
    out = run_example("examples/support_agent.py", "--store", str(tmp_path / "store"), timeout=60)
    assert "FAILED" in out
    assert re.search(r"trace [0-9a-f]{32} recorded", out), out


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


def test_import_langsmith_blames_the_final_answer(tmp_path: Path) -> None:
    out = run_example("examples/import_langsmith.py", "--store", str(tmp_path / "store"), timeout=60)
    assert "final answer: The discount is $39.78" in out
    assert re.search(r"culprit: step 4 \(llm chat gpt-4o-mini\), effect \+0\.\d\d, 95% interval \[\+0\.\d\d", out), out
    assert "FIX   Replace step 4's output with" in out and "397.80" in out
