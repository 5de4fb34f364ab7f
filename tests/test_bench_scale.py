"""The scale benchmark: its synthetic store reads back through the store's own views and
trajectory loader, and its quick mode (through the CLI) reports what it promises: the same rows
on every engine, rates, store costs by size and the 100-node arithmetic; never a timing threshold."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from benchmarks.scale_store import (
    DAY,
    SPANS_PER_TRACE,
    build_store,
    chunk_tables,
    query_times,
    shared_messages,
    word_pool,
)
from otel_replay.cli import main as cli
from otel_replay.trajectory import Store


@pytest.fixture(scope="module")
def pool():
    return word_pool()


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_synthetic_traces_read_back_as_agent_runs(tmp_path, pool):
    built = build_store(tmp_path, 2_000, pool)
    assert built["spans"] == 2_000 and built["traces"] == 200 and built["segments"] >= 4
    assert all(_positive(built[k]) for k in ("write_s", "compact_s", "bytes_per_span"))
    store = Store(tmp_path)
    files = sorted(p.parent.name for p in tmp_path.glob("span_rows/*/*.parquet"))
    assert files == [f"day={DAY}"]  # compacted: one segment for the day
    counts = store.sql("SELECT (SELECT count(*) FROM spans) spans, (SELECT count(*) FROM steps) steps, "
                       "(SELECT count(*) FROM traces) traces").to_pylist()[0]
    assert counts == {"spans": 2_000, "steps": 2_000, "traces": 200}
    trace_id = store.sql("SELECT trace_id FROM traces ORDER BY trace_id LIMIT 1").column(0)[0].as_py()
    traj = store.trajectory(trace_id)
    assert [s.kind for s in traj.steps] == ["llm", "tool"] * 4 + ["llm"]
    chats = [s for s in traj.steps if s.kind == "llm"]
    assert [len(s.inputs) for s in chats] == [1, 3, 5, 7, 9]  # the history grows turn by turn
    assert all(s.tool_name and s.status in ("unset", "error") for s in traj.steps if s.kind == "tool")
    assert traj.final_output and traj.agents[0].kind == "agent"
    assert traj.edges and not [e for e in traj.edges if e.source >= e.target]  # dataflow runs forward
    bodies = store.sql("SELECT body FROM messages").column("body").to_pylist()
    assert len(bodies) == 200 * 10 + 40 and all(json.loads(b) for b in bodies)
    times = query_times(tmp_path)
    assert all(_positive(times[k]) for k in ("trajectory_s", "trace_spans_s", "trace_sql_s", "aggregate_s"))


def test_a_chunk_has_the_schema_of_every_table_and_no_missing_payloads(pool):
    spans, steps, messages = chunk_tables(50, pool, np.random.default_rng(1), shared_messages()[1])
    assert spans.num_rows == steps.num_rows == 50 * SPANS_PER_TRACE and messages.num_rows == 500
    addressed = {h for col in ("input_hashes", "output_hashes") for hs in steps.column(col).to_pylist() for h in hs}
    assert addressed == set(messages.column("hash").to_pylist())  # every message is read or written by a step
    assert spans.column("span_id").to_pylist() == steps.column("span_id").to_pylist()
    assert len(set(spans.column("span_id").to_pylist())) == 500


def test_bad_sizes_are_rejected_with_the_expected_form():
    out = CliRunner().invoke(cli, ["bench", "scale", "--sizes", "lots"])
    assert out.exit_code == 2 and "give sizes like 1e5,1e6" in out.output
    out = CliRunner().invoke(cli, ["bench", "scale", "--sizes", "5"])
    assert out.exit_code == 2 and "at least 10 spans" in out.output


@pytest.mark.slow
def test_quick_scale_bench_through_the_cli(tmp_path):
    path = tmp_path / "scale.json"
    out = CliRunner().invoke(cli, ["bench", "scale", "--quick", "--sizes", "1e4,1e5", "--json", str(path)])
    assert out.exit_code == 0, out.output
    result = json.loads(path.read_text())
    t = result["throughput"]
    local = [p for p in t["points"] if p["engine"] == "local"]
    ray = [p for p in t["points"] if p["engine"] == "ray"]
    assert [p["concurrency"] for p in local] == [1, 8, 64] and [p["concurrency"] for p in ray] == [1, 4]
    assert all(p["same_rows"] for p in t["points"]) and t["local_instant"]["same_rows"] and t["ray"]["instant"]["same_rows"]
    assert all(_positive(p["rate"]) and p["policy_calls"] == 5 * p["rollouts"] for p in t["points"])
    assert t["verdict"]["culprit"] == t["verdict"]["planted"] and t["verdict"]["rollouts"] > 0
    assert [s["spans"] for s in result["store"]] == [10_000, 100_000]
    c = result["cluster"]
    assert c["rollouts_per_hour"] == pytest.approx(c["nodes"] * c["node_rate"] * 3600)
    assert c["node_rate"] == pytest.approx(min(c["workers_per_node"] * c["per_worker"], c["node_cpus"] / c["cpu_s_per_rollout"]))
    assert c["verdicts_per_hour"] == pytest.approx(c["rollouts_per_hour"] / t["verdict"]["rollouts"])
    for text in ("| local | 64 |", "| ray | 4 |", "| 100,000 | 10,000 |", "10,000 -> 100,000 spans (10x)",
                 "100-node Ray cluster", "rollouts/hour", "Assumptions:"):
        assert text in out.output, text
