"""The wheel ships the library and what its demo, examples and simulated model need, nothing else.

The benchmarks live in benchmarks/ and the test-only harnesses (fuzzing, kill -9 crashes, fault
injection, overload, damaged and torn segments, ...) in tests/harness/, both outside the package.
.ci/run builds the sdist and the wheel and runs this file on that wheel (OTEL_REPLAY_WHEEL); without
it, the slow test builds one from a copy of the committed tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from otel_replay.cli import bench as bench_cli
from otel_replay.cli import main as cli
from tests.helpers import REPO

# otel_replay/testing in the wheel: `otel-replay demo`, examples/, the docs' policies and verifiers
TESTING = {"__init__", "model", "server", "recording", "support_agent", "support_policies", "planted",
           "planted_policies"}
WHEEL_ENV = "OTEL_REPLAY_WHEEL"


def _check(names: list[str]) -> None:
    top = {n.split("/")[0] for n in names}
    assert top <= {"otel_replay", *(t for t in top if t.endswith((".dist-info", ".data")))}, sorted(top)
    modules = [n for n in names if n.endswith(".py")]
    assert not [n for n in modules if n.startswith("otel_replay/bench/")]
    testing = {Path(n).stem for n in modules if n.startswith("otel_replay/testing/")}
    assert testing == TESTING, f"otel_replay/testing in the wheel: {sorted(testing)}"
    assert "otel_replay/py.typed" in names and "otel_replay/cli/__init__.py" in names


def test_the_package_tree_holds_no_bench_or_harness():
    modules = [p.relative_to(REPO).as_posix() for p in (REPO / "otel_replay").rglob("*.py")]
    _check([*modules, "otel_replay/py.typed"])


@pytest.mark.skipif(not os.environ.get(WHEEL_ENV), reason=f"${WHEEL_ENV}: a built wheel (.ci/run sets it)")
def test_the_built_wheel_holds_the_package_only():
    _check(zipfile.ZipFile(os.environ[WHEEL_ENV]).namelist())


@pytest.mark.slow
def test_a_wheel_built_from_the_committed_tree_holds_the_package_only(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(tree)],
                   capture_output=True, check=True, timeout=600)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    _check(zipfile.ZipFile(wheel).namelist())


def test_bench_without_the_repository_says_how_to_get_it_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_cli, "SOURCE", tmp_path)  # as installed from a wheel: no benchmarks/ beside it
    result = CliRunner().invoke(cli, ["bench", "capture", "--quick"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "clone the otel-replay repository" in lines[0], result.output


def test_bench_runs_from_the_source_checkout():
    assert (bench_cli.SOURCE / "benchmarks" / "__init__.py").is_file()
    assert bench_cli._bench_module("machine").__name__ == "benchmarks.machine"
