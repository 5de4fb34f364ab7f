"""Reading export files of every supported format into records, with errors that name the
file and the line or record at fault. One reader per format; `sniff` picks one for `auto`."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from otel_replay.normalize.records import LogEvent, SpanRecord
from otel_replay.normalize.sources import (
    jaeger,
    langfuse_api,
    langsmith,
    otlp_json,
    otlp_proto,
    whowhen,
)
from otel_replay.normalize.sources.flat_json import read_flat

RECORD_ERRORS = (ValueError, TypeError, KeyError, AttributeError, RecursionError)


class UnreadableFile(ValueError):
    """A file that cannot be read at all (missing, empty, truncated, wrong format)."""


@dataclass(slots=True)
class SourceBatch:
    """What one file held: spans, log events, and the records skipped (location, reason)."""

    path: Path
    format: str
    spans: list[SpanRecord] = field(default_factory=list)
    logs: list[LogEvent] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UnreadableFile(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UnreadableFile(f"{path}: is a directory (this format reads files)") from None
    except OSError as exc:
        raise UnreadableFile(f"{path}: cannot read ({exc.strerror})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise UnreadableFile(f"{path}: truncated or corrupt gzip ({exc})") from None
    if not data.strip():
        raise UnreadableFile(f"{path}: the file is empty")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"{path}: not UTF-8 text at byte {exc.start} (is it a protobuf .pb file?)") from None


def json_documents(path: Path) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
    """[(location, document)] from a JSON file or a JSON-lines file; bad lines are skipped."""
    text = _text(path)
    try:
        return [(str(path), orjson.loads(text))], []
    except orjson.JSONDecodeError:
        pass  # orjson is strict (and fast); the json module below gives line/column and reads JSON lines
    try:
        return [(str(path), json.loads(text))], []
    except RecursionError:
        raise UnreadableFile(f"{path}: JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":
            lines = [ln for ln in text.splitlines() if ln.strip()]
            if len(lines) <= 1:
                raise UnreadableFile(f"{path}: invalid or truncated JSON at line {exc.lineno} column {exc.colno}: "
                                     f"{exc.msg}") from None
    docs, skipped = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            docs.append((f"{path}:{number}", orjson.loads(line)))
            continue
        except orjson.JSONDecodeError:
            pass
        try:
            docs.append((f"{path}:{number}", json.loads(line)))
        except (json.JSONDecodeError, RecursionError) as exc:
            skipped.append((f"{path}:{number}", f"invalid JSON: {getattr(exc, 'msg', 'nested too deeply')}"))
    if not docs:
        raise UnreadableFile(f"{path}: no line is valid JSON (first error: {skipped[0][1]})")
    return docs, skipped


def read_otlp(path: Path) -> SourceBatch:
    batch = SourceBatch(path, "otlp")
    if path.suffix in (".pb", ".binpb", ".proto") or _looks_binary(path):
        data = path.read_bytes()
        if not data:
            raise UnreadableFile(f"{path}: the file is empty")
        try:
            batch.spans = list(otlp_proto.spans_from_proto(otlp_proto.parse_traces(data)))
        except RECORD_ERRORS as exc:
            try:
                batch.logs = list(otlp_proto.logs_from_proto(otlp_proto.parse_logs(data)))
            except RECORD_ERRORS:
                raise UnreadableFile(f"{path}: not an OTLP protobuf request ({exc})") from None
        return batch
    docs, batch.skipped = json_documents(path)
    for location, doc in docs:
        errors: list[tuple[str, str]] = []
        try:
            if isinstance(doc, Mapping) and "resourceLogs" in doc:
                batch.logs += list(otlp_json.logs_from_request(doc))
            else:
                batch.spans += list(otlp_json.spans_from_request(doc, errors))
        except RECORD_ERRORS as exc:
            if len(docs) == 1:
                raise UnreadableFile(f"{location}: {exc}") from None
            batch.skipped.append((location, str(exc)))
        batch.skipped += [(f"{location} {where}", reason) for where, reason in errors]
    return batch


def _looks_binary(path: Path) -> bool:
    try:
        head = path.read_bytes()[:64]
    except OSError:
        return False
    return bool(head) and head.lstrip()[:1] not in (b"{", b"[") and head[:2] != b"\x1f\x8b"


def read_langsmith(path: Path) -> SourceBatch:
    batch = SourceBatch(path, "langsmith")
    docs, batch.skipped = json_documents(path)
    runs: list[Mapping[str, Any]] = []
    ops = [(loc, d) for loc, d in docs if isinstance(d, Mapping) and "op" in d and "payload" in d]
    if ops:
        runs = langsmith.merge_ingest_ops(d for _, d in ops)
    else:
        for location, doc in docs:
            try:
                runs += langsmith.runs_in(doc)
            except RECORD_ERRORS as exc:
                if len(docs) == 1:
                    raise UnreadableFile(f"{location}: {exc}") from None
                batch.skipped.append((location, str(exc)))
    batch.spans = _each(runs, langsmith.span_from_run_checked, batch.skipped, path)
    batch.spans = langsmith.order_by_dotted(batch.spans)
    return batch


def read_langfuse(path: Path) -> SourceBatch:
    docs, skipped = json_documents(path)
    if any(isinstance(d, Mapping) and "resourceSpans" in d for _, d in docs):
        batch = read_otlp(path)
        batch.format = "langfuse"
        return batch
    batch = SourceBatch(path, "langfuse", skipped=skipped)
    for location, doc in docs:
        try:
            observations, trace = langfuse_api.observations_in(doc)
        except RECORD_ERRORS as exc:
            if len(docs) == 1:
                raise UnreadableFile(f"{location}: {exc}") from None
            batch.skipped.append((location, str(exc)))
            continue
        good = []
        for i, obs in enumerate(observations):
            if "id" in obs and "traceId" in obs:
                good.append(obs)
            else:
                batch.skipped.append((f"{location} observation {i}", "observation without 'id' or 'traceId'"))
        try:
            batch.spans += langfuse_api.spans_from_observations(good, trace)
        except RECORD_ERRORS as exc:
            batch.skipped.append((location, str(exc)))
    return batch


def read_jaeger(path: Path) -> SourceBatch:
    batch = SourceBatch(path, "jaeger")
    docs, batch.skipped = json_documents(path)
    for location, doc in docs:
        traces = doc.get("data") if isinstance(doc, Mapping) else None
        if not isinstance(traces, list):
            raise UnreadableFile(f"{location}: not Jaeger JSON: expected an object with a 'data' list of traces")
        for t, trace in enumerate(traces):
            spans = trace.get("spans") if isinstance(trace, Mapping) else None
            if not isinstance(spans, list):
                batch.skipped.append((f"{location} data[{t}]", "trace without a 'spans' list"))
                continue
            for s, span in enumerate(spans):
                try:
                    batch.spans.append(jaeger.span_from_jaeger(span, trace.get("processes") or {}))
                except RECORD_ERRORS as exc:
                    batch.skipped.append((f"{location} data[{t}].spans[{s}]", str(exc)))
    return batch


def read_whowhen(path: Path) -> SourceBatch:
    batch = SourceBatch(path, "whowhen")
    files = sorted(path.rglob("*.json"), key=lambda p: (p.parent.name, int(p.stem) if p.stem.isdigit() else 0, p.stem)) \
        if path.is_dir() else [path]
    if not files:
        raise UnreadableFile(f"{path}: no Who&When .json logs found")
    for file in files:
        try:
            batch.spans += whowhen.read_log(file)
        except (UnicodeDecodeError, json.JSONDecodeError, OSError, *RECORD_ERRORS) as exc:
            batch.skipped.append((str(file), str(exc)))
    if not batch.spans:
        raise UnreadableFile(f"{path}: no readable Who&When log ({batch.skipped[0][1]})")
    return batch


def read_flat_file(path: Path) -> SourceBatch:
    docs, skipped = json_documents(path)
    batch = SourceBatch(path, "flat", skipped=skipped)
    for location, doc in docs:
        try:
            spans, logs = read_flat(doc)
        except RECORD_ERRORS as exc:
            raise UnreadableFile(f"{location}: {exc}") from None
        batch.spans += spans
        batch.logs += logs
    return batch


def _each(items: list[Any], convert: Callable[[Any], SpanRecord], skipped: list[tuple[str, str]], path: Path
          ) -> list[SpanRecord]:
    out = []
    for i, item in enumerate(items):
        try:
            out.append(convert(item))
        except RECORD_ERRORS as exc:
            skipped.append((f"{path} record {i}", str(exc)))
    return out


READERS: dict[str, Callable[[Path], SourceBatch]] = {
    "otlp": read_otlp,
    "langsmith": read_langsmith,
    "langfuse": read_langfuse,
    "jaeger": read_jaeger,
    "whowhen": read_whowhen,
    "flat": read_flat_file,
}


def sniff(path: Path) -> str:
    """The format of a file or directory, from its content."""
    if path.is_dir():
        return "whowhen"
    if path.suffix in (".pb", ".binpb") or _looks_binary(path):
        return "otlp"
    docs, _ = json_documents(path)
    doc = docs[0][1]
    if isinstance(doc, Mapping):
        if "resourceSpans" in doc or "resourceLogs" in doc:
            return "otlp"
        if "history" in doc and ("mistake_step" in doc or "mistake_agent" in doc):
            return "whowhen"
        if isinstance(doc.get("data"), list):
            first = doc["data"][0] if doc["data"] else {}
            return "jaeger" if isinstance(first, Mapping) and "spans" in first else "langfuse"
        if "observations" in doc:
            return "langfuse"
        if "spans" in doc:
            return "flat"
        if "runs" in doc or "items" in doc or "run_type" in doc or ("op" in doc and "payload" in doc):
            return "langsmith"
    if isinstance(doc, list) and doc and isinstance(doc[0], Mapping):
        return "langfuse" if "traceId" in doc[0] else "langsmith"
    raise UnreadableFile(f"{path}: cannot tell the format; name it (otlp, langsmith, langfuse, jaeger, whowhen)")


def read(format: str, path: Path) -> SourceBatch:
    if format == "auto":
        format = sniff(path)
    if format not in READERS:
        raise UnreadableFile(f"unknown format {format!r}; use one of {', '.join(READERS)} or auto")
    if not path.exists():
        raise UnreadableFile(f"{path}: no such file")
    return READERS[format](path)


