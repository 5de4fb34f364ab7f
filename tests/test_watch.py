"""`otel-replay watch`: continuous blame on stores of planted-culprit runs (the real openai SDK and
instrumentation against the simulated model), in process and as real subprocesses (kill -9,
SIGTERM, two watchers racing), and the sliding-hour ledger under generated arrival patterns."""

from __future__ import annotations

import heapq
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from otel_replay import Store
from otel_replay.api import make_watcher
from otel_replay.attribution.ledger import HOUR_NS, Ledger
from otel_replay.attribution.outcomes import output_hash
from otel_replay.cli import main as cli
from otel_replay.testing.planted import TOPOLOGIES, record_planted
from tests.helpers import REPO, needs_openai_v2

POLICIES_SPEC = "otel_replay.testing.planted_policies:single-late"
WATCH = ["watch", "--once", "--settle", "0", "--expect-contains", "OK", "--json"]
SLOW_POLICIES = """
import os, time
from otel_replay.replay import policies
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.planted import TOPOLOGIES, planted_registry, replay_model

topology = TOPOLOGIES["single-late"]
server = SimulatedModelServer(replay_model(topology)).start()
planted_registry(topology, server.base_url, policies.registry)
model = policies.registry.resolve("llm", None)
delay = float(os.environ.get("SLOW_POLICY_S", "0"))
if delay:  # write rollouts as they come, so a kill lands mid-job with rollouts stored
    import otel_replay.attribution.job
    otel_replay.attribution.job.FLUSH_INTERVAL_S = 0.2

@policies.llm
def slow(step, inputs, rng):
    time.sleep(delay)
    return model(step, inputs, rng)
"""


@pytest.fixture(autouse=True)
def _clean_registry():
    yield
    from otel_replay.replay import policies

    policies.registry.clear()


def record(root, *names: str, seeds: int = 1) -> list[str]:
    """Failing single-late runs, one agent (root name) per name: one failure group per name."""
    return [record_planted(root, replace(TOPOLOGIES["single-late"], name=name), model_seed=seed)
            for name in names for seed in range(seeds)]


