"""End to end against a real third-party trace backend: Arize Phoenix.

The demo records a failing run and attributes it; the original trace's spans go to Phoenix over
OTLP/HTTP (protobuf), then `otel-replay export --to otlp` sends the blame into the same trace.
Phoenix's own REST API must then show the blame spans merged into the original trace, under the
right parents, with their attributes and events. Links are not checked here: Phoenix drops them.

Phoenix lives in its own virtual environment (850 MB, Python >= 3.11), never in the project's:
`OTEL_REPLAY_PHOENIX=/path/to/bin/phoenix`, else `<repo>/.phoenix-venv/bin/phoenix`.
With `/usr/bin/chromium` present, the trace view is captured headless; `OTEL_REPLAY_SCREENSHOT=1`
also saves it to docs/phoenix-blame.png.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.helpers import REPO

pytestmark = pytest.mark.slow

PHOENIX_VENV = REPO / ".phoenix-venv"
CREATE_VENV = f"python3 -m venv {PHOENIX_VENV} && {PHOENIX_VENV}/bin/pip install arize-phoenix"
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = REPO / "docs" / "phoenix-blame.png"


def _phoenix_executable() -> Path:
    configured = os.environ.get("OTEL_REPLAY_PHOENIX")
    candidates = [Path(configured)] if configured else []
    candidates.append(PHOENIX_VENV / "bin" / "phoenix")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip(f"Arize Phoenix is not installed; create it with: {CREATE_VENV} "
                "(or set OTEL_REPLAY_PHOENIX to a `phoenix` executable)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read()


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    """A `phoenix serve` on loopback with free ports and a throwaway working dir; yields its URL."""
    executable = _phoenix_executable()
    workdir = tmp_path_factory.mktemp("phoenix")
    port, grpc_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
        "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
        "DO_NOT_TRACK": "1",
    }
    log_path = workdir / "phoenix.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([str(executable), "serve"], cwd=workdir, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"phoenix exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if _get(f"{base}/healthz", timeout=2)[0] == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"phoenix not ready after 60 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield base
    finally:
        # its own session, so its group id is its pid: stops it and anything it started, nothing else
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def _otel_replay(*args: str, timeout: float = 300) -> str:
    """Run the installed `otel-replay` command; returns stdout, fails the test on a non-zero exit."""
    script = Path(sys.executable).with_name("otel-replay")
    command = [str(script)] if script.exists() else [
        sys.executable, "-c", "import sys; from otel_replay.cli import main; sys.exit(main())"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
    env["COLUMNS"] = "200"
    done = subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"otel-replay {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _value(any_value: dict):
    """The one set field of an OTLP AnyValue, in OTLP/JSON (camelCase) or Phoenix's snake_case form."""
    kind, value = next((k, v) for k, v in any_value.items() if v is not None)
    return int(value) if kind in ("intValue", "int_value") else value  # OTLP/JSON writes int64 as a string


def _attributes(item: dict) -> dict:
    return {a["key"]: _value(a["value"]) for a in item.get("attributes") or []}


