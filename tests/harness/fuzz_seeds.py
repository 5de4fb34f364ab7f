"""Seed corpora for the fuzz targets (`fuzzing.py`), cut from the recorded fixtures, and a JSON
mutator that swaps values of a valid document for hostile ones (so the fuzzer gets past the parser).

Seeds are small (one to three records each) so a mutation costs milliseconds, not tens of them.
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import random
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# in a source checkout: the recorded data the tests read (tests/fixtures/README.md)
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
WHOWHEN = FIXTURES / "whowhen"
_ID_KEYS = {"traceId", "spanId", "parentSpanId"}

# Values a hostile or broken exporter sends, one of which replaces a random node of a seed.
HOSTILE: list[Any] = [
    None, True, 0, -1, 1.5, 2**63, 2**64 + 1, 10**30, -(2**63) - 1, float("nan"), float("inf"), 1e300,
    "", "0", "-5", "1e999", "NaN", "ab" * 16, "AB" * 8, "0" * 32, "zz" * 8, "x" * 2000, "\ud800", "\x00",
    "9999-12-31T23:59:59Z", "0001-01-01T00:00:00", "1970-01-01T00:00:00+14:00", "2024-02-30",
    [], {}, [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]], {"a": {"b": {"c": {"d": {"e": {}}}}}},
    {"stringValue": "x"}, {"intValue": "99999999999999999999"}, {"arrayValue": {"values": [{}]}},
    {"kvlistValue": {"values": [{"key": "k", "value": {"kvlistValue": {}}}]}}, {"bytesValue": "!!"},
]


def _compact(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _otlp_pieces(doc: dict[str, Any], top: str, mid: str, leaf: str, per: int) -> Iterator[dict[str, Any]]:
    """A request per `per` records, each keeping its resource and scope."""
    for outer in doc.get(top) or []:
        for middle in outer.get(mid) or []:
            items = middle.get(leaf) or []
            for i in range(0, len(items), per):
                yield {top: [{**outer, mid: [{**middle, leaf: items[i:i + per]}]}]}


def otlp_json_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((FIXTURES / "otel").glob("*.otlp.json")):
        doc = _load(path)
        if "resourceLogs" in doc:
            docs += list(_otlp_pieces(doc, "resourceLogs", "scopeLogs", "logRecords", 2))[:3]
        else:
            docs += list(_otlp_pieces(doc, "resourceSpans", "scopeSpans", "spans", 1))[:4]
    return docs


def _b64_ids(value: Any) -> Any:
    """OTLP/JSON (hex ids) as protobuf's JSON mapping wants it (base64 bytes)."""
    if isinstance(value, dict):
        return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in _ID_KEYS and isinstance(v, str) and v
                else _b64_ids(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_b64_ids(v) for v in value]
    return value


def otlp_proto_bodies() -> list[bytes]:
    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out = []
    for doc in otlp_json_docs():
        message = ExportLogsServiceRequest() if "resourceLogs" in doc else ExportTraceServiceRequest()
        out.append(ParseDict(_b64_ids(doc), message, ignore_unknown_fields=True).SerializeToString())
    return out


def flat_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((FIXTURES / "otel").glob("*.json")):
        if path.name.endswith(".otlp.json"):
            continue
        doc = _load(path)
        for span in (doc.get("spans") or [])[:3]:
            logs = [g for g in doc.get("logs") or [] if g.get("span_id") == span.get("span_id")]
            docs.append({"spans": [span], "logs": logs[:2]})
    return docs


def langsmith_seeds() -> list[bytes]:
    runs = _load(FIXTURES / "langsmith" / "trace_wrong_answer.runs.json")
    seeds = [_compact(runs[i:i + 2]) for i in range(0, min(len(runs), 12), 2)]
    page = _load(FIXTURES / "langsmith" / "trace_rate_limited.runs_query_v2.json")
    key = "items" if isinstance(page.get("items"), list) else "runs"
    seeds.append(_compact({**page, key: (page.get(key) or [])[:2]}))
    ops = (FIXTURES / "langsmith" / "trace_wrong_answer.ingest_ops.jsonl").read_bytes().splitlines()
    seeds.append(b"\n".join(ops[:3]) + b"\n")
    return seeds


def langfuse_seeds() -> list[bytes]:
    trace = _load(FIXTURES / "langfuse" / "trace_wrong_answer.trace_get.json")
    seeds = [_compact({**trace, "observations": trace["observations"][i:i + 2]}) for i in range(0, 8, 2)]
    for path in sorted((FIXTURES / "langfuse" / "export_3_traces").glob("*.observations_v2.json"))[:2]:
        page = _load(path)
        seeds.append(_compact({**page, "data": page["data"][:2]}))
    seeds.append(_compact(_load(FIXTURES / "langfuse" / "export_3_traces" / "traces_list.json")))
    return seeds


def jaeger_seeds() -> list[bytes]:
    from otel_replay.export.files import to_jaeger
    from otel_replay.normalize.sources.otlp_json import spans_from_request

    return [_compact(to_jaeger(list(spans_from_request(doc)))) for doc in otlp_json_docs() if "resourceSpans" in doc][:12]


