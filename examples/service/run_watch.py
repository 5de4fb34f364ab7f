"""Continuous blame: the service sends OTLP to `otel-replay collect`, and `watch` attributes its failures.

    python examples/service/run_watch.py [--store DIR] [--backend URL] [-n 20]

1. starts `otel-replay collect` on free loopback ports, writing to `--store` (default: a fresh
   temporary directory),
2. starts `app.py` with no store of its own: its OpenTelemetry SDK sends every span over OTLP/HTTP
   to collect and, with `--backend URL` (an OTLP/HTTP endpoint such as Phoenix's
   http://127.0.0.1:6006), to that trace backend too. In production one OTLP destination, an
   OpenTelemetry Collector, would fan the spans out to both (collectors/ has such a configuration);
   here the SDK exports to each itself, which needs no other program,
3. runs `load.py` against it, then stops it with SIGTERM (its exporters flush),
4. waits until collect has stored the spans of every request,
5. `otel-replay watch --once --settle 0`: scores each new trace with the support agent's verifier,
   attributes one trace per group of identical failures (the others are linked to its result),
   and with `--backend` sends the blame into the original traces (`--export otlp`). Nobody runs
   `attribute`,
6. shows `otel-replay jobs` and `otel-replay traces --failed`, then stops collect with SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_batch import HERE, POLICIES, VERIFIER, otel_replay, stop_service

from otel_replay import Store

SERVICE_TRACES = "root_name = 'POST /ask' and service_name = 'support-service'"


def otel_replay_command() -> list[str]:
    """The `otel-replay` command beside this interpreter, else `python -c ...`."""
    exe = Path(sys.executable).with_name("otel-replay")
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from otel_replay.cli import main; main()"]


def start_collect(store: Path) -> tuple[subprocess.Popen[str], str]:
    """`otel-replay collect` on free loopback ports; returns (process, its OTLP/HTTP base URL) once it listens."""
    print(f"$ otel-replay --store {store} collect --http-port 0 --grpc-port 0 --workers 1", flush=True)
    process = subprocess.Popen([*otel_replay_command(), "--store", str(store), "collect", "--http-port", "0",
                                "--grpc-port", "0", "--workers", "1"],  # one process is plenty for this load
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:  # the banner: OTLP/HTTP, OTLP/gRPC, store, workers, durable
        print(f"collect: {line.rstrip()}", flush=True)
        if line.startswith("durable"):
            break
        if line.startswith("OTLP/HTTP"):
            url = line.split()[1]
    else:
        process.kill()
        raise SystemExit(f"collect did not start (exit code {process.wait()})")
    return process, url


def stop_collect(process: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """SIGTERM: collect writes everything it accepted and prints its counts."""
    process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise SystemExit(f"collect did not stop within {timeout:.0f} s") from None
    for line in out.splitlines():
        print(f"collect: {line}", flush=True)


def start_service(endpoints: list[str], seed: int) -> tuple[subprocess.Popen[str], str]:
    """app.py on a free port, exporting OTLP to each endpoint; returns (process, base url) once it listens."""
    command = [sys.executable, str(HERE / "app.py"), "--port", "0", "--model-seed", str(seed)]
    for endpoint in endpoints:
        command += ["--otlp-endpoint", endpoint]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()  # "listening on URL (...)", or "" if it died
    if not line.startswith("listening on "):
        process.kill()
        raise SystemExit(f"the service did not start (exit code {process.poll()}): {line.strip()!r}")
    print(f"service: {line.strip()}", flush=True)
    return process, line.split()[2]


def wait_stored(store: Path, trace_ids: set[str], timeout: float = 60.0) -> int:
    """Wait until every trace in `trace_ids` is in the store and its span count stopped growing
    (collect writes what it accepted every 2 s); returns the number of spans stored."""
    deadline, last = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        rows = Store(store).sql("select trace_id, count(*) as n from spans group by trace_id").to_pylist()
        counts = {r["trace_id"]: r["n"] for r in rows}
        total = sum(counts.get(t, 0) for t in trace_ids)
        if trace_ids <= counts.keys() and total == last:
            return total
        last = total
        time.sleep(2.5)
    raise SystemExit(f"collect stored {len(trace_ids & counts.keys())} of {len(trace_ids)} traces within {timeout:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, help="collect's store directory (default: a fresh temporary directory)")
    parser.add_argument("--backend", metavar="URL",
                        help="an OTLP/HTTP trace backend (e.g. Phoenix's http://127.0.0.1:6006): the service's spans "
                             "and the blame go there too (default: none, the blame stays in the store)")
    parser.add_argument("-n", "--requests", type=int, default=20, help="questions the load sends (default 20)")
    parser.add_argument("--max-rollouts", type=int, default=400, help="watch's cap per plan (default 400)")
    parser.add_argument("--model-seed", type=int, default=2,
                        help="the service's simulated model seed (default 2: 3 of the 20 default questions fail)")
    args = parser.parse_args()
    store: Path = args.store or Path(tempfile.mkdtemp(prefix="otel-replay-watch-"))
    store.mkdir(parents=True, exist_ok=True)
    outcomes = store.parent / f"{store.name}-load.json"

    collect, collect_url = start_collect(store)
    try:
        service, url = start_service([collect_url, *([args.backend] if args.backend else [])], args.model_seed)
        try:
            subprocess.run([sys.executable, str(HERE / "load.py"), "--url", url, "-n", str(args.requests),
                            "--record", str(outcomes)], check=True)
        finally:
            stop_service(service)
        load = json.loads(outcomes.read_text())
        spans = wait_stored(store, {*load["passed"], *load["failed"]})
        print(f"collect stored {spans} spans of the {args.requests} requests", flush=True)

        watch = ["watch", "--once", "--settle", "0", "--where", SERVICE_TRACES, "--policies", POLICIES,
                 "--verifier", VERIFIER, "--max-rollouts", str(args.max_rollouts), "--concurrency", "8"]
        if args.backend:
            watch += ["--export", "otlp", "--otlp-endpoint", args.backend, "--otlp-protocol", "http/protobuf"]
        otel_replay(store, *watch)
        otel_replay(store, "jobs")
        otel_replay(store, "traces", "--failed")
    finally:
        stop_collect(collect)
    print(f"store: {store}")


if __name__ == "__main__":
    main()
