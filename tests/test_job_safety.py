"""Batch attribution jobs survive `kill -9` and share a store: real `otel-replay attribute`
subprocesses over a store of planted-culprit traces, compared with an uninterrupted run.

A job killed mid-way resumes (`--resume JOB_ID`) to the same result as an uninterrupted run
with the same seed; a second process on the same job id is refused while the first runs, and
takes over once it is dead; two jobs run at once on one store over the same traces both get
the right result.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from otel_replay import Store
from otel_replay.attribution.lock import JobLock, JobLocked
from otel_replay.cli import main as cli
from otel_replay.testing.planted import TOPOLOGIES, record_planted
from tests.helpers import REPO

TRACES = 3
WHERE = "service_name = 'planted-single-late'"
ARGS = ["attribute", "--where", WHERE, "--policies", "slow_planted_policies", "--expect-contains", "OK",
        "--seed", "3", "--concurrency", "4"]
POLICIES = """
import os, time
from otel_replay.replay import policies
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.planted import TOPOLOGIES, planted_registry, replay_model

topology = TOPOLOGIES["single-late"]
server = SimulatedModelServer(replay_model(topology)).start()
planted_registry(topology, server.base_url, policies.registry)
model = policies.registry.resolve("llm", None)
delay = float(os.environ.get("SLOW_POLICY_S", "0"))
if delay:  # write rollouts as they come, so a kill lands between two writes of one trace
    import otel_replay.attribution.job
    otel_replay.attribution.job.FLUSH_INTERVAL_S = 0.2

@policies.llm
def slow(step, inputs, rng):
    time.sleep(delay)  # time for the test to kill the job mid-way
    return model(step, inputs, rng)
"""


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A store with three single-late traces, the policies module, and the reference reports."""
    root = tmp_path_factory.mktemp("store")
    modules = tmp_path_factory.mktemp("modules")
    (modules / "slow_planted_policies.py").write_text(POLICIES)
    for seed in range(TRACES):
        record_planted(root, TOPOLOGIES["single-late"], model_seed=seed)
    sys.path.insert(0, str(modules))
    try:
        out = CliRunner().invoke(cli, ["--store", str(root), *ARGS, "--json", str(modules / "reference.json")])
    finally:
        sys.path.remove(str(modules))
        from otel_replay.replay import policies
        policies.registry.clear()
    assert out.exit_code == 0, out.output
    reference = json.loads((modules / "reference.json").read_text())["reports"]
    assert len(reference) == TRACES and any(r["verdict"] == "culprit-found" for r in reference), \
        [r["verdict"] for r in reference]
    return root, modules, reference


