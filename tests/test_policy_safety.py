"""Policies are user code: one that hangs is cut off, one that raises errors its rollout (never a
pass or a fail), and the policy-call budget holds under concurrency, timeouts and errors.

A planted-culprit agent recorded through the real openai SDK; policies call the simulated model
over real HTTP; jobs write real Parquet rows that are read back through DuckDB.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from otel_replay import Store
from otel_replay.attribution import Job, JobParams
from otel_replay.attribution.plans import Budget, boundary_plan
from otel_replay.attribution.rollouts import RolloutRunner
from otel_replay.attribution.sequential import Pairs
from otel_replay.cli import main as cli
from otel_replay.replay import ReplayPlan, replay
from otel_replay.replay.policies import Registry
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.planted import (
    TOPOLOGIES,
    ok,
    planted_registry,
    record_planted,
    replay_model,
)
from tests.helpers import needs_openai_v2

pytestmark = needs_openai_v2  # every test here records or runs the demo's agent (openai-v2)

TOPOLOGY = TOPOLOGIES["single-late"]
VERIFIER = "otel_replay.testing.planted:ok"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    trace_id = record_planted(root, TOPOLOGY)
    with SimulatedModelServer(replay_model(TOPOLOGY)) as server:
        yield root, trace_id, server


@pytest.fixture
def release():
    """Set at the end of the test, so every hung policy returns and its abandoned thread ends."""
    event = threading.Event()
    yield event
    event.set()


def counting_tool(calls: list[str]):
    def tool(arguments, rng):
        calls.append("tool")
        return json.dumps({"turn": arguments["turn"], "choice": arguments["choice"]})
    return tool


# -- one rollout -----------------------------------------------------------------------------------
def test_a_hanging_sync_policy_is_cut_off_and_its_thread_makes_no_further_call(planted, release):
    root, trace_id, _ = planted
    trajectory = Store(root).trajectory(trace_id)
    calls: list[str] = []

    def hangs(step, inputs, rng):
        calls.append("llm")
        release.wait(30)
        return list(step.outputs)  # as recorded: the walk would go on to the tool step

    registry = Registry()
    registry.register("llm", None, hangs)
    registry.register("tool", None, counting_tool(calls))
    started = time.monotonic()
    run = replay(trajectory, ReplayPlan.resample_from(0), 1, policies=registry, policy_timeout_s=0.3)
    assert time.monotonic() - started < 3
    assert run.errored and not run.ok and run.unreplayable.cause == "policy-timeout"
    assert run.unreplayable.index == 0 and "did not return within 0.3 s" in run.unreplayable.reason
    assert run.policy_calls == 1 and run.final_output == ""
    release.set()  # the abandoned call returns now; its rollout must stop before the next policy call
    time.sleep(0.3)
    assert calls == ["llm"]


def test_a_hanging_async_policy_is_cancelled(planted):
    root, trace_id, _ = planted
    cancelled = threading.Event()

    async def slow(step, inputs, rng):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    registry = Registry()
    registry.register("llm", None, slow)
    started = time.monotonic()
    run = replay(Store(root).trajectory(trace_id), ReplayPlan.resample_from(0), 1, policies=registry,
                 policy_timeout_s=0.3)
    assert time.monotonic() - started < 3
    assert run.errored and run.unreplayable.cause == "policy-timeout" and "cancelled" in run.unreplayable.reason
    assert cancelled.wait(2)


def test_a_policy_within_its_timeout_gives_the_same_rollout_as_without_one(planted):
    root, trace_id, server = planted
    trajectory = Store(root).trajectory(trace_id)
    registry = planted_registry(TOPOLOGY, server.base_url)
    plan = ReplayPlan.resample_from(0)
    for seed in range(3):
        bounded = replay(trajectory, plan, seed, policies=registry, policy_timeout_s=30)
        inline = replay(trajectory, plan, seed, policies=registry)
        assert bounded.ok and bounded.digest == inline.digest


def _raises(step, inputs, rng):
    raise RuntimeError("model endpoint said no")


def _not_an_output(step, inputs, rng):
    return 42


async def _raises_async(step, inputs, rng):
    raise TimeoutError("the policy's own HTTP timeout")


@pytest.mark.parametrize("timeout", [None, 5.0])
@pytest.mark.parametrize(("policy", "reason"), [
    (_raises, "raised RuntimeError: model endpoint said no"),
    (_not_an_output, "returned int; expected output messages"),
    (_raises_async, "raised TimeoutError: the policy's own HTTP timeout"),
])
def test_a_policy_that_raises_or_breaks_its_contract_errors_the_rollout(planted, policy, reason, timeout):
    root, trace_id, _ = planted
    registry = Registry()
    registry.register("llm", None, policy)
    run = replay(Store(root).trajectory(trace_id), ReplayPlan.resample_from(0), 1, policies=registry,
                 policy_timeout_s=timeout)
    assert run.errored and run.unreplayable.cause == "policy-error", run.unreplayable
    assert reason in run.unreplayable.reason


def test_a_missing_policy_is_unreplayable_not_errored(planted):
    root, trace_id, _ = planted
    run = replay(Store(root).trajectory(trace_id), ReplayPlan.resample_from(0), 1, policies=Registry(),
                 policy_timeout_s=5)
    assert run.unreplayable.cause == "missing-policy" and not run.errored


def test_a_timeout_must_be_positive(planted):
    root, trace_id, _ = planted
    with pytest.raises(ValueError, match="policy_timeout_s must be a positive number"):
        replay(Store(root).trajectory(trace_id), policy_timeout_s=0)


# -- jobs ------------------------------------------------------------------------------------------
def plan_outcomes(store: Store, job_id: str, plan_key: str) -> dict[int, bool | None]:
    """Rollout index -> failed (None: not scored) of one plan's stored rows; an errored row is never scored."""
    rows = store.sql("select rollout, failed, errored from rollouts where job_id = ? and plan = ?",
                     [job_id, plan_key]).to_pylist()
    assert not any(r["errored"] and r["failed"] is not None for r in rows)
    return {r["rollout"]: r["failed"] for r in rows}


