"""Small helpers shared by the tests (real components only; nothing here fakes the library)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"  # recorded data the tests read (see its README.md)


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
    import pytest
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
