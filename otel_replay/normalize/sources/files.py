"""Reading export files of every supported format into records, with errors that name the
file and the line or record at fault. One reader per format; `sniff` picks one for `auto`.

`read` returns a `SourceBatch` or raises `UnreadableFile` (a `SourceError`, see errors.py) when
nothing in the file can be read; each bad record is skipped and listed in `SourceBatch.skipped`.
Limits: a .gz file inflates to at most `MAX_INFLATED_BYTES`; JSON nests at most ~1000 levels;
reading peaks at about three times the file's (inflated) size in memory (the bytes, and
orjson's transient second copy of each string it parses).
"""

from __future__ import annotations

import functools
import json
import os
import re
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from otel_replay.normalize.bulk import paused_gc
from otel_replay.normalize.records import LogEvent, SpanRecord, TracePart
from otel_replay.normalize.sources import (
    jaeger,
    langfuse_api,
    langsmith,
    otlp_json,
    otlp_proto,
    whowhen,
)
from otel_replay.normalize.sources.errors import INPUT_ERRORS, SourceError, bad_record, shown
from otel_replay.normalize.sources.flat_json import read_flat

MAX_INFLATED_BYTES = 1 << 30  # a .gz file that inflates past 1 GiB is refused (a gzip bomb, or import it unpacked)
_GZIP = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
_CHUNK = 1 << 20  # gzip input fed per call, so what is left after a member is never copied whole


class UnreadableFile(SourceError):
    """A file that cannot be read at all (missing, empty, truncated, wrong format)."""


@dataclass(slots=True)
class SourceBatch:
    """What one file held: spans, log events, and the records skipped (where, reason)."""

    path: Path
    format: str
    spans: list[SpanRecord] = field(default_factory=list)
    logs: list[LogEvent] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def skip(self, error: SourceError, *, file: Path | None = None, line: int | None = None,
             record: str | None = None) -> None:
        """Record a skipped record, located in this batch's file."""
        located = error.located(file=str(file or self.path), line=line, within=record)
        self.skipped.append((located.where, located.problem))


def _unreadable(path: Path, reason: str, line: int | None = None) -> UnreadableFile:
    return UnreadableFile(reason, file=str(path), line=line)


def content(path: Path) -> bytes:
    """The file's bytes, gunzipped if they are gzip (at most `MAX_INFLATED_BYTES`)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _unreadable(path, "no such file") from None
    except IsADirectoryError:
        raise _unreadable(path, "is a directory (this format reads files)") from None
    except OSError as exc:
        raise _unreadable(path, f"cannot read ({exc.strerror})") from None
    if data[:2] == _GZIP:
        data = _gunzip(path, data)
    if data[:3] == _BOM:
        data = data[3:]
    if not data or data.isspace():  # (strip() would copy the whole file)
        raise _unreadable(path, "the file is empty")
    return data


def _gunzip(path: Path, data: bytes) -> bytes:
    """Every gzip member, stopping as soon as the output passes the limit."""
    out, pos, view = bytearray(), 0, memoryview(data)
    try:
        while pos < len(data):
            stream = zlib.decompressobj(31)
            while not stream.eof:
                if pos >= len(data):
                    raise _unreadable(path, "truncated gzip")
                piece = view[pos:pos + _CHUNK]
                pos += len(piece)
                out += stream.decompress(piece, MAX_INFLATED_BYTES + 1 - len(out))
                if len(out) > MAX_INFLATED_BYTES:
                    raise _unreadable(path, f"inflates past {MAX_INFLATED_BYTES >> 20} MB (a gzip bomb?); unpack it first")
            pos -= len(stream.unused_data)
            if data[pos:pos + 1] == b"\0" and data.count(b"\0", pos) == len(data) - pos:
                break  # zero padding after the last member (tape-style writers)
    except zlib.error as exc:
        raise _unreadable(path, f"truncated or corrupt gzip ({exc})") from None
    return bytes(out)


def _is_binary(data: bytes) -> bool:
    head = data[:64].lstrip()
    return bool(head) and head[:1] not in (b"{", b"[")


def _json_error(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "JSON nested too deeply"
    if isinstance(exc, json.JSONDecodeError):
        return f"invalid or truncated JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
    return f"invalid JSON: {str(exc)[:120]}"


@dataclass(slots=True)
class JsonDocuments:
    """A JSON or JSON-lines file as documents: (location, document) each, the lines that are not
    JSON, whether the file is one document, and how many lines a `keep` filter left unparsed."""

    docs: list[tuple[str, Any]]
    skipped: list[tuple[str, str]]
    single: bool
    unparsed: int = 0
    handed: int = 0  # JSON-lines documents given to an `each` callback instead of kept in `docs`


def json_documents(path: Path, data: bytes | None = None) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
    """[(location, document)] from a JSON file or a JSON-lines file; bad lines are skipped."""
    found = read_json(path, data)
    return found.docs, found.skipped


def read_json(path: Path, data: bytes | None = None, keep: Callable[[int, bytes], bool] | None = None,
              each: Callable[[str, Any], None] | None = None) -> JsonDocuments:
    """`json_documents`, with whether the file is one document; for JSON lines, `keep` (if given)
    says which lines to parse at all, and `each` (if given) takes each document as it is parsed,
    so a large file's documents are not all alive at once (they stay out of `docs`). `keep` gets a
    line's number (from 1) and its bytes."""
    data = content(path) if data is None else data
    try:
        return JsonDocuments([(str(path), orjson.loads(data))], [], single=True)  # strict, fast, checks UTF-8, nesting
    except orjson.JSONDecodeError as exc:
        if exc.msg == "unexpected content after document":  # a whole first document, then more: JSON lines
            return _json_lines(path, data, keep, each)
        # else the json module below reads NaN, big ints, JSON lines, and says where it failed
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        text = None
        if _is_binary(data):
            raise _unreadable(path, f"not UTF-8 text at byte {exc.start} (is it a protobuf .pb file?)") from None
        if data.count(b"\n") < 1:
            raise _unreadable(path, f"not UTF-8 text at byte {exc.start}") from None
    if text is not None:
        try:
            return JsonDocuments([(str(path), json.loads(text))], [], single=True)
        except (ValueError, RecursionError) as exc:
            extra = isinstance(exc, json.JSONDecodeError) and exc.msg == "Extra data"
            if not extra and sum(1 for ln in text.splitlines() if ln.strip()) <= 1:
                raise _unreadable(path, _json_error(exc)) from None
    return _json_lines(path, data, keep, each)


