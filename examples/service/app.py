"""A small support service: `POST /ask {"question": ...}` answered by the example support agent.

    python examples/service/app.py [--store DIR] [--otlp-endpoint URL ...] [--port 0] [--model-seed 2]

A plain ASGI app served by uvicorn on 127.0.0.1. The real `opentelemetry-instrumentation-asgi`
middleware makes each request's SERVER span (`POST /ask`); inside it the support agent
(`otel_replay.testing.support_agent`) runs the real `openai` SDK against a simulated model that
this process starts on 127.0.0.1, traced by the real `opentelemetry-instrumentation-openai-v2`,
captured by `ReplayProcessor` into `--store` and/or sent over OTLP/HTTP (protobuf) to each
`--otlp-endpoint` (e.g. `otel-replay collect` and a trace backend, as `run_watch.py` does).
Nothing is faked: the simulated model copies the order id wrong on its own now and then (the
support script's 10% typo rate, seeded by `--model-seed` and the question), and the customer is
then refused the refund they were owed.

Prints `listening on http://127.0.0.1:PORT` when ready; SIGTERM or Ctrl-C stops it and flushes
every captured span to the store and to each OTLP endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from otel_replay.store import default_root
from otel_replay.testing.recording import enable_content_capture, run_tool_loop
from otel_replay.testing.server import SimulatedModelServer
from otel_replay.testing.support_agent import SYSTEM, TOOL_FUNCTIONS, TOOLS, support_model

SERVICE = "support-service"
MAX_BODY = 64 * 1024
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class SupportService:
    """The ASGI app, with its OpenTelemetry setup and its model client."""

    def __init__(self, store: str | None, model_seed: int, otlp_endpoints: Sequence[str] = ()) -> None:
        enable_content_capture()  # message content on spans: set before the instrumentation is imported
        import openai
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from otel_replay import ReplayProcessor

        self.provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
        if store is not None:  # the Quickstart: one processor on the service's TracerProvider
            self.provider.add_span_processor(ReplayProcessor(store))
        for endpoint in otlp_endpoints:  # the ordinary OTLP setup: one batch exporter per destination
            self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint))))
        trace.set_tracer_provider(self.provider)
        self.instrumentor = OpenAIInstrumentor()
        self.instrumentor.instrument(tracer_provider=self.provider)
        self.tracer = trace.get_tracer("examples.service")  # the OTel API tracer
        self.model_server = SimulatedModelServer(support_model(model_seed)).start()
        self.client = openai.OpenAI(base_url=self.model_server.base_url, api_key="sim", max_retries=0)

    def asgi(self) -> Any:
        """The app as served: wrapped in the real ASGI instrumentation, which opens the SERVER span."""
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
        from opentelemetry.util.http import parse_excluded_urls

        # parsed here: instrumentation-asgi before 0.56b0 takes only the parsed list
        return OpenTelemetryMiddleware(self, excluded_urls=parse_excluded_urls("healthz"), tracer_provider=self.provider,
                                       exclude_spans=["receive", "send"])

    def close(self) -> None:
        """Stop the model, uninstrument, and flush every accepted span to the store and the endpoints."""
        self.model_server.stop()
        self.instrumentor.uninstrument()
        self.provider.shutdown()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if scope["type"] != "http":
            return None
        method, path = scope.get("method", "GET"), scope.get("path", "/")
        if path == "/healthz":
            return await _reply(send, 200, {"status": "ok"})
        if path != "/ask":
            return await _reply(send, 404, {"error": f"no route {path}; POST /ask"})
        if method != "POST":
            return await _reply(send, 405, {"error": "use POST /ask"})
        question = _question(await _body(receive))
        if question is None:
            return await _reply(send, 400, {"error": 'send JSON {"question": "..."}'})
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        try:  # the agent is synchronous (the openai client): a worker thread, with this request's trace context
            answer, trace_id = await asyncio.to_thread(run_tool_loop, self.client, self.tracer, "support-agent",
                                                       messages, TOOLS, TOOL_FUNCTIONS, temperature=0.7)
        except Exception as exc:  # noqa: BLE001 - a failed request is a 500 (the middleware marks the span)
            return await _reply(send, 500, {"error": f"{type(exc).__name__}: {exc}"})
        return await _reply(send, 200, {"answer": answer, "trace_id": trace_id})


def traces_url(endpoint: str) -> str:
    """An OTLP/HTTP base URL (as $OTEL_EXPORTER_OTLP_ENDPOINT) -> its traces URL; a URL that already
    ends in /v1/traces is kept."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else f"{endpoint}/v1/traces"


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _body(receive: Receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return b""
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _question(body: bytes) -> str | None:
    try:
        data = json.loads(body or b"null")
    except ValueError:
        return None
    question = data.get("question") if isinstance(data, dict) else None
    return question if isinstance(question, str) and question.strip() else None


async def _reply(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(0)  # uvicorn re-raises the signal it caught once it has shut down: then flush, below


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="store directory for ReplayProcessor (default: $OTEL_REPLAY_STORE or "
                                        "./otel-replay-store, unless --otlp-endpoint is given)")
    parser.add_argument("--otlp-endpoint", action="append", default=[], metavar="URL",
                        help="also send every span over OTLP/HTTP (protobuf) to URL/v1/traces (repeatable)")
    parser.add_argument("--port", type=int, default=8080, help="port on 127.0.0.1 (0: a free port; default 8080)")
    parser.add_argument("--model-seed", type=int, default=2,
                        help="the simulated model's seed (default 2: 3 of load.py's 20 questions get the typo)")
    args = parser.parse_args()
    store = args.store if args.store or args.otlp_endpoint else str(default_root())
    service = SupportService(store, args.model_seed, args.otlp_endpoint)
    sinks = ", ".join([*([f"store: {store}"] if store else []), *(f"OTLP: {traces_url(e)}" for e in args.otlp_endpoint)])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)  # connections made from now on wait in the backlog until uvicorn accepts them
    # uvicorn handles SIGTERM and Ctrl-C itself (stops accepting, finishes open requests), then re-raises it
    signal.signal(signal.SIGTERM, _stop)
    server = uvicorn.Server(uvicorn.Config(service.asgi(), log_level="warning", access_log=False))
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]} ({sinks})", flush=True)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        service.close()
        print(f"stopped; captured spans flushed ({sinks})", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
