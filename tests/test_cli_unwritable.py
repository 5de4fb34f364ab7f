"""A store the CLI cannot write: one line naming the store and the reason, exit 1, nothing changed.

Two real causes: a store path under a regular file (ENOTDIR, portable), and a read-only store (a
read-only bind mount in a private mount namespace when running as root, where chmod does not
stop writes; the permission bits otherwise). Each writing command runs in its own process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from otel_replay.cli import main as cli
from tests.helpers import FIXTURES, REPO, needs_openai_v2

SOURCE = FIXTURES / "otel" / "genai-openai_span_and_event.otlp.json"
OTHER = FIXTURES / "otel" / "openai-v2_event_only.otlp.json"
POLICIES = """
from otel_replay.replay import policies


@policies.llm
def chat(step, inputs, rng):
    return "sunny"


@policies.tool
def tool(arguments, rng):
    return {"temperature_c": 30}
"""
CLI = [sys.executable, "-c", "from otel_replay.cli import main; main(prog_name='otel-replay')"]


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A store with the fixture's traces and a finished attribution job; the tool loop's trace id."""
    base = tmp_path_factory.mktemp("unwritable")
    (base / "unwritable_policies.py").write_text(POLICIES)
    store = base / "store"
    assert CliRunner().invoke(cli, ["--store", str(store), "import", "otlp", str(SOURCE)]).exit_code == 0
    listed = CliRunner().invoke(cli, ["--store", str(store), "traces", "--json"]).output
    return store, next(r["trace_id"] for r in map(json.loads, listed.splitlines()) if r["tool_steps"] == 1)


def _can_mount_read_only(scratch: Path) -> bool:
    probe = scratch / "probe"
    probe.mkdir(exist_ok=True)
    done = subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" '
                           '&& ! touch "$1/x" 2>/dev/null', "sh", str(probe)], capture_output=True)
    return done.returncode == 0 and not (probe / "x").exists()


@contextmanager
def read_only(store: Path, scratch: Path) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    """A runner of the CLI (in a subprocess) that sees `store` read-only."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(store.parent), str(REPO)]), "COLUMNS": "200"}
    if os.geteuid() == 0:  # root writes through permission bits: mount the store read-only, for this process only
        if not shutil.which("unshare") or not _can_mount_read_only(scratch):
            pytest.skip("running as root without a way to mount the store read-only (unshare -m, mount)")
        wrap = ["unshare", "-m", "sh", "-c", 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && shift && '
                'exec "$@"', "sh", str(store)]
        yield lambda *args: subprocess.run([*wrap, *CLI, "--store", str(store), *args], env=env, text=True,
                                           capture_output=True, timeout=300)
        return
    dirs = [store, *(p for p in store.rglob("*") if p.is_dir())]
    for d in dirs:
        d.chmod(0o500)
    try:
        yield lambda *args: subprocess.run([*CLI, "--store", str(store), *args], env=env, text=True,
                                           capture_output=True, timeout=300)
    finally:
        for d in dirs:
            d.chmod(0o700)


@pytest.mark.parametrize("args", [
    ["import", "otlp", str(OTHER)],
    ["import", "otlp", "--jobs", "1", str(OTHER)],
    ["attribute", "--trace-id", "LOOP", "--policies", "unwritable_policies", "--expect-contains", "sunny"],
    ["fork", "LOOP", "--at", "2", "--do", '"sunny"', "--policies", "unwritable_policies"],
    ["compact", "--grace", "0"],
    pytest.param(["demo", "--rollouts", "2", "--html", "REPORT"], marks=needs_openai_v2),
], ids=["import", "import-one-process", "attribute", "fork", "compact", "demo"])
def test_a_read_only_store_is_one_line_and_left_unchanged(seeded, tmp_path, args):
    store, loop = seeded
    before = _tree(store)
    with read_only(store, tmp_path) as run:
        done = run(*[loop if a == "LOOP" else str(tmp_path / "demo.html") if a == "REPORT" else a for a in args])
    output = done.stdout + done.stderr
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert done.returncode == 1, output
    assert len(errors) == 1 and "Traceback" not in output, output
    assert errors[0].startswith(f"Error: cannot write to the store at {store}: ") or \
        errors[0].startswith(f"Error: cannot compact the store at {store}: "), output
    assert "Read-only file system" in errors[0] or "Permission denied" in errors[0], output
    assert len([line for line in output.splitlines() if line.strip()]) <= 2, output  # at most the job id's line
    assert _tree(store) == before  # nothing half-written
    assert not (tmp_path / "demo.html").exists()


@pytest.mark.parametrize("args", [
    ["import", "otlp", str(SOURCE)],
    ["import", "whowhen", str(SOURCE.parent)],
    pytest.param(["demo", "--rollouts", "2", "--html", "REPORT"], marks=needs_openai_v2),
], ids=["import", "import-dir", "demo"])
def test_a_store_path_under_a_regular_file_is_one_line(tmp_path, args):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the store's parent should be")
    store = blocker / "store"
    before = _tree(tmp_path)
    result = CliRunner().invoke(cli, ["--store", str(store),
                                      *[str(tmp_path / "demo.html") if a == "REPORT" else a for a in args]])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.output.splitlines() == [result.output.strip()]
    assert result.output.startswith(f"Error: cannot write to the store at {store}: Not a directory"), result.output
    assert _tree(tmp_path) == before
