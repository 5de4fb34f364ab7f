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

    python -m tests.harness.fuzzing otlp_json -max_total_time=20   # one target
    fuzz_summary(120)   # every target, a share of 120 s each, -> {target: {inputs, seconds, crashes}}

A finding always leaves an artifact (libFuzzer writes the input as `crash-`, `timeout-`, `oom-`
or `leak-`). A fuzzer that ends without one and without finishing its run did not fail on an
input: that is a harness failure (it could not start, or was killed from outside), reported as
`harness_error` with the fuzzer's own error lines, never as a crash, and tried again (up to
`START_ATTEMPTS` times, each in a new work directory). The likely cause of the one seen here
(a work directory left holding only `scratch/`, recreated by the fuzzer after the directory with
its corpus had been removed from the shared temp directory): libFuzzer then stops at once with
"The required directory ... does not exist"; `tests/test_fuzz.py` reproduces it.
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
import time
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
_FINDING = re.compile(r"=== Uncaught Python exception|==\d+== ?ERROR: libFuzzer|^ALARM", re.MULTILINE)
_ARTIFACTS = ("crash-", "timeout-", "oom-", "leak-")
SCRATCH_ENV = "OTEL_REPLAY_FUZZ_SCRATCH"
REPO = Path(__file__).resolve().parents[2]  # the repository root: tests.harness is imported from there
START_ATTEMPTS = 3  # a run that ends without a finding and without finishing is tried again
START_GRACE_S = 300  # beyond the fuzzing time: instrumented imports and the seed corpus on a loaded machine


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
        from otel_replay.normalize.privacy import DEFAULT_PRIVACY
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
    """`python -m tests.harness.fuzzing TARGET [libFuzzer flags] [corpus dirs]`; never returns."""
    atheris = _require_atheris()
    from tests.harness import fuzz_seeds

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


def _pythonpath() -> str:
    """The repository root first (the child runs in `workdir` and imports `tests.harness.fuzzing`)."""
    return os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])


_BOOT = ("import sys, atheris\n"
         "with atheris.instrument_imports(include=['otel_replay']):\n"
         "    from tests.harness import fuzzing\n"
         "fuzzing.main(sys.argv)\n")


def run_target(name: str, seconds: float, workdir: Path | None = None) -> dict[str, Any]:
    """Fuzz one target for `seconds` in a subprocess: {inputs, seconds, crashes, attempts}; a crash adds
    the failure and its artifacts, a run that could not start or finish adds `harness_error`."""
    _require_atheris()
    errors: list[str] = []
    for attempt in range(1, START_ATTEMPTS + 1):
        result = _attempt(name, seconds, workdir)
        result["attempts"] = attempt
        if "harness_error" not in result:
            break
        errors.append(result["harness_error"])
    if errors and "harness_error" not in result:
        result["harness_retries"] = errors  # started on a later attempt: say why the earlier ones did not
    return result


def _attempt(name: str, seconds: float, workdir: Path | None) -> dict[str, Any]:
    from tests.harness import fuzz_seeds

    own = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix=f"otel-replay-fuzz-{name}-")) if workdir is None else workdir
    corpus = workdir / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(fuzz_seeds.corpus(name)):
        (corpus / f"seed-{i:03d}").write_bytes(seed)
    flags = [f"-max_total_time={max(1, round(seconds))}", f"-timeout={TIMEOUT_S}", f"-rss_limit_mb={RSS_LIMIT_MB}",
             f"-max_len={MAX_LEN}", f"-artifact_prefix={workdir}/", "-print_final_stats=1"]
    started = time.monotonic()
    try:
        try:
            done = subprocess.run([sys.executable, "-c", _BOOT, name, *flags, str(corpus)], capture_output=True,
                                  text=True, errors="replace", timeout=seconds + START_GRACE_S, cwd=workdir,
                                  env={**os.environ, SCRATCH_ENV: str(workdir / "scratch"), "PYTHONPATH": _pythonpath()})
            returncode, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:  # killed: the output so far says how far it got
            returncode, output = None, _text(exc.stdout) + _text(exc.stderr)
        found = _DONE.findall(output)
        artifacts = sorted(p.name for p in workdir.iterdir() if p.name.startswith(_ARTIFACTS)) \
            if workdir.is_dir() else []
        result: dict[str, Any] = {"inputs": int(found[-1][0]) if found else _runs(output),
                                  "seconds": int(found[-1][1]) if found else 0, "crashes": 0}
        if artifacts or _FINDING.search(output):
            result.update(crashes=1, failure=_failure(output), artifacts=artifacts,
                          seconds=result["seconds"] or round(time.monotonic() - started))
            if own:  # keep the reproducer: the caller cannot see the workdir otherwise
                result["workdir"] = str(workdir)
                own = False
        elif not (found and returncode == 0):
            result["harness_error"] = _harness_error(returncode, output, corpus, seconds + START_GRACE_S)
        return result
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


def _text(value: str | bytes | None) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value or ""


def _harness_error(returncode: int | None, output: str, corpus: Path, deadline_s: float) -> str:
    """Why a run without a finding did not finish, in a line or a few: the exit, the fuzzer's own
    error lines (not its start-up chatter), and a corpus that vanished."""
    if returncode is None:
        how = f"did not finish within {deadline_s:.0f} s (killed)"
    elif returncode < 0:
        how = f"was killed by signal {-returncode} from outside (libFuzzer left no artifact: not a finding)"
    else:
        how = f"exited with code {returncode} without finishing"
    started = "started fuzzing" if re.search(r"#\d+\s+INITED", output) else "before its first input"
    said = [line for line in output.splitlines() if line.strip() and not line.startswith("INFO:")
            and "Failed to find function" not in line][-8:]
    if not corpus.is_dir():
        said.append(f"the corpus directory {corpus} is gone: something removed the work directory while the "
                    f"fuzzer ran (a clean-up of the temp directory?)")
    return f"the fuzzer {how}, {started}" + (": " + " | ".join(said) if said else "")


def _runs(output: str) -> int:
    counts = re.findall(r"stat::number_of_executed_units:\s*(\d+)", output) or re.findall(r"#(\d+)\s", output)
    return int(counts[-1]) if counts else 0


def _failure(output: str) -> str:
    """The part of the fuzzer's output that says what went wrong."""
    found = _FINDING.search(output)
    at = found.start() if found else output.find("Traceback")
    return output[at:at + 3000] if at >= 0 else output[-3000:]


def fuzz_summary(seconds: float, targets: tuple[str, ...] = TARGETS) -> dict[str, dict[str, Any]]:
    """Fuzz every target for an equal share of `seconds`, one subprocess each, one after another.

    Returns {target: {"inputs": n, "seconds": s, "crashes": 0 or 1, "attempts": n}}; a crashed
    target also has "failure" (the traceback) and "artifacts"/"workdir" (the input that crashed
    it); one whose fuzzer could not start or finish in `START_ATTEMPTS` tries has "harness_error"
    (not a crash: no input was implicated). Raises `FuzzingUnavailable` when atheris is not installed.
    """
    _require_atheris()
    share = max(1.0, seconds / len(targets))
    return {name: run_target(name, share) for name in targets}


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: python -m tests.harness.fuzzing TARGET [libFuzzer flags]; targets: {', '.join(TARGETS)}")
    _require_atheris()
    os.execv(sys.executable, [sys.executable, "-c", _BOOT, *sys.argv[1:]])  # again, with otel_replay instrumented
