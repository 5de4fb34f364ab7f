"""The least CPU a stored span costs in Python, beside the OTLP exporter: how far below it any writer could go.

An experiment behind a line of docs/benchmarks/capture.md. For the same distinct 4 KB GenAI spans as
`bench capture`'s CPU row, the floor does only what storing a span in the store's format needs,
whatever code surrounds it: read the SDK span, parse its two message attributes, the built-in
detectors' gate over what is stored (the cheapest proof that a span holds no secret), serialize and
hash each message in its canonical form (its content address), a span row, a step row and message rows, then Arrow, zstd
Parquet and fsync, in one batch. Nothing else: no step object, no memo of resent messages, no
problems checked, no queue, thread, pacing or counters. It is not a writer; it bounds any writer
that stores what this one stores. Rounds alternate the floor, the OTLP exporter and the live
`ReplayProcessor`, so a change of machine load falls on all three alike.

    python -m benchmarks.capture_floor [rounds]
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from xxhash import xxh3_128_hexdigest

from benchmarks.capture_vs_otlp import _cpu_per_span, _start_sink, rounds_argument
from benchmarks.spans import SeededText, SyntheticSpans
from otel_replay.normalize.content import PAYLOAD_ATTRIBUTES
from otel_replay.normalize.detectors import gate
from otel_replay.normalize.messages import canonical_message
from otel_replay.normalize.sources.sdk import span_from_sdk
from otel_replay.store.layout import day_of
from otel_replay.store.rows import RowBatch
from otel_replay.store.writer import write_batch

SPANS = 5000
STAGES = ("read", "parse", "canonical", "gate", "address", "rows", "write")
_SORTED = orjson.OPT_SORT_KEYS


def _floor(spans: Sequence[ReadableSpan], store: Path, clock: Callable[[], int] | None = None) -> dict[str, int]:
    """Store `spans` with the floor's work; with `clock`, the ns each stage took (else nothing is timed)."""
    spent = dict.fromkeys(STAGES, 0)
    tick = clock or int  # untimed: int() is 0, the cheapest call there is, and nothing is added up
    batch = RowBatch()
    span_rows: list[tuple[Any, ...]] = []
    step_rows: list[tuple[Any, ...]] = []
    known: set[str] = set()
    resource = ""
    now = time.time_ns()
    for span in spans:
        t0 = tick()
        record = span_from_sdk(span)
        t1 = tick()
        attrs = record.attributes
        parsed_inputs = orjson.loads(attrs["gen_ai.input.messages"])
        parsed_outputs = orjson.loads(attrs["gen_ai.output.messages"])
        rest = {k: v for k, v in attrs.items() if k not in PAYLOAD_ATTRIBUTES}
        t2 = tick()
        inputs = [canonical_message(m, owned=True) for m in parsed_inputs]
        outputs = [canonical_message(m, owned=True) for m in parsed_outputs]
        tc = tick()
        if gate(orjson.dumps([rest, inputs, outputs, record.name, record.scope_name])):
            raise RuntimeError(f"span {record.span_id}: the floor's spans must hold nothing to redact")
        t3 = tick()
        addresses = []
        for message in (*inputs, *outputs):
            body = orjson.dumps(message, option=_SORTED)
            digest = xxh3_128_hexdigest(body)
            if digest not in known:
                known.add(digest)
                batch.message_rows.append((digest, "message", message.get("role"), body.decode()))
            addresses.append(digest)
        t4 = tick()
        resource = resource or orjson.dumps(record.resource).decode()
        span_rows.append((record.trace_id, record.span_id, record.parent_span_id, record.name, record.kind,
                          record.start_ns, record.end_ns, record.status_code, record.status_message,
                          record.service_name, record.scope_name, record.scope_version, orjson.dumps(rest).decode(),
                          "[]", "[]", resource, "capture", now))
        get = attrs.get
        step_rows.append((record.trace_id, record.span_id, record.parent_span_id, "llm", get("gen_ai.operation.name"),
                          record.name, record.start_ns, record.end_ns, record.status_code, None, None, get("gen_ai.provider.name"),
                          get("gen_ai.request.model"), get("gen_ai.response.model"),
                          get("gen_ai.usage.input_tokens"), get("gen_ai.usage.output_tokens"), None, None, None,
                          None, None, None, tuple(addresses[:len(inputs)]), tuple(addresses[len(inputs):]), None,
                          tuple(get("gen_ai.response.finish_reasons") or ()), True, (), "genai",
                          record.service_name, "capture", now))
        t5 = tick()
        if clock is not None:
            for stage, took in zip(STAGES, (t1 - t0, t2 - t1, tc - t2, t3 - tc, t4 - t3, t5 - t4), strict=False):
                spent[stage] += took
    day = day_of(spans[0].start_time)
    batch.span_rows[day], batch.step_rows[day] = span_rows, step_rows
    t6 = tick()
    write_batch(store, batch)
    spent["write"] = tick() - t6
    return spent


def _floor_cpu_per_span(spans: Sequence[ReadableSpan], store: Path) -> float:
    gc.collect()
    start = time.process_time()
    _floor(spans, store)
    return (time.process_time() - start) / len(spans) * 1e6


def main(rounds: int = 5) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from otel_replay.capture import ReplayProcessor
    from otel_replay.capture.writer import load_for_writing

    spans = SyntheticSpans(SeededText(seed=7, corpus_bytes=1 << 21)).chat_spans(SPANS, 4096, distinct=True)
    load_for_writing()
    cpu: dict[str, list[float]] = {"otlp": [], "writer": [], "floor": []}
    best = dict.fromkeys(STAGES, float("inf"))
    sink, endpoint = _start_sink()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(rounds):
                cpu["floor"].append(_floor_cpu_per_span(spans, Path(tmp) / f"floor-{r}"))
                cpu["otlp"].append(_cpu_per_span(BatchSpanProcessor(
                    OTLPSpanExporter(endpoint=endpoint), max_queue_size=len(spans), max_export_batch_size=512), spans))
                cpu["writer"].append(_cpu_per_span(ReplayProcessor(Path(tmp) / f"writer-{r}"), spans))
                stages = _floor(spans, Path(tmp) / f"stages-{r}", time.perf_counter_ns)
                best = {stage: min(best[stage], stages[stage]) for stage in STAGES}
    finally:
        sink.kill()
        sink.wait(10)
    otlp = statistics.median(cpu["otlp"])
    print(f"{SPANS} distinct 4 KB GenAI spans a round, {rounds} rounds alternating; CPU of this process "
          "(from the first on_end until force_flush returned, or through the floor's write)")
    print("| path | least µs/span | median µs/span | median / OTLP |")
    print("|------|---------------|----------------|---------------|")
    for name, label in (("otlp", "BatchSpanProcessor(OTLPSpanExporter)"), ("writer", "ReplayProcessor"),
                        ("floor", "the floor (storing alone)")):
        print(f"| {label} | {min(cpu[name]):.1f} | {statistics.median(cpu[name]):.1f} "
              f"| {statistics.median(cpu[name]) / otlp:.2f}x |")
    print("Floor stages, µs a span (best of the rounds, wall clock): "
          + ", ".join(f"{stage} {best[stage] / SPANS / 1e3:.1f}" for stage in STAGES))


if __name__ == "__main__":
    main(rounds_argument("capture_floor", __doc__ or "", 5))
