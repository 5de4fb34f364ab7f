"""Zero-code capture: `OTEL_TRACES_EXPORTER=otel_replay opentelemetry-instrument python app.py`.

The real `opentelemetry-instrument` (opentelemetry-distro's configurator) runs the example service
variant that has no OpenTelemetry code (`examples/service/app_zero_code.py`), with the real
openai-v2 instrumentation loaded by its entry point; the store is read back through `Store`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from otel_replay import Store
from tests.helpers import REPO, needs_openai_v2

INSTRUMENT = Path(sys.executable).with_name("opentelemetry-instrument")
APP = REPO / "examples" / "service" / "app_zero_code.py"
QUIET = {"OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}  # the distro's default is otlp


def _env(**extra: str) -> dict[str, str]:
    """This environment without its OTEL_* settings, plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, **QUIET, **extra}


def _load_module() -> object:
    spec = importlib.util.spec_from_file_location("service_load", REPO / "examples" / "service" / "load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _service(env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen]]:
    """The zero-code service under opentelemetry-instrument; its URL; stopped with SIGTERM (which flushes)."""
    assert INSTRUMENT.exists(), "opentelemetry-instrument missing: pip install -e '.[dev]' (opentelemetry-distro)"
    proc = subprocess.Popen([str(INSTRUMENT), sys.executable, str(APP), "--port", "0"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        line = ""
        while time.monotonic() < deadline and not line.startswith("listening on "):
            if select.select([proc.stdout], [], [], 0.5)[0]:
                line = proc.stdout.readline()
                if not line:
                    break
        if not line.startswith("listening on "):
            proc.kill()
            raise AssertionError(f"the service did not start:\n{proc.communicate()[1]}")
        yield line.split()[2], proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        proc.stdout_text, proc.stderr_text = out, err  # type: ignore[attr-defined]


def _ask(url: str, n: int) -> list[str]:
    load = _load_module()
    return [load.ask(url, load.question(i))["trace_id"] for i in range(n)]


def _check_steps_have_payloads(store: Store, trace_id: str) -> list[str]:
    """The run's steps, each with its payloads; every span id they hold (one model call traced by
    two instrumentations, e.g. openai-v2 and OpenInference's, which `opentelemetry-instrument`
    turns on when both are installed, is one step with both span ids)."""
    steps = [s for s in store.trajectory(trace_id).steps if s.index is not None]
    assert [s.kind for s in steps][:2] == ["llm", "tool"] and steps[-1].kind == "llm", steps
    for step in steps:
        assert not step.observation_only and step.outputs, step
        if step.kind == "llm":
            assert step.inputs[0]["role"] == "system" and "order A-1042 arrived" in json.dumps(step.inputs[1])
    assert steps[0].outputs[0]["parts"][0]["name"] == "lookup_order"
    return [span_id for s in steps for span_id in s.span_ids]


@needs_openai_v2
def test_opentelemetry_instrument_captures_the_service_with_no_code_change(tmp_path):
    store_dir = tmp_path / "store"
    env = _env(OTEL_TRACES_EXPORTER="otel_replay", OTEL_SERVICE_NAME="support-service",
               OTEL_REPLAY_STORE=str(store_dir), OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental",
               # content only in log events: it reaches the store through the log processor the hook adds
               OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="event_only")
    with _service(env) as (url, proc):
        trace_ids = _ask(url, 2)
    assert proc.returncode == 0 and "otel-replay" not in proc.stderr_text, proc.stderr_text
    store = Store(store_dir)
    assert sorted(store.list_traces().column("trace_id").to_pylist()) == sorted(trace_ids)
    for trace_id in trace_ids:
        _check_steps_have_payloads(store, trace_id)
        assert store.trajectory(trace_id).service_name == "support-service"


class _OtlpSink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that keeps what it is sent."""

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.received.append((self.path, body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@needs_openai_v2
def test_beside_the_otlp_exporter_both_get_every_genai_span(tmp_path):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    sink = ThreadingHTTPServer(("127.0.0.1", 0), _OtlpSink)
    sink.received = []  # type: ignore[attr-defined]
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    store_dir = tmp_path / "store"
    env = _env(OTEL_TRACES_EXPORTER="otlp,otel_replay", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
               OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"http://127.0.0.1:{sink.server_address[1]}/v1/traces",
               OTEL_REPLAY_STORE=str(store_dir), OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental",
               OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="span_only")
    try:
        with _service(env) as (url, proc):
            (trace_id,) = _ask(url, 1)
    finally:
        sink.shutdown()
    assert proc.returncode == 0, proc.stderr_text
    exported = {}  # span id -> name, for the spans of this run that OTLP received
    for path, body in sink.received:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                exported.update({s.span_id.hex(): s.name for s in scope.spans if s.trace_id.hex() == trace_id})
    stored = _check_steps_have_payloads(Store(store_dir), trace_id)
    genai = {sid for sid, name in exported.items() if name.startswith(("chat ", "execute_tool ", "ChatCompletion"))}
    assert set(stored) == genai and "POST /ask" in exported.values()


@pytest.mark.parametrize(("variable", "value"), [("OTEL_REPLAY_FLUSH_INTERVAL_S", "2s"),
                                                 ("OTEL_REPLAY_CAPTURE_PAYLOADS", "prompts")])
def test_a_bad_variable_is_one_error_line_and_the_service_runs_on(tmp_path, variable, value):
    code = ("from opentelemetry import trace\n"
            "with trace.get_tracer('t').start_as_current_span('chat m', attributes={'gen_ai.operation.name': 'chat'}):\n"
            "    pass\n"
            "print('the service ran')\n")
    env = _env(OTEL_TRACES_EXPORTER="console,otel_replay", OTEL_REPLAY_STORE=str(tmp_path / "store"), **{variable: value})
    done = subprocess.run([str(INSTRUMENT), sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "the service ran" in done.stdout.splitlines(), done.stderr
    assert '"name": "chat m"' in done.stdout  # the other exporter still exports
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"otel-replay: {variable}={value!r}: {lines[0].split(': ', 2)[2]}"], done.stderr
    assert lines[0].endswith("; capture is off in this process (the service runs on)")
    assert not (tmp_path / "store").exists()


_PROBE = r"""
import json
import otel_replay
from opentelemetry import _logs, trace
processors = trace.get_tracer_provider()._active_span_processor._span_processors
logs = _logs.get_logger_provider()._multi_log_record_processor._log_record_processors
print(json.dumps({"span": [type(p).__name__ + ":" + type(getattr(p, "span_exporter", None)).__name__ for p in processors],
                  "log": [type(p).__name__ for p in logs],
                  "configure_returns_it": otel_replay.configure() is processors[1]}))
"""


def test_the_provider_holds_the_real_processor_and_no_idle_batch_processor(tmp_path):
    """What the configurator built, after the hook: ReplayProcessor itself on the provider (its own
    hot path), no BatchSpanProcessor around the placeholder exporter, the log processor on the
    LoggerProvider; and configure() in code then returns that processor."""
    env = _env(OTEL_TRACES_EXPORTER="console,otel_replay", OTEL_REPLAY_STORE=str(tmp_path / "store"))
    done = subprocess.run([str(INSTRUMENT), sys.executable, "-c", _PROBE], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"span": ["BatchSpanProcessor:ConsoleSpanExporter", "ReplayProcessor:NoneType"],
                      "log": ["ReplayLogProcessor"], "configure_returns_it": True}


_NO_PROVIDER = r"""
import json, sys
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from otel_replay.capture.configure import ReplayExporter
provider = TracerProvider()  # not the global one: the exporter finds no SDK provider to join
provider.add_span_processor(BatchSpanProcessor(ReplayExporter()))
with provider.get_tracer("t").start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m", "gen_ai.input.messages": '[{"role": "user", "content": "hi"}]'}):
    pass
provider.shutdown()
print(json.dumps("done"))
"""


def test_without_an_sdk_provider_the_exporter_feeds_its_own_processor(tmp_path):
    done = subprocess.run([sys.executable, "-c", _NO_PROVIDER], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=_env(OTEL_REPLAY_STORE=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    (row,) = Store(tmp_path).sql("select name, observation_only from steps").to_pylist()
    assert row == {"name": "chat m", "observation_only": False}
