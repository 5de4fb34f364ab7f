"""Attribution on Ray: a local Ray instance started by the test (2 CPUs), the planted-culprit
agents (real openai SDK and instrumentation when recorded, the simulated model over HTTP when
replayed), real Parquet stores. Ray gives the same rollouts, results, budget and resume as the
local thread pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from otel_replay import Store
from otel_replay.attribution import Job, JobParams
from otel_replay.attribution.executors import EngineError, RayExecutor
from otel_replay.cli import main as cli
from otel_replay.replay import policies
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.planted import TOPOLOGIES, planted_registry, record_planted, replay_model
from tests.helpers import REPO

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

VERIFIER = "otel_replay.testing.planted:ok"
ROWS = ("SELECT plan, rollout, step_index, role, seed, score, failed, unreplayable, policy_calls, digest "
        "FROM rollouts WHERE job_id = ? ORDER BY plan, rollout")


def spec(topology: str) -> str:
    return f"otel_replay.testing.planted_policies:{topology}"


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    return root, {name: record_planted(root, TOPOLOGIES[name]) for name in ("single-late", "echo")}


def registry_of(policy_spec: str):
    """The driver's registry, built from the spec exactly as `--policies` builds it."""
    policies.registry.clear()
    policies.load_module(policy_spec)
    built = policies.registry.copy()
    policies.registry.clear()
    return built


def run(root, trace_id: str, topology: str, executor=None, job_id=None, on_progress=None, **params):
    registry = registry_of(spec(topology))
    job_params = JobParams([trace_id], VERIFIER, policies=spec(topology), **{"concurrency": 4, **params})
    if executor == "ray":
        executor = RayExecutor(spec(topology), VERIFIER, workers=4, worker_cpus=0.25, registry=registry)
    job = Job(Store(root), job_params, registry, executor=executor, **({"job_id": job_id} if job_id else {}))
    job.on_progress = on_progress
    try:
        (result,) = job.run()
    finally:
        if isinstance(executor, RayExecutor):
            executor.close()
    return result, job


def steps(result):
    return [(s["index"], s["estimate"], s["ci_low"], s["ci_high"], s["verdict"], s["culprit"]) for s in result.steps]


def test_local_and_ray_give_the_same_rollouts_culprit_intervals_and_repair(local_ray, planted):
    root, traces = planted
    local, _ = run(root, traces["single-late"], "single-late", seed=5, repair=True)
    remote, _ = run(root, traces["single-late"], "single-late", executor="ray", seed=5, repair=True)
    local_rows = Store(root).sql(ROWS, [local.job_id]).to_pylist()
    remote_rows = Store(root).sql(ROWS, [remote.job_id]).to_pylist()
    assert len(local_rows) > 40 and {r["role"] for r in local_rows} >= {"factual", "boundary", "repair"}
    assert remote_rows == local_rows  # same seeds, scores, failed flags, policy calls, digests
    assert remote.verdict == local.verdict == "culprit-found"
    assert remote.culprit["index"] == local.culprit["index"] == TOPOLOGIES["single-late"].culprit
    assert steps(remote) == steps(local)
    assert remote.repair == local.repair and remote.repair["valid"]
    assert (remote.rollouts, remote.policy_calls) == (local.rollouts, local.policy_calls)


def test_the_budget_caps_policy_calls_across_ray_workers(local_ray, planted):
    root, traces = planted
    for limit in (40, 57):
        result, job = run(root, traces["single-late"], "single-late", executor="ray", max_policy_calls=limit,
                          concurrency=8)
        assert job.budget.spent == limit and result.verdict == "undecided"  # spent up to the cap, never past it
        assert result.budget_exhausted and result.culprit is None
        stored = Store(root).sql("SELECT sum(policy_calls) s, count(*) n FROM rollouts WHERE job_id = ?",
                                 [job.job_id]).to_pylist()[0]
        assert 0 < stored["s"] <= limit
        state = Store(root).sql("SELECT status, policy_calls FROM jobs WHERE job_id = ?", [job.job_id]).to_pylist()
        assert state == [{"status": "partial", "policy_calls": limit}]


def test_an_interrupted_ray_job_resumed_equals_an_uninterrupted_run(local_ray, planted):
    root, traces = planted
    whole, _ = run(root, traces["echo"], "echo", seed=3)

    def interrupt(progress):
        if progress.rollouts >= 25:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(root, traces["echo"], "echo", executor="ray", seed=3, on_progress=interrupt)
    (job_id,) = Store(root).sql("SELECT job_id FROM jobs WHERE status = 'interrupted'").column("job_id").to_pylist()
    stored = Store(root).sql("SELECT count(*) n FROM rollouts WHERE job_id = ?", [job_id]).column("n")[0].as_py()
    assert stored >= 25
    again, _ = run(root, traces["echo"], "echo", executor="ray", seed=3, job_id=job_id)
    assert steps(again) == steps(whole) and again.culprit["index"] == TOPOLOGIES["echo"].culprit
    raw = Store(root).sql("SELECT count(*) n FROM rollout_rows WHERE job_id = ?", [job_id]).column("n")[0].as_py()
    assert raw == again.rollouts  # the resumed job ran only the rollouts the interrupted one had not stored
    assert Store(root).sql(ROWS, [job_id]).to_pylist() == Store(root).sql(ROWS, [whole.job_id]).to_pylist()


