"""Coverage-guided fuzzing (atheris) of every importer and of the OTLP receiver, each target in its
own subprocess for 15 s: no crash, no input over the time bound, no process over the memory bound.

Needs the `fuzz` extra (`pip install 'otel-replay[fuzz]'`). A crash leaves its input in the
reported workdir; replay it with `python -m otel_replay.testing.fuzzing TARGET CRASH_FILE`.
"""

from __future__ import annotations

import sys

import pytest

from otel_replay.testing import fuzzing
from tests.helpers import FIXTURES

SECONDS_PER_TARGET = 15


@pytest.mark.slow
@pytest.mark.skipif(not FIXTURES.exists(), reason=f"shared fixtures (the seed corpora) not found at {FIXTURES}")
@pytest.mark.parametrize("target", fuzzing.TARGETS)
def test_fuzzing_finds_no_crash(target):
    pytest.importorskip("atheris")
    result = fuzzing.run_target(target, SECONDS_PER_TARGET)
    assert result["crashes"] == 0, f"{target}: {result.get('failure')}\nreproducer in {result.get('workdir')}"
    assert result["inputs"] > 100 and result["seconds"] >= SECONDS_PER_TARGET - 1, result


def test_without_atheris_fuzzing_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "atheris", None)  # what `import atheris` sees when it is not installed
    with pytest.raises(fuzzing.FuzzingUnavailable, match=r"pip install 'otel-replay\[fuzz\]'"):
        fuzzing.fuzz_summary(1)


@pytest.mark.slow
def test_every_target_accepts_its_own_seeds(tmp_path):
    """The seed corpora are valid input: each runs through its target without a failure (so a
    crash in the fuzz run is a finding, not a broken seed)."""
    from otel_replay.testing import fuzz_seeds

    if not FIXTURES.exists():
        pytest.skip(f"shared fixtures not found at {FIXTURES}")
    for name in fuzzing.TARGETS:
        run = fuzzing.target(name, tmp_path / name)
        seeds = fuzz_seeds.corpus(name)
        assert len(seeds) >= 5, name
        for seed in seeds:
            run(seed)
