"""Receiver benchmark: spans/s into `OtlpReceiver` over OTLP/HTTP from one client, with a baseline.

The client is a separate process with one thread and one keep-alive connection, sending batches
of GenAI chat spans (built before the clock starts, ~4 KB of distinct payload each, the capture
benchmark's writer spans, 16 to a trace as agent runs come). It is one of two kinds:

- `encoded` (default): requests encoded with the OTLP protobuf encoder before the clock starts
  and posted as they are, what a compiled sender such as the OpenTelemetry Collector's
  `otlphttp` exporter costs per request, so the receiver is what is measured;
- `exporter`: the Python SDK's OTLP/HTTP span exporter, which encodes each batch as it sends
  (~120 µs a span on these machines: one Python thread cannot send these spans much faster than ~8k/s).

The baseline is the same client posting to a stdlib HTTP server that reads and discards each
body: what the client and the loopback cost on their own. Each round times both servers back to
back, and the receiver / baseline ratio of those paired rounds is the figure to compare across machines.

Each round also times a fresh receiver with `durable=True` (`collect --durable`: every request in a
fsynced write-ahead log before its answer) on the same spans, in-memory and durable in alternating
order; the second table compares the two: spans/s accepted and stored, and the client's p50 / p99
request latency (one request: from its send until its response), durable / in-memory per round.
"""

from __future__ import annotations

import http.client
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks.machine import machine_info, speed_note
from benchmarks.spans import SeededText, SyntheticSpans
from otel_replay.capture.receiver import OtlpReceiver
from otel_replay.capture.receiver_workers import auto_workers
from otel_replay.trajectory import Store

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
SPANS_PER_TRACE = 16  # one agent run's worth; the receiver's workers split requests by trace
CLIENTS = ("encoded", "exporter")
MODES = ("memory", "durable")

# `--durable` against the in-memory receiver: key -> (label, unit, higher is better)
DURABLE_METRICS: dict[str, tuple[str, str, bool]] = {
    "accepted_spans_per_s": ("spans/s accepted (first send until the last response)", "spans/s", True),
    "stored_spans_per_s": ("spans/s stored (first send until force_flush wrote them)", "spans/s", True),
    "p50_latency_ms": ("request latency, p50", "ms", False),
    "p99_latency_ms": ("request latency, p99", "ms", False),
}

# metric key -> (label, unit, target, comparison); the target applies to the receiver.
METRICS: dict[str, tuple[str, str, float | None, str]] = {
    "stored_spans_per_s": ("OTLP/HTTP, first send until force_flush wrote them", "spans/s", 10_000.0, ">="),
    "received_spans_per_s": ("OTLP/HTTP, first send until the last response", "spans/s", None, ""),
    "received_mb_per_s": ("OTLP/HTTP request bodies received", "MB/s", None, ""),
}


# -- the client process ----------------------------------------------------------------------
def client_main() -> None:
    """The client: builds spans, then per `send URL` line sends them all and answers
    `sent FAILED RETRIES P50_MS P99_MS` (the latency of one request: from its send until its response).

    Run as `python -c "from benchmarks.receiver import client_main; client_main()" SPANS BATCH KIND`.
    """
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    count, batch, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    spans = SyntheticSpans(SeededText(seed=7, corpus_bytes=2_000_000)).chat_spans(
        count, PAYLOAD_BYTES, distinct=True, per_trace=SPANS_PER_TRACE)
    batches = [spans[i:i + batch] for i in range(0, count, batch)]
    bodies = [encode_spans(b).SerializeToString() for b in batches]
    print(f"ready {sum(map(len, bodies))}", flush=True)
    send = _send_encoded if kind == "encoded" else _send_with_exporter
    for line in sys.stdin:
        command, _, url = line.strip().partition(" ")
        if command != "send":
            break
        latencies: list[float] = []
        failed, retries = send(url, batches if kind == "exporter" else bodies, latencies)
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        print(f"sent {failed} {retries} {p50 * 1e3:.3f} {p99 * 1e3:.3f}", flush=True)


