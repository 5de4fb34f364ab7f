"""OTLP/JSON trace files read by the import workers themselves, each parsing only the lines that
can hold its traces: the same records, skipped records, errors and rows as one process."""

from __future__ import annotations

import base64
import functools
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.imports import _trace, otlp_request, write_otlp_json
from otel_replay import Store
from otel_replay.cli import main as cli
from otel_replay.normalize.content import DETAILS_EVENT
from otel_replay.normalize.records import partition_of
from otel_replay.normalize.sources.files import (
    UnreadableFile,
    _lines,
    in_file_order,
    otlp_json_bytes,
    read,
    read_otlp_part,
    screen_otlp_lines,
)
from otel_replay.normalize.sources.otlp_json import trace_parts_named
from otel_replay.store.import_files import import_files, jobs_for_bytes
from otel_replay.store.ingest_parallel import can_fork, ingest_decoded

pytestmark = pytest.mark.skipif(not can_fork(), reason="workers that read their own part need the fork start method")


def _attrs(values: dict) -> list[dict]:
    return [{"key": k, "value": {"stringValue": v}} for k, v in values.items()]


def _span(trace_id, span_id="00000000000000aa", **extra) -> dict:
    span = {"spanId": span_id, "name": "chat m", "kind": 3, "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000001000000000", "attributes": _attrs({"gen_ai.operation.name": "chat"}), **extra}
    if trace_id is not None:
        span["traceId"] = trace_id
    return span


def _request(*spans, resource=None) -> dict:
    rs = {"scopeSpans": [{"scope": {"name": "x"}, "spans": list(spans)}]}
    if resource is not None:
        rs["resource"] = resource
    return {"resourceSpans": [rs]}


def _messy_lines() -> list[str]:
    """Lines one process reads with every kind of trouble, beside plain one-trace lines."""
    t = [f"{i:032x}" for i in range(1, 30)]
    b64 = base64.b64encode(bytes.fromhex(t[7])).decode()
    lines = [json.dumps(otlp_request(_trace(i))) for i in range(40)]  # plain lines, one trace each
    lines += [
        '{"resourceSpans": [{"traceId": "' + t[0] + '", oops',  # not JSON, but names a trace
        "{not json at all",
        json.dumps({"something": "else"}),  # JSON, not a request
        json.dumps({"resourceSpans": "nope"}),  # a request of the wrong shape
        json.dumps(_request(_span(t[1], "00000000000000b1"), _span(t[2], "bad"), _span(t[3], "00000000000000b3"),
                            _span(None, "00000000000000b4"), _span(12345, "00000000000000b5"))),  # mixed traces
        json.dumps(_request(_span(t[4].upper(), "00000000000000c1"), _span(b64, "00000000000000c2"))),
        json.dumps(_request(_span(t[5], "00000000000000d1")), separators=(", ", " : ")),  # spaced out
        json.dumps(_request(_span(t[6], "00000000000000e1"))).replace('"traceId"', '"\\u0074raceId"'),  # escaped key
        json.dumps(_request(_span(t[8], "00000000000000f1", links=[{"traceId": t[9], "spanId": "00000000000000f2"}]))),
        json.dumps(_request(_span(t[10], "0000000000000101"), resource={"attributes": "not a list"})),
        json.dumps(_request(_span(t[11], "0000000000000111", startTimeUnixNano="soon"))),  # a bad span
        json.dumps(_request(_span(None, "0000000000000121"))),  # only a span without a trace id
        json.dumps(_request(_span(t[12], "0000000000000131", attributes=[
            {"key": "traceId", "value": {"stringValue": t[13]}}, {"key": "gen_ai.operation.name",
                                                                 "value": {"stringValue": "chat"}}]))),
        json.dumps(_request(_span(t[14], "0000000000000141", name="caf\u00e9 \u00b0C"))),  # \\u escapes elsewhere
        json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [  # content events, as GenAI events mode writes
            _log(f"{3:032x}", f"{9:016x}", "q3"),  # a plain trace's chat span (trace 3 = _trace(2))
            _log(None, f"{13:016x}", "q4"),  # its span, no trace id: trace 4's chat span
            _log(f"{5:032x}", f"{17:016x}", "q5 mismatched"),  # names trace 5, but the span is trace 5's? yes
            _log(f"{6:032x}", f"{0xdead00:016x}", "no such span"),  # matches nothing: counted once
            _log(f"{7:032x}", f"{9:016x}", "its span is in trace 3"),  # the span decides, not the trace id
            _log(f"{8:032x}", "bad", "bad span id"),  # malformed: reported once
        ]}]}]}),
    ]
    return lines


def _log(trace_id, span_id, text) -> dict:
    record = {"eventName": DETAILS_EVENT, "spanId": span_id, "timeUnixNano": "1767225600000000000",
              "attributes": _attrs({"gen_ai.input.messages": json.dumps([{"role": "user", "parts": [
                  {"type": "text", "content": text}]}])})}
    if trace_id is not None:
        record["traceId"] = trace_id
    return record


