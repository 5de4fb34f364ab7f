"""Synthetic stores for the scale benchmark: N spans of GenAI agent traces, written as Parquet
segments through the store's own schemas and writer, compacted, then queried as the CLI does.

Each trace is one agent run of `SPANS_PER_TRACE` spans: an `invoke_agent` root, then five chat
calls and four tool calls in turn, each with its span row and its step row, and the run's ten
payloads content-addressed in `message_rows` (the system prompt and tool definitions are shared
by every trace of a service and stored once). Text comes from a pool of word-like tokens drawn
from a Zipf distribution (it compresses about as well as English); ids are random hex. The
traces of one day arrive as segments of `SEGMENT_SPANS` spans, as many writers would leave them,
and are compacted before querying (the README's advice).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from otel_replay.store import queries
from otel_replay.store.compact import compact_day
from otel_replay.store.layout import write_segment
from otel_replay.store.schema import schema_of
from otel_replay.trajectory import Store

SPANS_PER_TRACE = 10  # invoke_agent, then chat / tool alternating: 5 chat, 4 tool
SEGMENT_SPANS = 50_000  # spans per segment before compaction (a writer's flush is smaller)
DAY = "2026-01-01"
T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
SERVICES = [f"support-{i:02d}" for i in range(20)]
MODELS = ("gpt-4o", "gpt-4o-mini", "claude-sonnet-4", "gemini-2.5-flash")
TOOLS = ("search_docs", "get_order", "refund_order", "send_email", "lookup_customer", "create_ticket")
POOL_WORDS = 4_000_000  # ~27 MB of text; a segment's messages take a different window of it
ROLES = ["user"] + ["assistant", "tool"] * 4 + ["assistant"]  # a trace's ten messages, in order
QUERY_REPEATS = 5  # per query; the median is reported


def word_pool(seed: int = 0) -> pa.Buffer:
    """A long ASCII text of word-like tokens with a Zipf frequency (built once, kept across sizes)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    vocab = ["".join(rng.choice(letters, size=int(n))) for n in rng.integers(2, 10, size=5000)]
    ranks = np.minimum(rng.zipf(1.3, size=POOL_WORDS), len(vocab)) - 1
    return pa.py_buffer(" ".join(vocab[i] for i in ranks).encode())


def _strings(data: bytes | pa.Buffer, lengths: np.ndarray) -> pa.Array:
    """Consecutive pieces of `data` of the given lengths, as a string array (no copy of the text)."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    return pa.StringArray.from_buffers(len(lengths), pa.py_buffer(offsets), buffer)


def _hex(n: int, width: int) -> pa.Array:
    return _strings(os.urandom(n * width // 2).hex().encode(), np.full(n, width))


def _texts(pool: pa.Buffer, rng: np.random.Generator, n: int, low: int, high: int) -> pa.Array:
    """n distinct pieces of the pool, low..high characters each."""
    lengths = rng.integers(low, high + 1, size=n)
    total = int(lengths.sum())
    if total >= pool.size:
        raise ValueError(f"the word pool ({pool.size:,} bytes) is shorter than a segment's text ({total:,})")
    start = int(rng.integers(0, pool.size - total))
    return _strings(pool.slice(start, total), lengths)


def _join(*parts: Any) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def _table(table: str, columns: dict[str, Any], n: int) -> pa.Table:
    """Columns in the schema's order; a column the generator does not fill is null."""
    schema = schema_of(table)
    arrays = [pa.array(columns[f.name], type=f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def shared_messages() -> tuple[pa.Table, dict[str, tuple[str, str]]]:
    """The system prompt and tool definitions of each service, stored once: (rows, service -> hashes)."""
    rows, hashes = [], {}
    for service in SERVICES:
        system, tools = _hex(2, 32).to_pylist()
        rows.append({"hash": system, "kind": "system", "role": None,
                     "body": json.dumps([{"type": "text", "content": f"You are the {service} agent."}])})
        rows.append({"hash": tools, "kind": "tools", "role": None, "body": json.dumps(
            [{"type": "function", "name": t, "parameters": {"type": "object"}} for t in TOOLS])})
        hashes[service] = (system, tools)
    columns = {k: [r[k] for r in rows] for k in ("hash", "kind", "role", "body")}
    return _table("message_rows", columns, len(rows)), hashes


# per position in a trace: 0 the agent, 1 + 2j chat turn j (j = 0..4), 2 + 2k tool call k (k = 0..3)
_POS = np.arange(SPANS_PER_TRACE)
_KIND = np.where(_POS == 0, 0, np.where(_POS % 2 == 1, 1, 2))  # agent, llm, tool
_IN = [[], *[list(range(p)) if p % 2 else [p - 1] for p in _POS[1:]]]  # message indices each step reads
_OUT = [[], *[[p] for p in _POS[1:]]]  # ... and writes (chat j writes message 1 + 2j, tool k message 2 + 2k)


def _lists(per_position: list[list[int]], traces: int, values: pa.Array, base: int = SPANS_PER_TRACE) -> pa.Array:
    """A list column: for span p of trace t, values[t * base + i] for i in per_position[p]."""
    rel = np.array([i for items in per_position for i in items], dtype=np.int64)
    lengths = np.tile([len(items) for items in per_position], traces)
    index = (np.arange(traces)[:, None] * base + rel[None, :]).ravel()
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), values.take(pa.array(index)))