def events(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def of(kind: str, output: str) -> list[dict]:
    return [e for e in events(output) if e["event"] == kind]


def handled(root) -> dict[str, tuple[int, int]]:
    """Each failing trace -> (report rows written for it, links of it to another trace's result)."""
    rows = Store(root).sql("""
        select o.trace_id,
               (select count(*) from report_rows r where r.trace_id = o.trace_id) as reports,
               (select count(*) from group_links l where l.trace_id = o.trace_id and l.role = 'member') as links
        from outcomes o where not o.passed order by o.trace_id""").to_pylist()
    return {r["trace_id"]: (r["reports"], r["links"]) for r in rows}


def counts(root) -> dict[str, int]:
    tables = ("job_rows", "rollout_rows", "result_rows", "report_rows", "outcome_rows", "group_links", "budget_rows",
              "skip_rows")
    return {t: Store(root).sql(f"select count(*) n from {t}").column("n")[0].as_py() for t in tables}  # noqa: S608


def results(root) -> list[dict]:
    return Store(root).sql("select * exclude (day) from results order by job_id, trace_id, method, step_index"
                           ).to_pylist()


def cli_watch(root, *args: str) -> str:
    out = CliRunner().invoke(cli, ["--store", str(root), *WATCH, "--policies", POLICIES_SPEC, *args])
    assert out.exit_code == 0, out.output
    return out.output


@needs_openai_v2
def test_watch_once_attributes_one_trace_per_group_links_the_rest_and_a_second_run_does_nothing(tmp_path):
    root = tmp_path / "store"
    grouped = record(root, "shop", seeds=3)  # three identical failures: one group
    alone = record(root, "bank", "mail")
    passing = record_planted(root, TOPOLOGIES["control"])  # answers OK: the verifier passes it

    first = cli_watch(root, "--max-policy-calls", "40")
    assert [e["traces"] for e in of("scored", first)] == [6] and of("scored", first)[0]["failed"] == 5
    attributed = {e["trace_id"]: e for e in of("attributed", first)}
    assert len(attributed) == 3 and set(alone) < set(attributed)
    (representative,) = set(attributed) & set(grouped)
    assert {e["trace_id"] for e in of("linked", first)} == set(grouped) - {representative}
    assert all(e["representative"] == representative and e["job_id"] == attributed[representative]["job_id"]
               for e in of("linked", first))
    assert handled(root) == {t: (1, 0) if t in attributed else (0, 1) for t in [*grouped, *alone]}
    assert passing not in handled(root)
    job_ids = {e["job_id"] for e in attributed.values()}
    assert all(j.startswith("w") for j in job_ids)

    before = counts(root)
    second = cli_watch(root, "--max-policy-calls", "40")
    assert counts(root) == before  # nothing scored, started, linked or granted again
    assert not of("scored", second) and not of("attributed", second) and not of("linked", second)
    status = of("status", second)
    assert len(status) == 1 and status[0]["attributed"] == status[0]["linked"] == 0


@needs_openai_v2
def test_the_outcome_a_watcher_scores_is_the_one_the_job_scores(tmp_path):
    root = tmp_path / "store"
    record(root, "shop")
    cli_watch(root, "--max-policy-calls", "20")
    rows = Store(root).sql("select source, score, passed, signature from outcome_rows order by source").to_pylist()
    assert [r["source"] for r in rows] == ["attribute", "watch"]
    assert rows[0]["score"] == rows[1]["score"] == 0.0 and rows[0]["signature"] == rows[1]["signature"]
    assert json.loads(rows[0]["signature"]) == ["invoke_agent shop", "chat sim-gpt", output_hash(" fail\n")]
    assert output_hash("Order 1042 refused") == output_hash("order  77 REFUSED") != output_hash("order 77 refunded")


def start(root, modules, *args: str, delay: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(modules), str(REPO)]), "SLOW_POLICY_S": str(delay)}
    return subprocess.Popen([sys.executable, "-c", "from otel_replay.cli import main; main()", "--store", str(root),
                             *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out


def watch_rollouts(root) -> int:
    return Store(root).sql("select count(*) n from rollout_rows where starts_with(job_id, 'w')").column("n")[0].as_py()


def wait_for_rollouts(proc: subprocess.Popen, root, at_least: int = 10) -> None:
    deadline = time.monotonic() + 120
    while watch_rollouts(root) < at_least:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.2)


@pytest.fixture
def modules(tmp_path):
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "slow_watch_policies.py").write_text(SLOW_POLICIES)
    return folder


SUBPROCESS_WATCH = ["watch", "--settle", "0", "--expect-contains", "OK", "--policies", "slow_watch_policies",
                    "--json", "--seed", "5"]


@needs_openai_v2
def test_a_watcher_killed_mid_job_resumes_on_restart_to_the_uninterrupted_results(tmp_path, modules):
    root, reference = tmp_path / "store", tmp_path / "reference"
    record(root, "shop")
    shutil.copytree(root, reference)
    finish(start(reference, modules, *SUBPROCESS_WATCH, "--once"))

    first = start(root, modules, *SUBPROCESS_WATCH, "--once", delay=0.03)
    try:
        wait_for_rollouts(first, root)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        first.kill()
    store = Store(root)
    assert store.sql("select count(*) n from report_rows").column("n")[0].as_py() == 0  # killed mid-job
    assert store.sql("select status from jobs").column("status").to_pylist() == ["running"]

    again = finish(start(root, modules, *SUBPROCESS_WATCH, "--once"))
    (resumed,) = of("attributing", again)
    assert resumed["resumed"]
    assert results(root) == results(reference) and results(root)  # same job id, same rows
    assert store.sql("select count(*) n from report_rows").column("n")[0].as_py() == 1
    assert store.sql("select status from jobs").column("status").to_pylist() == ["done"]
    # the dead run's grant was closed before the job was granted again: no grant stays open
    open_grants = store.sql("""select count(*) n from (select grant_id, bool_or(ended_ns is not null) ended
                                from budget_rows group by grant_id) where not ended""")
    assert open_grants.column("n")[0].as_py() == 0


