"""Coverage-guided fuzzing (atheris / libFuzzer) of every importer and of the OTLP receiver.

One target per importer (`flat_json`, `otlp_json`, `otlp_proto`, `langsmith`, `langfuse_api`,
`jaeger`, `whowhen`), one for format sniffing (`files_sniff`), two for the receiver's decoder
(`receiver_json`, `receiver_proto`) and one for its HTTP handling (`receiver_http`: raw
requests, content types, gzip/deflate, chunked bodies). A target fails (a "crash") when:

- anything but the documented error escapes (`SourceError` for importers, `RequestError` for
  the decoder; for the handler, any well-formed response but a 500);
- a record it returns would not store: normalizing it, building its rows and converting them
  to Arrow must not raise;
- one input takes more than `TIMEOUT_S` seconds, or the process passes `RSS_LIMIT_MB`.

`atheris.Fuzz()` never returns, so each target runs in its own subprocess:

    python -m otel_replay.testing.fuzzing otlp_json -max_total_time=20   # one target
    fuzz_summary(120)   # every target, a share of 120 s each, -> {target: {inputs, seconds, crashes}}
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

TIMEOUT_S = 5  # per input: nothing here should take a second on inputs of MAX_LEN bytes
RSS_LIMIT_MB = 1536
MAX_LEN = 32768
FILE_TARGETS = {"flat_json": "flat", "otlp_json": "otlp", "otlp_proto": "otlp", "langsmith": "langsmith",
                "langfuse_api": "langfuse", "jaeger": "jaeger", "whowhen": "whowhen", "files_sniff": "auto"}
JSON_TARGETS = {"flat_json", "otlp_json", "langsmith", "langfuse_api", "jaeger", "whowhen", "files_sniff",
                "receiver_json"}
TARGETS = (*FILE_TARGETS, "receiver_json", "receiver_proto", "receiver_http")
_OK_STATUSES = {200, 400, 404, 405, 408, 411, 413, 415, 429, 503}  # 429: over the per-client rate
_DONE = re.compile(r"Done (\d+) runs in (\d+) second")
SCRATCH_ENV = "OTEL_REPLAY_FUZZ_SCRATCH"


class FuzzingUnavailable(RuntimeError):
    """atheris is not installed (`pip install 'otel-replay[fuzz]'`)."""


def _require_atheris() -> Any:
    try:
        import atheris
    except ImportError:
        raise FuzzingUnavailable("fuzzing needs atheris: pip install 'otel-replay[fuzz]' (or pip install atheris)") \
            from None
    return atheris


# -- what every target checks ------------------------------------------------------------------
def assert_storable(spans: list[Any], logs: list[Any] = ()) -> None:  # type: ignore[assignment]
    """Records a reader returned pass its checks and become Arrow rows of the store's schema, the
    way `store.ingest` makes them (normalize, redact, rows), short of writing the files."""
    from otel_replay.normalize.pipeline import normalize_spans
    from otel_replay.normalize.sources.checks import check_log, check_span
    from otel_replay.store.rows import RowBatch, RowBuilder
    from otel_replay.store.writer import to_arrow

    for span in spans:
        check_span(span)
    for log in logs:
        check_log(log)
    normalized, _ = normalize_spans(spans, logs)
    try:  # what ingest and the capture writer do next: redact (when the redaction layer is there)
        from otel_replay.normalize.redact import DEFAULT_PRIVACY
    except ImportError:
        DEFAULT_PRIVACY = None  # noqa: N806
    if DEFAULT_PRIVACY is not None:
        normalized = [DEFAULT_PRIVACY(n) for n in normalized]
    batch = RowBatch()
    RowBuilder(source="fuzz").add_all(batch, normalized)
    to_arrow(batch.messages, "message_rows")
    for rows in batch.spans.values():
        to_arrow(rows, "span_rows")
    for rows in batch.steps.values():
        to_arrow(rows, "step_rows")


def _file_target(target: str, workdir: Path) -> Callable[[bytes], None]:
    from otel_replay.normalize.sources import files
    from otel_replay.normalize.sources.errors import SourceError

    fmt = FILE_TARGETS[target]
    path = workdir / ("input.pb" if target == "otlp_proto" else "input.json")

    def run(data: bytes) -> None:
        path.write_bytes(data)
        try:
            batch = files.READERS[files.sniff(path) if fmt == "auto" else fmt](path)
        except SourceError:
            return
        assert_storable(batch.spans, batch.logs)

    return run


def _decode_target(as_json: bool) -> Callable[[bytes], None]:
    from otel_replay.capture.receiver_decode import LOGS, TRACES, RequestError, decode_body

    def run(data: bytes) -> None:
        if not data:
            return
        signal = LOGS if data[0] & 1 else TRACES
        try:
            records, _ = decode_body(signal, data[1:], as_json)
        except RequestError as exc:
            assert exc.status in (400, 413), exc.status
            return
        assert_storable(records if signal == TRACES else [], records if signal == LOGS else [])

    return run


def _http_target(workdir: Path) -> Callable[[bytes], None]:
    """The real handler of a real (not listening) receiver, fed over a socket pair, one request each."""
    from otel_replay.capture.processor import ReplayProcessor
    from otel_replay.capture.receiver import OtlpReceiver
    from otel_replay.capture.receiver_http import HttpServer, _OtlpHandler

    receiver = OtlpReceiver(workdir / "store", http_port=0, grpc_port=0, read_timeout_s=0.5, max_body_mb=1)
    receiver.processor = ReplayProcessor(workdir / "store", flush_interval_s=0.5)
    server = HttpServer(receiver)  # bound, never serving: requests are handed to the handler below

    def run(data: bytes) -> None:
        ours, theirs = socket.socketpair()
        replies: list[bytes] = []
        reader = threading.Thread(target=_read_all, args=(ours, replies), daemon=True)
        try:
            reader.start()  # pipelined requests can answer more than a socket buffer holds
            sender = threading.Thread(target=_send_all, args=(ours, data), daemon=True)
            sender.start()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the response had nowhere to go
                _OtlpHandler(theirs, ("127.0.0.1", 0), server)
            theirs.shutdown(socket.SHUT_RDWR)
            sender.join(TIMEOUT_S)
            reader.join(TIMEOUT_S)
        finally:
            theirs.close()
            ours.close()
        reply = b"".join(replies)
        for status in re.findall(rb"HTTP/1\.[01] (\d{3}) ", reply):
            assert int(status) != 500, reply[:600]  # 500: a decoder or handler bug caught by the catch-all
        assert b"Error code: 500" not in reply, reply[:600]  # the stdlib's page for an HTTP/0.9 request
        failed = [k for k in receiver.processor.stats["skipped"] if k.startswith(("writer error", "unreadable span"))]
        assert not failed, f"the capture writer failed on an accepted record: {failed}"

    return run


def _send_all(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # the client sent everything: reads past it see EOF


def _read_all(sock: socket.socket, out: list[bytes]) -> None:
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            out.append(chunk)


def target(name: str, workdir: Path) -> Callable[[bytes], None]:
    """The function atheris calls with each input of target `name` (scratch files go in `workdir`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    if name in FILE_TARGETS:
        return _file_target(name, workdir)
    if name in ("receiver_json", "receiver_proto"):
        return _decode_target(name == "receiver_json")
    if name == "receiver_http":
        return _http_target(workdir)
    raise KeyError(f"no fuzz target {name!r}; targets: {', '.join(TARGETS)}")


# -- running --------------------------------------------------------------------------------------
def main(argv: list[str]) -> None:
    """`python -m otel_replay.testing.fuzzing TARGET [libFuzzer flags] [corpus dirs]`; never returns."""
    atheris = _require_atheris()
    from otel_replay.testing import fuzz_seeds

    name = argv[1]
    scratch = os.environ.get(SCRATCH_ENV)  # run_target's, removed with its workdir; else one reused per target
    workdir = Path(scratch or Path(tempfile.gettempdir()) / f"otel-replay-fuzz-scratch-{name}")
    run = target(name, workdir)
    kwargs: dict[str, Any] = {}
    if name in JSON_TARGETS:
        prefix = 1 if name.startswith("receiver_") else 0
        kwargs["custom_mutator"] = lambda data, size, seed: fuzz_seeds.json_mutator(data, size, seed, prefix)
    atheris.Setup([argv[0], *argv[2:]], run, **kwargs)
    atheris.Fuzz()


_BOOT = ("import sys, atheris\n"
         "with atheris.instrument_imports(include=['otel_replay']):\n"
         "    from otel_replay.testing import fuzzing\n"
         "fuzzing.main(sys.argv)\n")


def run_target(name: str, seconds: float, workdir: Path | None = None) -> dict[str, Any]:
    """Fuzz one target for `seconds` in a subprocess; {inputs, seconds, crashes} (and the failure)."""
    _require_atheris()
    from otel_replay.testing import fuzz_seeds

    own = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix=f"otel-replay-fuzz-{name}-")) if workdir is None else workdir
    corpus = workdir / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(fuzz_seeds.corpus(name)):
        (corpus / f"seed-{i:03d}").write_bytes(seed)
    flags = [f"-max_total_time={max(1, round(seconds))}", f"-timeout={TIMEOUT_S}", f"-rss_limit_mb={RSS_LIMIT_MB}",
             f"-max_len={MAX_LEN}", f"-artifact_prefix={workdir}/", "-print_final_stats=1"]
    try:
        done = subprocess.run([sys.executable, "-c", _BOOT, name, *flags, str(corpus)], capture_output=True,
                              text=True, errors="replace", timeout=seconds + 120, cwd=workdir,
                              env={**os.environ, SCRATCH_ENV: str(workdir / "scratch")})
        output = done.stdout + done.stderr
        found = _DONE.findall(output)
        result: dict[str, Any] = {"inputs": int(found[-1][0]) if found else _runs(output),
                                  "seconds": int(found[-1][1]) if found else round(seconds),
                                  "crashes": 0 if done.returncode == 0 and found else 1}
        if result["crashes"]:
            artifacts = sorted(p.name for p in workdir.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-")))
            result["failure"] = _failure(output)
            result["artifacts"] = artifacts
            if own:  # keep the reproducer: the caller cannot see the workdir otherwise
                result["workdir"] = str(workdir)
                own = False
        return result
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


def _runs(output: str) -> int:
    counts = re.findall(r"stat::number_of_executed_units:\s*(\d+)", output) or re.findall(r"#(\d+)\s", output)
    return int(counts[-1]) if counts else 0


def _failure(output: str) -> str:
    """The part of the fuzzer's output that says what went wrong."""
    for marker in ("=== Uncaught Python exception", "==ERROR", "ALARM", "Traceback"):
        at = output.find(marker)
        if at >= 0:
            return output[at:at + 3000]
    return output[-3000:]


def fuzz_summary(seconds: float, targets: tuple[str, ...] = TARGETS) -> dict[str, dict[str, Any]]:
    """Fuzz every target for an equal share of `seconds`, one subprocess each, one after another.

    Returns {target: {"inputs": n, "seconds": s, "crashes": 0 or 1}}; a crashed target also has
    "failure" (the traceback) and "artifacts"/"workdir" (the input that crashed it). Raises
    `FuzzingUnavailable` when atheris is not installed.
    """
    _require_atheris()
    share = max(1.0, seconds / len(targets))
    return {name: run_target(name, share) for name in targets}


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: python -m otel_replay.testing.fuzzing TARGET [libFuzzer flags]; targets: {', '.join(TARGETS)}")
    _require_atheris()
    os.execv(sys.executable, [sys.executable, "-c", _BOOT, *sys.argv[1:]])  # again, with otel_replay instrumented
