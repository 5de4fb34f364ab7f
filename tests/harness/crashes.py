"""kill -9 of a writing process, and readers that read while a writer writes.

The writer child runs a real `TracerProvider` + `ReplayProcessor` and loops: end a burst of
GenAI spans named `chat <seed>-<i>`, print `produced <n>`, usually `force_flush`, and print
`flushed <n>` once it returned True. The parent kills it with SIGKILL at a random moment and
checks the store:

- it opens, and the catalog's queries work;
- every `*.parquet` file reads whole with pyarrow; any other file is a writer's temp file
  (`.<name>.tmp`, which no read glob matches) or a manifest;
- no span is visible without its step row (a batch is seen whole or not at all);
- every span up to the last `flushed <n>` line is there: what a crash may lose is only what
  was still queued (`lost_flushed` must be 0).

    python -m tests.harness.crashes STORE SEED
"""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tests.harness.workload import REPO, Producer, tracer_for

ALLOWED_DIRS = ("_compactions", "_batches", "quarantine")


@dataclass(slots=True)
class CrashTrial:
    seed: int
    killed_after_s: float
    produced: int  # spans ended before the kill (as far as the child said)
    flushed: int  # spans covered by a force_flush that returned True
    present: int  # of this child's spans, how many the store has
    lost_flushed: int  # flushed but missing: must be 0
    lost_unflushed: int  # produced, not flushed, missing: the queue a crash may lose
    temp_files: int  # temp files this kill left (it landed mid-write)
    problems: list[str] = field(default_factory=list)  # unreadable files, stray files, failed queries


@dataclass(slots=True)
class StoreCheck:
    """What `verify_store` found; `checked` lets repeated checks read each file once."""

    checked: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    temp_files: int = 0  # temp files first seen by this check
    temp_seen: set[str] = field(default_factory=set)


def verify_store(root: Path, check: StoreCheck | None = None) -> StoreCheck:
    """Every visible segment reads whole; nothing else but temp files; the views open and answer."""
    from otel_replay import Store

    check = check or StoreCheck()
    check.problems, check.temp_files = [], 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel.split("/", 1)[0] in ALLOWED_DIRS:
            continue
        if path.name.startswith(".") and path.name.endswith(".tmp"):
            check.temp_files += rel not in check.temp_seen
            check.temp_seen.add(rel)
        elif path.suffix != ".parquet" or path.name.startswith("."):
            check.problems.append(f"{rel}: not a segment and not a temp file")
        elif rel not in check.checked:
            try:
                pq.read_table(path)
                check.checked.add(rel)
            except Exception as exc:  # noqa: BLE001 - any failure to read is what this looks for
                check.problems.append(f"{rel}: unreadable: {exc}")
    try:
        store = Store(root)
        store.sql("select count(*) from steps")
        store.list_traces(limit=5)
        torn = _spans_without_steps(store)
        if torn:
            check.problems.append(f"{torn} chat spans are visible without their step rows (a torn batch)")
    except Exception as exc:  # noqa: BLE001
        check.problems.append(f"the store's views fail: {exc}")
    return check


def _spans_without_steps(store: Any) -> int:
    """Visible chat spans whose step row is not visible: a batch seen in part."""
    return store.sql("select count(*) n from spans s where regexp_full_match(s.name, 'chat [0-9]+-[0-9]+') and not exists "
                     "(select 1 from steps t where t.trace_id = s.trace_id and t.span_id = s.span_id)"
                     ).column("n")[0].as_py()


def _spans_of(root: Path, seed: int) -> set[int]:
    from otel_replay import Store

    prefix = f"chat {seed}-"
    names = Store(root).sql("select name from spans where starts_with(name, ?)", [prefix]).column("name")
    return {int(n[len(prefix):]) for n in names.to_pylist()}


def _last(lines: list[str], word: str) -> int:
    values = [int(ln.split()[1]) for ln in lines if ln.startswith(word + " ") and ln.split()[1].isdigit()]
    return max(values, default=0)


