"""Blame back into the original trace: real OTLP exporters (HTTP and gRPC) to receivers in the
test, decoded with opentelemetry-proto; Jaeger and OTLP JSON files; the attribute registry."""

from __future__ import annotations

import importlib.util
import json
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
import yaml
from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay import Store
from otel_replay.cli import main as cli
from otel_replay.export.blame import blame_spans
from otel_replay.export.job import stored_reports
from tests.helpers import REPO, needs_openai_v2

pytestmark = needs_openai_v2  # every test here records or runs the demo's agent (openai-v2)


@pytest.fixture(scope="module")
def attributed(tmp_path_factory):
    store = tmp_path_factory.mktemp("export")
    out = CliRunner().invoke(cli, ["--store", str(store), "demo", "--html", str(store / "r.html")])
    assert out.exit_code == 0, out.output
    job_id = out.output.split(" job ")[-1].split()[0]
    (report,) = stored_reports(Store(store), job_id)
    return store, job_id, report


class _Capture(BaseHTTPRequestHandler):
    requests: list[bytes] = []

    def do_POST(self) -> None:
        _Capture.requests.append(self.rfile.read(int(self.headers["Content-Length"])))
        body = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        return None


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []

    def Export(self, request, context):  # noqa: N802 - the generated name
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def _spans(requests):
    return [(rs, ss, span) for request in requests for rs in request.resource_spans for ss in rs.scope_spans
            for span in ss.spans]


def _attrs(items):
    out = {}
    for kv in items:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which)
    return out


def _check_tree(requests, store, report):
    traj = Store(store).trajectory(report["trace_id"])
    root = Store(store).sql("select root_span_id from traces where trace_id = ?", [report["trace_id"]]).column(0)[0].as_py()
    spans = _spans(requests)
    assert {span.trace_id.hex() for _, _, span in spans} == {report["trace_id"]}  # the ORIGINAL trace
    (attribution,) = [s for _, _, s in spans if s.name == "otel_replay.attribution"]
    assert attribution.parent_span_id.hex() == root
    attrs = _attrs(attribution.attributes)
    culprit = report["culprit"]
    assert attrs["otel_replay.attribution.culprit.span_id"] == culprit["span_id"] == traj.steps[0].span_id
    assert attrs["otel_replay.attribution.culprit.step_index"] == 0
    assert attrs["otel_replay.attribution.verdict"] == "culprit-found"
    assert abs(attrs["otel_replay.attribution.culprit.estimate"] - culprit["estimate"]) < 1e-12
    assert "WHERE Step 0" in attrs["otel_replay.attribution.explanation"]
    assert [e.name for e in attribution.events] == ["otel_replay.step_blame"] * len(traj.steps) + ["gen_ai.evaluation.result"]
    run_evaluation = _attrs(attribution.events[-1].attributes)  # the GenAI conventions' evaluation, from the wire
    assert run_evaluation["gen_ai.evaluation.name"] == "otel_replay.attribution"
    assert run_evaluation["gen_ai.evaluation.score.label"] == "culprit-found"
    assert abs(run_evaluation["gen_ai.evaluation.score.value"] - culprit["estimate"]) < 1e-12
    assert "WHERE Step 0" in run_evaluation["gen_ai.evaluation.explanation"]
    links = {link.span_id.hex(): _attrs(link.attributes) for link in attribution.links}
    assert set(links) == {s.span_id for s in traj.steps}
    assert links[culprit["span_id"]]["otel_replay.blame.culprit"] is True
    blames = {s.parent_span_id.hex(): s for _, _, s in spans if s.name.startswith("otel_replay.blame ")}
    assert set(blames) == {s.span_id for s in traj.steps}  # one blame span under each scored step's span
    culprit_blame = blames[culprit["span_id"]]
    assert _attrs(culprit_blame.attributes)["otel_replay.blame.culprit"] is True
    assert [e.name for e in culprit_blame.events] == ["gen_ai.evaluation.result", "otel_replay.repair"]
    step_evaluation = _attrs(culprit_blame.events[0].attributes)
    assert step_evaluation["gen_ai.evaluation.name"] == "otel_replay.blame"
    assert step_evaluation["gen_ai.evaluation.score.label"] == "decisive"
    assert abs(step_evaluation["gen_ai.evaluation.score.value"] - culprit["estimate"]) < 1e-12
    assert step_evaluation["gen_ai.evaluation.explanation"].startswith("Step 0 (")
    assert _attrs(culprit_blame.events[1].attributes)["otel_replay.repair.valid"] is True
    assert "otel_replay.repair.output" not in _attrs(culprit_blame.events[1].attributes)  # no payloads unless asked
    for blame in blames.values():  # every scored step's blame span says its verdict as an evaluation
        (evaluation,) = [_attrs(e.attributes) for e in blame.events if e.name == "gen_ai.evaluation.result"]
        assert evaluation["gen_ai.evaluation.score.label"] == _attrs(blame.attributes)["otel_replay.blame.verdict"]
    assert all(_attrs(b.attributes)["otel_replay.blame.culprit"] is False for p, b in blames.items() if p != culprit["span_id"])
    resource = _attrs(spans[0][0].resource.attributes)
    assert resource["service.name"] == "otel-replay"