@needs_openai_v2
def test_sigterm_stops_the_watcher_cleanly_and_the_job_resumes(tmp_path, modules):
    root = tmp_path / "store"
    traces = record(root, "shop", "bank")
    proc = start(root, modules, *SUBPROCESS_WATCH, "--interval", "60", delay=0.03)
    try:
        wait_for_rollouts(proc, root)
        proc.send_signal(signal.SIGTERM)
        out = finish(proc, timeout=60)
    finally:
        proc.kill()
    (stopped,) = of("stopped", out)
    assert stopped["reason"] == "SIGTERM"
    (interrupted,) = of("interrupted", out)
    state = Store(root).sql("select status, message from jobs where job_id = ?", [interrupted["job_id"]]).to_pylist()
    assert state[0]["status"] == "interrupted" and "KeyboardInterrupt" not in state[0]["message"]
    assert f"--resume {interrupted['job_id']}" in state[0]["message"]
    assert watch_rollouts(root) > 0 and interrupted["trace_id"] not in {t for t, h in handled(root).items() if any(h)}

    again = finish(start(root, modules, *SUBPROCESS_WATCH, "--once"))
    assert {e["trace_id"]: e["resumed"] for e in of("attributing", again)}[interrupted["trace_id"]]
    assert handled(root) == dict.fromkeys(traces, (1, 0))


