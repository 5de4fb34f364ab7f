"""Receiver faults with the real `otel-replay collect` in a child process, over real sockets (shared
by tests/test_receiver_faults.py and `bench reliability`):

- `full_disk_acknowledgement`: the store fills up while OTLP batches arrive (protobuf over HTTP
  and gRPC, alternately). Which requests were acknowledged, which refused (503 + Retry-After,
  UNAVAILABLE + RetryInfo), and which acknowledged spans reached the store.
- `grpc_flood`: with `--token`, rounds of concurrent unauthenticated gRPC calls of 15 MB each
  while a real gRPC exporter with the token sends spans: the collect process's resident memory
  (VmRSS, sampled), how the flood was refused, and what the exporter got.

How a store is made unwritable (`mechanism_for`), best first:

- "tmpfs": the store on a private tmpfs (`unshare -rm`, no root needed), filled (ENOSPC) or
  remounted read-only (EROFS, which holds even for root);
- "rlimit" (full only): collect's RLIMIT_FSIZE set to 0 with prlimit, so writes fail with EFBIG
  (Python ignores SIGXFSZ);
- "chmod" (read-only only, not as root): the store's directories made read-only.

    python -m tests.harness.receiver_faults SCRATCH WORKERS MECHANISM   (the `Collect` child)
"""

from __future__ import annotations

import contextlib
import http.client
import inspect
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_replay.capture.processor import ReplayProcessor
from tests.harness.workload import REPO, chat_attributes, user_namespaces

TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
TRACE_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
LOGS_METHOD = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
FLUSH_INTERVAL_S: float = inspect.signature(ReplayProcessor).parameters["flush_interval_s"].default
"""How often collect's writer writes (it does not set its own): the most an acknowledgement can precede a failed write."""
STORED_SPANS_SQL = "select trace_id, count(*) as spans from spans group by trace_id"
MB = 1024 * 1024


# -- clients -----------------------------------------------------------------------------------------
def post(port: int, body: bytes, headers: dict[str, str] | None = None, source: str | None = None,
         content_type: str = "application/json") -> tuple[int, dict[str, str], bytes]:
    """One POST to /v1/traces on a new connection: (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0) if source else None)
    try:
        conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": content_type, **(headers or {})})
        response = conn.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        conn.close()


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll `condition` every 50 ms until it holds or `timeout` passes; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


class Recording(SpanExporter):
    """A real exporter, with the result of each of its exports kept."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner, self.results = inner, []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        self.results.append(result)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()


def trace_hex(n: int) -> str:
    """The trace id of request `n` (never all zeros)."""
    return f"{n + 1:032x}"


def span_body(n: int) -> bytes:
    """An OTLP/JSON body: one GenAI chat span, in trace `trace_hex(n)`."""
    attributes = [{"key": k, "value": {"stringValue": v}} for k, v in chat_attributes(f"question {n}").items()]
    span = {"traceId": trace_hex(n), "spanId": f"{n + 1:016x}", "name": "chat m", "kind": 3,
            "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000",
            "attributes": attributes}
    return json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "js"}}]}, "scopeSpans": [
        {"scope": {"name": "js-agent"}, "spans": [span]}]}]}).encode()


