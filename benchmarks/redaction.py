"""What redaction costs on the capture writer, with its gates and without them (the exact path).

Run: ``otel-replay bench redaction`` (or ``python -m benchmarks.redaction``). CPU time of this
thread (`time.thread_time`), the minimum over several rounds: the machines are shared, and the
minimum is the cost without preemption. "exact" is `Redactor(gates=False)`: every string walked and
every scan run, as redaction did before the gates; both must find the same, and the bench checks it.

- A distinct 4 KB message of each kind: redaction alone, beside what the writer already pays for it
  (canonical bytes plus its xxh3-128 content address).
- The writer per distinct span carrying that message: normalize + privacy + rows.
- Chat spans of the capture bench (4 KB of distinct messages each, a shared system prompt): privacy
  per span after the batch was normalized, as the writer does it (the payloads are no longer in cache);
  clean, and with an API key and an email in each user message.
- A message an agent loop resends: a memo lookup.
"""

from __future__ import annotations

import gc
import inspect
import json
import time
from collections.abc import Callable
from typing import Any

from benchmarks.spans import SeededText, SyntheticSpans
from otel_replay.normalize import redact
from otel_replay.normalize.messages import canonical_bytes, content_hash
from otel_replay.normalize.pipeline import normalize_span
from otel_replay.normalize.privacy import Privacy
from otel_replay.normalize.records import SpanRecord
from otel_replay.normalize.redact import Redactor
from otel_replay.normalize.sources.sdk import span_from_sdk
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
    prose = " ".join(inspect.getdoc(m) or "" for m in (redact, engine, Redactor, Privacy)) * 3
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


PLANTED = " my key is sk-proj-abcdefghijklmnopqrstuvwx1234, mail jane.doe@example.com "


def chat_records(spans: int, secret: bool) -> list[SpanRecord]:
    """Chat spans of the capture bench; `secret`: each user message also holds an API key and an email."""
    records = [span_from_sdk(s) for s in SyntheticSpans(SeededText(7, 2_000_000)).chat_spans(spans, SIZE, distinct=True)]
    if secret:
        for record in records:
            inputs = json.loads(record.attributes["gen_ai.input.messages"])
            inputs[1]["parts"][0]["content"] += PLANTED
            record.attributes["gen_ai.input.messages"] = json.dumps(inputs)
    return records


def chat_privacy_us(gates: bool, records: list[SpanRecord], rounds: int) -> float:
    """Privacy per chat span of the capture bench, after the whole batch was normalized."""
    best = float("inf")
    for _ in range(rounds):
        items = [normalize_span(r) for r in records]
        privacy = Privacy(Redactor(gates=gates))
        enabled = gc.isenabled()
        gc.disable()
        try:
            start = time.thread_time()
            for item in items:
                privacy(item)
            best = min(best, time.thread_time() - start)
        finally:
            if enabled:
                gc.enable()
    return best / len(records) * 1e6


def run_redaction_bench(quick: bool = False) -> dict[str, Any]:
    rounds, spans = (150, 200) if quick else (1500, 1000)
    gated, exact = Redactor(), Redactor(gates=False)
    messages: dict[str, dict[str, Any]] = {}
    for name, text in samples().items():
        message = {"role": "user", "parts": [{"type": "text", "content": text}]}
        found = sorted(gated.value(message)[1])
        if found != sorted(exact.value(message)[1]):
            raise AssertionError(f"{name}: the gates changed what is found")
        messages[name] = {
            "gated_us": cpu_us(lambda m=message: gated.value(m), rounds=rounds),
            "exact_us": cpu_us(lambda m=message: exact.value(m), rounds=rounds),
            "hash_us": cpu_us(lambda m=message: content_hash(canonical_bytes(m)), rounds=rounds),
            "span_none_us": min(writer_us(text, None, spans) for _ in range(3)),
            "span_exact_us": min(writer_us(text, Privacy(Redactor(gates=False)), spans) for _ in range(3)),
            "span_gated_us": min(writer_us(text, Privacy(), spans) for _ in range(3)),
            "found": found,
        }
    chat = {}
    for secret in (False, True):
        records = chat_records(spans, secret)
        found = [sorted(Privacy(Redactor(gates=gates))(normalize_span(records[0])).step.redacted) for gates in (True, False)]
        if found[0] != found[1] or bool(found[0]) != secret:
            raise AssertionError(f"chat spans: the gates changed what is found: {found}")
        chat["with a secret" if secret else "clean"] = {"exact_us": chat_privacy_us(False, records, 3),
                                                         "gated_us": chat_privacy_us(True, records, 3)}
    message = {"role": "user", "parts": [{"type": "text", "content": samples()["English prose"]}]}
    gated.messages([message])
    resent = cpu_us(lambda: gated.messages([message]), 100, max(rounds // 5, 30))
    return {"messages": messages, "chat_span": chat, "resent_us": resent}


def format_redaction_table(result: dict[str, Any]) -> str:
    lines = [f"{'4 KB message':20} {'gated':>7} {'exact':>7} {'hash':>6}   {'writer per span: none':>21} "
             f"{'exact':>7} {'gated':>7}  found"]
    for name, row in result["messages"].items():
        lines.append(f"{name:20} {row['gated_us']:5.1f}µs {row['exact_us']:5.1f}µs {row['hash_us']:4.1f}µs   "
                     f"{row['span_none_us']:19.1f}µs {row['span_exact_us']:5.1f}µs {row['span_gated_us']:5.1f}µs  "
                     f"{row['found']}")
    for kind, chat in result["chat_span"].items():
        lines.append(f"{'chat span, ' + kind:20} {chat['gated_us']:5.1f}µs {chat['exact_us']:5.1f}µs  (privacy per "
                     f"capture-bench span, {chat['exact_us'] / chat['gated_us']:.1f}x)")
    lines.append(f"{'resent (memo hit)':20} {result['resent_us']:5.2f}µs")
    return "\n".join(lines)


def main() -> None:
    print(format_redaction_table(run_redaction_bench()))


if __name__ == "__main__":
    main()