@pytest.fixture(scope="module")
def messy(tmp_path_factory) -> list[Path]:
    work = tmp_path_factory.mktemp("messy")
    lines_file, document = work / "messy.jsonl", work / "document.json"
    lines_file.write_text("\n".join(_messy_lines()) + "\n\n")
    document.write_text(json.dumps(_request(_span(f"{77:032x}", "0000000000000771"),
                                            _span(f"{78:032x}", "0000000000000781"), _span(f"{79:032x}", "x")),
                                   indent=2))  # one request over many lines: one document
    return [lines_file, document]


def _keys(spans) -> list[tuple[str, str]]:
    return sorted((s.trace_id, s.span_id) for s in spans)


@pytest.mark.parametrize("parts", [2, 3, 5, 9])
def test_the_parts_read_exactly_what_one_reader_reads(messy, parts):
    for path in messy:
        whole = read("otlp", path)
        data = otlp_json_bytes(path)
        assert data is not None
        got = [read_otlp_part(path, data, (i, parts)) for i in range(parts)]
        shares = [screen_otlp_lines(data, (i, parts)) for i in range(parts)]
        assert all(share is None for share in shares) == (path.suffix == ".json")  # a document is never screened
        assert all(share.typecode == ("B" if parts <= 8 else "H") for share in shares if share is not None)
        assert screen_otlp_lines(data, (0, 65)) is None  # wider than any mask: each worker screens every line
        shared = [read_otlp_part(path, data, (i, parts), shares) for i in range(parts)]  # each line screened once
        assert [(_keys(b.spans), b.logs, b.skipped, n) for b, n in shared] == [(_keys(b.spans), b.logs, b.skipped, n)
                                                                               for b, n in got]
        assert _keys(s for batch, _ in got for s in batch.spans) == _keys(whole.spans)  # each span once
        for i, (batch, _) in enumerate(got):  # and each in the worker of its trace, however it is spelled
            assert all(partition_of(s.trace_id, parts) == i for s in batch.spans)
        merged = sorted({entry for batch, _ in got for entry in batch.skipped}, key=in_file_order)
        assert merged == whole.skipped
        assert all(batch.logs == whole.logs for batch, _ in got)  # every part has every log event, to pick from
    lines = messy[0].read_text().count("\n") - 1
    parsed = sum(n for _, n in got)
    assert parsed < 2 * lines  # each plain line parsed by one worker, not by all


def test_messy_files_import_the_same_with_workers(tmp_path, messy):
    outputs = {}
    for jobs in (1, 3):
        result = CliRunner().invoke(cli, ["--store", str(tmp_path / str(jobs)), "import", "otlp", "--jobs", str(jobs),
                                          *map(str, messy)])
        assert result.exit_code == 0, result.output
        outputs[jobs] = result.output
    assert outputs[1] == outputs[3]  # counts, skipped records, their order and first locations
    assert "messy.jsonl:41" in outputs[1] and "skipped" in outputs[1]
    assert "1 log events matched no span" in outputs[1]  # the one naming no span, once
    batches, _ = import_files(tmp_path / "again", "otlp", messy, jobs=3)
    assert sum(where.endswith("logRecords[5]") for b in batches for where, _ in b.skipped) == 1  # the malformed one
    content = "select span_id, has_payload from steps where has_payload order by span_id"
    assert Store(tmp_path / "3").sql(content).to_pylist() == Store(tmp_path / "1").sql(content).to_pylist()
    for sql in ("select * exclude (ingested_ns) from steps", "select * exclude (ingested_ns) from spans"):
        one = sorted(map(str, Store(tmp_path / "1").sql(sql).to_pylist()))
        assert one == sorted(map(str, Store(tmp_path / "3").sql(sql).to_pylist())), sql
    writers = {p.name.split("-")[-3] for p in (tmp_path / "3" / "step_rows").rglob("*.parquet")}
    assert len(writers) == 3  # three workers wrote their own segments


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 12), st.sampled_from(["hex", "HEX", "b64", "int", "none", "escaped", "bad"]),
                          st.booleans(), st.booleans()), min_size=1, max_size=12),
       st.integers(2, 4), st.booleans())
