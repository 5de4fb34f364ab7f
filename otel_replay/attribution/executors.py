"""Where rollouts run: a thread pool in this process, or Ray actors on a cluster.

Every rollout is a pure function of (trajectory, plan, seed), so an executor only decides where
`RolloutRunner.rollout` runs (the default, a thread pool here, is `rollouts.LocalExecutor`). Rows come back to the driver, which records them (`RolloutRunner.record`:
redacts policy-made text, remembers them) and writes them as they arrive, so resuming, the store
and the results are the same whichever engine ran them.

Ray workers are actors (long-lived worker processes, so Ray does not stop and restart idle
ones between batches). They cannot receive closures: each rebuilds the policy registry from
the job's `--policies` spec (and the `otel_replay.policies` entry points) and the verifier from
its spec, once, and keeps it (with any clients its policies hold). The trajectory is plain data,
put in Ray's object store once per batch. The budget stays a hard cap across workers: with
`--max-policy-calls`, every policy call first takes one unit from a budget actor, whose methods
run one at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from otel_replay.attribution import verifiers
from otel_replay.attribution.plans import Budget, BudgetExhausted, RolloutSpec
from otel_replay.attribution.rollouts import Executor, RolloutRunner, Row
from otel_replay.errors import OtelReplayError
from otel_replay.replay.policies import Registry
from otel_replay.trajectory import Trajectory

ENGINES = ("local", "ray")
RAY_INSTALL = "pip install 'otel-replay[ray]'"
MAX_ROLLOUTS_PER_TASK = 8


class EngineError(OtelReplayError):
    """The chosen engine cannot run this job: ray is missing, unreachable, or its workers lack a policy."""


# -- the worker side (runs in Ray worker processes) --------------------------------------------------
@dataclass(frozen=True, slots=True)
class WorkerJob:
    """What a worker needs to rebuild the job's runner: specs and numbers, never closures."""

    job_id: str
    policies: str | None
    verifier: str
    threshold: float
    seed: int
    credit: bool
    max_steps: int
    policy_timeout_s: float | None
    limit: int | None


_LOADED: dict[tuple[str | None, str], tuple[Registry, verifiers.Verifier]] = {}


def worker_policies(policies_spec: str | None, verifier_spec: str) -> tuple[Registry, verifiers.Verifier]:
    """The registry and verifier of a spec pair, built once per process."""
    key = (policies_spec, verifier_spec)
    if key not in _LOADED:
        from otel_replay.replay import policies

        policies.registry.clear()  # exactly what the spec registers, not what an earlier spec left
        policies.load_entry_points()
        if policies_spec:
            policies.load_module(policies_spec)
        _LOADED[key] = (policies.registry.copy(), verifiers.build(verifier_spec))
    return _LOADED[key]


def worker_check(policies_spec: str | None, verifier_spec: str) -> list[str]:
    """The policy keys a worker registers (and the verifier builds there, or this raises)."""
    return worker_policies(policies_spec, verifier_spec)[0].keys()


class ActorBudget:
    """The job's budget seen from a worker: every unit is taken from the budget actor."""

    def __init__(self, counter: Any, limit: int | None) -> None:
        self.counter = counter
        self.limit = limit
        self.spent = 0  # units this worker took

    def take(self) -> None:
        import ray

        if not ray.get(self.counter.take.remote()):
            raise BudgetExhausted(f"the budget of {self.limit} policy calls is spent")
        self.spent += 1

    @property
    def exhausted(self) -> bool:
        import ray

        return bool(ray.get(self.counter.exhausted.remote()))


def run_rollouts(job: WorkerJob, trajectory: Trajectory, specs: list[RolloutSpec], counter: Any
                 ) -> tuple[list[Row | None], int]:
    """One chunk on a worker: the rows of `specs`, in order, and the policy calls they spent."""
    registry, verifier = worker_policies(job.policies, job.verifier)
    budget: Any = Budget(None) if counter is None else ActorBudget(counter, job.limit)
    runner = RolloutRunner(job.job_id, registry, verifier, job.threshold, job.seed, 1, budget, job.credit,
                           job.max_steps, policy_timeout_s=job.policy_timeout_s)
    return [runner.rollout(trajectory, spec) for spec in specs], budget.spent  # the driver records them


class BudgetCounter:
    """A Ray actor holding the job's budget; its methods run one at a time, so `take` is atomic."""

    def __init__(self, limit: int | None, spent: int) -> None:
        self.limit = limit
        self.spent = spent

    def take(self) -> bool:
        if self.limit is not None and self.spent >= self.limit:
            return False
        self.spent += 1
        return True

    def exhausted(self) -> bool:
        return self.limit is not None and self.spent >= self.limit

    def total(self) -> int:
        return self.spent


# -- the driver side --------------------------------------------------------------------------------
def require_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise EngineError(f"--engine ray needs the ray package: {RAY_INSTALL}") from exc
    return ray


def connect(address: str | None = None, **init: Any) -> None:
    """Join the Ray cluster at `address` ("auto", "ray://host:10001"), or start a local instance
    (None); nothing to do when this process is already connected."""
    ray = require_ray()
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, include_dashboard=False, **init)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise EngineError(f"cannot connect to Ray at {address!r}: {exc}; start a cluster with `ray start --head`, "
                          "or leave out --address for a local instance") from exc