def span_request(n: int, spans: int = 1) -> ExportTraceServiceRequest:
    """An OTLP protobuf request: `spans` GenAI chat spans, all in trace `trace_hex(n)`."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name").value.string_value = "receiver-faults"
    scope = resource_spans.scope_spans.add()
    for i in range(spans):
        span = scope.spans.add(trace_id=bytes.fromhex(trace_hex(n)), span_id=(i + 1).to_bytes(8, "big"),
                               name=f"chat {i}", start_time_unix_nano=1_700_000_000_000_000_000 + i,
                               end_time_unix_nano=1_700_000_001_000_000_000 + i)
        for key, value in chat_attributes(f"question {n}.{i}").items():
            span.attributes.add(key=key).value.string_value = value
    return request


def grpc_call(endpoint: str, n: int, spans: int = 1, channel: grpc.Channel | None = None) -> grpc.RpcError | None:
    """One authorized Export of `span_request(n, spans)`; None when acknowledged, else the error."""
    with contextlib.ExitStack() as stack:
        if channel is None:
            channel = stack.enter_context(grpc.insecure_channel(endpoint))
        try:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(
                span_request(n, spans), metadata=tuple(AUTH.items()), timeout=30)
        except grpc.RpcError as exc:
            return exc
    return None


def retry_delay_s(error: grpc.RpcError) -> int:
    """The retry delay a refused gRPC call was given (google.rpc.RetryInfo), 0 without one."""
    info = dict(error.trailing_metadata() or ()).get("google.rpc.retryinfo-bin")
    return RetryInfo.FromString(info).retry_delay.seconds if info else 0


def stored_spans(store: Path) -> dict[str, int]:
    """Spans stored per trace id; empty while nothing is written."""
    from otel_replay import Store

    try:
        table = Store(store).sql(STORED_SPANS_SQL)
    except Exception:  # noqa: BLE001 - nothing written yet
        return {}
    return dict(zip(table.column("trace_id").to_pylist(), table.column("spans").to_pylist(), strict=True))


def stored_traces(store: Path) -> set[str]:
    return set(stored_spans(store))


# -- collect in a child process ----------------------------------------------------------------------
class CollectCli:
    """`otel-replay collect --token TOKEN` over `store` in a child process, both ports picked free;
    its stderr (the writer's warnings) goes to `stderr`."""

    def __init__(self, store: Path, workers: int, stderr: Path) -> None:
        command = [sys.executable, "-c", "from otel_replay.cli import main; main()", "--store", str(store), "collect",
                   "--http-port", "0", "--grpc-port", "0", "--token", TOKEN, "--workers", str(workers)]
        env = {k: v for k, v in os.environ.items() if k != "OTEL_REPLAY_COLLECT_TOKEN"}
        with open(stderr, "w", encoding="utf-8") as err:
            self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        self.lines = [self.proc.stdout.readline().rstrip() for _ in range(2)]
        self.http_port, self.grpc_endpoint = _endpoints(self.proc, self.lines, stderr)

    def stop(self) -> str:
        """SIGTERM, then what collect printed: "stopped RC: line / line ..."."""
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=300)
        return f"stopped {self.proc.returncode}: {' / '.join(out.splitlines())}"


def _endpoints(proc: subprocess.Popen, lines: list[str], stderr: Path) -> tuple[int, str]:
    """The HTTP port and gRPC endpoint from collect's first two lines (else it is killed: why, from `stderr`)."""
    if not lines[0].startswith("OTLP/HTTP  http://127.0.0.1:"):
        proc.kill()
        raise RuntimeError(f"collect did not start: {lines} {stderr.read_text() if stderr.exists() else ''}")
    return int(lines[0].split()[1].rsplit(":", 1)[1]), lines[1].split()[1]


def rss_of(pid: int) -> int:
    """Resident memory of process `pid` in bytes (VmRSS in /proc/PID/status)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class RssSampler:
    """Samples a process's resident memory every `every_s` on a daemon thread, keeping the peak."""

    def __init__(self, pid: int, every_s: float = 0.02) -> None:
        self.pid, self.every_s = pid, every_s
        self.peak = self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, RuntimeError):  # the process may have exited
                self.peak = max(self.peak, rss_of(self.pid))
                self.samples += 1
            self._stop.wait(self.every_s)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def mechanism_for(fault: str) -> str | None:
    """How to make `fault` ("full" or "read_only") here, best first; None when nothing can."""
    if user_namespaces():
        return "tmpfs"
    if fault == "full":
        return "rlimit"
    return "chmod" if os.geteuid() != 0 else None  # chmod does not stop root from writing


