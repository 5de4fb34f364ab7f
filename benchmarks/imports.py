"""Import benchmark: steps/s for each format on the same generated traces, in one run.

Every format is generated from one set of synthetic agent traces (invoke_agent root, a chat
call that asks for a tool, the tool, a chat call that answers), written to a file, then imported
with the same code path as `otel-replay import` (read, normalize, content-address, write
Parquet). The baseline per format is `json.loads`/protobuf parse of the same file alone: the
floor any importer pays to read the bytes. Besides wall-clock time the table gives the process's
CPU time per step, which other work on a shared machine disturbs far less, and the load average.
"""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from benchmarks.machine import record_work_ms
from otel_replay.normalize.bulk import paused_gc
from otel_replay.normalize.pipeline import normalize_spans
from otel_replay.normalize.privacy import DEFAULT_PRIVACY
from otel_replay.normalize.sources.files import read
from otel_replay.store.import_files import import_files, jobs_for_bytes
from otel_replay.store.ingest_parallel import jobs_for
from otel_replay.store.rows import RowBatch, RowBuilder
from otel_replay.store.writer import write_batch

T0 = 1_767_225_600_000_000_000  # 2026-01-01
STEPS_PER_TRACE = 3  # chat, tool, chat (the agent span is structure)


def _trace(i: int) -> list[dict[str, Any]]:
    """One agent run as neutral span dicts (ids, times, GenAI attributes)."""
    tid = f"{i + 1:032x}"
    sid = [f"{i * 4 + k + 1:016x}" for k in range(4)]
    question = f"What is the weather in city {i}? Please answer briefly and cite the tool." * 3
    call = {"type": "tool_call", "id": f"call_{i}", "name": "get_weather", "arguments": {"city": f"city {i}"}}
    result = json.dumps({"city": f"city {i}", "temperature_c": i % 30, "condition": "cloudy"})
    system = {"role": "system", "parts": [{"type": "text", "content": "You are a weather assistant. " * 8}]}
    user = {"role": "user", "parts": [{"type": "text", "content": question}]}
    asked = {"role": "assistant", "parts": [call]}
    answered = {"role": "tool", "parts": [{"type": "tool_call_response", "id": f"call_{i}", "response": result}]}
    final = {"role": "assistant", "parts": [{"type": "text", "content": f"It is {i % 30}°C and cloudy in city {i}."}]}
    t = T0 + i * 10_000_000
    return [
        {"trace": tid, "span": sid[0], "parent": None, "name": "invoke_agent weather", "start": t, "end": t + 9_000_000,
         "attrs": {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather"}},
        {"trace": tid, "span": sid[1], "parent": sid[0], "name": "chat m", "start": t + 1_000, "end": t + 3_000_000,
         "attrs": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 90,
                   "gen_ai.input.messages": json.dumps([system, user]),
                   "gen_ai.output.messages": json.dumps([{**asked, "finish_reason": "tool_call"}])}},
        {"trace": tid, "span": sid[2], "parent": sid[0], "name": "execute_tool get_weather", "start": t + 3_100_000,
         "end": t + 4_000_000, "attrs": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
                                         "gen_ai.tool.call.id": f"call_{i}", "gen_ai.tool.call.arguments": json.dumps(call["arguments"]),
                                         "gen_ai.tool.call.result": result}},
        {"trace": tid, "span": sid[3], "parent": sid[0], "name": "chat m", "start": t + 4_100_000, "end": t + 8_000_000,
         "attrs": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 140,
                   "gen_ai.input.messages": json.dumps([system, user, asked, answered]),
                   "gen_ai.output.messages": json.dumps([{**final, "finish_reason": "stop"}])}},
    ]


def _any(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    return {"stringValue": str(value)}


def otlp_request(spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "bench"}}]},
                               "scopeSpans": [{"scope": {"name": "bench"}, "spans": [
        {"traceId": s["trace"], "spanId": s["span"], **({"parentSpanId": s["parent"]} if s["parent"] else {}),
         "name": s["name"], "kind": 1, "startTimeUnixNano": str(s["start"]), "endTimeUnixNano": str(s["end"]),
         "attributes": [{"key": k, "value": _any(v)} for k, v in s["attrs"].items()], "status": {}}
        for s in spans]}]}]}


def write_otlp_json(spans: list[dict[str, Any]], path: Path) -> None:
    with path.open("w") as out:  # one request per trace, one per line, as the Collector's file exporter
        for k in range(0, len(spans), 4):
            out.write(json.dumps(otlp_request(spans[k:k + 4])) + "\n")