def test_cli_batch_job_on_ray_and_its_resume(local_ray, planted):
    root, traces = planted
    args = ["--store", str(root), "attribute", "--where", "service_name = 'planted-single-late'",
            "--policies", spec("single-late"), "--expect-contains", "OK", "--engine", "ray",
            "--worker-cpus", "0.25"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    assert "★ decisive" in out.output
    job_id = out.output.split("job ")[-1].split()[0]
    resumed = CliRunner().invoke(cli, ["--store", str(root), "attribute", "--resume", job_id, "--engine", "ray"])
    assert resumed.exit_code == 0, resumed.output
    table = lambda text: text[: text.index("WHAT")]  # noqa: E731 - the step table, printed the same
    assert table(resumed.output) == table(out.output)
    policies.registry.clear()


def test_workers_that_cannot_rebuild_the_policies_are_named(local_ray, planted, tmp_path, monkeypatch):
    root, traces = planted
    (tmp_path / "driver_only_policies.py").write_text(
        "import otel_replay.testing.planted_policies as planted\n"
        "def register(registry):\n    getattr(planted, 'single-late')(registry)\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # importable here, not on the workers' path
    out = CliRunner().invoke(cli, ["--store", str(root), "attribute", "--trace-id", traces["single-late"],
                                   "--policies", "driver_only_policies:register", "--expect-contains", "OK",
                                   "--engine", "ray"])
    assert out.exit_code == 1 and "a Ray worker cannot load the policies" in out.output, out.output
    assert "driver_only_policies" in out.output and "Traceback" not in out.output
    policies.registry.clear()
    with SimulatedModelServer(replay_model(TOPOLOGIES["single-late"])) as server:
        closures = planted_registry(TOPOLOGIES["single-late"], server.base_url)  # built here, not from a module
        with pytest.raises(EngineError, match="do not register llm, tool:search, tool:work"):
            RayExecutor(None, VERIFIER, registry=closures)


def test_cli_rejects_an_address_without_the_ray_engine(planted):
    root, traces = planted
    out = CliRunner().invoke(cli, ["--store", str(root), "attribute", "--trace-id", traces["single-late"],
                                   "--policies", spec("single-late"), "--expect-contains", "OK",
                                   "--address", "auto"])
    assert out.exit_code == 1 and "--address is for --engine ray" in out.output


def test_cli_in_a_subprocess_starts_its_own_local_ray_instance(planted):
    root, traces = planted
    args = ["--store", str(root), "attribute", "--trace-id", traces["single-late"], "--policies", spec("single-late"),
            "--expect-contains", "OK", "--seed", "1"]
    done = subprocess.run([sys.executable, "-c", "from otel_replay.cli import main; main()", *args, "--engine", "ray",
                           "--worker-cpus", "0.5"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert done.returncode == 0, done.stdout + done.stderr
    local = CliRunner().invoke(cli, args)
    policies.registry.clear()
    assert local.exit_code == 0, local.output
    summary = lambda text: text.strip().splitlines()[-1].rsplit(", job ", 1)  # noqa: E731 - "N rollouts, M calls", job
    (ray_counts, ray_job), (local_counts, local_job) = summary(done.stdout), summary(local.output)
    assert ray_counts == local_counts
    assert Store(root).sql(ROWS, [ray_job]).to_pylist() == Store(root).sql(ROWS, [local_job]).to_pylist()


def test_watch_on_ray_attributes_each_failure_once_with_the_local_watchers_results(local_ray, tmp_path):
    """`watch --engine ray` runs each job's rollouts on Ray workers: every failure is attributed once,
    with the rollouts and results a local watcher gets; a second pass does nothing."""
    stores = {engine: tmp_path / engine for engine in ("local", "ray")}
    traces = {engine: record_planted(store, TOPOLOGIES["single-late"]) for engine, store in stores.items()}
    assert traces["local"] == traces["ray"]  # the same recording (seeded ids) in two fresh stores
    for engine, store in stores.items():
        args = ["--store", str(store), "watch", "--once", "--settle", "0", "--policies", spec("single-late"),
                "--where", "service_name = 'planted-single-late'", "--expect-contains", "OK", "--json",
                "--engine", engine]
        out = CliRunner().invoke(cli, args)
        assert out.exit_code == 0, out.output
        events = [json.loads(line) for line in out.output.splitlines()]
        assert {e["trace_id"] for e in events if e["event"] == "attributed"} == {traces[engine]}
        again = CliRunner().invoke(cli, args)
        assert not [line for line in again.output.splitlines() if '"attributing"' in line]
    query = "SELECT trace_id, step_index, estimate, ci_low, ci_high, verdict, culprit FROM results ORDER BY ALL"
    assert Store(stores["ray"]).sql(query).to_pylist() == Store(stores["local"]).sql(query).to_pylist()
    rows = "SELECT plan, rollout, seed, score, failed, policy_calls FROM rollouts ORDER BY plan, rollout"
    assert Store(stores["ray"]).sql(rows).to_pylist() == Store(stores["local"]).sql(rows).to_pylist()
    policies.registry.clear()