def race(tmp_path, modules, n: int) -> None:
    root = tmp_path / "store"
    traces = record(root, *(f"agent-{i}" for i in range(n)))
    procs = [start(root, modules, *SUBPROCESS_WATCH, "--once", "--max-policy-calls", "30") for _ in range(2)]
    try:
        outs = [finish(p) for p in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert handled(root) == dict.fromkeys(traces, (1, 0))  # one report each, no link (every trace its own group)
    by_watcher = [{e["trace_id"] for e in of("attributed", out)} for out in outs]
    assert not by_watcher[0] & by_watcher[1] and by_watcher[0] | by_watcher[1] == set(traces)
    jobs = Store(root).sql("select job_id, status from jobs").to_pylist()
    assert len(jobs) == n and {j["status"] for j in jobs} <= {"done", "partial"}
    per_job = Store(root).sql("select count(distinct trace_id) n from rollouts group by job_id").column("n")
    assert set(per_job.to_pylist()) == {1}


@needs_openai_v2
def test_two_watchers_racing_attribute_each_trace_exactly_once(tmp_path, modules):
    race(tmp_path, modules, 6)


@pytest.mark.slow
def test_two_watchers_racing_on_fifty_failing_traces_attribute_each_exactly_once(tmp_path, modules):
    race(tmp_path, modules, 50)


@pytest.mark.slow  # ~25 s of whole watch runs; the ledger's hourly cap is a property test below (default suite)
@needs_openai_v2
def test_an_hourly_budget_pauses_a_job_and_the_resumed_job_ends_as_an_unconstrained_one(tmp_path):
    root, reference = tmp_path / "store", tmp_path / "reference"
    traces = record(root, "shop", "bank")
    shutil.copytree(root, reference)
    make_watcher(policies=POLICIES_SPEC, verifier="contains:OK", store=reference, settle_s=0, seed=2).run(once=True)

    now = [time.time_ns()]
    seen: list[dict] = []
    watcher = make_watcher(policies=POLICIES_SPEC, verifier="contains:OK", store=root, settle_s=0, seed=2,
                           max_policy_calls_per_hour=100, on_event=seen.append, clock=lambda: now[0])
    hours = 0
    while len(handled(root)) < 2 or any(h == (0, 0) for h in handled(root).values()):
        watcher.run(once=True)
        assert watcher.ledger.state().counted <= 100
        deferred = {t for e in seen if e["event"] == "skipped" and "per hour is spent" in e["reason"]
                    for t in e["trace_ids"]}
        waiting = {t for t in deferred if sum(handled(root).get(t, (0, 0))) == 0}
        listed = {row[1] for row in Store(root).named("list_skipped", ["watch", "watch", 100])}
        assert listed == waiting  # `otel-replay jobs --skipped` lists what the budget keeps waiting, until done
        now[0] += HOUR_NS + 1
        hours += 1
        assert hours < 20
    assert hours > 2 and any(e["event"] == "paused" for e in seen)
    assert any(e["event"] == "skipped" and "per hour is spent" in e["reason"] for e in seen)
    assert Store(root).sql("select count(*) n from skip_rows where job_id = 'watch'").column("n")[0].as_py() >= 1
    assert results(root) == results(reference) and handled(root) == dict.fromkeys(traces, (1, 0))
    spent = Store(root).sql("select granted_ns, spent from budget_rows where spent is not null").to_pylist()
    for hour in {r["granted_ns"] // HOUR_NS for r in spent}:  # grants of one clock hour, ended within it
        assert sum(r["spent"] for r in spent if r["granted_ns"] // HOUR_NS == hour) <= 100


# -- the ledger, as a unit ------------------------------------------------------------------------
S = 10**9
arrival = st.tuples(st.integers(0, 2400), st.one_of(st.none(), st.integers(1, 60)), st.integers(0, 90),
                    st.integers(1, 3000), st.booleans())


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cap=st.integers(10, 120), arrivals=st.lists(arrival, min_size=1, max_size=6))
@example(cap=50, arrivals=[(0, None, 50, 3000, False), (3700, None, 50, 10, False)])  # calls at 3000 s and 3700 s
@example(cap=30, arrivals=[(0, 30, 30, 600, True), (100, 20, 20, 10, False), (4000, None, 30, 10, False)])
def test_the_ledger_never_lets_any_hour_hold_more_calls_than_its_cap(cap, arrivals):
    """Jobs arrive, are granted calls, make them spread over their run and settle, or die without
    settling (the first arrival after the death takes the dead job over: its id is granted again);
    no sliding hour ever holds more than `cap` calls, and no job makes more calls than granted."""
    with tempfile.TemporaryDirectory() as folder:
        now = [10**18]
        ledger = Ledger(Store(folder), "test", cap, clock=lambda: now[0])
        Store(folder).root.ensure()
        calls: list[int] = []
        queue: list[tuple[int, int, int, str, object]] = []  # (time, settles first, order, kind, what)
        t, dead = now[0], []
        for i, (gap, want, need, duration, dies) in enumerate(arrivals):
            t += gap * S
            heapq.heappush(queue, (t, 1, i, "arrive", (i, want, need, duration, dies)))
        while queue:
            now[0], _, order, kind, item = heapq.heappop(queue)
            if kind == "settle":
                grant, made = item
                ledger.settle(grant, made)
                continue
            i, want, need, duration, dies = item
            taken = next((d for d in dead if d[1] <= now[0]), None)
            if taken is not None:
                dead.remove(taken)
            job_id = taken[0] if taken else f"j{i}"
            grant = ledger.grant(job_id, want)
            if grant is None:
                continue
            assert want is None or grant.calls <= want
            made = min(need, grant.calls)
            calls += [now[0] + (k + 1) * duration * S // (made + 1) for k in range(made)]
            if dies:  # never settled; its process is gone once its calls are made
                dead.append((job_id, now[0] + duration * S))
            else:
                heapq.heappush(queue, (now[0] + duration * S, 0, len(arrivals) + order, "settle", (grant, made)))
        calls.sort()
        for k, start in enumerate(calls):
            in_hour = sum(1 for c in calls[k:] if c < start + HOUR_NS)
            assert in_hour <= cap, (start, in_hour)


def test_the_ledger_frees_calls_an_hour_after_the_job_that_spent_them_ended(tmp_path):
    now = [10**18]
    Store(tmp_path).root.ensure()
    ledger = Ledger(Store(tmp_path), "test", 10, clock=lambda: now[0])
    first = ledger.grant("j1", None)
    assert first.calls == 10 and ledger.grant("j2", 5) is None
    now[0] += 600 * S
    ledger.settle(first, 4)
    assert ledger.state().counted == 4
    second = ledger.grant("j2", 9)
    assert second.calls == 6 and ledger.state().left == 0
    ledger.settle(second, 6)
    assert ledger.state().frees_at_ns == now[0] + HOUR_NS
    now[0] += HOUR_NS - 1
    assert ledger.grant("j3", None) is None  # both ended less than an hour ago
    now[0] += 1
    assert ledger.state().counted == 0 and ledger.grant("j3", None).calls == 10
