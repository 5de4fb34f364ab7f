"""A small support service: `POST /ask {"question": ...}` answered by the example support agent.

    python examples/service/app.py [--store DIR] [--port 0] [--model-seed 2]

A plain WSGI app on the stdlib's threading `wsgiref` server (127.0.0.1). Each request runs the
support agent (`otel_replay.testing.support_agent`): the real `openai` SDK against a simulated
model that this process starts on 127.0.0.1, traced by the real
`opentelemetry-instrumentation-openai-v2`, captured by `ReplayProcessor` into `--store`. Every
request is one trace whose root is a SERVER span (`POST /ask`) around the agent, as a real
service's traces look. Nothing is faked: the simulated model copies the order id wrong on its
own now and then (the support script's 10% typo rate, seeded by `--model-seed` and the question),
and the customer is then refused the refund they were owed.

Prints `listening on http://127.0.0.1:PORT` when ready; SIGTERM or Ctrl-C stops it and flushes
every captured span to the store.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from otel_replay.store import default_root
from otel_replay.testing.recording import enable_content_capture, run_tool_loop
from otel_replay.testing.server import SimulatedModelServer
from otel_replay.testing.support_agent import SYSTEM, TOOL_FUNCTIONS, TOOLS, support_model

SERVICE = "support-service"
MAX_BODY = 64 * 1024
StartResponse = Callable[..., Any]


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """One thread per request, as a small production WSGI server would do."""

    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    """No access log on stderr (the traces are the log)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        return None


class SupportService:
    """The WSGI app, with its OpenTelemetry setup and its model client."""

    def __init__(self, store: str, model_seed: int) -> None:
        enable_content_capture()  # message content on spans: set before the instrumentation is imported
        import openai
        from opentelemetry import trace
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        from otel_replay import ReplayProcessor

        # The Quickstart: one processor on the service's TracerProvider.
        self.provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
        self.provider.add_span_processor(ReplayProcessor(store))
        trace.set_tracer_provider(self.provider)
        self.instrumentor = OpenAIInstrumentor()
        self.instrumentor.instrument(tracer_provider=self.provider)
        self.tracer = trace.get_tracer("examples.service")  # the OTel API tracer
        self.model_server = SimulatedModelServer(support_model(model_seed)).start()
        self.client = openai.OpenAI(base_url=self.model_server.base_url, api_key="sim", max_retries=0)

    def close(self) -> None:
        """Stop the model, uninstrument, and flush every accepted span to the store."""
        self.model_server.stop()
        self.instrumentor.uninstrument()
        self.provider.shutdown()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        method, path = environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/")
        if path == "/healthz":
            return _reply(start_response, 200, {"status": "ok"})
        if path != "/ask":
            return _reply(start_response, 404, {"error": f"no route {path}; POST /ask"})
        if method != "POST":
            return _reply(start_response, 405, {"error": "use POST /ask"})
        attributes = {"http.request.method": method, "http.route": "/ask", "url.path": path, "url.scheme": "http",
                      "server.address": environ.get("SERVER_NAME", "127.0.0.1"),
                      "server.port": int(environ.get("SERVER_PORT") or 0),
                      "user_agent.original": environ.get("HTTP_USER_AGENT", "")}
        with self.tracer.start_as_current_span("POST /ask", kind=SpanKind.SERVER, attributes=attributes) as span:
            question = _question(environ)
            if question is None:
                span.set_attribute("http.response.status_code", 400)
                return _reply(start_response, 400, {"error": 'send JSON {"question": "..."}'})
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
            try:
                answer, trace_id = run_tool_loop(self.client, self.tracer, "support-agent", messages, TOOLS,
                                                 TOOL_FUNCTIONS, temperature=0.7)
            except Exception as exc:  # noqa: BLE001 - a failed request is a 500 and an errored span
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                span.set_attribute("http.response.status_code", 500)
                return _reply(start_response, 500, {"error": f"{type(exc).__name__}: {exc}"})
            span.set_attribute("http.response.status_code", 200)
            return _reply(start_response, 200, {"answer": answer, "trace_id": trace_id})


def _question(environ: dict[str, Any]) -> str | None:
    try:
        length = min(int(environ.get("CONTENT_LENGTH") or 0), MAX_BODY)
        body = json.loads(environ["wsgi.input"].read(length) or b"null")
    except (ValueError, OSError):
        return None
    question = body.get("question") if isinstance(body, dict) else None
    return question if isinstance(question, str) and question.strip() else None


def _reply(start_response: StartResponse, status: int, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}
    start_response(f"{status} {reason[status]}", [("Content-Type", "application/json"),
                                                  ("Content-Length", str(len(data)))])
    return [data]


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(0)  # unwinds serve_forever on the main thread, so the finally below flushes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=str(default_root()), help="store directory (default: $OTEL_REPLAY_STORE or ./otel-replay-store)")
    parser.add_argument("--port", type=int, default=8080, help="port on 127.0.0.1 (0: a free port; default 8080)")
    parser.add_argument("--model-seed", type=int, default=2,
                        help="the simulated model's seed (default 2: 3 of load.py's 20 questions get the typo)")
    args = parser.parse_args()
    service = SupportService(args.store, args.model_seed)
    server = make_server("127.0.0.1", args.port, service, server_class=ThreadingWSGIServer, handler_class=QuietHandler)
    signal.signal(signal.SIGTERM, _stop)
    print(f"listening on http://127.0.0.1:{server.server_port} (store: {args.store})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        service.close()
        print(f"stopped; captured spans flushed to {args.store}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
