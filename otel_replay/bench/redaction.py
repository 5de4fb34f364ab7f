"""What redaction costs on the capture writer: µs per distinct 4 KB message, and per 4 KB span.

Run: ``python -m otel_replay.bench.redaction``. CPU time of this thread (`time.thread_time`), the
minimum over many short batches: the machines are shared, and the minimum is the cost without
preemption. Beside each message: what the writer already pays for it (canonical bytes plus its
xxh3-128 content address). A message an agent loop resends costs a memo lookup.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable

from otel_replay.normalize import redact
from otel_replay.normalize.messages import canonical_bytes, content_hash
from otel_replay.normalize.pipeline import normalize_span
from otel_replay.normalize.records import SpanRecord
from otel_replay.normalize.redact import Privacy, Redactor
from otel_replay.replay import engine
from otel_replay.store.rows import RowBatch, RowBuilder

SIZE = 4096


def cpu_us(fn: Callable[[], object], batch: int = 10, rounds: int = 1500) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(batch):
            fn()
        best = min(best, time.thread_time() - start)
    return best / batch * 1e6


def samples() -> dict[str, str]:
    """4 KB texts of the kinds an agent's messages hold."""
    prose = " ".join(inspect.getdoc(m) or "" for m in (redact, engine, redact.Redactor, redact.Privacy)) * 3
    tool_json = json.dumps([{"order_id": 100234 + i, "amount": round(i * 13.37, 2), "status": "shipped",
                             "created": f"2025-01-{i % 28 + 1:02d}T10:{i % 60:02d}:00Z"} for i in range(60)])
    planted = (" key sk-proj-abcdefghijklmnopqrstuvwx1234 mail bob@example.com card 4111 1111 1111 1111 ")
    return {
        "English prose": prose[:SIZE],
        "Python source": inspect.getsource(engine)[6000:6000 + SIZE],
        "JSON tool result": tool_json[:SIZE],
        "prose + 3 secrets": (prose[:2000] + planted + prose[2000:])[:SIZE],
    }


def _span(i: int, text: str) -> SpanRecord:
    message = json.dumps([{"role": "user", "parts": [{"type": "text", "content": f"{i} {text}"}]}])
    answer = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": f"answer {i}"}]}])
    return SpanRecord(f"{i:032x}", f"{i:016x}", None, "chat m", start_ns=1_767_225_600 * 10**9 + i,
                      end_ns=1_767_225_600 * 10**9 + i + 1000,
                      attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                                  "gen_ai.input.messages": message, "gen_ai.output.messages": answer})


def writer_us(text: str, privacy: Privacy | None, spans: int = 1000) -> float:
    """Normalize + redact + rows per distinct span (the writer's work before Arrow and Parquet)."""
    records = [_span(i, text[: SIZE - 8]) for i in range(spans)]
    batch, builder = RowBatch(), RowBuilder("bench")
    start = time.thread_time()
    for record in records:
        item = normalize_span(record)
        builder.add(batch, privacy(item) if privacy is not None else item)
    return (time.thread_time() - start) / spans * 1e6


def main() -> None:
    print(f"{'4 KB message':20} {'redact':>8} {'hash':>6}  {'span, none':>10} {'span, redacted':>14}  found")
    for name, text in samples().items():
        message = {"role": "user", "parts": [{"type": "text", "content": text}]}
        r = Redactor()
        found = sorted(r.value(message)[1])
        cost = cpu_us(lambda r=r, m=message: r.value(m))
        base = cpu_us(lambda m=message: content_hash(canonical_bytes(m)))
        plain = min(writer_us(text, None) for _ in range(3))
        redacted = min(writer_us(text, Privacy()) for _ in range(3))
        print(f"{name:20} {cost:6.1f}µs {base:4.1f}µs  {plain:8.1f}µs {redacted:12.1f}µs  {found}")
    r, message = Redactor(), {"role": "user", "parts": [{"type": "text", "content": samples()["English prose"]}]}
    r.messages([message])
    print(f"{'resent (memo hit)':20} {cpu_us(lambda: r.messages([message]), 100, 300):6.2f}µs")


if __name__ == "__main__":
    main()