def assert_errored_rows_never_counted(store: Store, job: Job, result, registry: Registry) -> None:
    """Every errored row is unscored, and each step's pairs and failure rates count scored rows only:
    recomputed from the stored rows of its two plans, over the first rollouts of some look."""
    rows = store.sql("select * from rollouts where job_id = ?", [job.job_id]).to_pylist()
    for row in (r for r in rows if r["errored"]):
        assert row["failed"] is None and row["score"] is None and not row["unreplayable"] and row["reason"]
    trajectory = store.trajectory(result.trace_id)
    runner = RolloutRunner(job.job_id, registry, ok, 0.5, 0, 1, Budget(None))
    resamplable = [s.index for s in trajectory.steps if runner.can_resample(trajectory, s.index)]
    checked = 0
    for step in result.steps:
        if not step["n_held"]:
            continue
        position = resamplable.index(step["index"])
        upper = resamplable[position + 1] if position + 1 < len(resamplable) else len(trajectory)
        held = plan_outcomes(store, job.job_id, boundary_plan(resamplable, upper).key())
        redecided = plan_outcomes(store, job.job_id, boundary_plan(resamplable, step["index"]).key())
        matches = []
        for look in job.params.design().with_tests(len(resamplable)).looks:
            if all(r in held and r in redecided for r in range(look)):
                pairs = Pairs.of([held[r] for r in range(look)], [redecided[r] for r in range(look)], look)
                matches.append(pairs.n == step["n_held"] and pairs.held_failures / pairs.n == pytest.approx(
                    step["fail_held"]) and pairs.redecided_failures / pairs.n == pytest.approx(step["fail_resampled"]))
        assert any(matches), step
        checked += 1
    assert checked


def test_rollouts_whose_policy_raises_are_errored_rows_left_out_of_the_estimates(planted):
    root, trace_id, server = planted
    registry = planted_registry(TOPOLOGY, server.base_url)
    model = registry.resolve("llm", None)

    def flaky(step, inputs, rng):
        if rng.random() < 0.25:  # the rollout's own rng: the same rollouts fail on every run
            raise ConnectionError("connection reset by the model endpoint")
        return model(step, inputs, rng)

    registry.register("llm", None, flaky)
    job = Job(Store(root), JobParams([trace_id], VERIFIER, concurrency=4, seed=5), registry)
    (result,) = job.run()
    store = Store(root)
    errored = store.sql("select count(*) n, any_value(reason) r from rollouts where job_id = ? and errored",
                        [job.job_id]).to_pylist()[0]
    assert errored["n"] > 0 and errored["n"] == job.errored
    assert "ConnectionError: connection reset" in errored["r"]
    assert result.verdict == "culprit-found" and result.culprit["index"] == TOPOLOGY.culprit
    assert_errored_rows_never_counted(store, job, result, registry)
    message = store.sql("select message from jobs where job_id = ?", [job.job_id]).column("message")[0].as_py()
    assert f"{job.errored} rollouts errored" in message


