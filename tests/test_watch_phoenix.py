"""Continuous blame end to end against a real Arize Phoenix: examples/service/run_watch.py.

The support service sends its spans over OTLP/HTTP to a real `otel-replay collect` and to a real
Phoenix; `otel-replay watch --once --export otlp` scores what collect stored, attributes one trace
per failure group (the others are linked) and sends the blame into the original traces. Phoenix's
REST API must then show, for each representative, the `otel_replay.attribution` span and the
`otel_replay.blame ...` spans merged into the service's own trace, under its step spans, as the
store's result says. Nobody runs `attribute`. Phoenix: see tests/test_phoenix.py (its fixture).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from otel_replay import Store
from tests.helpers import REPO
from tests.test_phoenix import _attributes, _file_spans, _otel_replay, _phoenix_trace, phoenix  # noqa: F401

pytestmark = pytest.mark.slow

BLAME_VERDICTS = {"decisive", "contributing", "locked-in", "no effect", "protective", "undecided",
                  "observation-only", "no policy", "unreplayable", "not scored"}


def _run_watch(store: Path, backend: str) -> str:
    """run_watch.py --backend: stdout; fails the test with its output on a non-zero exit."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER_OTLP")},
           "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "examples/service/run_watch.py", "--store", str(store), "--backend", backend],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"run_watch.py exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_watch_sends_blame_into_the_services_traces_in_phoenix(phoenix, tmp_path):  # noqa: F811 - the fixture
    store = tmp_path / "store"
    out = _run_watch(store, phoenix)
    failed = set(re.findall(r"trace ([0-9a-f]{32}) FAILED", out))
    assert 1 <= len(failed) <= 6, out  # the simulated model's own typos: a few of 20

    db = Store(store)
    stored = db.sql("select trace_id, span_id, parent_span_id, name from spans").to_pylist()
    traces = {r["trace_id"] for r in stored}
    assert len(traces) == 20 and failed <= traces, out

    # 1. the service's own spans reached Phoenix directly, as they reached collect: same ids, same tree
    phoenix_spans: dict[str, list[dict]] = {}
    for trace_id in traces:
        mine = [r for r in stored if r["trace_id"] == trace_id]
        spans = _phoenix_trace(phoenix, trace_id, len(mine))
        phoenix_spans[trace_id] = spans
        by_id = {s["span_id"]: s for s in spans}
        for row in mine:
            assert row["span_id"] in by_id, (trace_id, row["name"])
            assert by_id[row["span_id"]]["name"] == row["name"]
            assert by_id[row["span_id"]]["parent_span_id"] == row["parent_span_id"]

    # 2. watch found the failures itself, attributed one per group and linked the others
    scored = db.sql("select trace_id, passed from outcomes").to_pylist()
    assert {r["trace_id"] for r in scored} == traces
    assert {r["trace_id"] for r in scored if not r["passed"]} == failed
    links = {r["trace_id"]: r for r in db.sql("select trace_id, representative, job_id, role from group_links").to_pylist()}
    assert links.keys() == failed
    representatives = {t: links[t]["job_id"] for t in failed if links[t]["role"] == "representative"}
    assert representatives and all(links[t]["representative"] in representatives for t in failed)
    assert "attribute" not in re.findall(r"^\$ otel-replay --store \S+ (\w+)", out, re.MULTILINE)
    for trace_id in traces - failed:  # a passing trace gets no blame
        assert not [s for s in phoenix_spans[trace_id] if s["name"].startswith("otel_replay.")], trace_id

    # 3. each representative's blame, merged into its original trace in Phoenix, as the store says
    for trace_id, job in representatives.items():
        originals = {r["span_id"]: r for r in stored if r["trace_id"] == trace_id}
        root = next(r for r in originals.values() if r["parent_span_id"] is None)
        merged = tmp_path / f"{job}.json"
        _otel_replay("--store", str(store), "export", "--job", job, "--to", "otlp-json", "--out", str(merged))
        ours = [s for s in _file_spans(json.loads(merged.read_text())) if s["name"].startswith("otel_replay.")]
        spans = _phoenix_trace(phoenix, trace_id, len(phoenix_spans[trace_id]) + len(ours))
        assert {s["trace_id"] for s in spans} == {trace_id}
        by_id = {s["span_id"]: s for s in spans}

        (attribution,) = [s for s in spans if s["name"] == "otel_replay.attribution"]
        assert attribution["parent_span_id"] == root["span_id"]  # under the service's POST /ask span
        summary = _attributes(attribution)
        assert summary["otel_replay.attribution.job_id"] == job
        results = {r["span_id"]: r for r in db.sql(
            "select span_id, name, verdict, culprit from result_rows where job_id = ? and trace_id = ?",
            [job, trace_id]).to_pylist()}
        culprit_ids = {s for s, r in results.items() if r["culprit"]}
        assert [results[s]["name"] for s in culprit_ids] == ["chat sim-gpt"]  # the model's lookup call, as in the batch
        assert summary["otel_replay.attribution.verdict"] == "culprit-found"
        assert summary["otel_replay.attribution.culprit.span_id"] in culprit_ids

        blame = [s for s in spans if s["name"].startswith("otel_replay.blame ")]
        assert blame and len(blame) == len([s for s in ours if s["name"].startswith("otel_replay.blame ")])
        expected = {s["parentSpanId"]: _attributes(s) for s in ours if s["name"] != "otel_replay.attribution"}
        for span in blame:
            step = originals[span["parent_span_id"]]  # under one of the service's own step spans
            assert by_id[step["span_id"]]["name"] == step["name"]
            assert span["name"] == f"otel_replay.blame {results[step['span_id']]['name']}"
            numbers = _attributes(span)
            assert numbers["otel_replay.blame.verdict"] in BLAME_VERDICTS
            assert numbers["otel_replay.blame.verdict"] == results[step["span_id"]]["verdict"]
            assert numbers["otel_replay.blame.culprit"] is results[step["span_id"]]["culprit"]
            assert numbers == expected[span["parent_span_id"]]  # what the store's result exports, types and values
        culprits = [s["parent_span_id"] for s in blame if _attributes(s)["otel_replay.blame.culprit"] is True]
        assert culprits == [summary["otel_replay.attribution.culprit.span_id"]]
