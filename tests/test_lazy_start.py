"""A service's start: importing and creating the processor loads neither pyarrow nor DuckDB, nor
the normalize pipeline and the redaction detectors, on the caller's thread (the writer thread loads
what writing needs)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO

_PROBE = r"""
import json, sys, threading
heavy = ("pyarrow", "duckdb", "numpy", "scipy")
ours = ("otel_replay.normalize.pipeline", "otel_replay.normalize.privacy", "otel_replay.normalize.redact",
        "otel_replay.normalize.detectors", "otel_replay.normalize.conventions")
seen = []
main = threading.get_ident()
def hook(event, args):
    if event == "import" and threading.get_ident() == main and (args[0].split(".")[0] in heavy or args[0] in ours):
        seen.append(args[0])
sys.addaudithook(hook)
from otel_replay import ReplayProcessor
processor = ReplayProcessor(sys.argv[1])
from opentelemetry.sdk.trace import TracerProvider
provider = TracerProvider()
provider.add_span_processor(processor)
with provider.get_tracer("t").start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m", "gen_ai.input.messages": "[]"}):
    pass
on_main = sorted(set(seen))
provider.shutdown()  # the writer thread imports and writes; then, from here, anything goes
print(json.dumps({"on_main": on_main, "written": processor.stats["written_spans"]}))
"""


def test_the_processor_loads_no_heavy_module_on_the_services_thread(tmp_path):
    out = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path / "store")], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report == {"on_main": [], "written": 1}, report


_CONFIGURE = _PROBE.split("from otel_replay import")[0] + r"""
from opentelemetry import trace
from otel_replay import configure
processor = configure(sys.argv[1])  # makes the TracerProvider and the LoggerProvider, adds both processors
provider = trace.get_tracer_provider()
with trace.get_tracer("t").start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m", "gen_ai.input.messages": "[]"}):
    pass
on_main = sorted(set(seen))
provider.shutdown()
print(json.dumps({"on_main": on_main, "written": processor.stats["written_spans"]}))
"""


def test_configure_loads_no_heavy_module_on_the_services_thread(tmp_path):
    out = subprocess.run([sys.executable, "-c", _CONFIGURE, str(tmp_path / "store")], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report == {"on_main": [], "written": 1}, report


def test_the_cli_lists_every_command_with_its_own_help_without_loading_them():
    import click

    from otel_replay.cli import COMMANDS, main

    ctx = click.Context(main)
    for name, (_, _, summary) in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name
        assert command.get_short_help_str(limit=300) == summary  # the listing says what the command says
    probe = ("import sys; from otel_replay.cli import main; sys.argv[0] = 'otel-replay'\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('duckdb', 'pyarrow', 'scipy', 'otel_replay.attribution') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
    assert "attribute" in out.stdout and "Find the step that made a run fail" in out.stdout