@pytest.mark.slow  # ~15-20 s; each kind of bad policy alone is in the default suite (above)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(p_hang=0.08, p_raise=0.3, seed=1, budget=120)
@given(p_hang=st.floats(0.0, 0.1), p_raise=st.floats(0.0, 0.4), seed=st.integers(0, 2**16),
       budget=st.integers(40, 160))
def test_the_budget_holds_under_concurrency_32_with_hanging_raising_and_good_policies(
        planted, release, p_hang, p_raise, seed, budget):
    root, trace_id, server = planted
    registry = planted_registry(TOPOLOGY, server.base_url)
    chance = random.Random(seed)
    lock = threading.Lock()
    entered = [0]

    def chaos(fn):
        def policy(*args):
            with lock:
                entered[0] += 1
                draw = chance.random()
            if draw < p_hang:
                release.wait(60)
            elif draw < p_hang + p_raise:
                raise RuntimeError("chaos")
            return fn(*args)
        return policy

    keys = registry.keys()  # a sorted list: the loop re-registers
    for key in keys:
        kind, _, name = key.partition(":")
        registry.register(kind, name or None, chaos(registry.resolve(kind, name or None)))
    params = JobParams([trace_id], VERIFIER, rollouts=12, concurrency=32, seed=seed, max_policy_calls=budget,
                       policy_timeout_s=0.25, full=True)
    job = Job(Store(root), params, registry)
    (result,) = job.run()
    store = Store(root)
    spent = store.sql("select coalesce(sum(policy_calls), 0) s from rollouts where job_id = ?",
                      [job.job_id]).column("s")[0].as_py()
    assert entered[0] <= job.budget.spent <= budget  # policies actually entered, under the cap
    assert spent <= budget
    if p_hang + p_raise >= 0.2:
        assert job.errored > 0
    if result.steps and any(s["n_held"] for s in result.steps):
        assert_errored_rows_never_counted(store, job, result, registry)


def test_cli_policy_timeout_cuts_off_a_hanging_policy(planted, tmp_path, monkeypatch):
    root, trace_id, _ = planted
    (tmp_path / "hanging_policies.py").write_text(
        "import threading\n"
        "from otel_replay.replay import policies\n"
        "from otel_replay.testing.planted import TOPOLOGIES, planted_registry, replay_model\n"
        "from otel_replay.testing import SimulatedModelServer\n"
        "server = SimulatedModelServer(replay_model(TOPOLOGIES['single-late'])).start()\n"
        "planted_registry(TOPOLOGIES['single-late'], server.base_url, policies.registry)\n"
        "model = policies.registry.resolve('llm', None)\n"
        "never = threading.Event()\n"
        "@policies.llm\n"
        "def sometimes_hangs(step, inputs, rng):\n"
        "    if rng.random() < 0.2:\n"
        "        never.wait(20)\n"
        "    return model(step, inputs, rng)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        out = CliRunner().invoke(cli, ["--store", str(root), "attribute", "--trace-id", trace_id, "--policies",
                                       "hanging_policies", "--expect-contains", "OK", "--rollouts", "8",
                                       "--policy-timeout", "0.2", "--concurrency", "8"])
    finally:
        from otel_replay.replay import policies
        policies.registry.clear()
    assert out.exit_code in (0, 4), out.output  # 8 rollouts a plan may leave steps undecided (exit 4)
    assert "rollouts errored (a policy raised or timed out)" in out.output
    job_id = out.output.split("job ")[-1].split()[0]
    params = json.loads(Store(root).sql("select params from jobs where job_id = ?", [job_id]).column("params")[0].as_py())
    assert params["policy_timeout_s"] == 0.2
    reasons = Store(root).sql("select reason from rollouts where job_id = ? and errored", [job_id]).column("reason")
    assert reasons.to_pylist() and all("did not return within 0.2 s" in r for r in reasons.to_pylist())