def percentile(values: list[float], q: float) -> float:
    """The `q`th percentile (nearest rank) of `values`; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * q / 100) - 1))]


def _send_with_exporter(url: str, batches: list[Any], latencies: list[float]) -> tuple[int, int]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    exporter = OTLPSpanExporter(endpoint=url, timeout=120)
    failed = 0
    for batch in batches:
        started = time.perf_counter()
        failed += exporter.export(batch) is not SpanExportResult.SUCCESS
        latencies.append(time.perf_counter() - started)  # its encoding and its own retries included
    exporter.shutdown()
    return failed, 0  # the exporter retries on its own, unseen


def _send_encoded(url: str, bodies: list[bytes], latencies: list[float]) -> tuple[int, int]:
    """POST each body over one keep-alive connection; on 429/503 wait `Retry-After` and resend it."""
    parsed = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
    failed = retries = 0
    try:
        for body in bodies:
            for _ in range(100):
                started = time.perf_counter()
                conn.request("POST", parsed.path, body, {"Content-Type": "application/x-protobuf"})
                response = conn.getresponse()
                response.read()
                latencies.append(time.perf_counter() - started)
                if response.status not in (429, 503):
                    failed += response.status != 200
                    break
                retries += 1
                time.sleep(min(float(response.getheader("Retry-After") or 1), 1.0))
            else:
                failed += 1
    finally:
        conn.close()
    return failed, retries


class _Client:
    def __init__(self, sizes: Sizes, kind: str) -> None:
        code = "from benchmarks.receiver import client_main; client_main()"
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(sizes.spans), str(sizes.batch), kind],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.request_bytes = int(self._expect("ready")[0])
        self.retries = 0
        self.latency_ms = (0.0, 0.0)  # p50, p99 of the last `send`

    def _expect(self, word: str) -> str:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith(word):
            raise RuntimeError(f"benchmark client: expected {word!r}, got {line!r} (exit code {self.proc.poll()})")
        return line.split()[1:]

    def send(self, url: str) -> float:
        """Seconds until every batch was answered; raises if any export failed."""
        assert self.proc.stdin is not None
        started = time.perf_counter()
        self.proc.stdin.write(f"send {url}\n")
        self.proc.stdin.flush()
        failed, retries, p50, p99 = self._expect("sent")
        elapsed = time.perf_counter() - started
        failed, retries = int(failed), int(retries)
        self.retries += retries
        self.latency_ms = (float(p50), float(p99))
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


def _receiver_round(client: _Client, sizes: Sizes, store: Path, workers: int, durable: bool = False) -> dict[str, Any]:
    """One timed round; the workers (if any) start before the clock, as `collect` starts them once."""
    with OtlpReceiver(store, http_port=0, grpc_port=0, workers=workers, durable=durable) as receiver:
        cpu_started = _receiver_cpu(receiver)
        started = time.perf_counter()
        received = client.send(f"{receiver.http_endpoint}/v1/traces")
        if not receiver.flush(FLUSH_TIMEOUT_S):
            raise RuntimeError(f"the receiver's writer did not finish within {FLUSH_TIMEOUT_S} s")
        stored = time.perf_counter() - started
        cpu = _receiver_cpu(receiver) - cpu_started
        written = receiver.stats()["written_spans"]
    # a request some workers had room for and one had not is resent whole: its other shares are
    # written twice and read once, so the store must hold each span once and every accepted one
    distinct = Store(store).sql("select count(*) as n from spans").to_pylist()[0]["n"]
    if written != receiver.counts["accepted_traces"] or distinct != sizes.spans:
        raise RuntimeError(f"stored {distinct} of {sizes.spans} spans, wrote {written} ({receiver.counts})")
    p50, p99 = client.latency_ms
    return {"received_s": received, "stored_s": stored, "written_twice": written - sizes.spans,
            "cpu_us_per_span": cpu / sizes.spans * 1e6, "p50_latency_ms": p50, "p99_latency_ms": p99}


def _receiver_cpu(receiver: OtlpReceiver) -> float:
    """CPU seconds the receiver's workers have used; with none, this process's (the receiver runs in it;
    the client is another process)."""
    if receiver.workers is None:
        return time.process_time()
    return float(receiver.stats()["worker_cpu_s"])


# -- where the time goes -----------------------------------------------------------------------
def per_span_costs(spans: int, batch: int) -> dict[str, float]:
    """CPU µs per span of encoding the client's requests (what the OTLP exporter does before each
    send) and of decoding them (the receiver's request thread, before it answers), in this process."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from otel_replay.capture.receiver_decode import decode_body

    made = SyntheticSpans(SeededText(seed=7, corpus_bytes=2_000_000)).chat_spans(
        spans, PAYLOAD_BYTES, distinct=True, per_trace=SPANS_PER_TRACE)
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
def run_receiver_bench(quick: bool = False, store_dir: Path | None = None, workers: int | None = None,
                       client: str = "encoded") -> dict:
    """Time the receiver and the baseline over OTLP/HTTP; returns one JSON-ready dict.

    :param quick: one small round (a few seconds, for tests); the default takes about a minute.
    :param store_dir: where the receiver's stores go (kept); default a temporary directory (removed).
    :param workers: the receiver's worker processes (default: `collect`'s, one per core); 1: none.
    :param client: `encoded` (requests encoded before the clock) or `exporter` (the Python OTLP exporter).
    """
    if client not in CLIENTS:
        raise ValueError(f"client must be one of {', '.join(CLIENTS)}, got {client!r}")
    sizes = QUICK if quick else FULL
    workers = workers or auto_workers()
    started = time.perf_counter()
    machine = machine_info()
    root = Path(store_dir) if store_dir is not None else Path(tempfile.mkdtemp(prefix="otel-replay-bench-"))
    kind, client = client, _Client(sizes, client)
    rounds: list[dict[str, Any]] = []
    try:
        _baseline_round(client)  # warm-up: the client's first export pays for imports and caches
        for i in range(sizes.rounds):
            baseline = _baseline_round(client)
            timed = {}
            for mode in MODES if i % 2 == 0 else MODES[::-1]:  # alternating: neither always runs second
                timed[mode] = _receiver_round(client, sizes, root / f"round-{i}-{mode}", workers, mode == "durable")
            rounds.append({"baseline_s": baseline, **timed["memory"], "durable": timed["durable"]})
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
    durable = {key: _durable_metric(key, rounds, n) for key in DURABLE_METRICS}
    return {
        "quick": quick,
        "client": kind,
        "workers": workers,
        "client_retries": client.retries,
        "baseline": BASELINE,
        "machine": machine,
        "sizes": asdict(sizes),
        "payload_bytes_per_span": PAYLOAD_BYTES,
        "request_bytes_per_round": client.request_bytes,
        "rounds": rounds,
        "costs": costs,
        "metrics": metrics,
        "durable": durable,
        "elapsed_s": time.perf_counter() - started,
    }


def _metric(key: str, pairs: list[tuple[float, float]]) -> dict[str, Any]:
    label, unit, target, op = METRICS[key]
    receiver = statistics.median(p[0] for p in pairs)
    passed = None if target is None else (receiver >= target if op == ">=" else receiver <= target)
    return {"label": label, "unit": unit, "target": target, "op": op, "passed": passed, "receiver": receiver,
            "baseline": statistics.median(p[1] for p in pairs),
            "ratio_vs_baseline": statistics.median(p[0] / p[1] for p in pairs)}


def _durable_metric(key: str, rounds: list[dict[str, Any]], spans: int) -> dict[str, Any]:
    """One `DURABLE_METRICS` row: medians over the rounds of each mode, and of their per-round ratio."""
    label, unit, _ = DURABLE_METRICS[key]

    def value(r: dict[str, Any]) -> float:
        if key == "accepted_spans_per_s":
            return spans / r["received_s"]
        if key == "stored_spans_per_s":
            return spans / r["stored_s"]
        return float(r[key])

    pairs = [(value(r), value(r["durable"])) for r in rounds]
    return {"label": label, "unit": unit, "memory": statistics.median(p[0] for p in pairs),
            "durable": statistics.median(p[1] for p in pairs),
            "ratio": statistics.median(p[1] / p[0] for p in pairs if p[0] > 0) if any(p[0] > 0 for p in pairs) else 0.0}


def format_durable_table(result: dict) -> str:
    """`--durable` against the in-memory receiver, same run and load (median per-round ratio)."""
    header = ["--durable vs in-memory, same run and load", "in-memory", "--durable", "durable / in-memory"]
    rows = [header]
    for key, (label, unit, higher) in DURABLE_METRICS.items():
        m = result["durable"][key]
        worse = "lower" if higher else "higher"
        rows.append([label, f"{m['memory']:,.1f} {unit}", f"{m['durable']:,.1f} {unit}",
                     f"{m['ratio']:.2f}x ({worse} is worse)"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


_CLIENT_NOTES = {
    "encoded": "requests encoded (OTLP protobuf) before the clock and posted as they are, as a compiled sender "
               "such as the OpenTelemetry Collector would",
    "exporter": "the Python SDK's exporter (opentelemetry-exporter-otlp-proto-http), encoding each batch as it sends",
}


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
        f"Machine: {machine['cpus']} CPUs ({machine['cpu_model']}), {machine['implementation']} {machine['python']}"
        f"{speed_note(machine)}; {'quick' if result['quick'] else 'full'} run, {result['elapsed_s']:.1f} s.",
        f"Client: one process, one thread, one connection; {_CLIENT_NOTES[result['client']]}; {sizes['spans']:,} "
        f"distinct GenAI chat spans per round (~{result['payload_bytes_per_span']:,} payload bytes each, "
        f"{SPANS_PER_TRACE} to a trace) in requests of {sizes['batch']} spans, "
        f"{result['request_bytes_per_round'] / 1e6:.1f} MB of protobuf per round, no compression"
        + (f"; {result['client_retries']} requests resent after 503 (a worker's queue full)"
           if result.get("client_retries") else "") + ".",
        f"Receiver: `OtlpReceiver(workers={result['workers']})`"
        + (" (decoding and storing in this process)." if result["workers"] == 1 else
           f": {result['workers']} worker processes, started before the clock, each decoding and storing "
           f"its share of every request's traces."),
        f"Median of {sizes['rounds']} round(s) after an untimed warm-up; in each the baseline and then a fresh "
        f"receiver got the same spans. "
        f"The baseline column is the client's own ceiling (it stores nothing); its time is until the last response.",
    ]
    if result.get("rounds") and "cpu_us_per_span" in result["rounds"][0]:
        cpu = statistics.median(r["cpu_us_per_span"] for r in result["rounds"])
        where = "its workers' processes" if result["workers"] > 1 else "the receiver's process"
        notes.append(f"CPU per stored span ({where}, from the first send until force_flush; median of the rounds): "
                     f"{cpu:.0f} µs, less disturbed by other work on a shared machine than spans/s.")
    if result.get("costs"):
        costs = result["costs"]
        notes.append(f"CPU per span, the same spans in one process: the exporter encodes one in "
                     f"{costs['client_encode_us']:.0f} µs, the receiver decodes it in {costs['receiver_decode_us']:.0f} µs "
                     f"before answering; storing it is the capture writer's work (`otel-replay bench capture`).")
    out = lines + [""] + [f"- {note}" for note in notes]
    if result.get("durable"):
        out += ["", format_durable_table(result), "",
                "- Each round also ran a fresh `OtlpReceiver(durable=True)` (`collect --durable`: every request's body "
                "in a fsynced write-ahead log under the store before its answer; each worker its own log) on the same "
                "spans, the two modes in alternating order; the first table's receiver column is the in-memory one. "
                "Latency: one request, from its send until its response, at the client."]
    return "\n".join(out)