def _json_lines(path: Path, data: bytes, keep: Callable[[int, bytes], bool] | None,
                each: Callable[[str, Any], None] | None) -> JsonDocuments:
    found = JsonDocuments([], [], single=False)
    skipped = found.skipped

    def take(where: str, doc: Any) -> None:
        if each is None:
            found.docs.append((where, doc))
        else:
            found.handed += 1
            each(where, doc)

    for number, line in enumerate(_lines(data), start=1):
        if not line.strip():
            continue
        if keep is not None and not keep(number, line):
            found.unparsed += 1
            continue
        where = f"{path}:{number}"
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            try:
                doc = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as exc:
                skipped.append((where, f"not UTF-8 text at byte {exc.start}"))
                continue
            except (ValueError, RecursionError) as exc:
                skipped.append((where, _json_error(exc).replace(" at line 1 column", " at column")))
                continue
        take(where, doc)
    if not found.docs and not found.handed and not found.unparsed:
        raise no_valid_line(path, skipped)
    return found


def _lines(data: bytes) -> Iterator[bytes]:
    """`data.split(b"\\n")`, one line at a time: a large file's lines all copied at once would double
    what it holds in memory (and fault in as many fresh pages)."""
    start = 0
    end = data.find(b"\n")
    while end >= 0:
        yield data[start:end]
        start, end = end + 1, data.find(b"\n", end + 1)
    yield data[start:]


def no_valid_line(path: Path, skipped: list[tuple[str, str]]) -> UnreadableFile:
    """The error of a JSON-lines file none of whose lines is JSON (`skipped`: its lines, in order)."""
    first = skipped[0][1] if skipped else "no JSON"
    return _unreadable(path, f"no line is valid JSON (first error: {first})")


def _location(path: Path, where: str) -> dict[str, Any]:
    """`path:12` -> file and line, for an error located in a JSON-lines document."""
    prefix = f"{path}:"
    if where.startswith(prefix) and where[len(prefix):].isdigit():
        return {"file": path, "line": int(where[len(prefix):])}
    return {"file": path}


def _whole(path: Path, where: str, error: SourceError) -> UnreadableFile:
    """A document-level error as the file's error (one document) -- the caller raises it."""
    loc = _location(path, where)
    located = error.located(file=str(loc["file"]), line=loc.get("line"))
    return UnreadableFile(located.reason, field=located.field, file=located.file, line=located.line,
                          record=located.record)


