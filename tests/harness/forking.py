"""fork() at random moments while a new ReplayProcessor writes its first batches (gunicorn
`--preload`, celery prefork): every child must capture and store its own spans, and exit promptly.

Each trial runs in a fresh interpreter (so nothing is loaded yet, as in a service starting up):
it makes a processor on a fresh store, ends a burst of GenAI spans, sleeps a random 0-40 ms so
the fork lands somewhere in the writer's first batch, forks, and both sides end more spans and
shut down. The parent reports, as one JSON line, how the child ended and how long it took; the
store then must hold every span each side ended, with its step.

    python -m tests.harness.forking STORE SEED
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.harness.workload import REPO

SPANS = 20
CHILD_LIMIT_S = 15.0  # a child still running after this is taken as deadlocked


def fork_trial(root: Path, seed: int) -> dict[str, Any]:
    """One trial in a fresh interpreter; what it reported (`problems` empty when all is well)."""
    try:
        done = subprocess.run([sys.executable, "-m", "tests.harness.forking", str(root), str(seed)],
                              cwd=REPO, capture_output=True, text=True, timeout=CHILD_LIMIT_S * 3)
    except subprocess.TimeoutExpired:
        return {"seed": seed, "problems": ["the trial hung"]}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"seed": seed, "problems": [f"exit {done.returncode}: {done.stderr[-500:]}"]}
    report = json.loads(lines[-1])
    from otel_replay import Store

    problems = []
    store = Store(root)
    for side, prefixes in (("parent", ("chat before-", "chat after-")), ("child", ("chat child-",))):
        stored = sum(_stored(store, prefix) for prefix in prefixes)
        report[f"{side}_stored"] = stored
        if stored != report[f"{side}_ended"]:
            problems.append(f"{side}: ended {report[f'{side}_ended']} GenAI spans, stored {stored} (with their steps)")
    if report["child_exit"] != 0:
        problems.append(f"the child exited with {report['child_exit']}")
    report["seed"], report["problems"] = seed, problems
    return report


def _stored(store: Any, prefix: str) -> int:
    """Spans named `prefix...` that are stored with their step row."""
    return store.sql("select count(*) n from spans s join steps t using (trace_id, span_id) "
                     "where starts_with(s.name, ?)", [prefix]).column("n")[0].as_py()


def _trial(root: Path, seed: int) -> None:
    from otel_replay import ReplayProcessor
    from tests.harness.workload import Producer, tracer_for

    rng = random.Random(seed)
    processor = ReplayProcessor(root, flush_interval_s=0.005)
    provider, tracer = tracer_for(processor, service="fork")
    producer = Producer(tracer)
    for i in range(SPANS):
        producer.span(f"chat before-{i}", f"question {i} " + "x" * rng.randint(0, 5000))
    time.sleep(rng.uniform(0, 0.04))
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: its own store, so what it stores can be counted apart
        code = 0
        try:  # the processor gave the child its own queue and writer thread (at fork)
            child = Producer(tracer)
            for i in range(SPANS):
                child.span(f"chat child-{i}", f"question {i}")
            provider.shutdown()
            code = 0 if processor.stats["written_spans"] >= SPANS else 3
        except BaseException:  # noqa: BLE001
            code = 2
        os._exit(code)
    for i in range(SPANS):
        producer.span(f"chat after-{i}", f"question {i}")
    provider.shutdown()
    deadline = started + CHILD_LIMIT_S
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    exit_code = os.waitstatus_to_exitcode(status) if status is not None and done else -9
    print(json.dumps({"parent_ended": 2 * SPANS, "child_ended": SPANS, "child_exit": exit_code,
                      "child_s": round(time.monotonic() - started, 3)}), flush=True)


if __name__ == "__main__":
    _trial(Path(sys.argv[1]), int(sys.argv[2]))
