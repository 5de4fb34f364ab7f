"""Receiver benchmark: spans/s into `OtlpReceiver` over OTLP/HTTP from one client, with a baseline.

The client is a separate Python process with one thread and the real OTLP/HTTP span exporter,
sending batches of GenAI chat spans (built before the clock starts, ~4 KB of distinct payload
each, the capture benchmark's writer spans). The baseline is the same client posting to a
stdlib HTTP server that reads and discards each body: what the client, its encoding and the
loopback cost on their own. Each round times both servers back to back, and the receiver /
baseline ratio of those paired rounds is the figure to compare across machines.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from otel_replay.bench.machine import machine_info
from otel_replay.bench.spans import SeededText, SyntheticSpans
from otel_replay.capture.receiver import OtlpReceiver

BASELINE = "stdlib HTTP server that discards the body"
PAYLOAD_BYTES = 4096
FLUSH_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Sizes:
    """How much each round sends; `QUICK` is for tests, `FULL` for the README numbers."""

    spans: int  # spans per round, all distinct
    batch: int  # spans per export request
    rounds: int


FULL = Sizes(spans=15_360, batch=512, rounds=3)
QUICK = Sizes(spans=1_024, batch=512, rounds=1)

# metric key -> (label, unit, target, comparison); the target applies to the receiver.
METRICS: dict[str, tuple[str, str, float | None, str]] = {
    "stored_spans_per_s": ("OTLP/HTTP, first send until force_flush wrote them", "spans/s", 10_000.0, ">="),
    "received_spans_per_s": ("OTLP/HTTP, first send until the last response", "spans/s", None, ""),
    "received_mb_per_s": ("OTLP/HTTP request bodies received", "MB/s", None, ""),
}


# -- the client process ----------------------------------------------------------------------
def client_main() -> None:
    """The client: builds spans, then per `send URL` line exports them all and answers `sent N`.

    Run as `python -c "from otel_replay.bench.receiver import client_main; client_main()" SPANS BATCH`.
    """
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    count, batch = int(sys.argv[1]), int(sys.argv[2])
    spans = SyntheticSpans(SeededText(seed=7, corpus_bytes=2_000_000)).chat_spans(count, PAYLOAD_BYTES, distinct=True)
    batches = [spans[i:i + batch] for i in range(0, count, batch)]
    request_bytes = sum(len(encode_spans(b).SerializeToString()) for b in batches)
    print(f"ready {request_bytes}", flush=True)
    for line in sys.stdin:
        command, _, url = line.strip().partition(" ")
        if command != "send":
            break
        exporter = OTLPSpanExporter(endpoint=url, timeout=120)
        failed = sum(exporter.export(b) is not SpanExportResult.SUCCESS for b in batches)
        exporter.shutdown()
        print(f"sent {failed}", flush=True)


class _Client:
    def __init__(self, sizes: Sizes) -> None:
        code = "from otel_replay.bench.receiver import client_main; client_main()"
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(sizes.spans), str(sizes.batch)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.request_bytes = int(self._expect("ready"))

    def _expect(self, word: str) -> str:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith(word):
            raise RuntimeError(f"benchmark client: expected {word!r}, got {line!r} (exit code {self.proc.poll()})")
        return line.split()[1]

    def send(self, url: str) -> float:
        """Seconds until every batch was answered; raises if any export failed."""
        assert self.proc.stdin is not None
        started = time.perf_counter()
        self.proc.stdin.write(f"send {url}\n")
        self.proc.stdin.flush()
        failed = int(self._expect("sent"))
        elapsed = time.perf_counter() - started
        if failed:
            raise RuntimeError(f"benchmark client: {failed} export requests to {url} failed")
        return elapsed

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(30)


# -- the baseline server ---------------------------------------------------------------------
class _Discard(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return None


def _baseline_round(client: _Client) -> float:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discard)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    try:
        return client.send(f"http://127.0.0.1:{server.server_address[1]}/v1/traces")
    finally:
        server.shutdown()
        server.server_close()


def _receiver_round(client: _Client, sizes: Sizes, store: Path) -> dict[str, Any]:
    with OtlpReceiver(store, http_port=0, grpc_port=0) as receiver:
        started = time.perf_counter()
        received = client.send(f"{receiver.http_endpoint}/v1/traces")
        if not receiver.flush(FLUSH_TIMEOUT_S):
            raise RuntimeError(f"the receiver's writer did not finish within {FLUSH_TIMEOUT_S} s")
        stored = time.perf_counter() - started
        assert receiver.processor is not None
        written = receiver.processor.stats["written_spans"]
    if written != sizes.spans or receiver.counts["refused_traces"]:
        raise RuntimeError(f"stored {written} of {sizes.spans} spans ({receiver.counts})")
    return {"received_s": received, "stored_s": stored}


# -- where the time goes -----------------------------------------------------------------------
def per_span_costs(spans: int, batch: int) -> dict[str, float]:
    """CPU µs per span of encoding the client's requests (what the OTLP exporter does before each
    send) and of decoding them (the receiver's request thread, before it answers), in this process."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from otel_replay.capture.receiver_decode import decode_body

    made = SyntheticSpans(SeededText(seed=7, corpus_bytes=2_000_000)).chat_spans(spans, PAYLOAD_BYTES, distinct=True)
    batches = [made[i:i + batch] for i in range(0, spans, batch)]
    started = time.process_time()
    bodies = [encode_spans(b).SerializeToString() for b in batches]
    encode = time.process_time() - started
    started = time.process_time()
    decoded = sum(len(decode_body("traces", body, json=False)[0]) for body in bodies)
    decode = time.process_time() - started
    if decoded != spans:
        raise RuntimeError(f"decoded {decoded} of {spans} spans")
    return {"client_encode_us": encode / spans * 1e6, "receiver_decode_us": decode / spans * 1e6}


# -- the run ---------------------------------------------------------------------------------
def run_receiver_bench(quick: bool = False, store_dir: Path | None = None) -> dict:
    """Time the receiver and the baseline over OTLP/HTTP; returns one JSON-ready dict.

    :param quick: one small round (a few seconds, for tests); the default takes about a minute.
    :param store_dir: where the receiver's stores go (kept); default a temporary directory (removed).
    """
    sizes = QUICK if quick else FULL
    started = time.perf_counter()
    machine = machine_info()
    root = Path(store_dir) if store_dir is not None else Path(tempfile.mkdtemp(prefix="otel-replay-bench-"))
    client = _Client(sizes)
    rounds: list[dict[str, Any]] = []
    try:
        _baseline_round(client)  # warm-up: the client's first export pays for imports and caches
        for i in range(sizes.rounds):
            baseline = _baseline_round(client)
            rounds.append({"baseline_s": baseline, **_receiver_round(client, sizes, root / f"round-{i}")})
    finally:
        client.close()
        if store_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    n, mb = sizes.spans, client.request_bytes / 1e6
    costs = per_span_costs(min(sizes.spans, 4096), sizes.batch)
    metrics = {
        "stored_spans_per_s": _metric("stored_spans_per_s", [(n / r["stored_s"], n / r["baseline_s"]) for r in rounds]),
        "received_spans_per_s": _metric("received_spans_per_s",
                                        [(n / r["received_s"], n / r["baseline_s"]) for r in rounds]),
        "received_mb_per_s": _metric("received_mb_per_s", [(mb / r["received_s"], mb / r["baseline_s"]) for r in rounds]),
    }
    return {
        "quick": quick,
        "baseline": BASELINE,
        "machine": machine,
        "sizes": asdict(sizes),
        "payload_bytes_per_span": PAYLOAD_BYTES,
        "request_bytes_per_round": client.request_bytes,
        "rounds": rounds,
        "costs": costs,
        "metrics": metrics,
        "elapsed_s": time.perf_counter() - started,
    }


def _metric(key: str, pairs: list[tuple[float, float]]) -> dict[str, Any]:
    label, unit, target, op = METRICS[key]
    receiver = statistics.median(p[0] for p in pairs)
    passed = None if target is None else (receiver >= target if op == ">=" else receiver <= target)
    return {"label": label, "unit": unit, "target": target, "op": op, "passed": passed, "receiver": receiver,
            "baseline": statistics.median(p[1] for p in pairs),
            "ratio_vs_baseline": statistics.median(p[0] / p[1] for p in pairs)}


def format_receiver_table(result: dict) -> str:
    """The result as a Markdown table (readable as plain text) followed by notes on the run."""
    header = ["metric", "target", "OtlpReceiver", result.get("baseline", BASELINE), "receiver / baseline", "result"]
    rows = [header]
    for key in METRICS:
        m = result["metrics"][key]
        target = "" if m["target"] is None else f"{m['op']} {m['target']:,.0f} {m['unit']}"
        verdict = "" if m["passed"] is None else ("pass" if m["passed"] else "FAIL")
        rows.append([m["label"], target, f"{m['receiver']:,.1f} {m['unit']}", f"{m['baseline']:,.1f} {m['unit']}",
                     f"{m['ratio_vs_baseline']:.2f}x", verdict])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    machine, sizes = result["machine"], result["sizes"]
    notes = [
        f"Machine: {machine['cpus']} CPUs ({machine['cpu_model']}), {machine['implementation']} {machine['python']}; "
        f"{'quick' if result['quick'] else 'full'} run, {result['elapsed_s']:.1f} s.",
        f"Client: one process, one thread, opentelemetry-exporter-otlp-proto-http, {sizes['spans']:,} distinct GenAI "
        f"chat spans per round (~{result['payload_bytes_per_span']:,} payload bytes each) in requests of "
        f"{sizes['batch']} spans, {result['request_bytes_per_round'] / 1e6:.1f} MB of protobuf per round, no compression.",
        f"Median of {sizes['rounds']} round(s) after an untimed warm-up; in each the baseline and then a fresh "
        f"receiver got the same spans. "
        f"The baseline column is the client's own ceiling (it stores nothing); its time is until the last response.",
    ]
    if result.get("costs"):
        costs = result["costs"]
        notes.append(f"CPU per span, the same spans in one process: the exporter encodes one in "
                     f"{costs['client_encode_us']:.0f} µs, the receiver decodes it in {costs['receiver_decode_us']:.0f} µs "
                     f"before answering; storing it is the capture writer's work (`otel-replay bench capture`).")
    return "\n".join(lines + [""] + [f"- {note}" for note in notes])
