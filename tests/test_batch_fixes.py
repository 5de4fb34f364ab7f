"""Fixes to batch attribution: a passing trace in `attribute --where` is skipped and listed; `aggregate`
counts a trace once across jobs; the FIX line says when no repair was searched; Ctrl-C leaves an
`interrupted` (resumable) job and exit status 130; an OTLP export failure names the URL and the job."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from otel_replay import Store
from otel_replay.attribution import Job, JobParams
from otel_replay.cli import main as cli
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.planted import TOPOLOGIES, planted_registry, record_planted, replay_model
from tests.helpers import REPO, needs_openai_v2

pytestmark = needs_openai_v2  # every test here records or runs the demo's agent (openai-v2)

PLANTED = "otel_replay.testing.planted_policies:single-late"
SLOW_POLICIES = """
import time
from otel_replay.replay import policies
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.planted import TOPOLOGIES, planted_registry, replay_model
import otel_replay.attribution.job

otel_replay.attribution.job.FLUSH_INTERVAL_S = 0.2
topology = TOPOLOGIES["single-late"]
server = SimulatedModelServer(replay_model(topology)).start()
planted_registry(topology, server.base_url, policies.registry)
model = policies.registry.resolve("llm", None)

@policies.llm
def slow(step, inputs, rng):
    time.sleep(0.03)
    return model(step, inputs, rng)
"""


@pytest.fixture(autouse=True)
def _clean_registry():
    yield
    from otel_replay.replay import policies

    policies.registry.clear()


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A store with one failing and one passing planted run."""
    root = tmp_path_factory.mktemp("store")
    return root, record_planted(root, TOPOLOGIES["single-late"]), record_planted(root, TOPOLOGIES["control"])


def invoke(root, *args: str):
    return CliRunner().invoke(cli, ["--store", str(root), *args])


def job_on(root, trace_id: str, **params):
    topology = TOPOLOGIES["single-late"]
    with SimulatedModelServer(replay_model(topology)) as server:
        job = Job(Store(root), JobParams([trace_id], "contains:OK", **params), planted_registry(topology, server.base_url))
        (result,) = job.run()
    return job, result


def test_attribute_where_skips_and_lists_a_passing_trace_instead_of_failing_the_job(planted):
    root, failing, passing = planted
    out = invoke(root, "attribute", "--where", "true", "--policies", PLANTED, "--expect-contains", "OK",
                 "--rollouts", "4")
    assert out.exit_code in (0, 4), out.output  # the failing trace's verdict decides; the passing one is no error
    assert f"skipped {passing}: passed the verifier (score 1.00, threshold 0.5)" in out.output
    assert f"attribution of {failing}" in out.output
    job_id = out.output.split("otel-replay jobs --skipped --job ")[1].split()[0]
    skipped = [json.loads(line) for line in invoke(root, "jobs", "--skipped", "--job", job_id, "--json").output.splitlines()]
    assert [(s["trace_id"], s["reason"][:19]) for s in skipped] == [(passing, "passed the verifier")]
    (state,) = [json.loads(line) for line in invoke(root, "jobs", "--json").output.splitlines()
                if json.loads(line)["job_id"] == job_id]
    assert state["status"] in ("done", "partial") and state["skipped"] == 1 and "1 skipped" in state["message"]
    unknown = invoke(root, "jobs", "--skipped", "--job", "jnosuch")
    assert unknown.exit_code == 1 and "no job 'jnosuch' in the store" in unknown.output  # not an empty table


def test_aggregate_counts_a_trace_once_when_two_jobs_attributed_it(planted):
    root, failing, _ = planted
    first, _ = job_on(root, failing)
    second, result = job_on(root, failing)
    assert result.verdict == "culprit-found"
    rows = [json.loads(line) for line in invoke(root, "aggregate", "--json").output.splitlines()]
    culprit = next(r for r in rows if r["culprit_in"])
    assert (culprit["traces"], culprit["culprit_in"], culprit["culprit_pct"]) == (1, 1, 100.0)
    assert all(r["culprit_pct"] <= 100.0 for r in rows)
    only_first = [json.loads(line) for line in invoke(root, "aggregate", "--job", first.job_id, "--json").output.splitlines()]
    assert next(r for r in only_first if r["culprit_in"])["culprit_pct"] == 100.0


def test_without_repair_the_fix_line_says_no_repair_was_searched(planted):
    root, failing, _ = planted
    _, result = job_on(root, failing, seed=1)
    assert result.culprit is not None and result.repair is None
    assert result.explanation["fix"].startswith("No repair was searched (add --repair to search one).")
    stored = json.loads(Store(root).sql("select report from reports where job_id = ?", [result.job_id])
                        .column("report")[0].as_py())
    assert stored["explanation"]["fix"] == result.explanation["fix"]


def test_an_interrupted_job_is_interrupted_not_failed(planted):
    root, failing, _ = planted
    topology = TOPOLOGIES["single-late"]
    with SimulatedModelServer(replay_model(topology)) as server:
        job = Job(Store(root), JobParams([failing], "contains:OK", seed=4), planted_registry(topology, server.base_url))

        def interrupt(progress):
            if progress.rollouts >= 20:
                raise KeyboardInterrupt

        job.on_progress = interrupt
        with pytest.raises(KeyboardInterrupt):
            job.run()
    (state,) = Store(root).sql("select status, message from jobs where job_id = ?", [job.job_id]).to_pylist()
    assert state["status"] == "interrupted" and "KeyboardInterrupt" not in state["message"]
    assert f"otel-replay attribute --resume {job.job_id}" in state["message"]


def test_ctrl_c_stops_attribute_with_status_130_and_the_resume_command(planted, tmp_path):
    root, failing, _ = planted
    (tmp_path / "slow_fix_policies.py").write_text(SLOW_POLICIES)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    proc = subprocess.Popen([sys.executable, "-c", "from otel_replay.cli import main; main()", "--store", str(root),
                             "attribute", "--trace-id", failing, "--policies", "slow_fix_policies",
                             "--expect-contains", "OK", "--seed", "8"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job_id = proc.stderr.readline().split()[1]
        deadline = time.monotonic() + 120
        while Store(root).sql("select count(*) n from rollout_rows where job_id = ?", [job_id]).column("n")[0].as_py() < 5:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert f"otel-replay attribute --resume {job_id}" in err and "Traceback" not in err
    (state,) = Store(root).sql("select status, message from jobs where job_id = ?", [job_id]).to_pylist()
    assert state["status"] == "interrupted" and "KeyboardInterrupt" not in state["message"]
    assert Store(root).sql("select count(*) n from reports where job_id = ?", [job_id]).column("n")[0].as_py() == 0


class _Refuses(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - the http.server hook
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(400)
        self.end_headers()

    def log_message(self, *args):
        return None  # quiet: the test reads the exporter's error, not the server's log


def test_an_otlp_export_failure_names_the_endpoint_url_and_the_job(planted):
    root, failing, _ = planted
    job, _ = job_on(root, failing, rollouts=2)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        out = invoke(root, "export", "--job", job.job_id, "--to", "otlp", "--otlp-endpoint", endpoint)
    finally:
        server.shutdown()
    assert out.exit_code == 1
    assert f"to {endpoint}/v1/traces (OTLP http/protobuf)" in out.output
    assert f"otel-replay export --job {job.job_id} --to otlp" in out.output and "--job J " not in out.output
