"""Text that policies produce during attribution is redacted before it is stored, as captured payloads
are: rollout final outputs, the culprit step's output in each rollout (`detail`, where repair
candidates come from), error messages, and the repair in the report. The policy here answers like
the planted agent but leaks an API key and an email address in every message it writes; the
rollout and report tables are then read back from the Parquet files on disk through DuckDB."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from otel_replay import Store
from otel_replay.attribution import AttributionError, Job, JobParams
from otel_replay.cli import main as cli
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.planted import TOPOLOGIES, planted_registry, record_planted, replay_model
from tests.helpers import needs_openai_v2

pytestmark = needs_openai_v2  # every test here records or runs the demo's agent (openai-v2)

API_KEY = "sk-proj-T3BlbkFJabcdefghijklmnop0123"
EMAIL = "jane.doe+billing@example.com"
TICKET = "TICKET-042424"
LEAK = f" (ask {EMAIL}, key {API_KEY}, {TICKET})"
TOPOLOGY = TOPOLOGIES["single-late"]


@pytest.fixture(scope="module")
def store_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("store")
    record_planted(root, TOPOLOGY)
    return root


def leaky_registry(base_url: str, registry=None):
    """The planted policies, but the model's every message also carries a secret."""
    registry = planted_registry(TOPOLOGY, base_url, registry)
    model = registry.resolve("llm", None)

    def leaky(step, inputs, rng):
        out = model(step, inputs, rng)
        return [{**m, "parts": [*m["parts"], {"type": "text", "content": LEAK}]} for m in out]

    registry.register("llm", None, leaky)
    return registry


def run_job(root: Path, **params) -> Job:
    with SimulatedModelServer(replay_model(TOPOLOGY)) as server:
        trace_id = Store(root).sql("select trace_id from traces").column("trace_id")[0].as_py()
        job = Job(Store(root), JobParams([trace_id], "contains:OK", concurrency=8, repair=True, **params),
                  leaky_registry(server.base_url))
        job.run()
    return job


def rows_of(root: Path, table: str, job_id: str) -> list[dict]:
    """The job's rows of one table, decoded from the Parquet files on disk by DuckDB."""
    con = duckdb.connect()
    try:
        rows = con.sql("select * from read_parquet($glob) where job_id = $job",
                       params={"glob": str(root / table / "**" / "*.parquet"), "job": job_id}).to_arrow_table().to_pylist()
    finally:
        con.close()
    assert rows, f"no {table} of job {job_id}"
    return rows


def stored(root: Path, table: str, job_id: str) -> str:
    """Every value of the job's rows of one table, as one string to search."""
    return json.dumps(rows_of(root, table, job_id), default=str, ensure_ascii=False)


def test_policy_output_is_redacted_before_rollouts_and_repairs_are_stored(store_root):
    job = run_job(store_root)
    rollouts, reports = stored(store_root, "rollout_rows", job.job_id), stored(store_root, "report_rows", job.job_id)
    for text in (rollouts, reports):
        assert API_KEY not in text and EMAIL not in text
    assert "[REDACTED:openai_key]" in rollouts and "[REDACTED:email]" in rollouts
    rows = rows_of(store_root, "rollout_rows", job.job_id)
    re_decided = [r["final_output"] for r in rows if r["role"] != "factual"]  # the factual run is the recording's
    assert re_decided and all("[REDACTED:openai_key]" in final for final in re_decided)
    assert any(r["detail"] and "[REDACTED:email]" in r["detail"] for r in rows if r["role"] == "repair")
    report = json.loads(rows_of(store_root, "report_rows", job.job_id)[0]["report"])
    assert report["verdict"] == "culprit-found" and report["repair"] is not None
    assert "[REDACTED:openai_key]" in json.dumps(report["repair"]["output"])  # the repair candidate, as stored
    assert TICKET in rollouts  # not a built-in detector's: only a rule of the user's redacts it (below)


def test_redaction_off_stores_policy_output_as_produced(store_root):
    job = run_job(store_root, redact=False)
    assert API_KEY in stored(store_root, "rollout_rows", job.job_id)


def test_user_rules_apply_and_a_bad_rules_file_is_refused(store_root, tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"patterns": {"ticket": "TICKET-[0-9]{6}"}}))
    job = run_job(store_root, redact_rules=str(rules))
    text = stored(store_root, "rollout_rows", job.job_id)
    assert TICKET not in text and "[REDACTED:ticket]" in text and API_KEY not in text  # built-ins stay on
    (tmp_path / "bad.json").write_text('{"patterns": {"x": "("}}')
    with pytest.raises(AttributionError, match="bad.json"):
        Job(Store(store_root), JobParams(["0" * 32], "contains:OK", redact_rules=str(tmp_path / "bad.json")), None)


def test_the_attribute_command_takes_the_redaction_options(store_root, tmp_path, monkeypatch):
    (tmp_path / "leaky_policies.py").write_text(
        "from otel_replay.replay import policies\n"
        "from otel_replay.testing import SimulatedModelServer\n"
        "from otel_replay.testing.planted import TOPOLOGIES, replay_model\n"
        "from tests.test_attribution_redaction import leaky_registry\n"
        "server = SimulatedModelServer(replay_model(TOPOLOGIES['single-late'])).start()\n"
        "leaky_registry(server.base_url, policies.registry)\n")
    rules = tmp_path / "rules.yaml"
    rules.write_text("patterns:\n  ticket: 'TICKET-[0-9]{6}'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    base = ["--store", str(store_root), "attribute", "--where", "true", "--policies", "leaky_policies",
            "--expect-contains", "OK", "--rollouts", "6"]
    try:
        out = CliRunner().invoke(cli, [*base, "--redact-rules", str(rules)])
        assert out.exit_code in (0, 4), out.output  # 6 rollouts a plan may leave a step undecided (exit 4)
        job_id = out.output.split("job ")[-1].split()[0]
        text = stored(store_root, "rollout_rows", job_id)
        assert "[REDACTED:ticket]" in text and TICKET not in text and API_KEY not in text
        params = rows_of(store_root, "job_rows", job_id)[0]["params"]
        assert json.loads(params)["redact_rules"] == str(rules.resolve())  # a resume redacts the same way
        both = CliRunner().invoke(cli, [*base, "--redact-rules", str(rules), "--no-redact"])
        assert both.exit_code == 2 and "not both" in both.output
        again = CliRunner().invoke(cli, ["--store", str(store_root), "attribute", "--resume", job_id, "--no-redact"])
        assert again.exit_code == 2 and "redacts as the job did" in again.output
        rules.unlink()
        gone = CliRunner().invoke(cli, ["--store", str(store_root), "attribute", "--resume", job_id])
        assert gone.exit_code == 1 and f"cannot read redaction rules {rules.resolve()}" in gone.output, gone.output
    finally:
        from otel_replay.replay import policies

        policies.registry.clear()