def export_over_http(store, job_id, *options: str) -> list[ExportTraceServiceRequest]:
    """`otel-replay export --to otlp` over OTLP/HTTP with the real exporter, into a local server;
    the requests it received."""
    _Capture.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = CliRunner().invoke(cli, ["--store", str(store), "export", "--job", job_id, "--to", "otlp",
                                       "--otlp-protocol", "http/protobuf", *options,
                                       "--otlp-endpoint", f"http://127.0.0.1:{server.server_address[1]}"])
    finally:
        server.shutdown()
    assert out.exit_code == 0, out.output
    return [ExportTraceServiceRequest.FromString(body) for body in _Capture.requests]


def test_export_over_otlp_http_with_the_real_exporter(attributed):
    store, job_id, report = attributed
    requests = export_over_http(store, job_id)
    _check_tree(requests, store, report)


def test_export_over_otlp_grpc_with_the_real_exporter_and_env_configuration(attributed, monkeypatch):
    store, job_id, report = attributed
    servicer = _Servicer()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")  # the standard variables
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    try:
        out = CliRunner().invoke(cli, ["--store", str(store), "export", "--job", job_id, "--to", "otlp"])
    finally:
        server.stop(None)
    assert out.exit_code == 0, out.output
    _check_tree(servicer.requests, store, report)


def test_jaeger_and_otlp_json_files_merge_the_original_and_the_blame(attributed, tmp_path):
    store, job_id, report = attributed
    for target, name in (("jaeger-json", "j.json"), ("otlp-json", "o.json")):
        out = CliRunner().invoke(cli, ["--store", str(store), "export", "--job", job_id, "--to", target,
                                       "--out", str(tmp_path / name)])
        assert out.exit_code == 0, out.output
    jaeger = json.loads((tmp_path / "j.json").read_text())
    (trace,) = jaeger["data"]
    names = [s["operationName"] for s in trace["spans"]]
    assert names[0] == "invoke_agent support-agent" and "otel_replay.attribution" in names
    assert {p["serviceName"] for p in trace["processes"].values()} == {"support-service", "otel-replay"}
    assert all(isinstance(s["startTime"], int) and s["traceID"] == report["trace_id"] for s in trace["spans"])
    # the OTLP/JSON file is a valid request: our own importer reads it back into the same trace
    back = CliRunner().invoke(cli, ["--store", str(tmp_path / "back"), "import", "otlp", str(tmp_path / "o.json")])
    assert back.exit_code == 0, back.output
    spans = Store(tmp_path / "back").sql("select name, parent_span_id from spans where trace_id = ?", [report["trace_id"]])
    assert spans.num_rows == len(names)


def test_every_exported_attribute_is_declared_and_every_declared_one_is_exported(attributed):
    store, _, report = attributed
    registry = yaml.safe_load((REPO / "schemas" / "registry.yaml").read_text())
    declared = {a["id"]: a["type"] for g in registry["groups"] for a in g["attributes"]}
    root = Store(store).sql("select root_span_id from traces where trace_id = ?", [report["trace_id"]]).column(0)[0].as_py()
    written: dict[str, object] = {}
    undecided = {**report, "verdict": "undecided", "culprit": None, "candidates": [2, 0],
                 "steps": [{**s, "culprit": False, "verdict": "undecided" if s["index"] == 2 else "contributing"
                            if s["index"] == 0 else s["verdict"]} for s in report["steps"]]}
    for span in [*blame_spans(report, root, payloads=True), *blame_spans(undecided, root)]:
        written |= dict(span.attributes)
        for event in span.events:
            written |= dict(event.attributes)
        for link in span.links:
            written |= dict(link.attributes)
    assert set(written) == set(declared)
    python_types = {"string": str, "int": int, "double": float, "boolean": bool, "int[]": tuple}
    for key, value in written.items():
        assert isinstance(value, python_types[declared[key]]), (key, value)
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = hooks.render((REPO / "docs" / "reference" / "attributes.md").read_text())
    assert all(f"`{key}`" in page for key in declared)  # the docs render the table (docs/reference/attributes.md)


@pytest.mark.parametrize(("args", "message"), [
    (["export", "--job", "JOB", "--to", "otlp", "--otlp-endpoint", "http://127.0.0.1:9"], "results stay in the store"),
    (["export", "--job", "jnothing", "--to", "otlp-json", "--out", "x.json"], "has no attribution results"),
    (["export", "--job", "JOB", "--trace-id", "f" * 32, "--to", "otlp"], "no trace"),
    (["export", "--job", "JOB", "--to", "otlp-json"], "give --out FILE"),
    (["export", "--job", "JOB", "--to", "otlp", "--otlp-header", "novalue"], "KEY=VALUE"),
])
def test_bad_input(attributed, args, message):
    store, job_id, _ = attributed
    out = CliRunner().invoke(cli, ["--store", str(store), *[job_id if a == "JOB" else a for a in args]])
    assert out.exit_code in (1, 2) and message in out.output, out.output
    assert stored_reports(Store(store), job_id)  # the results are still there to export later