def crash_trial(root: Path, seed: int, max_delay_s: float = 1.2, check: StoreCheck | None = None,
                delay_s: float | None = None) -> CrashTrial:
    """Start a writer child, SIGKILL it after a random delay (or `delay_s`), then check the store."""
    rng = random.Random(seed)
    child = subprocess.Popen([sys.executable, "-m", "tests.harness.crashes", str(root), str(seed)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready = child.stdout.readline()  # after imports and the processor's start
        delay = rng.uniform(0.02, max_delay_s) if delay_s is None else delay_s
        time.sleep(delay)
    finally:
        child.kill()  # SIGKILL
        out, _ = child.communicate(timeout=60)
    lines = out.splitlines()[:-1] if out and not out.endswith("\n") else out.splitlines()  # a cut last line
    produced, flushed = _last(lines, "produced"), _last(lines, "flushed")
    check = verify_store(root, check)
    problems = list(check.problems) if ready.strip() == "ready" else [f"the child did not start: {ready!r}"]
    try:
        present = _spans_of(root, seed)
    except Exception as exc:  # noqa: BLE001
        problems.append(f"query failed: {exc}")
        present = set()
    lost_flushed = sum(1 for i in range(flushed) if i not in present)
    return CrashTrial(seed, delay, produced, flushed, len(present), lost_flushed,
                      max(produced - flushed - len(present - set(range(flushed))), 0), check.temp_files, problems)


CRASHES_PER_STORE = 10  # a store keeps what each earlier crash left; a fresh one every ten keeps checks fast


def run_crash_trials(root: Path, trials: int, seed: int = 0, max_delay_s: float = 1.2) -> dict[str, Any]:
    """`trials` kills, ten into each store (which keeps what every earlier crash left), summarized."""
    checks = [StoreCheck() for _ in range(0, trials, CRASHES_PER_STORE)]
    results = [crash_trial(root / f"store-{n // CRASHES_PER_STORE}", seed * 1000 + n, max_delay_s,
                           checks[n // CRASHES_PER_STORE]) for n in range(trials)]
    lost = [t.lost_flushed for t in results]
    return {
        "kills": trials,
        "survived": sum(not t.problems for t in results),
        "mid_write_kills": sum(t.temp_files > 0 for t in results),
        "lost_flushed_max": max(lost, default=0),
        "lost_flushed_mean": statistics.fmean(lost) if lost else 0.0,
        "lost_unflushed_max": max((t.lost_unflushed for t in results), default=0),
        "lost_unflushed_mean": statistics.fmean(t.lost_unflushed for t in results) if results else 0.0,
        "flushed_spans": sum(t.flushed for t in results),
        "segments_checked": sum(len(c.checked) for c in checks),
        "problems": [p for t in results for p in t.problems],
        "trials": [asdict(t) for t in results],
    }


def concurrent_reads(root: Path, seconds: float, seed: int = 7) -> dict[str, Any]:
    """Read the store over and over while a writer child writes to it; the writer is killed at the end."""
    from otel_replay import Store

    child = subprocess.Popen([sys.executable, "-m", "tests.harness.crashes", str(root), str(seed)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    reads = files_read = 0
    errors: list[str] = []
    counts: list[int] = []
    partial = 0  # reads that saw a chat span without its step
    seen: set[Path] = set()
    try:
        child.stdout.readline()
        waited = time.monotonic() + 60
        while not any(root.glob("span_rows/*/*.parquet")) and time.monotonic() < waited:
            time.sleep(0.01)  # the first segment; from here on every query reads real files
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                store = Store(root)
                counts.append(store.sql("select count(*) n from spans").column("n")[0].as_py())
                partial += _spans_without_steps(store) > 0
                reads += 1
                for path in set(root.glob("*/*/*.parquet")) - seen:
                    pq.read_table(path)
                    seen.add(path)
                    files_read += 1
            except Exception as exc:  # noqa: BLE001
                errors.append(repr(exc))
    finally:
        child.kill()
        child.communicate(timeout=60)
    shrank = sum(1 for a, b in zip(counts, counts[1:], strict=False) if b < a)
    return {"queries": reads, "files_read": files_read, "errors": errors, "count_went_down": shrank,
            "final_count": counts[-1] if counts else 0, "partial_batches_seen": partial}


# -- the child --------------------------------------------------------------------------------------
def _writer(root: Path, seed: int) -> None:
    from otel_replay import ReplayProcessor

    rng = random.Random(seed)
    processor = ReplayProcessor(root, flush_interval_s=rng.choice([0.02, 0.1, 0.5]))
    _, tracer = tracer_for(processor, service=f"crash-{seed}")
    producer = Producer(tracer)
    print("ready", flush=True)
    i = 0
    while True:
        for _ in range(rng.randint(1, 40)):
            producer.span(f"chat {seed}-{i}", f"question {i} " + "x" * rng.randint(0, 20_000), f"answer {i}")
            i += 1
        print(f"produced {i}", flush=True)
        if rng.random() < 0.8 and processor.force_flush(30_000):
            print(f"flushed {i}", flush=True)


if __name__ == "__main__":
    _writer(Path(sys.argv[1]), int(sys.argv[2]))