def start(root, modules, *args: str, delay: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(modules), str(REPO)]), "SLOW_POLICY_S": str(delay)}
    return subprocess.Popen([sys.executable, "-c", "from otel_replay.cli import main; main()", "--store", str(root),
                             *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def job_id_of(proc: subprocess.Popen) -> str:
    """From the line a job prints first on stderr: "job jXXXX (if interrupted, continue it with ...)"."""
    seen = []
    for _ in range(50):
        line = proc.stderr.readline()
        if line.startswith("job j"):
            return line.split()[1]
        seen.append(line)
        if not line:
            break
    raise AssertionError(f"no job id on stderr: {''.join(seen)}")


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out, err


def essentials(report: dict) -> dict:
    """What must not change between runs: every estimate, interval, verdict and count."""
    return {key: report[key] for key in ("trace_id", "verdict", "culprit", "steps", "rollouts", "policy_calls",
                                         "recorded_score")}


def assert_same_reports(path, reference: list[dict]) -> None:
    got = json.loads(path.read_text())["reports"]
    assert [essentials(r) for r in got] == [essentials(r) for r in reference]


def count_rows(root, job_id: str) -> int:
    return Store(root).sql("select count(*) n from rollout_rows where job_id = ?", [job_id]).column("n")[0].as_py()


@pytest.mark.slow
def test_a_job_killed_mid_way_resumes_to_the_uninterrupted_result_and_is_locked_while_it_runs(planted, tmp_path):
    root, modules, reference = planted
    first = start(root, modules, *ARGS, delay=0.05)
    try:
        job_id = job_id_of(first)
        deadline = time.monotonic() + 120
        while count_rows(root, job_id) < 10:  # some rollouts are written
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.2)
        written = count_rows(root, job_id)
        assert written < sum(r["rollouts"] for r in reference)  # still mid-way

        second = start(root, modules, "attribute", "--resume", job_id)  # the same job while it runs: refused
        _, err = second.communicate(timeout=120)
        assert second.returncode == 1
        assert f"job {job_id} is already running in process {first.pid}" in err, err
        assert first.poll() is None

        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        first.kill()
    kept = Store(root).sql("select count(*) n from rollouts where job_id = ?", [job_id]).column("n")[0].as_py()
    assert 0 < kept < sum(r["rollouts"] for r in reference)  # the resume starts from a partial job
    lock_file = root / "locks" / f"job-{job_id}.lock"
    assert lock_file.read_text().strip() == str(first.pid)  # left behind by the dead process: stale
    state = Store(root).sql("select status from jobs where job_id = ?", [job_id]).column("status")[0].as_py()
    assert state == "running"

    resumed = start(root, modules, "attribute", "--resume", job_id, "--json", str(tmp_path / "resumed.json"))
    assert job_id_of(resumed) == job_id
    finish(resumed)
    assert_same_reports(tmp_path / "resumed.json", reference)
    store = Store(root)
    assert store.sql("select status from jobs where job_id = ?", [job_id]).column("status")[0].as_py() == "done"
    distinct = store.sql("select count(*) n from rollouts where job_id = ?", [job_id]).column("n")[0].as_py()
    assert distinct == sum(r["rollouts"] for r in reference)
    assert not lock_file.exists()  # released by the run that finished


@pytest.mark.slow
def test_two_jobs_at_once_on_one_store_and_the_same_traces_both_get_the_right_result(planted, tmp_path):
    root, modules, reference = planted
    procs = [start(root, modules, *ARGS, "--json", str(tmp_path / f"{name}.json"), delay=0.005) for name in "ab"]
    try:
        job_ids = [job_id_of(p) for p in procs]
        for proc in procs:
            finish(proc)
    finally:
        for proc in procs:
            proc.kill()
    assert job_ids[0] != job_ids[1]
    for name in "ab":
        assert_same_reports(tmp_path / f"{name}.json", reference)
    store = Store(root)
    for job_id in job_ids:
        assert store.sql("select status from jobs where job_id = ?", [job_id]).column("status")[0].as_py() == "done"
        n = store.sql("select count(*) n from rollouts where job_id = ?", [job_id]).column("n")[0].as_py()
        assert n == sum(r["rollouts"] for r in reference)
    assert not list(root.glob("rollout_rows/*/*.tmp"))


def test_the_job_lock_refuses_a_second_holder_and_is_free_once_released(tmp_path):
    first = JobLock(tmp_path, "j123").acquire()
    with pytest.raises(JobLocked, match=rf"job j123 is already running in process {os.getpid()}"):
        JobLock(tmp_path, "j123").acquire()
    with JobLock(tmp_path, "j456"):  # another job id: no contention
        pass
    first.release()
    assert not (tmp_path / "locks" / "job-j123.lock").exists()
    with JobLock(tmp_path, "j123") as again:
        assert again.took_over is None
    with pytest.raises(ValueError, match="cannot hold"):
        JobLock(tmp_path, "../etc/passwd")


def test_a_lock_file_left_by_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "job-j1.lock").write_text(f"{dead.pid}\n")  # as a kill -9 leaves it
    with JobLock(tmp_path, "j1") as lock:
        assert lock.took_over == dead.pid
        assert (tmp_path / "locks" / "job-j1.lock").read_text() == f"{os.getpid()}\n"