def whowhen_seeds() -> list[bytes]:
    seeds = []
    for path in sorted(WHOWHEN.glob("*/1*.json"))[:6]:
        doc = _load(path)
        doc["history"] = doc.get("history", [])[:3]
        seeds.append(_compact(doc))
    return seeds


HTTP_PATHS = ("/v1/traces", "/v1/logs")


def http_request(path: str, body: bytes, content_type: str, encoding: str = "", chunked: bool = False) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Type: {content_type}"]
    if encoding:
        head.append(f"Content-Encoding: {encoding}")
    if chunked:
        head.append("Transfer-Encoding: chunked")
        half = len(body) // 2
        body = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:]) if part) + b"0\r\n\r\n"
    else:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def http_seeds() -> list[bytes]:
    docs = otlp_json_docs()[:6]
    protos = otlp_proto_bodies()[:6]
    seeds = []
    for i, (doc, proto) in enumerate(zip(docs, protos, strict=True)):
        path = "/v1/logs" if "resourceLogs" in doc else "/v1/traces"
        encoding = ("", "gzip", "deflate")[i % 3]
        pack = {"": lambda b: b, "gzip": gzip.compress, "deflate": zlib.compress}[encoding]
        seeds.append(http_request(path, pack(_compact(doc)), "application/json", encoding, chunked=i % 2 == 1))
        seeds.append(http_request(path, pack(proto), "application/x-protobuf", encoding, chunked=i % 2 == 0))
    seeds.append(b"GET /v1/traces HTTP/1.1\r\nHost: x\r\n\r\n")
    seeds.append(http_request("/v1/traces", b"{}", "text/plain"))
    return seeds


def corpus(target: str) -> list[bytes]:
    """The seed inputs of one fuzz target."""
    otlp = [_compact(d) for d in otlp_json_docs()]
    if target in ("otlp_json", "receiver_json"):
        seeds = otlp
    elif target in ("otlp_proto", "receiver_proto"):
        seeds = otlp_proto_bodies()
    elif target == "flat_json":
        seeds = [_compact(d) for d in flat_docs()]
    elif target == "langsmith":
        seeds = langsmith_seeds()
    elif target == "langfuse_api":
        seeds = langfuse_seeds()
    elif target == "jaeger":
        seeds = jaeger_seeds()
    elif target == "whowhen":
        seeds = whowhen_seeds()
    elif target == "files_sniff":
        seeds = otlp[:3] + otlp_proto_bodies()[:2] + langsmith_seeds()[:2] + langfuse_seeds()[:2] + jaeger_seeds()[:2] \
            + whowhen_seeds()[:2] + [_compact(d) for d in flat_docs()[:2]] + [gzip.compress(otlp[0])]
    elif target == "receiver_http":
        return http_seeds()
    else:
        raise KeyError(f"no fuzz target {target!r}")
    if target.startswith("receiver_"):  # the first byte picks the signal: 0 traces, 1 logs
        seeds = [bytes([1 if b"resourceLogs" in s or b"logRecords" in s else 0]) + s for s in seeds]
    return seeds


# -- a mutator that keeps JSON valid ----------------------------------------------------------------
def nodes(doc: Any, out: list[tuple[Any, Any]]) -> None:
    """Every (container, key) of a parsed document, for picking a node to replace."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            out.append((doc, key))
            nodes(value, out)
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out.append((doc, i))
            nodes(value, out)


def mutate_json(doc: Any, rng: random.Random) -> Any:
    """Replace, delete or duplicate one node of `doc` (in place), or wrap it deeper."""
    found: list[tuple[Any, Any]] = []
    nodes(doc, found)
    if not found:
        return copy.deepcopy(rng.choice(HOSTILE))
    payloads = [(c, k) for c, k in found if isinstance(c[k], str) and c[k][:1] in ("[", "{")]
    if payloads and rng.random() < 0.4:  # a payload carried as JSON text (gen_ai.input.messages, ...)
        container, key = rng.choice(payloads)
        try:
            inner = json.loads(container[key])
        except (ValueError, RecursionError):
            inner = None
        if inner is not None:
            container[key] = json.dumps(mutate_json(inner, rng), ensure_ascii=False)
            return doc
    container, key = rng.choice(found)
    action = rng.random()
    if action < 0.6:
        container[key] = copy.deepcopy(rng.choice(HOSTILE))
    elif action < 0.7:
        del container[key]
    elif action < 0.85 and isinstance(container, list):
        container.insert(key, json.loads(json.dumps(container[key])))  # a duplicate record (same ids)
    else:
        value = container[key]
        for _ in range(rng.choice((2, 70, 400))):
            value = [value] if rng.random() < 0.5 else {"kvlistValue": {"values": [{"key": "k", "value": value}]}}
        container[key] = value
    return doc


def json_mutator(data: bytes, max_size: int, seed: int, prefix: int = 0) -> bytes:
    """For atheris' `custom_mutator`: half the time a JSON-aware mutation, else libFuzzer's own."""
    import atheris

    rng = random.Random(seed)
    if rng.random() < 0.5:
        try:
            doc = json.loads(data[prefix:])
        except (ValueError, RecursionError):
            doc = None
        if doc is not None:
            try:
                out = data[:prefix] + _compact(mutate_json(doc, rng))
            except (ValueError, RecursionError):
                out = b""
            if out and len(out) <= max_size:
                return out
    return atheris.Mutate(data, max_size)