def write_otlp_json_batches(spans: list[dict[str, Any]], path: Path, batch: int = 512, running: int = 64) -> None:
    """Requests of `batch` spans each, from `running` traces at a time, each trace's spans spread
    over the batches as they end: how a busy service's BatchSpanProcessor, and the Collector's file
    exporter after it, write them (every line mixes many traces)."""
    per_trace = STEPS_PER_TRACE + 1
    order = sorted(range(len(spans)), key=lambda k: (k // (per_trace * running), k % per_trace, k))
    with path.open("w") as out:
        for k in range(0, len(order), batch):
            out.write(json.dumps(otlp_request([spans[i] for i in order[k:k + batch]])) + "\n")


def write_otlp_proto(spans: list[dict[str, Any]], path: Path) -> None:
    doc = otlp_request(spans)
    for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for key in ("traceId", "spanId", "parentSpanId"):
            if key in span:
                span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    path.write_bytes(ParseDict(doc, ExportTraceServiceRequest()).SerializeToString())


def write_jaeger(spans: list[dict[str, Any]], path: Path) -> None:
    traces: dict[str, dict[str, Any]] = {}
    for s in spans:
        trace = traces.setdefault(s["trace"], {"traceID": s["trace"], "spans": [],
                                                "processes": {"p1": {"serviceName": "bench", "tags": []}}})
        tags = [{"key": k, "type": "int64" if isinstance(v, int) else "string", "value": v} for k, v in s["attrs"].items()]
        trace["spans"].append({
            "traceID": s["trace"], "spanID": s["span"], "operationName": s["name"], "processID": "p1",
            "references": [{"refType": "CHILD_OF", "traceID": s["trace"], "spanID": s["parent"]}] if s["parent"] else [],
            "startTime": s["start"] // 1000, "duration": (s["end"] - s["start"]) // 1000, "tags": tags, "logs": []})
    path.write_text(json.dumps({"data": list(traces.values())}))


def _iso(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns // 1000 % 10**6:06d}Z"


def write_langsmith(spans: list[dict[str, Any]], path: Path) -> None:
    def run_id(span_hex: str) -> str:
        return str(uuid.UUID(int=int(span_hex, 16)))

    with path.open("w") as out:
        for s in spans:
            attrs = s["attrs"]
            run: dict[str, Any] = {"id": run_id(s["span"]), "trace_id": str(uuid.UUID(s["trace"])), "name": s["name"],
                                   "start_time": _iso(s["start"]), "end_time": _iso(s["end"]), "status": "success"}
            if s["parent"]:
                run["parent_run_id"] = run_id(s["parent"])
            op = attrs["gen_ai.operation.name"]
            if op == "chat":
                msgs = json.loads(attrs["gen_ai.input.messages"])
                run.update(run_type="llm", extra={"metadata": {"ls_model_name": "m"}},
                           inputs={"messages": [[{"role": m["role"], "content": m["parts"][0].get("content", "")} for m in msgs]]},
                           outputs={"generations": [[{"text": "", "message": {"type": "ai", "content": "done"}}]]})
            elif op == "execute_tool":
                run.update(run_type="tool", extra={"tool_call_id": attrs["gen_ai.tool.call.id"]},
                           inputs=json.loads(attrs["gen_ai.tool.call.arguments"]),
                           outputs={"output": attrs["gen_ai.tool.call.result"]})
            else:
                run.update(run_type="chain", inputs={}, outputs={})
            out.write(json.dumps(run) + "\n")


WRITERS: dict[str, tuple[str, Callable[[list[dict[str, Any]], Path], None]]] = {
    "otlp (JSON lines)": ("otlp", write_otlp_json),
    "otlp (protobuf)": ("otlp", write_otlp_proto),
    "jaeger": ("jaeger", write_jaeger),
    "langsmith (runs JSON lines)": ("langsmith", write_langsmith),
}


def _parse_only(path: Path, fmt: str) -> None:
    data = path.read_bytes()
    if fmt == "otlp" and path.suffix == ".pb":
        ExportTraceServiceRequest().ParseFromString(data)
    else:
        for line in data.splitlines():
            json.loads(line)


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished worker processes."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _timed_import(store: Path, fmt: str, path: Path, jobs: int) -> dict[str, Any]:
    """One `otel-replay import` as the command runs it, in the fresh process it runs in (a process
    that has already imported much in-process hands its forked workers a fragmented heap, ~20 %
    slower); the time and CPU (its workers' too) of the import alone, not the interpreter's start."""
    started, cpu_started = time.perf_counter(), _cpu_seconds()
    batches, result = import_files(store, fmt, [path], jobs=jobs)
    elapsed, cpu = time.perf_counter() - started, _cpu_seconds() - cpu_started
    return {"steps": result.steps - result.traces,  # agent spans are structure, not steps
            "seconds": elapsed, "cpu_seconds": cpu, "skipped": sum(len(b.skipped) for b in batches),
            "segments": len(result.segments)}


def run_import_bench(quick: bool = False) -> dict[str, Any]:
    speed_before = record_work_ms()
    traces = 500 if quick else 10_000
    spans = [s for i in range(traces) for s in _trace(i)]
    work = Path(tempfile.mkdtemp(prefix="otel-replay-bench-import-"))
    rows = []
    try:
        path = work / "input.json"
        write_otlp_json(spans, path)
        default_jobs = jobs_for_bytes(path.stat().st_size)  # what `otel-replay import` does with this file
        runs = [(label, fmt, writer, 1) for label, (fmt, writer) in WRITERS.items()]
        parallel = jobs_for(len(spans), traces, max(default_jobs, 2))  # in quick mode too
        if parallel > 1:
            runs[1:1] = [("otlp (JSON lines)", "otlp", write_otlp_json, parallel),
                         ("otlp (JSON lines, 512-span batches across traces)", "otlp", write_otlp_json_batches, parallel)]
        for name, fmt, writer, jobs in runs:
            label = f"{name}, {jobs} process{'es' if jobs > 1 else ''}"
            if writer in (write_otlp_json, write_otlp_json_batches) and jobs == default_jobs:
                label += " (default)"
            path = work / ("input.pb" if "protobuf" in label else "input.json")
            writer(spans, path)
            started = time.perf_counter()
            _parse_only(path, fmt)
            parse_s = time.perf_counter() - started
            store = work / "store"
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
                timed = fresh.submit(_timed_import, store, fmt, path, jobs).result()
            steps = timed["steps"]
            rows.append({"format": label, "jobs": jobs, "traces": traces, **timed, "steps_per_s": steps / timed["seconds"],
                         "cpu_us_per_step": timed["cpu_seconds"] / steps * 1e6, "file_mb": path.stat().st_size / 1e6,
                         "parse_only_s": parse_s, "ratio_to_parse": timed["seconds"] / parse_s if parse_s else None})
            shutil.rmtree(store)
            path.unlink()
        path = work / "input.json"
        write_otlp_json(spans, path)
        stages = import_stages(path, work / "stages", steps=rows[0]["steps"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"quick": quick, "traces": traces, "rows": rows, "target_steps_per_s_otlp_json": 20_000,
            "stages": stages, "load_average": os.getloadavg(), "cpus": os.cpu_count(),
            "record_work_ms": [speed_before, record_work_ms()]}


IMPORT_STAGES = ("read", "normalize", "redact", "rows", "arrow and parquet")


def import_stages(path: Path, store: Path, steps: int) -> dict[str, float]:
    """CPU µs per step of each stage of one in-process OTLP/JSON import, each over the whole file
    before the next (as `ingest` runs them; the garbage collector paused as there)."""
    clock = time.process_time
    seconds: dict[str, float] = {}
    with paused_gc():
        started = clock()
        batch = read("otlp", path)
        seconds["read"], started = clock() - started, clock()
        normalized, _ = normalize_spans(batch.spans, batch.logs)
        seconds["normalize"], started = clock() - started, clock()
        redacted = [DEFAULT_PRIVACY(item) for item in normalized]
        seconds["redact"], started = clock() - started, clock()
        rows = RowBatch()
        RowBuilder(source="bench:stages").add_all(rows, redacted)
        seconds["rows"], started = clock() - started, clock()
        write_batch(store, rows)
        seconds["arrow and parquet"] = clock() - started
    return {stage: seconds[stage] / steps * 1e6 for stage in IMPORT_STAGES}


def format_import_table(result: dict[str, Any]) -> str:
    lines = ["| format | traces | steps | file MB | import s | steps/s | CPU µs/step | parse-only s | import / parse |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['format']} | {r['traces']:,} | {r['steps']:,} | {r['file_mb']:.1f} | {r['seconds']:.2f} | "
                     f"{r['steps_per_s']:,.0f} | {r['cpu_us_per_step']:.0f} | {r['parse_only_s']:.2f} | "
                     f"{r['ratio_to_parse']:.1f}x |")
    otlp = [r for r in result["rows"] if r["format"].startswith("otlp (JSON") and "(default)" in r["format"]]
    slowest = min(r["steps_per_s"] for r in otlp)
    mark = "pass" if slowest >= result["target_steps_per_s_otlp_json"] else "FAIL"
    lines.append("")
    rates = " and ".join(f"{r['steps_per_s']:,.0f}" for r in otlp)
    lines.append(f"Target: >= {result['target_steps_per_s_otlp_json']:,} steps/s for OTLP/JSON (the default, each "
                 f"layout): {rates} ({mark}).")
    if result.get("stages"):
        stages = result["stages"]
        lines.append("Where one process spends it, CPU µs per OTLP/JSON step: " + ", ".join(
            f"{stage} {stages[stage]:.0f}" for stage in IMPORT_STAGES) + f" ({sum(stages.values()):.0f} in all).")
    if result.get("load_average"):
        lines.append("Load average at the end of the run (1/5/15 min): {:.2f} / {:.2f} / {:.2f} on {} CPUs.".format(
            *result["load_average"], result.get("cpus")))
    if result.get("record_work_ms"):
        lines.append("Machine speed: a fixed miniature of record work took {:.1f} ms before the run and {:.1f} ms "
                     "after it (`record_work_ms`, lower is faster; these shared machines differ by up to 2x between "
                     "days, so compare runs by it).".format(*result["record_work_ms"]))
    return "\n".join(lines)