def read_otlp(path: Path) -> SourceBatch:
    batch = SourceBatch(path, "otlp")
    data = content(path)
    if path.suffix in (".pb", ".binpb", ".proto") or _is_binary(data):
        _read_otlp_proto(path, data, batch)
        return batch
    _read_otlp_json(path, data, batch, None)
    return batch


def otlp_json_bytes(path: Path) -> bytes | None:
    """The bytes of an OTLP/JSON file, which import workers can split by trace (`read_otlp_part`);
    None for protobuf. Raises `UnreadableFile`."""
    if path.suffix in (".pb", ".binpb", ".proto"):
        return None
    data = content(path)
    return None if _is_binary(data) else data


ScreenedLines = array
"""One part's share of screening a JSON-lines file (`screen_otlp_lines`): for line n (from 1) with
(n - 1) % parts == index, at (n - 1) // parts, the parts its text can hold spans of, one bit each
(all bits set: it cannot tell, every part parses the line). An array, so that a share of a file of
many short lines is a few bytes a line through the pipes, not a list of Python ints."""


def screen_otlp_lines(data: bytes, part: TracePart) -> ScreenedLines | None:
    """`part`'s share of screening an OTLP/JSON file's lines for the parts they hold (`trace_parts_named`),
    so that workers screen a line once between them, not once each (`read_otlp_part`'s `screened`).
    None for a file whose first line is not a whole object: one document over many lines is parsed
    whole, never screened (a wrong guess costs time only: such a file's lines are never looked up);
    None too for more than 64 parts, more than the widest mask holds (each part screens every line)."""
    index, parts = part
    code = next((code for code in "BHLQ" if array(code).itemsize * 8 >= parts), None)
    end = data.find(b"\n")
    first = (data if end < 0 else data[:end]).strip()
    if code is None or first[:1] != b"{" or first[-1:] != b"}":
        return None
    every = (1 << array(code).itemsize * 8) - 1
    screened = array(code)
    for number, line in enumerate(_lines(data)):
        if number % parts == index:
            named = otlp_json.trace_parts_named(line, parts) if line.strip() else set()
            screened.append(every if named is None else sum(1 << p for p in named))
    return screened