def chunk_tables(traces: int, pool: pa.Buffer, rng: np.random.Generator, shared: dict[str, tuple[str, str]]
                 ) -> tuple[pa.Table, pa.Table, pa.Table]:
    """span_rows, step_rows and message_rows of `traces` agent runs (10 spans, 10 messages each)."""
    n = traces * SPANS_PER_TRACE
    t_of = np.repeat(np.arange(traces), SPANS_PER_TRACE)
    pos = np.tile(_POS, traces)
    kind = _KIND[pos]
    llm, tool, agent = kind == 1, kind == 2, kind == 0
    trace_ids, span_ids, msg_ids = _hex(traces, 32), _hex(n, 16), _hex(traces * 10, 32)
    calls = _join("call_", _hex(traces * 4, 12))  # call k of trace t at t * 4 + k
    service_of = rng.integers(0, len(SERVICES), size=traces)
    service = pa.array(SERVICES).take(pa.array(service_of[t_of]))
    model = pa.array(MODELS).take(pa.array(rng.integers(0, len(MODELS), size=traces)[t_of]))
    tool_of = rng.integers(0, len(TOOLS), size=traces * 4)
    k = np.clip((pos - 1) // 2, 0, 3)  # the tool call a chat turn makes / a tool span runs
    call_index = pa.array(t_of * 4 + k)
    call, tool_name = calls.take(call_index), pa.array(TOOLS).take(pa.array(tool_of[t_of * 4 + k]))
    # times: children one after another from the trace's start; the agent span covers them all
    durations = np.where(llm, rng.integers(300, 4000, size=n), rng.integers(5, 900, size=n)) * 10**6
    durations = durations.reshape(traces, SPANS_PER_TRACE)
    durations[:, 0] = 0
    starts = T0 + rng.integers(0, 86_000 * 10**9, size=traces)[:, None] + np.cumsum(durations, axis=1) \
        - durations + _POS[None, :] * 10**6
    ends = starts + durations
    ends[:, 0] = ends[:, -1] + 10**6
    starts, ends = starts.ravel(), ends.ravel()
    error = np.repeat(rng.random(traces) < 0.05, SPANS_PER_TRACE) & (pos == SPANS_PER_TRACE - 2)
    tokens_in, tokens_out = rng.integers(200, 6000, size=n), rng.integers(20, 900, size=n)
    finish = pa.array(np.where(pos == SPANS_PER_TRACE - 1, "stop", "tool_calls"))
    attributes = pc.if_else(pa.array(llm), _join(
        '{"gen_ai.operation.name":"chat","gen_ai.request.model":"', model, '","gen_ai.provider.name":"openai",'
        '"gen_ai.response.model":"', model, '","gen_ai.response.id":"chatcmpl-', span_ids,
        '","gen_ai.usage.input_tokens":', pc.cast(pa.array(tokens_in), pa.string()),
        ',"gen_ai.usage.output_tokens":', pc.cast(pa.array(tokens_out), pa.string()),
        ',"gen_ai.response.finish_reasons":["', finish, '"]}'), pc.if_else(pa.array(tool), _join(
            '{"gen_ai.operation.name":"execute_tool","gen_ai.tool.name":"', tool_name, '","gen_ai.tool.call.id":"',
            call, '"}'), _join('{"gen_ai.operation.name":"invoke_agent","gen_ai.agent.name":"', service, '"}')))
    name = pc.if_else(pa.array(llm), _join("chat ", model), pc.if_else(pa.array(tool), tool_name, service))
    roots = span_ids.take(pa.array(t_of * SPANS_PER_TRACE))
    parent = pc.if_else(pa.array(agent), pa.scalar(None, pa.string()), roots)
    status = pa.array(np.where(error, "error", "unset"))
    common = {"trace_id": trace_ids.take(pa.array(t_of)), "span_id": span_ids, "parent_span_id": parent,
              "start_ns": starts, "end_ns": ends, "service_name": service, "source": pa.array(["capture"] * n),
              "ingested_ns": np.full(n, time.time_ns())}
    spans = _table("span_rows", {
        **common, "name": pc.if_else(pa.array(agent), _join("invoke_agent ", service),
                                     pc.if_else(pa.array(tool), _join("execute_tool ", tool_name), name)),
        "span_kind": pa.array(np.where(llm, "CLIENT", "INTERNAL")), "status_code": status,
        "status_message": pa.array(np.where(error, "upstream timeout", None)),
        "scope_name": pa.array(["opentelemetry.instrumentation.openai_v2"] * n), "scope_version": pa.array(["2.4b0"] * n),
        "attributes": attributes, "events": pa.array(["[]"] * n), "links": pa.array(["[]"] * n),
        "resource": _join('{"service.name":"', service, '","telemetry.sdk.language":"python"}')}, n)
    system = pa.array([shared[s][0] for s in SERVICES]).take(pa.array(service_of[t_of]))
    tools_hash = pa.array([shared[s][1] for s in SERVICES]).take(pa.array(service_of[t_of]))
    null = pa.scalar(None, pa.string())
    steps = _table("step_rows", {
        **common, "kind": pa.array(np.array(["agent", "llm", "tool"])[kind]),
        "operation": pa.array(np.array(["invoke_agent", "chat", "execute_tool"])[kind]), "name": name,
        "status": status, "error_type": pa.array(np.where(error, "TimeoutError", None)),
        "provider": pc.if_else(pa.array(llm), "openai", null), "request_model": pc.if_else(pa.array(llm), model, null),
        "response_model": pc.if_else(pa.array(llm), model, null),
        "input_tokens": pa.array(tokens_in, mask=~llm), "output_tokens": pa.array(tokens_out, mask=~llm),
        "agent_name": pc.if_else(pa.array(agent), service, null), "tool_name": pc.if_else(pa.array(tool), tool_name, null),
        "tool_call_id": pc.if_else(pa.array(tool), call, null), "system_hash": pc.if_else(pa.array(llm), system, null),
        "tools_hash": pc.if_else(pa.array(llm), tools_hash, null),
        "input_hashes": _lists(_IN, traces, msg_ids), "output_hashes": _lists(_OUT, traces, msg_ids),
        "finish_reasons": _lists([[p] if p % 2 else [] for p in _POS], traces, finish),
        "has_payload": ~agent, "convention": pa.array(["genai"] * n)}, n)
    # the ten messages of each trace: user, then (tool call k, its result) for k = 0..3, then the answer
    calls_k = np.arange(traces * 4)
    bodies = pa.concat_arrays([
        _join('{"parts":[{"content":"', _texts(pool, rng, traces, 120, 400), '","type":"text"}],"role":"user"}'),
        _join('{"parts":[{"arguments":{"query":"', _texts(pool, rng, traces * 4, 20, 80), '"},"id":"', calls,
              '","name":"', pa.array(TOOLS).take(pa.array(tool_of[calls_k])), '","type":"tool_call"}],"role":"assistant"}'),
        _join('{"parts":[{"id":"', calls, '","response":"', _texts(pool, rng, traces * 4, 200, 900),
              '","type":"tool_call_response"}],"role":"tool"}'),
        _join('{"parts":[{"content":"', _texts(pool, rng, traces, 150, 600), '","type":"text"}],"role":"assistant"}')])
    t, m = np.arange(traces)[:, None], _POS[None, :]
    order = np.where(m == 0, t, np.where(m == 9, 9 * traces + t, np.where(m % 2 == 1, traces + t * 4 + (m - 1) // 2,
                                                                            5 * traces + t * 4 + (m - 2) // 2)))
    messages = _table("message_rows", {"hash": msg_ids, "kind": pa.array(["message"] * (traces * 10)),
                                       "role": pa.array(np.tile(ROLES, traces)),
                                       "body": bodies.take(pa.array(order.ravel()))}, traces * 10)
    return spans, steps, messages


def build_store(root: Path, spans: int, pool: pa.Buffer, seed: int = 0) -> dict[str, Any]:
    """Write `spans` spans as segments of one day, then compact; sizes and times."""
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    shared_rows, shared = shared_messages()
    write_segment(root, "message_rows", DAY, shared_rows)
    traces = spans // SPANS_PER_TRACE
    per_segment = max(1, min(SEGMENT_SPANS, spans // 4) // SPANS_PER_TRACE)  # at least 4 segments to compact
    segments = 0
    for first in range(0, traces, per_segment):
        span_table, step_table, message_table = chunk_tables(min(per_segment, traces - first), pool, rng, shared)
        write_segment(root, "message_rows", DAY, message_table)
        write_segment(root, "span_rows", DAY, span_table)
        write_segment(root, "step_rows", DAY, step_table)
        segments += 1
    written = time.perf_counter() - started
    started = time.perf_counter()
    compact_day(root, DAY)
    compacted = time.perf_counter() - started
    sizes = {t: sum(p.stat().st_size for p in (root / t).rglob("*.parquet")) for t in
             ("span_rows", "step_rows", "message_rows")}
    return {"spans": traces * SPANS_PER_TRACE, "traces": traces, "segments": segments, "write_s": written,
            "compact_s": compacted, "bytes": sizes, "bytes_per_span": sum(sizes.values()) / (traces * SPANS_PER_TRACE)}


def _median_time(fn: Callable[[], Any], repeats: int = QUERY_REPEATS) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def query_times(root: Path, seed: int = 0) -> dict[str, Any]:
    """Median wall time (warm page cache) of: loading one trace's trajectory (steps, payloads,
    dataflow, as `attribute` does), one trace's spans (as `export` does), and a step-name
    aggregate over every step, each on a fresh DuckDB connection over the store's views as a
    command opens it; and one trace's spans on an already open connection (the query alone)."""
    store = Store(root)
    all_ids = store.sql("SELECT trace_id FROM span_rows WHERE parent_span_id IS NULL").column("trace_id").to_pylist()
    picks = random.Random(seed).sample(all_ids, min(QUERY_REPEATS, len(all_ids)))
    order = iter(picks * QUERY_REPEATS)
    steps_loaded: list[int] = []

    def one_trajectory() -> None:
        steps_loaded.append(len(store.trajectory(next(order)).steps))

    def one_trace_spans() -> None:
        store.named("trace_span_rows", [next(order)])

    con = store.connect()  # the same query on an open connection: the part that depends on the data

    def one_trace_sql() -> None:
        con.execute(queries.query("trace_span_rows"), [next(order)]).fetchall()

    aggregate_sql = queries.load("bench.sql")["step_name_aggregate"]
    groups: list[int] = []

    def aggregate() -> None:
        groups.append(store.sql(aggregate_sql).num_rows)

    store.trajectory(picks[0])  # warm the page cache and the imports
    try:
        out = {"trajectory_s": _median_time(one_trajectory), "trace_spans_s": _median_time(one_trace_spans),
               "trace_sql_s": _median_time(one_trace_sql), "aggregate_s": _median_time(aggregate)}
    finally:
        con.close()
    if set(steps_loaded) != {SPANS_PER_TRACE - 1} or not groups or groups[0] < len(MODELS) + len(TOOLS):
        raise RuntimeError(f"the synthetic store did not read back: steps {set(steps_loaded)}, groups {groups[:1]}")
    return out