def test_screening_never_hides_a_span_from_its_worker(tmp_path, spans, parts, spaced):
    """Whatever the trace ids look like, a line's text names every part that owns one of its spans."""
    made = []
    for n, (trace, spelling, linked, bad_span) in enumerate(spans):
        hex_id = f"{trace:032x}"
        trace_id = {"hex": hex_id, "HEX": hex_id.upper(), "b64": base64.b64encode(bytes.fromhex(hex_id)).decode(),
                    "int": trace, "none": None, "escaped": hex_id, "bad": "zz-" + hex_id}[spelling]
        extra = {"links": [{"traceId": f"{trace + 1:032x}", "spanId": "00000000000000ff"}]} if linked else {}
        span = _span(trace_id, f"{n + 1:016x}" if not bad_span else "nope", **extra)
        made.append((json.dumps(span, separators=(", ", ": ") if spaced else (",", ":")), spelling))
    line = '{"resourceSpans":[{"scopeSpans":[{"spans":[' + ",".join(text for text, _ in made) + "]}]}]}"
    if any(spelling == "escaped" for _, spelling in made):
        line = line.replace('"traceId"', '"\\u0074raceId"', 1)
    path = tmp_path / "line.jsonl"
    path.write_text(line + "\n" + json.dumps(otlp_request(_trace(100))) + "\n")  # trace 101: none of the above
    whole = read("otlp", path)
    named = trace_parts_named(line.encode(), parts)
    doc = json.loads(line)
    for record in (r for r in whole.spans if r.trace_id != f"{101:032x}"):  # the line's spans: each one's part
        assert named is None or partition_of(record.trace_id, parts) in named
    if any(isinstance(span.get("traceId"), int) for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]):
        assert named is None  # a number is a valid trace id the text does not show as one
    data = path.read_bytes()
    shares = [screen_otlp_lines(data, (i, parts)) for i in range(parts)]
    for screened in (None, shares):  # each worker screening every line, or the workers sharing it
        got = [read_otlp_part(path, data, (i, parts), screened) for i in range(parts)]
        assert _keys(s for batch, _ in got for s in batch.spans) == _keys(whole.spans)
        assert sorted({e for batch, _ in got for e in batch.skipped}, key=in_file_order) == whole.skipped


@given(st.lists(st.sampled_from([b"", b"\n", b"{}", b'{"a": 1}', b" ", b"\r", b"x"]), max_size=12).map(b"".join))
def test_lines_are_read_one_at_a_time_as_split_cuts_them(data):
    assert list(_lines(data)) == data.split(b"\n")


def test_a_file_with_no_valid_line_stores_nothing_of_any_file(tmp_path):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    write_otlp_json([s for i in range(200) for s in _trace(i)], good)
    bad.write_text("".join(f'{{"resourceSpans": [{{"traceId": "{i:032x}", broken\n' for i in range(1, 20)))
    for jobs in (1, 3):
        store = tmp_path / f"store{jobs}"
        with pytest.raises(UnreadableFile, match=r"bad\.jsonl: no line is valid JSON \(first error: invalid"):
            import_files(store, "otlp", [good, bad], jobs=jobs)
        assert not list(store.rglob("*.parquet"))  # the good file's traces were decoded, never stored


def test_a_document_of_the_wrong_shape_is_the_same_error_with_workers(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"resourceSpans": "nope"}))
    first, second = (CliRunner().invoke(cli, ["--store", str(tmp_path / f"s{j}"), "import", "otlp", "--jobs", str(j),
                                              str(path)]) for j in (1, 3))
    assert first.exit_code == second.exit_code == 1
    assert first.output == second.output and str(path) in first.output


def test_protobuf_files_are_read_by_the_parent(tmp_path):
    proto = tmp_path / "x.pb"
    proto.write_bytes(b"\x0a\x00")
    assert otlp_json_bytes(proto) is None
    assert jobs_for_bytes(10, 3) == 3 and jobs_for_bytes(10) == 1  # small files stay in one process
    assert 1 <= jobs_for_bytes(1 << 30) <= 8


def _decode_or_die(part):
    if part[0] == 1:
        os._exit(3)  # a worker killed mid-import
    return [], [], part


def test_a_worker_that_dies_fails_the_import(tmp_path):
    with pytest.raises(RuntimeError, match="import worker 1 ended without an answer"):
        ingest_decoded(tmp_path, _decode_or_die, 2, lambda extras: None, source="test")


def _one_part(path: Path, part):
    spans = read("otlp", path).spans
    return [s for s in spans if partition_of(s.trace_id, part[1]) == part[0]], [], part


def test_a_failed_check_stores_nothing(tmp_path):
    path = tmp_path / "two.json"
    write_otlp_json([s for i in range(6) for s in _trace(i)], path)
    decode = functools.partial(_one_part, path)

    def refuse(extras):
        assert extras == [(0, 2), (1, 2)]  # every part decoded before the check
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        ingest_decoded(tmp_path / "store", decode, 2, refuse, source="test")
    assert not list(tmp_path.rglob("*.parquet"))
    extras, result = ingest_decoded(tmp_path / "store", decode, 2, lambda extras: None, source="test")
    assert extras == [(0, 2), (1, 2)] and result.traces == 6 and result.spans == 24
    assert Store(tmp_path / "store").sql("select count(*) as n from spans").column("n")[0].as_py() == 24


def _screen_share(part):
    if part[0] == 2:
        raise ValueError("screening failed")
    return f"share {part[0]}"


def _decode_with_shares(part, shares):
    return [], [], (part, shares)


def test_every_worker_decodes_with_every_part_s_share_and_a_failed_share_stores_nothing(tmp_path):
    extras, _ = ingest_decoded(tmp_path, _decode_with_shares, 2, lambda extras: None, source="test",
                               screen=_screen_share)
    assert extras == [((0, 2), ["share 0", "share 1"]), ((1, 2), ["share 0", "share 1"])]
    with pytest.raises(RuntimeError, match=r"import worker 2 failed:(.|\n)*ValueError: screening failed"):
        ingest_decoded(tmp_path, _decode_with_shares, 3, lambda extras: None, source="test", screen=_screen_share)
    assert not list(tmp_path.rglob("*.parquet"))