class Collect:
    """`CollectCli` in a child process (`fault_child`) that can make the store unwritable and mend it.

    The child takes on stdin: "ro", "rw" (tmpfs, chmod), "fill", "unfill" (tmpfs, rlimit),
    "written TRACE_ID..." (yes / no) and "stop"; it answers one line each. After "stop", the store is
    copied to `store` (outside the private mount), and collect's stderr is in `stderr`.
    """

    def __init__(self, scratch: Path, workers: int, mechanism: str) -> None:
        command = [sys.executable, "-m", "tests.harness.receiver_faults", str(scratch), str(workers), mechanism]
        if mechanism == "tmpfs":
            command = ["unshare", "-rm", *command]
        self.proc = subprocess.Popen(command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.store, self.stderr = scratch / "out", scratch / "collect.err"
        lines = [self.proc.stdout.readline().rstrip() for _ in range(2)]
        self.http_port, self.grpc_endpoint = _endpoints(self.proc, lines, self.stderr)

    def tell(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def must(self, command: str) -> None:
        if (answer := self.tell(command)) != "ok":
            raise RuntimeError(f"the collect child could not {command!r}: {answer}")

    def close(self) -> str:
        if self.proc.poll() is None:
            answer = self.tell("stop")
            self.proc.wait(120)
            return answer
        return f"exited {self.proc.returncode}"


def fault_child() -> None:
    """The child of `Collect`: runs collect over a store it can break and mend on command."""
    scratch, workers, mechanism = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    mount = scratch / "mnt"
    mount.mkdir()
    if mechanism == "tmpfs":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0755", "tmpfs", str(mount)], check=True)
    store, filler = mount / "store", mount / "filler"
    collect = CollectCli(store, workers, scratch / "collect.err")
    print("\n".join(collect.lines), flush=True)
    limit = resource.prlimit(collect.proc.pid, resource.RLIMIT_FSIZE)
    actions: dict[tuple[str, str], Callable[[], object]] = {
        ("ro", "tmpfs"): lambda: subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True),
        ("rw", "tmpfs"): lambda: subprocess.run(["mount", "-o", "remount,rw", str(mount)], check=True),
        ("ro", "chmod"): lambda: _chmod_dirs(store, 0o555),
        ("rw", "chmod"): lambda: _chmod_dirs(store, 0o755),
        ("fill", "tmpfs"): lambda: _fill(filler),
        ("unfill", "tmpfs"): filler.unlink,
        ("fill", "rlimit"): lambda: resource.prlimit(collect.proc.pid, resource.RLIMIT_FSIZE, (0, limit[1])),
        ("unfill", "rlimit"): lambda: resource.prlimit(collect.proc.pid, resource.RLIMIT_FSIZE, limit),
    }
    for line in sys.stdin:
        what = line.strip()
        if what.startswith("written "):
            print("yes" if set(what.split()[1:]) <= stored_traces(store) else "no", flush=True)
        elif what == "stop":
            stopped = collect.stop()
            if store.exists():
                shutil.copytree(store, scratch / "out")
            print(stopped, flush=True)
            return
        elif (what, mechanism) in actions:
            actions[what, mechanism]()
            print("ok", flush=True)
        else:
            print(f"cannot {what!r} with {mechanism}", flush=True)


def _fill(path: Path) -> None:
    with open(path, "wb", buffering=0) as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 65536)


def _chmod_dirs(root: Path, mode: int) -> None:
    for path in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        os.chmod(path, mode)


