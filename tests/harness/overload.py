"""Sustained overload: spans offered at `factor` times what the writer can store, for a while.

The child process first measures its writer's capacity (spans per second from queue to Parquet,
with nothing else running; this is also the warm-up: imports, first writes), then ends GenAI
spans with distinct payloads at `factor` times that rate for `seconds`, sampling its resident
memory (RSS, every 50 ms) and the bytes capture holds. What must hold: the service's thread never
waits (max `end()` time), the excess is dropped and counted, every accepted span is written, and
memory stays bounded by the byte cap: the queued bytes never exceed the queue's share of it, and
the growth of resident memory over its level just before the overload starts (after the warm-up
and a garbage collection) never exceeds the cap itself (`sizing.MemoryBudget` reserves room in
the cap for writing a batch and for every cache).

    python -m tests.harness.overload STORE SECONDS CAP_BYTES PAYLOAD_BYTES FACTOR
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.harness.workload import Producer, rss_bytes, run_child, tracer_for

CALIBRATION_SPANS = 200  # below the writer's wake threshold: all queued, then one timed flush


def run_overload(store: Path, seconds: float, cap_bytes: int, payload_bytes: int = 131_072,
                 factor: float = 10.0) -> dict[str, Any]:
    """Run the overload in a child process (a clean heap to measure); returns its figures."""
    return run_child("tests.harness.overload",
                     [str(store), str(seconds), str(cap_bytes), str(payload_bytes), str(factor)],
                     timeout=seconds + 300)


_OPEN = '[{"role": "user", "parts": [{"type": "text", "content": "'
_CLOSE = '"}]}]'
_ANSWER = '[{"role": "assistant", "parts": [{"type": "text", "content": "ok"}], "finish_reason": "stop"}]'


def _attributes(i: int, base: str) -> dict[str, Any]:
    """A chat span whose prompt is a new string each time, as a service's prompts are (built by
    concatenation, so the producer can outrun the writer tenfold)."""
    return {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
            "gen_ai.input.messages": f"{_OPEN}{i} {base}{_CLOSE}", "gen_ai.output.messages": _ANSWER}


def _writer_rate(store: Path, base: str) -> float:
    from otel_replay import ReplayProcessor

    processor = ReplayProcessor(store, flush_interval_s=3600, max_queue_bytes=2**40)
    provider, tracer = tracer_for(processor, service="calibration")
    producer = Producer(tracer)
    rates = []
    for round_no in range(2):  # the first round warms up (imports, first segment); the second is timed
        for i in range(CALIBRATION_SPANS):
            producer.span(f"chat calibration-{round_no}-{i}", "", attributes=_attributes(i, base))
        started = time.perf_counter()
        processor.force_flush(300_000)
        rates.append(CALIBRATION_SPANS / (time.perf_counter() - started))
    rate = rates[-1]
    provider.shutdown()
    return rate


def _overload(store: Path, seconds: float, cap: int, payload_bytes: int, factor: float) -> dict[str, Any]:
    from otel_replay import ReplayProcessor

    base = "x" * payload_bytes
    gc.collect()
    before_warmup = rss_bytes()
    warm = store.parent / (store.name + "-calibration")
    writer_rate = _writer_rate(warm, base)  # the warm-up: imports, first segments written
    shutil.rmtree(warm, ignore_errors=True)
    gc.collect()
    baseline = rss_bytes()  # growth is measured from here: just before the overload starts
    processor = ReplayProcessor(store, max_queue_bytes=cap, flush_interval_s=0.5)
    budget = processor._queue.budget  # noqa: SLF001 - the figures of the split, for the report
    provider, tracer = tracer_for(processor, service="overload")
    producer = Producer(tracer)
    peak = {"rss": baseline, "held": 0}
    timeline: list[int] = []  # peak resident growth so far, every tenth of the run
    stop = threading.Event()

    def sample() -> None:
        next_mark = seconds / 10
        begun = time.perf_counter()
        while not stop.wait(0.05):
            peak["rss"] = max(peak["rss"], rss_bytes())
            peak["held"] = max(peak["held"], processor.stats["queued_bytes"])
            if time.perf_counter() - begun >= next_mark:
                timeline.append(peak["rss"] - baseline)
                next_mark += seconds / 10

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    target = factor * writer_rate
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        for _ in range(int(target * elapsed) - producer.produced):
            producer.span(f"chat overload-{producer.produced}", "", attributes=_attributes(producer.produced, base))
        time.sleep(0.002)
    offered_s = time.perf_counter() - started
    stop.set()
    sampler.join()
    provider.shutdown()
    stats = processor.stats
    return {
        "seconds": offered_s, "payload_bytes": payload_bytes, "cap_bytes": cap, "factor": factor,
        "writer_spans_per_s": writer_rate, "target_spans_per_s": target, "offered_spans_per_s": producer.produced / offered_s,
        "accepted_spans_per_s": stats["accepted"] / offered_s, "offered": producer.produced, "accepted": stats["accepted"], "dropped": stats["dropped_queue_full"],
        "written": stats["written_spans"], "exceptions": producer.exceptions, "max_end_ms": producer.max_end_s * 1000,
        "end_over_1ms": producer.over_1ms, "end_over_10ms": producer.over_10ms,
        "peak_held_bytes": peak["held"], "queue_bytes": budget.queue_bytes, "reserved_bytes": budget.reserved_bytes,
        "rss_before_warmup": before_warmup, "rss_baseline": baseline, "rss_peak": peak["rss"],
        "rss_growth": peak["rss"] - baseline, "rss_growth_timeline": timeline, "internal_errors": stats["internal_errors"],
    }


if __name__ == "__main__":
    root, secs, cap_bytes, payload, fac = sys.argv[1:6]
    print(json.dumps(_overload(Path(root), float(secs), int(cap_bytes), int(payload), float(fac))), flush=True)
