"""Small helpers shared by the tests (real components only; nothing here fakes the library)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"  # recorded data the tests read (see its README.md)


def needs(distribution: str, minimum: str, what: str) -> pytest.MarkDecorator:
    """Skip where the installed `distribution` is older than `minimum`, saying that `what` needs it.

    For the oldest-SDK CI job (.ci/run): OpenTelemetry 1.30, without the dev packages that need a
    newer one. The skip is on the installed version only, so a package merely missing still fails.
    """
    from packaging.version import Version  # pytest's own dependency

    installed = version(distribution)
    return pytest.mark.skipif(Version(installed) < Version(minimum),
                              reason=f"{what} needs {distribution}>={minimum} (installed: {installed})")


# what the oldest supported OpenTelemetry (1.30) cannot run
needs_openai_v2 = needs("opentelemetry-api", "1.43",  # util-genai 1.1b0: opentelemetry-api~=1.43
                        "the demo's and the examples' instrumentation, opentelemetry-instrumentation-openai-v2==2.4b0 "
                        "with opentelemetry-util-genai==1.1b0,")
needs_util_genai = needs("opentelemetry-api", "1.43", "opentelemetry-util-genai==1.1b0")
needs_openllmetry_anthropic = needs("opentelemetry-semantic-conventions", "0.63b1",
                                    "OpenLLMetry's opentelemetry-instrumentation-anthropic==0.62.4")
needs_emit_keywords = needs("opentelemetry-sdk", "1.38", "Logger.emit(event_name=..., attributes=...)")
needs_log_record_event_name = needs("opentelemetry-proto", "1.35", "the LogRecord.event_name field")
needs_http_retry_on_429 = needs("opentelemetry-exporter-otlp-proto-http", "1.45",
                                "an OTLP/HTTP exporter that retries on 429")


def provider_with(processor, service: str = "test-service") -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(processor)
    return provider


def chat_attributes(user: str = "hi", answer: str = "hello", model: str = "m") -> dict[str, object]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model,
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": user}]}]),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": answer}], "finish_reason": "stop"}]
        ),
    }


def run_module(module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Run `python -m module args` from the repo root; returns stdout, raises on failure."""
    merged = {**os.environ, **(env or {})}
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=merged,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{module} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


@contextmanager
def local_s3(scratch: Path) -> Iterator[dict[str, str]]:
    """An S3-compatible server (moto) on 127.0.0.1, and the environment a client needs to reach it
    (set while inside; `scratch` is a directory for an empty AWS config). Needs the s3-test extra."""
    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    nowhere = scratch / "none"
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": str(nowhere), "AWS_SHARED_CREDENTIALS_FILE": str(nowhere)}
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            mp.delenv("AWS_PROFILE", raising=False)
            s3fs.S3FileSystem.clear_instance_cache()  # an instance made before would keep another endpoint
            yield env
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()