def read_otlp_part(path: Path, data: bytes, part: TracePart,
                   screened: list[ScreenedLines | None] | None = None) -> tuple[SourceBatch, int]:
    """The spans of `part`'s traces in an OTLP/JSON file (`otlp_json_bytes`), and every log
    record (the caller picks its own: a log event may name its span without its trace), parsing
    only the lines that can hold them, with the records skipped among those lines; and how many
    documents it parsed (no part parsing any, the file has no valid line). `screened`: every
    part's `screen_otlp_lines` of this file, in part order (else each line is screened here).
    Raises `UnreadableFile` for a file that is one document and no request, as `read_otlp` does."""
    index, parts = part
    shares = screened if screened is not None and all(share is not None for share in screened) else None

    def keep(number: int, line: bytes) -> bool:
        if shares is not None:
            return bool(shares[(number - 1) % parts][(number - 1) // parts] >> index & 1)  # type: ignore[index]
        named = otlp_json.trace_parts_named(line, parts)
        return named is None or index in named

    batch = SourceBatch(path, "otlp")
    found = _read_otlp_json(path, data, batch, part, keep)
    return batch, len(found.docs) + found.handed


def _read_otlp_json(path: Path, data: bytes, batch: SourceBatch, part: TracePart | None,
                    keep: Callable[[int, bytes], bool] | None = None) -> JsonDocuments:
    """Records of every document (with `part`: spans of its traces), each JSON line decoded as it
    is parsed; the skipped in file order."""
    found = read_json(path, data, keep, functools.partial(_decode_otlp_doc, path, batch, part, False))
    for where, doc in found.docs:
        _decode_otlp_doc(path, batch, part, found.single, where, doc)
    batch.skipped = sorted(found.skipped + batch.skipped, key=in_file_order)
    return found


def _decode_otlp_doc(path: Path, batch: SourceBatch, part: TracePart | None, single: bool, where: str,
                     doc: Any) -> None:
    errors: list[tuple[str, str]] = []
    try:
        if isinstance(doc, Mapping) and "resourceLogs" in doc:
            batch.logs += list(otlp_json.logs_from_request(doc, errors))
        else:
            batch.spans += list(otlp_json.spans_from_request(doc, errors, part))
    except SourceError as exc:
        if single:
            raise _whole(path, where, exc) from None
        batch.skip(exc, **_location(path, where))
    batch.skipped += [(f"{where} {record}", reason) for record, reason in errors]


def in_file_order(entry: tuple[str, str]) -> tuple[int, ...]:
    """A skipped record's place in its file (entries of one file): its line, then the indices of its
    path in the document (`file:12 resourceSpans[0].scopeSpans[1].spans[7]`)."""
    return tuple(int(n) for n in _PLACE.findall(entry[0]))


_PLACE = re.compile(r"(?::|\[)(\d+)")


def _read_otlp_proto(path: Path, data: bytes, batch: SourceBatch) -> None:
    """A trace request, else a logs request; per-record errors are skipped, not fatal."""
    Errors = list[tuple[str, str]]
    attempts: tuple[tuple[Callable[[Errors], list[Any]], list[Any]], ...] = (
        (lambda errors: list(otlp_proto.spans_from_proto(otlp_proto.parse_traces(data), errors)), batch.spans),
        (lambda errors: list(otlp_proto.logs_from_proto(otlp_proto.parse_logs(data), errors)), batch.logs))
    first_error = ""
    for decode, out in attempts:
        errors: Errors = []
        try:
            records = decode(errors)
        except SourceError as exc:
            first_error = first_error or exc.problem
            continue
        if records:
            out += records
            batch.skipped += [(f"{path} {record}", reason) for record, reason in errors]
            return
        if errors:
            first_error = first_error or f"{errors[0][0]}: {errors[0][1]}"
    if path.suffix not in (".pb", ".binpb", ".proto") and _looks_like_text(data):  # neither JSON nor protobuf
        first = data.lstrip()[:1].decode("utf-8", "replace")
        raise _unreadable(path, f"neither OTLP/JSON (it starts with {first!r}, not '{{' or '[') nor OTLP protobuf")
    raise _unreadable(path, f"not an OTLP protobuf request ({first_error or 'it holds no spans or log records'})")


def _looks_like_text(data: bytes) -> bool:
    """Printable UTF-8 in its first KB (protobuf starts with a field tag byte, and holds control bytes)."""
    head = data[:1024]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # (a character cut at the end of the window is fine)
            return False
        text = head[:exc.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\r\n" for c in text)


def read_langsmith(path: Path) -> SourceBatch:
    batch = SourceBatch(path, "langsmith")
    docs, batch.skipped = json_documents(path)
    runs: list[tuple[dict[str, Any], str | None, Any]] = []  # (file/line, record, run)
    ops = [(where, d) for where, d in docs if isinstance(d, Mapping) and "op" in d and "payload" in d]
    if ops:
        good = []
        for where, op in ops:
            payload = op.get("payload")
            if isinstance(payload, Mapping) and isinstance(payload.get("id"), (str, int)):
                good.append(op)
            else:
                batch.skip(langsmith.LangSmithFormatError("ingest op without a payload id", field="payload.id"),
                           **_location(path, where))
        runs = [({}, f"run {i}", run) for i, run in enumerate(langsmith.merge_ingest_ops(good))]
    else:
        for where, doc in docs:
            try:
                found = langsmith.runs_in(doc)
            except SourceError as exc:
                if len(docs) == 1:
                    raise _whole(path, where, exc) from None
                batch.skip(exc, **_location(path, where))
                continue
            runs += [(_location(path, where), f"record {i}" if len(found) > 1 else None, run)
                     for i, run in enumerate(found)]
    batch.spans = _each(runs, langsmith.span_from_run_checked, batch)
    batch.spans = langsmith.order_by_dotted(batch.spans)
    return batch


def read_langfuse(path: Path) -> SourceBatch:
    docs, skipped = json_documents(path)
    if any(isinstance(d, Mapping) and "resourceSpans" in d for _, d in docs):
        batch = read_otlp(path)
        batch.format = "langfuse"
        return batch
    batch = SourceBatch(path, "langfuse", skipped=skipped)
    for where, doc in docs:
        try:
            observations, trace = langfuse_api.observations_in(doc)
        except SourceError as exc:
            if len(docs) == 1:
                raise _whole(path, where, exc) from None
            batch.skip(exc, **_location(path, where))
            continue
        good = []
        for i, obs in enumerate(observations):
            if "id" in obs and "traceId" in obs:
                good.append(obs)
            else:
                batch.skip(langfuse_api.LangfuseFormatError("observation without 'id' or 'traceId'"),
                           **_location(path, where), record=f"observation {i}")
        errors: list[SourceError] = []
        batch.spans += langfuse_api.spans_from_observations(good, trace, errors)
        for error in errors:
            batch.skip(error, **_location(path, where))
    return batch


def read_jaeger(path: Path) -> SourceBatch:
    batch = SourceBatch(path, "jaeger")
    docs, batch.skipped = json_documents(path)
    for where, doc in docs:
        traces = doc.get("data") if isinstance(doc, Mapping) else None
        if not isinstance(traces, list):
            raise _whole(path, where, jaeger.JaegerFormatError(
                "not Jaeger JSON: expected an object with a 'data' list of traces"))
        for t, trace in enumerate(traces):
            spans = trace.get("spans") if isinstance(trace, Mapping) else None
            if not isinstance(spans, list):
                batch.skip(jaeger.JaegerFormatError("trace without a 'spans' list"), **_location(path, where),
                           record=f"data[{t}]")
                continue
            processes = trace.get("processes")
            processes = processes if isinstance(processes, Mapping) else {}
            for s, span in enumerate(spans):
                try:
                    batch.spans.append(jaeger.span_from_jaeger(span, processes))
                except SourceError as exc:
                    batch.skip(exc, **_location(path, where), record=f"data[{t}].spans[{s}]")
    return batch


def _log_order(p: Path) -> tuple[str, int, str]:
    return p.parent.name, int(p.stem) if p.stem.isascii() and p.stem.isdigit() else 0, p.stem


def read_whowhen(path: Path) -> SourceBatch:
    batch = SourceBatch(path, "whowhen")
    files = sorted(path.rglob("*.json"), key=_log_order) if path.is_dir() else [path]
    if not files:
        raise _unreadable(path, "no Who&When .json logs found")
    for file in files:
        try:
            docs, _ = json_documents(file)
            if len(docs) != 1:
                raise whowhen.WhoWhenFormatError("not a Who&When log: one JSON document expected")
            batch.spans += whowhen.spans_from_log(docs[0][1], file.parent.name, file.stem)
        except SourceError as exc:
            batch.skip(exc, file=file)
    if not batch.spans:
        raise _unreadable(path, f"no readable Who&When log ({batch.skipped[0][1]})")
    return batch


def read_flat_file(path: Path) -> SourceBatch:
    docs, skipped = json_documents(path)
    batch = SourceBatch(path, "flat", skipped=skipped)
    for where, doc in docs:
        errors: list[SourceError] = []
        try:
            spans, logs = read_flat(doc, errors)
        except SourceError as exc:
            if len(docs) == 1:
                raise _whole(path, where, exc) from None
            batch.skip(exc, **_location(path, where))
            continue
        batch.spans += spans
        batch.logs += logs
        for error in errors:
            batch.skip(error, **_location(path, where))
    return batch


def _each(items: Iterable[tuple[dict[str, Any], str | None, Any]], convert: Callable[[Any], SpanRecord],
          batch: SourceBatch) -> list[SpanRecord]:
    out = []
    for location, record, item in items:
        try:
            out.append(convert(item))
        except SourceError as exc:
            batch.skip(exc, **location, record=record)
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
    data = content(path)
    if path.suffix in (".pb", ".binpb") or _is_binary(data):
        return "otlp"
    docs, _ = json_documents(path, data)
    del data
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
    raise _unreadable(path, "cannot tell the format; name it (otlp, langsmith, langfuse, jaeger, whowhen)")


def read(format: str, path: Path) -> SourceBatch:
    """Read one file (or a Who&When directory); raises only `UnreadableFile`."""
    if format == "auto":
        format = sniff(path)
    if format not in READERS:
        raise UnreadableFile(f"unknown format {shown(format)}; use one of {', '.join(READERS)} or auto")
    if not os.path.lexists(path):
        raise _unreadable(path, "no such file")
    try:
        with paused_gc():  # parsing builds many containers at once; see normalize.bulk
            return READERS[format](path)
    except UnreadableFile:
        raise
    except SourceError as exc:  # a document-level error a reader did not locate
        raise UnreadableFile(exc.reason, field=exc.field, file=exc.file or str(path), line=exc.line,
                             record=exc.record) from None
    except INPUT_ERRORS as exc:  # a bug in a reader must still name the file
        raise UnreadableFile(bad_record(exc).reason, file=str(path)) from None
