"""ReplayProcessor side by side with what a service already runs: the OTLP exporter.

1. Start-up: a fresh interpreter's `from otel_replay import ReplayProcessor; ReplayProcessor(store)`
   against `import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter`
   (and `otel-replay --help`, a whole CLI process, against `python -c pass`), alternating, medians.
2. CPU per span: the same distinct 4 KB GenAI spans through `ReplayProcessor` (normalize,
   content-address, Parquet zstd, fsync) and through `BatchSpanProcessor(OTLPSpanExporter)`
   (protobuf encoding, HTTP to a sink on 127.0.0.1 that runs in another process, so only the
   sender's CPU is counted): this process's CPU time from the first `on_end` until `force_flush`
   returned, divided by the spans, in alternating rounds; the ratio of the medians.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor

STARTUP_TARGET = 1.5  # ReplayProcessor's start-up / the OTel SDK and OTLP exporter's
CPU_TARGET = 1.0  # ReplayProcessor's CPU per span / the OTLP exporter's

_IMPORT_OURS = ("import sys, time; t = time.perf_counter(); from otel_replay import ReplayProcessor; "
                "ReplayProcessor(sys.argv[1]); print(time.perf_counter() - t)")
_IMPORT_OTEL = ("import time; t = time.perf_counter(); import opentelemetry.sdk.trace, "
                "opentelemetry.exporter.otlp.proto.http.trace_exporter; print(time.perf_counter() - t)")
_SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def _child_seconds(code: str, *args: str) -> float:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, timeout=120)
    return float(out.stdout.strip().splitlines()[-1])


def _wall_seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True, timeout=120)
    return time.perf_counter() - start


def startup(rounds: int) -> dict[str, Any]:
    """Import-and-create times in fresh interpreters (medians of alternating rounds), and the CLI's `--help`."""
    ours, otel, cli, bare = [], [], [], []
    cli_argv = [sys.executable, "-c", "import sys; from otel_replay.cli import main; sys.argv[0] = 'otel-replay'; main()",
                "--help"]
    with tempfile.TemporaryDirectory(prefix="otel-replay-startup-") as scratch:
        for n in range(rounds):
            pair = [(ours, lambda n=n: _child_seconds(_IMPORT_OURS, str(Path(scratch) / f"s{n}"))),
                    (otel, lambda: _child_seconds(_IMPORT_OTEL))]
            for samples, measure in pair if n % 2 else pair[::-1]:
                samples.append(measure())
            cli.append(_wall_seconds(cli_argv))
            bare.append(_wall_seconds([sys.executable, "-c", "pass"]))
    return {"replay_s": statistics.median(ours), "otel_s": statistics.median(otel),
            "ratio": statistics.median(ours) / statistics.median(otel), "rounds": rounds,
            "cli_help_s": statistics.median(cli), "python_s": statistics.median(bare)}


def _start_sink() -> tuple[subprocess.Popen[str], str]:
    sink = subprocess.Popen([sys.executable, "-c", _SINK], stdout=subprocess.PIPE, text=True)
    port = sink.stdout.readline().strip() if sink.stdout else ""
    return sink, f"http://127.0.0.1:{port}/v1/traces"


def _cpu_per_span(processor: Any, spans: Sequence[ReadableSpan], timeout_ms: int = 300_000) -> float:
    gc.collect()
    start = time.process_time()
    for span in spans:
        processor.on_end(span)
    if not processor.force_flush(timeout_ms):
        raise RuntimeError(f"{type(processor).__name__}.force_flush did not finish")
    used = time.process_time() - start
    stats = getattr(processor, "stats", None)
    if stats is not None and stats["written_spans"] != len(spans):
        raise RuntimeError(f"ReplayProcessor wrote {stats['written_spans']} of {len(spans)} spans")
    processor.shutdown()
    return used / len(spans) * 1e6


def cpu_vs_otlp(spans: Sequence[ReadableSpan], rounds: int, store: Path) -> dict[str, Any]:
    """CPU µs per span: ReplayProcessor against BatchSpanProcessor(OTLPSpanExporter) to a local sink."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from otel_replay.capture import ReplayProcessor
    from otel_replay.capture.writer import load_for_writing

    load_for_writing()  # what a writer loads once per process is start-up, measured above: not per span
    sink, endpoint = _start_sink()
    ours: list[float] = []
    otlp: list[float] = []
    try:
        for n in range(rounds):
            pair = [(ours, lambda n=n: ReplayProcessor(store / f"cpu-{n}")),
                    (otlp, lambda: BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), max_queue_size=len(spans),
                                                      max_export_batch_size=min(512, len(spans))))]
            for samples, make in pair if n % 2 else pair[::-1]:
                samples.append(_cpu_per_span(make(), spans))
    finally:
        sink.kill()
        sink.wait(10)
    return {"replay_us": statistics.median(ours), "otlp_us": statistics.median(otlp),
            "ratio": statistics.median(ours) / statistics.median(otlp), "rounds": rounds, "spans": len(spans)}


def format_vs_otlp(startup_result: dict[str, Any], cpu: dict[str, Any]) -> list[str]:
    """Markdown rows: what a service pays with ReplayProcessor beside what it pays for the OTLP exporter."""
    s, c = startup_result, cpu
    rows = [
        ["measure", "target", "ReplayProcessor", "OTel SDK + OTLP exporter", "ratio", "result"],
        ["start-up: import and create (fresh interpreter)", f"≤ {STARTUP_TARGET:g}x",
         f"{s['replay_s'] * 1000:.0f} ms", f"{s['otel_s'] * 1000:.0f} ms", f"{s['ratio']:.2f}x",
         "pass" if s["ratio"] <= STARTUP_TARGET else "FAIL"],
        ["CPU per distinct 4 KB GenAI span, on_end to on disk / sent", f"≤ {CPU_TARGET:g}x",
         f"{c['replay_us']:.0f} µs", f"{c['otlp_us']:.0f} µs", f"{c['ratio']:.2f}x",
         "pass" if c["ratio"] <= CPU_TARGET else "FAIL"],
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["", f"- Start-up: medians of {s['rounds']} alternating fresh interpreters, timed inside each from "
              f"before the import to after the processor exists (interpreter start excluded); `otel-replay --help` "
              f"takes {s['cli_help_s'] * 1000:.0f} ms as a whole process, `python -c pass` {s['python_s'] * 1000:.0f} ms.",
              f"- CPU: {c['spans']} distinct spans per round, {c['rounds']} alternating rounds, this process's CPU "
              f"(all threads) from the first on_end until force_flush returned; the OTLP sink runs in another "
              f"process. ReplayProcessor normalizes, redacts, content-addresses, writes zstd Parquet and fsyncs; "
              f"the exporter encodes protobuf and posts it over HTTP."]
    return lines


def rounds_argument(module: str, doc: str, default: int) -> int:
    """The `rounds` argument of a capture experiment run as `python -m benchmarks.<module> [rounds]`."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{module}", description=doc.splitlines()[0])
    parser.add_argument("rounds", nargs="?", type=int, default=default, help=f"rounds of each (default {default})")
    rounds = parser.parse_args().rounds
    if rounds < 1:
        parser.error("rounds must be at least 1")
    return int(rounds)
