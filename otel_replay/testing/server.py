"""`SimulatedModelServer`: the simulated model behind a real HTTP server on 127.0.0.1, speaking
the OpenAI chat-completions API (JSON and streaming), so the real `openai` SDK and real
instrumentations can talk to it."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from otel_replay.testing.model import SimulatedModel

MAX_BODY = 8 * 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: with Nagle, each reply waits ~40 ms

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        return None

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self._send(status, json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode())

    def do_POST(self) -> None:
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._error(404, f"unknown path {self.path}; this server answers /v1/chat/completions")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._error(413, "request too large")
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._error(400, "the body is not JSON")
            return
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._error(400, "'messages' must be a list")
            return
        if self.server.latency_s:
            time.sleep(self.server.latency_s)
        try:
            response = self.server.model.complete(body)
        except Exception as exc:  # noqa: BLE001 - a script error is the caller's 500, not a dead server
            self._error(500, f"the simulated model's script failed: {type(exc).__name__}: {exc}", "server_error")
            return
        if body.get("stream"):
            self._stream(response, bool((body.get("stream_options") or {}).get("include_usage")))
        else:
            self._send(200, json.dumps(response).encode())

    def _stream(self, response: dict[str, Any], include_usage: bool) -> None:
        choice = response["choices"][0]
        base = {k: response[k] for k in ("id", "created", "model", "system_fingerprint")} | {"object": "chat.completion.chunk"}
        delta: dict[str, Any] = {"role": "assistant", "content": choice["message"].get("content")}
        if choice["message"].get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(choice["message"]["tool_calls"])]
        chunks = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                  {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]
        if include_usage:
            chunks.append({**base, "choices": [], "usage": response["usage"]})
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self._send(200, body.encode(), "text/event-stream")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], model: SimulatedModel, latency_s: float) -> None:
        super().__init__(address, _Handler)
        self.model = model
        self.latency_s = latency_s


class SimulatedModelServer:
    """Serve a `SimulatedModel` on 127.0.0.1 (port 0: a free port). Use as a context manager."""

    def __init__(self, model: SimulatedModel, host: str = "127.0.0.1", port: int = 0, latency_s: float = 0.0) -> None:
        self.model = model
        self._host = host
        self._server = _Server((host, port), model, latency_s)
        # a short poll: stop() waits for the loop to notice (the default 0.5 s added that to every use)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="simulated-model",
                                        daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self._server.server_port}/v1"

    def start(self) -> SimulatedModelServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> SimulatedModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
