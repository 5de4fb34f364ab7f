"""The CLI as a new user types it: --store after the command, modules beside you, short prefixes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness.torn import otlp_file
from tests.helpers import REPO

CLI = [sys.executable, "-c", "import sys; from otel_replay.cli import main; sys.argv[0] = 'otel-replay'; main()"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    base = tmp_path_factory.mktemp("habits")
    otlp_file(base / "runs.json", 2)
    done = subprocess.run([*CLI, "--store", str(base / "store"), "import", "otlp", "--jobs", "1", str(base / "runs.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return base / "store"


def _run(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_store_is_accepted_after_the_command_too(store):
    before = _run("--store", str(store), "traces", "--json")
    after = _run("traces", "--store", str(store), "--json")
    assert after.returncode == 0, after.stderr
    assert after.stdout == before.stdout and after.stdout.count("trace_id") == 2
    wins = _run("--store", str(store.parent / "elsewhere"), "traces", "--store", str(store), "--json")
    assert wins.stdout == before.stdout  # the one after the command wins


def test_a_verifier_module_beside_the_user_is_found(store, tmp_path):
    (tmp_path / "mycheck.py").write_text("def ok(final_output, rollout):\n    return 0.0\n")
    done = _run("--store", str(store), "attribute", "--trace-id", f"{1:032x}", "--verifier", "mycheck:ok",
                "--max-policy-calls", "5", cwd=tmp_path)
    assert "No module named" not in done.stdout + done.stderr
    assert "No step could be re-decided" in done.stdout and done.returncode == 5  # loaded, ran, nothing to re-decide


def test_a_short_prefix_says_how_long_a_prefix_must_be(store):
    done = _run("--store", str(store), "show", "00000")
    assert done.returncode != 0 and "needs at least 6 hex digits" in done.stderr


def test_every_option_of_every_command_says_what_it_does():
    import click

    from otel_replay.cli import main

    def walk(group: click.Group, prefix: str) -> list[str]:
        ctx, missing = click.Context(group), []
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            missing += [f"{prefix}{name} {p.opts[0]}" for p in command.params
                        if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
            if isinstance(command, click.Group):
                missing += walk(command, f"{prefix}{name} ")
        return missing

    assert walk(main, "") == []
