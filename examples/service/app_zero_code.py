"""The support service of `app.py` with no OpenTelemetry set-up in its code, for `opentelemetry-instrument`.

    OTEL_TRACES_EXPORTER=otel_replay OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
    OTEL_SERVICE_NAME=support-service OTEL_REPLAY_STORE=/tmp/support-svc \\
    OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental \\
    OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_only \\
    opentelemetry-instrument python examples/service/app_zero_code.py [--port 8080] [--model-seed 2]

`app.py` less its Quickstart lines (its own TracerProvider, `ReplayProcessor` and
`OpenAIInstrumentor` calls): `opentelemetry-instrument` sets up the SDK from the environment and
instruments the `openai` SDK through the instrumentation's entry point, and the `otel_replay`
traces exporter adds capture into `$OTEL_REPLAY_STORE`. The content settings must be in the
environment because the instrumentation reads them before this module runs. The ASGI middleware
stays: `opentelemetry-instrumentation-asgi` has no auto-instrumentation of its own (the
frameworks built on it, such as Starlette and FastAPI, do). At exit the SDK shuts its
TracerProvider down, which writes every captured span to the store.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys

from app import SupportService, _stop  # examples/service/app.py, beside this file

from otel_replay.testing.server import SimulatedModelServer
from otel_replay.testing.support_agent import support_model


class ZeroCodeSupportService(SupportService):
    """`SupportService` on the providers `opentelemetry-instrument` set up: no SDK code here."""

    def __init__(self, model_seed: int) -> None:
        import openai
        from opentelemetry import trace

        self.provider = trace.get_tracer_provider()  # the configurator's (a proxy without opentelemetry-instrument)
        self.tracer = trace.get_tracer("examples.service")
        self.model_server = SimulatedModelServer(support_model(model_seed)).start()
        self.client = openai.OpenAI(base_url=self.model_server.base_url, api_key="sim", max_retries=0)

    def close(self) -> None:
        """Stop the model; the SDK's exit hook shuts the providers down and so flushes the store."""
        self.model_server.stop()


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080, help="port on 127.0.0.1 (0: a free port; default 8080)")
    parser.add_argument("--model-seed", type=int, default=2, help="the simulated model's seed (default 2)")
    args = parser.parse_args()
    service = ZeroCodeSupportService(args.model_seed)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)
    signal.signal(signal.SIGTERM, _stop)
    server = uvicorn.Server(uvicorn.Config(service.asgi(), log_level="warning", access_log=False))
    store = os.environ.get("OTEL_REPLAY_STORE", "./otel-replay-store")
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]} (store: {store})", flush=True)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        service.close()
        print("stopped; the SDK flushes captured spans at exit", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