class RolloutWorker:
    """A Ray actor: one worker process that keeps the job's policies (and the clients they hold)
    between rollouts, and runs the chunks of rollouts it is given one at a time."""

    def __init__(self, policies: str | None, verifier: str) -> None:
        self.policies = policies
        self.verifier = verifier

    def ready(self) -> list[str]:
        return worker_check(self.policies, self.verifier)

    def run(self, job: WorkerJob, trajectory: Trajectory, specs: list[RolloutSpec], counter: Any
            ) -> tuple[list[Row | None], int]:
        return run_rollouts(job, trajectory, specs, counter)


class RayExecutor:
    """Rollouts on `workers` Ray actors (each reserving `worker_cpus` CPUs), one chunk of
    rollouts at a time per worker.

    Policies and the verifier are rebuilt in the workers from their specs; give the driver's
    `registry` to check at once that the workers register every policy it has.
    """

    def __init__(self, policies: str | None, verifier: str, *, workers: int = 4, worker_cpus: float = 0.25,
                 rollouts_per_task: int | None = None, registry: Registry | None = None) -> None:
        self.ray = ray = require_ray()
        if not ray.is_initialized():
            connect()
        self.policies = policies
        self.verifier = verifier
        self.workers = max(1, workers)
        self.rollouts_per_task = rollouts_per_task
        cpus = ray.cluster_resources().get("CPU", 0)
        if self.workers * worker_cpus > cpus:
            raise EngineError(f"{self.workers} Ray workers x {worker_cpus:g} CPUs each need {self.workers * worker_cpus:g} "
                              f"CPUs; the cluster has {cpus:g}: lower --concurrency or --worker-cpus")
        actor = ray.remote(RolloutWorker).options(num_cpus=worker_cpus, max_restarts=2, max_task_retries=2)
        self._actors = [actor.remote(policies, verifier) for _ in range(self.workers)]
        self._counter: Any = None
        self._budget: Budget | None = None
        try:
            keys = ray.get([a.ready.remote() for a in self._actors])[0]
        except ray.exceptions.RayTaskError as exc:
            self.close()
            raise EngineError(f"a Ray worker cannot load the policies or the verifier: {_cause(exc)}") from exc
        missing = sorted(set(registry.keys()) - set(keys)) if registry is not None else []
        if missing:
            self.close()
            raise EngineError(
                f"Ray workers rebuild policies from --policies {policies or '(none)'} and the entry points, "
                f"which do not register {', '.join(missing)}; register every policy in that module")

    def close(self) -> None:
        """Stop the workers (they also stop when this process ends)."""
        for actor in self._actors:
            self.ray.kill(actor)
        self._actors = []

    def _counter_for(self, budget: Budget) -> Any:
        """The budget actor (None without a cap), started from the driver's count for a new budget."""
        if budget.limit is None:
            return None
        if self._budget is not budget:
            self._counter = self.ray.remote(BudgetCounter).options(num_cpus=0).remote(budget.limit, budget.spent)
            self._budget = budget
        return self._counter

    def map(self, runner: RolloutRunner, trajectory: Trajectory, specs: Sequence[RolloutSpec]) -> list[Row | None]:
        ray = self.ray
        specs = list(specs)
        counter = self._counter_for(runner.budget)
        job = WorkerJob(runner.job_id, self.policies, self.verifier, runner.threshold, runner.seed, runner.credit,
                        runner.max_steps, runner.policy_timeout_s, runner.budget.limit)
        size = self.rollouts_per_task or max(1, min(MAX_ROLLOUTS_PER_TASK, len(specs) // (4 * self.workers)))
        chunks = [(start, specs[start:start + size]) for start in range(0, len(specs), size)]
        chunks.reverse()  # popped from the end: submitted in spec order
        shared = ray.put(trajectory)
        rows: list[Row | None] = [None] * len(specs)
        idle = list(self._actors)
        running: dict[Any, tuple[int, Any]] = {}
        try:
            while chunks or running:
                while chunks and idle:
                    start, chunk = chunks.pop()
                    worker = idle.pop()
                    running[worker.run.remote(job, shared, chunk, counter)] = (start, worker)
                ready, _ = ray.wait(list(running), num_returns=1)
                start, worker = running.pop(ready[0])
                idle.append(worker)
                try:
                    got, spent = ray.get(ready[0])
                except ray.exceptions.RayTaskError as exc:
                    raise _cause(exc) from exc
                if counter is None:
                    runner.budget.spent += spent
                for offset, row in enumerate(got):
                    rows[start + offset] = None if row is None else runner.record(row)  # redacted, remembered
        finally:
            for pending in running:
                with contextlib.suppress(Exception):  # a running chunk finishes on its worker; its rows are dropped
                    ray.cancel(pending)
            if counter is not None:  # the actor's count is the truth (a retried chunk spends again)
                runner.budget.spent = ray.get(counter.total.remote())
        return rows


def _cause(exc: Any) -> BaseException:
    """The exception a Ray task raised, as its own type (a VerifierError stays a VerifierError)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def make_executor(engine: str, address: str | None, policies: str | None, verifier: str, registry: Registry,
                  workers: int, worker_cpus: float = 0.25) -> Executor | None:
    """The executor for `--engine` (None: the default thread pool)."""
    if engine == "local":
        if address:
            raise EngineError("--address is for --engine ray")
        return None
    if engine != "ray":
        raise EngineError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    connect(address)
    return RayExecutor(policies, verifier, workers=workers, worker_cpus=worker_cpus, registry=registry)
