"""tests/fixtures/record.py re-records the OTel fixtures: each new recording, written to a
temporary directory, meets the expectations tests/test_conventions.py holds the committed one to.

A fixture records in this interpreter only when its instrumentation packages are installed at
the pinned versions; the ones the dev extra installs run by default (openai-v2 2.4b0 with
util-genai 1.1b0), the rest are marked slow and skip, naming the missing pins, where those
packages are absent (`python tests/fixtures/record.py --venvs DIR NAME` installs them instead).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import test_conventions as conventions
from tests.helpers import FIXTURES

RECORD = FIXTURES / "record.py"
_spec = importlib.util.spec_from_file_location("record_fixtures", RECORD)
record = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = record  # (dataclasses look their module up there)
_spec.loader.exec_module(record)

DEFAULT = {"openai-v2_span_and_event", "util-genai-1.1_handler_span_and_event"}  # the dev extra's packages
CASES = [pytest.param(name, marks=() if name in DEFAULT else pytest.mark.slow) for name in sorted(record.FIXTURES)]


def test_the_script_records_every_fixture_the_conventions_test_describes():
    assert set(record.FIXTURES) == set(conventions.SPECS)
    for fixture in record.FIXTURES.values():
        assert fixture.packages in record.PACKAGE_SETS
        assert all("==" in pin for pins in record.PACKAGE_SETS.values() for pin in (*pins.instrumentation, *pins.client))


@pytest.fixture()
def conventions_on(monkeypatch):
    """Point tests/test_conventions.py at another directory (its caches cleared either side)."""

    def point(directory: Path) -> None:
        conventions.records.cache_clear()
        conventions.normalized.cache_clear()
        monkeypatch.setattr(conventions, "OTEL", directory)

    yield point
    conventions.records.cache_clear()
    conventions.normalized.cache_clear()


@pytest.mark.parametrize("name", CASES)
def test_a_rerecorded_fixture_meets_the_conventions_expectations(name, tmp_path, conventions_on):
    if unmet := record.unmet(name):
        pytest.skip(f"{name} records with {', '.join(unmet)}, not installed here "
                    f"(python tests/fixtures/record.py --venvs DIR {name} installs them in a venv)")
    spec = conventions.SPECS[name]
    openai = spec.provider == "openai"
    reference = {number: [conventions.step_row(s) for s in conventions.llm_steps(
        conventions.turn(conventions.REFERENCE, "flat", number))] for number in (1, 2)} if openai else {}

    done = subprocess.run([sys.executable, str(RECORD), "--out", str(tmp_path), name],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    committed = {p.name.replace(name, "NAME") for p in (FIXTURES / "otel").glob(f"{name}.*")}
    assert {p.name.replace(name, "NAME") for p in tmp_path.iterdir()} == committed  # the same files
    doc = json.loads((tmp_path / f"{name}.json").read_text())
    assert doc["fixture"] == name and doc["producer"]["settings"] == record.FIXTURES[name].settings

    conventions_on(tmp_path)
    conventions.test_flat_and_otlp_give_identical_steps(name)
    for variant in conventions.VARIANTS:
        conventions.test_turn1_tool_loop(name, variant)
        conventions.test_turn2_streamed_tool_call_is_reassembled(name, variant)
        conventions.test_turn3_failing_call_is_an_error(name, variant)
        if name in conventions.CONTENT_ONLY_IN_LOGS:
            conventions.test_content_only_in_logs(name, variant)
    if spec.raw_error_type:
        conventions.test_class_wrapper_is_stripped_from_error_type(name)
    tools = conventions.llm_steps(conventions.turn(name, "flat", 1))[0].content.tools
    assert tools == ([conventions.TOOL_DEFINITION] if spec.tool_definitions else [])
    for number, rows in reference.items():  # the committed reference's llm steps, whatever the convention
        assert [conventions.step_row(s) for s in conventions.llm_steps(conventions.turn(name, "flat", number))] == rows