def _file_spans(request: dict) -> list[dict]:
    return [s for rs in request["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]


def _is_ours(name: str) -> bool:
    return name.startswith("otel_replay.")


@pytest.fixture(scope="module")
def attributed(tmp_path_factory):
    """A recorded failing demo run whose attribution found a culprit: (store, job, OTLP/JSON request)."""
    base = tmp_path_factory.mktemp("demo")
    for attempt in range(3):  # the demo's simulated model is random; the sequential default decides it nearly always
        store = base / f"store{attempt}"
        out = _otel_replay("--store", str(store), "demo", "--html", str(base / f"demo{attempt}.html"))
        match = re.search(r" job (j[0-9a-f]+)", out)
        assert match, out
        job = match.group(1)
        merged = base / f"merged{attempt}.json"
        _otel_replay("--store", str(store), "export", "--job", job, "--to", "otlp-json", "--out", str(merged))
        request = json.loads(merged.read_text())
        attribution = next(s for s in _file_spans(request) if s["name"] == "otel_replay.attribution")
        if _attributes(attribution)["otel_replay.attribution.verdict"] == "culprit-found":
            return store, job, request
    pytest.fail("three demo runs found no culprit")


def _original_only_protobuf(request: dict) -> bytes:
    """The recorded spans of an OTLP/JSON request (no otel_replay.* spans), as OTLP protobuf bytes."""
    request = json.loads(json.dumps(request))
    for resource_spans in request["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            scope_spans["spans"] = [s for s in scope_spans["spans"] if not _is_ours(s["name"])]
            for span in scope_spans["spans"]:
                # OTLP/JSON ids are hex; the protobuf JSON mapping of bytes fields is base64
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
                for link in span.get("links") or []:
                    for key in ("traceId", "spanId"):
                        link[key] = base64.b64encode(bytes.fromhex(link[key])).decode()
        resource_spans["scopeSpans"] = [ss for ss in resource_spans["scopeSpans"] if ss["spans"]]
    request["resourceSpans"] = [rs for rs in request["resourceSpans"] if rs["scopeSpans"]]
    return ParseDict(request, ExportTraceServiceRequest()).SerializeToString()


def _phoenix_trace(base: str, trace_id: str, expected: int) -> list[dict]:
    """The trace's spans from Phoenix's REST API, polled until `expected` spans are there (10 s)."""
    url = f"{base}/v1/projects/default/spans/otlpv1?trace_id={trace_id}&limit=1000"
    deadline = time.monotonic() + 10
    spans: list[dict] = []
    while time.monotonic() < deadline:
        spans = json.loads(_get(url)[1])["data"]
        if len(spans) >= expected:
            break
        time.sleep(0.3)
    return spans


def test_blame_merges_into_the_original_trace_in_phoenix(phoenix, attributed, tmp_path):
    store, job, request = attributed
    file_spans = _file_spans(request)
    originals = [s for s in file_spans if not _is_ours(s["name"])]
    ours = [s for s in file_spans if _is_ours(s["name"])]
    trace_id = originals[0]["traceId"]
    root = next(s for s in originals if not s.get("parentSpanId"))

    # 1. the recorded trace's own spans, as the instrumented service would have sent them
    post = urllib.request.Request(f"{phoenix}/v1/traces", data=_original_only_protobuf(request),
                                  headers={"Content-Type": "application/x-protobuf"}, method="POST")
    with urllib.request.urlopen(post, timeout=10) as response:
        assert response.status == 200
    assert len(_phoenix_trace(phoenix, trace_id, len(originals))) == len(originals)

    # 2. the blame, sent by otel-replay's own OTLP exporter
    out = _otel_replay("--store", str(store), "export", "--job", job, "--to", "otlp",
                       "--otlp-protocol", "http/protobuf", "--otlp-endpoint", phoenix)
    assert f"exported {len(ours)} blame spans for 1 trace(s)" in out

    # 3. read back through Phoenix's API: one trace, the originals plus the blame
    spans = _phoenix_trace(phoenix, trace_id, len(file_spans))
    assert sorted(s["name"] for s in spans) == sorted(s["name"] for s in file_spans)
    assert {s["trace_id"] for s in spans} == {trace_id}
    by_id = {s["span_id"]: s for s in spans}
    for original in originals:  # the recorded tree is untouched
        assert by_id[original["spanId"]]["parent_span_id"] == original.get("parentSpanId")
        assert by_id[original["spanId"]]["name"] == original["name"]

    # the attribution span hangs off the trace's root span
    attribution = next(s for s in spans if s["name"] == "otel_replay.attribution")
    assert attribution["parent_span_id"] == root["spanId"]
    summary = _attributes(attribution)
    assert summary["otel_replay.attribution.job_id"] == job
    assert summary["otel_replay.attribution.verdict"] == "culprit-found"
    culprit_id = summary["otel_replay.attribution.culprit.span_id"]
    assert culprit_id in {s["spanId"] for s in originals}

    # one blame span under each scored step's own span; exactly one culprit, under the culprit step
    expected_blame = {s["parentSpanId"]: _attributes(s) for s in ours if s["name"] != "otel_replay.attribution"}
    step_events = [e for e in attribution["events"] or [] if e["name"] == "otel_replay.step_blame"]
    step_names = {_attributes(e)["otel_replay.step.span_id"]: _attributes(e)["otel_replay.step.name"]
                  for e in step_events}
    blame = [s for s in spans if s["name"].startswith("otel_replay.blame ")]
    assert {s["parent_span_id"] for s in blame} == set(expected_blame)
    for span in blame:
        step_name = step_names[span["parent_span_id"]]
        assert span["name"] == f"otel_replay.blame {step_name}"
        assert by_id[span["parent_span_id"]]["name"].endswith(step_name)
        assert _attributes(span) == expected_blame[span["parent_span_id"]]  # types and values survive
    culprits = [s for s in blame if _attributes(s)["otel_replay.blame.culprit"] is True]
    assert len(culprits) == 1
    culprit = culprits[0]
    assert culprit["parent_span_id"] == culprit_id
    numbers = _attributes(culprit)
    assert numbers["otel_replay.blame.rank"] == 1
    assert numbers["otel_replay.blame.verdict"] in {"decisive", "contributing"}
    assert numbers["otel_replay.blame.ci_low"] <= numbers["otel_replay.blame.score"] <= numbers["otel_replay.blame.ci_high"]
    assert numbers["otel_replay.blame.ci_low"] > 0  # a culprit's interval excludes "no effect"
    assert numbers["otel_replay.blame.score"] == pytest.approx(summary["otel_replay.attribution.culprit.estimate"])
    assert numbers["otel_replay.blame.ci_low"] == pytest.approx(summary["otel_replay.attribution.culprit.ci_low"])
    assert numbers["otel_replay.blame.ci_high"] == pytest.approx(summary["otel_replay.attribution.culprit.ci_high"])

    # events with their attributes survive: a step_blame per scored step, the repair on the culprit
    assert len(step_events) == len(expected_blame)
    assert {_attributes(e)["otel_replay.step.span_id"] for e in step_events} == set(expected_blame)
    culprit_event = next(e for e in step_events if _attributes(e)["otel_replay.step.span_id"] == culprit_id)
    assert _attributes(culprit_event)["otel_replay.blame.culprit"] is True
    assert _attributes(culprit_event)["otel_replay.blame.score"] == pytest.approx(numbers["otel_replay.blame.score"])
    repairs = [e for e in culprit["events"] or [] if e["name"] == "otel_replay.repair"]
    assert len(repairs) == 1
    repair = _attributes(repairs[0])
    assert set(repair) >= {"otel_replay.repair.fail_rate", "otel_replay.repair.drift", "otel_replay.repair.valid"}
    assert "otel_replay.repair.output" not in repair  # payloads only with --export-payloads
    assert 0 <= repair["otel_replay.repair.fail_rate"] <= 1
    # the GenAI conventions' evaluation events survive too: one per blame span, one on the attribution span
    for span in blame:
        (evaluation,) = [_attributes(e) for e in span["events"] or [] if e["name"] == "gen_ai.evaluation.result"]
        assert evaluation["gen_ai.evaluation.name"] == "otel_replay.blame"
        assert evaluation["gen_ai.evaluation.score.label"] == _attributes(span)["otel_replay.blame.verdict"]
        assert evaluation["gen_ai.evaluation.score.value"] == pytest.approx(_attributes(span)["otel_replay.blame.score"])
    (run,) = [_attributes(e) for e in attribution["events"] or [] if e["name"] == "gen_ai.evaluation.result"]
    assert run["gen_ai.evaluation.name"] == "otel_replay.attribution"
    assert run["gen_ai.evaluation.score.label"] == "culprit-found"

    if CHROMIUM.exists():
        _screenshot(f"{phoenix}/redirects/spans/{culprit['span_id']}", tmp_path)


def _screenshot(url: str, tmp_path: Path) -> None:
    """Phoenix's trace view with the culprit's blame span selected, captured by headless Chromium."""
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    shot = tmp_path / "phoenix-blame.png"
    subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--window-size=1600,1000", "--virtual-time-budget=15000",
         "--force-prefers-reduced-motion", "--hide-scrollbars", f"--screenshot={shot}", url],
        capture_output=True, timeout=120, check=False)
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "chromium wrote no screenshot"
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
    if os.environ.get("OTEL_REPLAY_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)
