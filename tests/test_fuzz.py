"""Coverage-guided fuzzing (atheris) of every importer and of the OTLP receiver, each target in its
own subprocess for 15 s: no crash, no input over the time bound, no process over the memory bound.

Needs the `fuzz` extra (`pip install 'otel-replay[fuzz]'`). A crash leaves its input in the
reported workdir; replay it with `python -m tests.harness.fuzzing TARGET CRASH_FILE`.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time

import pytest

from tests.harness import fuzzing

SECONDS_PER_TARGET = 15


@pytest.mark.slow
@pytest.mark.parametrize("target", fuzzing.TARGETS)
def test_fuzzing_finds_no_crash(target):
    pytest.importorskip("atheris")
    result = fuzzing.run_target(target, SECONDS_PER_TARGET)
    assert result["crashes"] == 0, f"{target}: {result.get('failure')}\nreproducer in {result.get('workdir')}"
    assert "harness_error" not in result, f"{target}: the fuzzer did not run (no input is implicated): " \
                                          f"{result['harness_error']}"
    assert result["inputs"] > 100 and result["seconds"] >= SECONDS_PER_TARGET - 1, result


def test_without_atheris_fuzzing_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "atheris", None)  # what `import atheris` sees when it is not installed
    with pytest.raises(fuzzing.FuzzingUnavailable, match=r"pip install 'otel-replay\[fuzz\]'"):
        fuzzing.fuzz_summary(1)


@pytest.mark.slow
def test_every_target_accepts_its_own_seeds(tmp_path):
    """The seed corpora are valid input: each runs through its target without a failure (so a
    crash in the fuzz run is a finding, not a broken seed)."""
    from tests.harness import fuzz_seeds
    for name in fuzzing.TARGETS:
        run = fuzzing.target(name, tmp_path / name)
        seeds = fuzz_seeds.corpus(name)
        assert len(seeds) >= 5, name
        for seed in seeds:
            run(seed)


def test_a_fuzzer_that_cannot_start_is_a_harness_failure_said_plainly_and_retried(tmp_path):
    """What happened once in the full bench: the work directory was removed (a clean-up of the shared
    temp directory) while the fuzzer started, so libFuzzer found no corpus and exited. That is not a
    crash; the harness says why and starts the target again."""
    pytest.importorskip("atheris")
    from tests.harness import fuzz_seeds

    workdir = tmp_path / "work"
    last_seed = workdir / "corpus" / f"seed-{len(fuzz_seeds.corpus('receiver_json')) - 1:03d}"
    removed = threading.Event()

    def clean_up_once() -> None:
        deadline = time.monotonic() + 60
        while not last_seed.exists() and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(0.05)  # the fuzzer is starting: its instrumented imports take a second or more
        shutil.rmtree(workdir / "corpus")
        removed.set()

    thread = threading.Thread(target=clean_up_once, daemon=True)
    thread.start()
    result = fuzzing.run_target("receiver_json", 2, workdir)
    thread.join()
    assert removed.is_set()
    assert result["crashes"] == 0 and "harness_error" not in result and result["attempts"] == 2, result
    (first,) = result["harness_retries"]
    assert first.startswith("the fuzzer exited with code 1 without finishing, before its first input"), first
    assert "does not exist" in first and f"the corpus directory {workdir / 'corpus'} is gone" in first, first
    assert result["inputs"] > 100, result  # the second attempt fuzzed