# -- 1. the store fills up while batches arrive ------------------------------------------------------
class _Sender:
    """Sends request after request, protobuf over HTTP (even numbers) and over gRPC (odd), keeping each answer."""

    def __init__(self, collect: Collect, spans: int) -> None:
        self.collect, self.spans = collect, spans
        self.channel = grpc.insecure_channel(collect.grpc_endpoint)
        self.sent: list[dict[str, Any]] = []

    def send(self) -> dict[str, Any]:
        n = len(self.sent)
        if n % 2 == 0:
            status, headers, _ = post(self.collect.http_port, span_request(n, self.spans).SerializeToString(),
                                      AUTH, content_type="application/x-protobuf")
            answer, retry = str(status), int(headers.get("Retry-After") or 0)
        else:
            error = grpc_call(self.collect.grpc_endpoint, n, self.spans, self.channel)
            answer, retry = ("OK", 0) if error is None else (error.code().name, retry_delay_s(error))
        sent = {"n": n, "via": "http" if n % 2 == 0 else "grpc", "answer": answer, "retry_s": retry,
                "acked": answer in ("200", "OK"), "refused": answer in ("503", "UNAVAILABLE"), "t": time.monotonic()}
        self.sent.append(sent)
        return sent

    def send_until(self, done: Callable[[dict[str, Any]], bool], timeout: float, gap_s: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done(self.send()):
                return True
            time.sleep(gap_s)
        return False


def full_disk_acknowledgement(hold_s: float, spans: int = 10, gap_s: float = 0.05) -> dict[str, Any]:
    """Collect (one process) receives a request every `gap_s`, `spans` spans each; its store fills up
    (mechanism "tmpfs" or "rlimit"), stays full `hold_s` after the first refusal, is emptied, then
    ten more requests. Returns the requests by phase and answer, and the acknowledged spans not stored."""
    mechanism = mechanism_for("full")
    scratch = Path(tempfile.mkdtemp(prefix="otel-replay-full-disk-"))
    try:
        collect = Collect(scratch, 1, mechanism)
        sender = _Sender(collect, spans)
        try:
            written = sender.send_until(lambda s: s["acked"] and collect.tell(f"written {trace_hex(0)}") == "yes",
                                        60, max(gap_s, 0.25))  # the writer's first write is done: the store works
            fault = len(sender.sent)
            collect.must("fill")
            t_fault = time.monotonic()
            sender.send_until(lambda s: s["refused"], 60, gap_s)
            sender.send_until(lambda s: False, hold_s, gap_s)
            mend = len(sender.sent)
            collect.must("unfill")
            t_mend = time.monotonic()
            sender.send_until(lambda s: s["acked"], 60, gap_s)
            resumed_s = sender.sent[-1]["t"] - t_mend if sender.sent[-1]["acked"] else None
            for _ in range(10):
                sender.send()
        finally:
            sender.channel.close()
            stopped = collect.close()
        stored = stored_spans(collect.store)
        warnings = collect.stderr.read_text().splitlines()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _acknowledgement_figures(sender.sent, stored, spans, fault, mend, {
        "mechanism": mechanism, "written_before": written, "fault_s": sender.sent[mend - 1]["t"] - t_fault,
        "resumed_s": resumed_s, "stopped": stopped, "exit_ok": stopped.startswith("stopped 0"),
        "failure_warnings": sum("cannot write to the store" in w for w in warnings),
        "resume_warnings": sum("capture resumed" in w for w in warnings)})


def _acknowledgement_figures(sent: list[dict[str, Any]], stored: dict[str, int], spans: int, fault: int, mend: int,
                             run: dict[str, Any]) -> dict[str, Any]:
    """What the answers promised against what the store holds."""
    for s in sent:
        s["lost"] = spans - stored.get(trace_hex(s["n"]), 0) if s["acked"] else 0
    during = sent[fault:mend]
    first = next((s["n"] for s in during if s["refused"]), None)  # the writer's first failed write is before it
    refusing = [s for s in during if first is not None and s["n"] >= first]
    lost = [s for s in sent if s["lost"]]
    window = [s for s in lost if first is not None and s["n"] < first]
    in_window = {s["n"] for s in window}
    return {
        **run, "spans_per_request": spans, "flush_interval_s": FLUSH_INTERVAL_S, "requests": len(sent),
        "answers": {phase: dict(Counter(f"{s['via']} {s['answer']}" for s in part)) for phase, part in
                    (("before", sent[:fault]), ("during", during), ("after", sent[mend:]))},
        "acked_spans": spans * sum(s["acked"] for s in sent),
        "stored_acked_spans": sum(spans - s["lost"] for s in sent if s["acked"]),
        "acked_in_fault_before_refusal": sum(s["acked"] for s in during if first is None or s["n"] < first),
        "lost_spans": sum(s["lost"] for s in lost),
        "lost_in_window": sum(s["lost"] for s in window),
        "lost_beyond_window": sum(s["lost"] for s in lost if s["n"] not in in_window),
        "window_s": sent[first]["t"] - min(s["t"] for s in window) if window else 0.0,
        "refused_during": sum(s["refused"] for s in refusing), "during_after_refusal": len(refusing),
        "refused_with_retry": sum(s["refused"] and s["retry_s"] >= 1 for s in refusing),
        "acked_after_mend": sum(s["acked"] for s in sent[mend:]),
        "lost_after_mend": sum(s["lost"] for s in sent[mend:]),
    }


# -- 2. unauthenticated gRPC flood -------------------------------------------------------------------
class _Exporter:
    """A real gRPC exporter with the token, ending one span every `every_s` on its own thread."""

    def __init__(self, endpoint: str, every_s: float = 0.05) -> None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        self.exporter = Recording(OTLPSpanExporter(endpoint=endpoint, insecure=True, headers=AUTH, timeout=30))
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("legitimate")
        self.trace_ids: list[str] = []
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="legitimate-exporter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with self.tracer.start_as_current_span("chat m", attributes=chat_attributes("legitimate")) as span:
                self.trace_ids.append(f"{span.get_span_context().trace_id:032x}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        self.provider.shutdown()


def flood_message(megabytes: float) -> bytes:
    """A well-formed OTLP request of about `megabytes` MB (one span with a large attribute)."""
    request = span_request(10**6)
    request.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="padding").value.string_value = (
        "x" * int(megabytes * MB))
    return request.SerializeToString()


def _flood(endpoint: str, message: bytes, calls: int, rounds: int) -> Counter[str]:
    """`rounds` of `calls` concurrent Export calls without the token, each on its own connection; their codes."""
    codes: Counter[str] = Counter()
    for _ in range(rounds):
        channels = [grpc.insecure_channel(endpoint) for _ in range(calls)]
        pending = [channel.unary_unary(TRACE_METHOD).future(message, timeout=60) for channel in channels]
        codes.update(call.code().name for call in pending)
        for channel in channels:
            channel.close()
    return codes


def grpc_flood(calls: int, rounds: int, megabytes: float = 15.0) -> dict[str, Any]:
    """Collect (one process, `--token`) under `rounds` of `calls` concurrent unauthenticated Export calls
    of `megabytes` MB, while `_Exporter` sends with the token: collect's VmRSS before and at peak, the
    flood's status codes, the exporter's results and whether its spans were stored."""
    scratch = Path(tempfile.mkdtemp(prefix="otel-replay-flood-"))
    store = scratch / "store"
    try:
        collect = CollectCli(store, 1, scratch / "collect.err")
        legitimate = _Exporter(collect.grpc_endpoint)
        try:
            warm = wait_until(lambda: bool(legitimate.trace_ids) and legitimate.trace_ids[0] in stored_traces(store),
                              60)  # the writer's first write done: its one-off allocations are in the baseline
            before = 0
            for _ in range(10):
                before = max(before, rss_of(collect.proc.pid))
                time.sleep(0.02)
            sampler = RssSampler(collect.proc.pid)
            codes = _flood(collect.grpc_endpoint, flood_message(megabytes), calls, rounds)
            time.sleep(0.2)
            peak = sampler.stop()
        finally:
            legitimate.stop()
            stopped = collect.stop()
        stored = stored_traces(store)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results = legitimate.exporter.results
    return {"calls": calls, "rounds": rounds, "megabytes": megabytes, "flood_calls": calls * rounds,
            "codes": dict(codes), "unauthenticated": codes["UNAUTHENTICATED"], "flood_ok": codes["OK"],
            "rss_before": before, "rss_peak": peak, "rss_growth": max(peak - before, 0), "samples": sampler.samples,
            "warm": warm, "legitimate_exports": len(results), "legitimate_successes": results.count(SpanExportResult.SUCCESS),
            "legitimate_spans": len(legitimate.trace_ids), "legitimate_stored": sum(t in stored for t in legitimate.trace_ids),
            "stopped": stopped, "exit_ok": stopped.startswith("stopped 0")}


if __name__ == "__main__":
    fault_child()
