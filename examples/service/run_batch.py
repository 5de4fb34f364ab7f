"""The nightly batch: run the service under load, then attribute every failing trace and aggregate.

    python examples/service/run_batch.py [--store DIR] [-n 20] [--max-rollouts 400]

1. starts `app.py` in the background on a free port (store: `--store`, default a fresh temp dir),
2. runs `load.py` against it (N support questions; it prints how many were refunded correctly),
3. stops the service with SIGTERM, which flushes every captured span to the store,
4. `otel-replay attribute --where ...` over the failing traces, re-deciding steps with the support
   agent's policies (`otel_replay.testing.support_policies`: the simulated model and the real tools),
5. `otel-replay aggregate`: which step name is the culprit across the failing runs.

Choosing the failing traces: a wrong answer is not an error (every span ends `ok`; the traces
view marks `status = 'error'` only for an errored root or last step), and attributing a passing
run is an error, so the batch needs a predicate that selects exactly the runs the verifier fails.
The data support one: a customer owed a refund was failed exactly when the agent never called
`issue_refund`, so the job selects the service's traces without an `issue_refund` tool step (a
SQL predicate, the way a batch job over a shared store would select runs; no side channel from
the load script). As a check, the load script records which trace ids it saw fail, and this
script verifies that the predicate selects the same set before attributing.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from otel_replay import Store
from otel_replay.attribution.job import select_traces

HERE = Path(__file__).resolve().parent
VERIFIER = "otel_replay.testing.support_agent:refunded"
POLICIES = "otel_replay.testing.support_policies"
FAILING = ("root_name = 'POST /ask' and service_name = 'support-service' and trace_id not in "
           "(select trace_id from steps where kind = 'tool' and name = 'issue_refund')")


VERDICT_EXITS = (0, 3, 4, 5)  # `attribute`: culprit found, no culprit, undecided, unreplayable


def otel_replay(store: Path, *args: str) -> None:
    """Run the `otel-replay` command (the one installed beside this interpreter, else via -c); an
    exit status that reports a verdict is not an error here."""
    exe = Path(sys.executable).with_name("otel-replay")
    found = str(exe) if exe.exists() else shutil.which("otel-replay")
    command = [found] if found else [sys.executable, "-c", "from otel_replay.cli import main; main()"]
    print(f"$ otel-replay --store {store} {' '.join(map(shell_word, args))}", flush=True)
    done = subprocess.run([*command, "--store", str(store), *args])
    if done.returncode not in VERDICT_EXITS:
        raise subprocess.CalledProcessError(done.returncode, done.args)


def shell_word(arg: str) -> str:
    """`arg` as a shell word a reader can paste: bare, else in double quotes when that is safe."""
    if re.fullmatch(r"[\w@%+=:,./-]+", arg):
        return arg
    return f'"{arg}"' if not set(arg) & set('"$`\\!') else shlex.quote(arg)


def start_service(store: Path, seed: int) -> tuple[subprocess.Popen[str], str]:
    """Start app.py on a free port; returns (process, base url) once it listens."""
    process = subprocess.Popen([sys.executable, str(HERE / "app.py"), "--store", str(store), "--port", "0",
                                "--model-seed", str(seed)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()  # the first line, "listening on URL ...", or "" if it died
    if not line.startswith("listening on "):
        process.kill()
        raise SystemExit(f"the service did not start (exit code {process.poll()}): {line.strip()!r}")
    print(f"service: {line.strip()}", flush=True)
    return process, line.split()[2]


def stop_service(process: subprocess.Popen[str], timeout: float = 30.0) -> None:
    """SIGTERM: the service stops serving and flushes its spans to the store."""
    process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise SystemExit(f"the service did not stop within {timeout:.0f} s") from None
    print(f"service: {out.strip()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, help="store directory (default: a fresh temporary directory)")
    parser.add_argument("-n", "--requests", type=int, default=20, help="questions the load sends (default 20)")
    parser.add_argument("--max-rollouts", type=int, default=400,
                        help="cap per plan while rollouts are added until each step is decided (default 400)")
    parser.add_argument("--model-seed", type=int, default=2,
                        help="the service's simulated model seed (default 2: 3 of the 20 default questions fail)")
    args = parser.parse_args()
    store: Path = args.store or Path(tempfile.mkdtemp(prefix="otel-replay-service-"))
    outcomes = store.parent / f"{store.name}-load.json"

    process, url = start_service(store, args.model_seed)
    try:
        subprocess.run([sys.executable, str(HERE / "load.py"), "--url", url, "-n", str(args.requests),
                        "--record", str(outcomes)], check=True)
    finally:
        stop_service(process)

    failed = set(json.loads(outcomes.read_text())["failed"])
    selected = set(select_traces(Store(store), FAILING))
    if selected != failed:
        raise SystemExit(f"the predicate selects {len(selected)} traces but the load saw {len(failed)} fail: "
                         f"{sorted(selected ^ failed)} differ")
    print(f"the predicate selects the {len(selected)} traces the verifier fails", flush=True)
    if not selected:
        print("no failing traces this time: nothing to attribute")
        return
    otel_replay(store, "attribute", "--where", FAILING, "--policies", POLICIES, "--verifier", VERIFIER,
                "--max-rollouts", str(args.max_rollouts), "--concurrency", "8")
    otel_replay(store, "aggregate")
    print(f"store: {store}")


if __name__ == "__main__":
    main()
