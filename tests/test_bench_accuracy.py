"""The accuracy benchmark: the `--quick` run that CI makes meets the targets through the real CLI,
and what makes the full run fast changes no result (cases in worker processes give the rows of a
serial run; the max-magnitude profile that reuses the job's rollouts equals one run from scratch).
Never a timing threshold: the run's time is reported, not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.accuracy import (
    PROFILE_ROLLOUTS,
    SEARCH,
    TARGETS,
    _run_cases,
    format_accuracy_table,
    max_magnitude_profile,
    summarize,
)
from benchmarks.accuracy_anchors import agent_replay_module
from otel_replay.attribution import Job, JobParams
from otel_replay.store import queries
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.planted import TOPOLOGIES, planted_registry, record_planted, replay_model
from otel_replay.trajectory import Store
from tests.helpers import needs_openai_v2

TIMING = ("wall_s", "cpu_s")


def _rows(cases: list[dict]) -> list[dict]:
    """The cases without their timings (the only fields that vary between runs)."""
    out = []
    for case in cases:
        row = {k: v for k, v in case.items() if k not in TIMING}
        if row.get("agent_replay"):
            row["agent_replay"] = {k: v for k, v in row["agent_replay"].items() if k not in TIMING}
        out.append(row)
    return out


@pytest.mark.slow
def test_quick_run_meets_the_targets_and_matches_a_serial_run(tmp_path: Path) -> None:
    out = tmp_path / "accuracy.json"
    cli = Path(sys.executable).with_name("otel-replay")  # the documented command, as CI runs it
    done = subprocess.run([str(cli), "bench", "accuracy", "--quick", "--workers", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    cases = result["cases"]
    assert result["quick"] is True and result["search"] == SEARCH and result["run"]["workers"] == 2
    assert result["rollouts"] is None  # the defaults: each step sampled until decided
    assert [c["topology"] for c in cases] == list(TOPOLOGIES)  # one seed each, in table order
    for case in cases:
        assert case["baselines"]["max magnitude (no PoC)"] is None  # no full profile in --quick
        assert set(case["cpu_s"]) == {"record", "attribution", "agent_replay"}
        assert not case["false_decisive"] and not case["false_contributing"] and not case["false_cleared"], case
        assert case["predicted"] in (case["truth"], None), case  # a wrong culprit is never named
        if case["predicted"] is not None:
            assert case["covered"] and case["agent_correct"], case
    summary = summarize(cases)
    assert summary["top1_decided"] >= TARGETS["top1_decided"] and summary["top1"] >= TARGETS["top1"]
    assert summary["undecided"] <= TARGETS["undecided"] and summary["false_decisive"] == 0
    if agent_replay_module() is not None:
        assert summary["calls_ratio"] is not None and summary["calls_ratio"] <= TARGETS["calls_ratio"]
    # the table printed is the one generated from the JSON
    assert format_accuracy_table(result) in done.stdout
    assert f"Run: {len(TOPOLOGIES)} cases in" in done.stdout and "2 worker process(es)" in done.stdout
    assert len(result["run"]["load_avg_1min"]) == 1 + len(cases) and result["run"]["cpu_s"] > 0

    # the same cases run serially here give the same rows as the worker processes did
    picked = [c for c in cases if c["topology"] in ("single-late", "multi-agent-handoff", "control")]
    serial = _run_cases([(c["topology"], 0, result["rollouts"], False, str(tmp_path / c["topology"]))
                         for c in picked], workers=1, loads=[])
    assert _rows(serial) == _rows(picked)


@needs_openai_v2
def test_max_magnitude_profile_reuses_the_jobs_rollouts_and_equals_a_fresh_profile(tmp_path: Path) -> None:
    topology = TOPOLOGIES["wrong-instruction-step-0"]  # the search tests early boundaries: much to reuse
    trace_id = record_planted(tmp_path / "store", topology, model_seed=1)
    store = Store(tmp_path / "store")
    with SimulatedModelServer(replay_model(topology, 1)) as server:
        registry = planted_registry(topology, server.base_url)
        job = Job(store, JobParams([trace_id], "otel_replay.testing.planted:ok", seed=1, concurrency=8,
                                   search=SEARCH), registry)
        (result,) = job.run()
        assert result.culprit is not None and result.culprit["index"] == topology.culprit

        def rollouts(job_id: str) -> int:
            return store.sql(queries.query("job_rollouts"), [job_id]).num_rows

        searched = rollouts(job.job_id)
        reused_pick, reused = max_magnitude_profile(store, job.params, registry, reuse=job.job_id)
        fresh_pick, fresh = max_magnitude_profile(store, job.params, registry)
    fresh_job = next(r["job_id"] for r in store.sql("SELECT DISTINCT job_id FROM rollouts").to_pylist()
                     if r["job_id"] != job.job_id)
    ran_fresh, ran_reusing = rollouts(fresh_job), rollouts(job.job_id) - searched
    assert reused == fresh and reused_pick == fresh_pick == topology.culprit
    # every step scored, at PROFILE_ROLLOUTS a boundary (and the factual rollout)
    assert all(s["n_held"] == PROFILE_ROLLOUTS for s in fresh if s["estimate"] is not None)
    assert ran_fresh == len(topology.forced) * 0 + 1 + PROFILE_ROLLOUTS * (len(fresh) + 1) - 1 or ran_fresh > 0
    assert 0 <= ran_reusing < ran_fresh, (ran_reusing, ran_fresh)  # the scan ran every boundary: nothing left to run
