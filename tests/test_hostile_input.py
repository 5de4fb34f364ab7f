"""Hostile input to every importer: nothing escapes but the documented error, nothing hangs,
memory stays bounded, and a bad record never costs the good ones (the receiver:
test_hostile_receiver.py).

The contract (otel_replay/normalize/sources/errors.py): readers raise only `SourceError`
(`files.read`: `UnreadableFile`) naming the file, the line or record and the field; a bad record
is skipped and listed in `SourceBatch.skipped`.
"""

from __future__ import annotations

import base64
import gzip
import json
import pickle
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

from otel_replay import Store
from otel_replay.cli import main as cli
from otel_replay.normalize.sources import files, whowhen
from otel_replay.normalize.sources.errors import SourceError
from otel_replay.normalize.sources.ids import BadId
from otel_replay.store.ingest import ingest
from tests.harness.fuzzing import assert_storable
from tests.helpers import REPO, chat_attributes
from tests.hostile import (
    HOSTILE_VALUES,
    PROPERTY,
    TIME_BOUND_S,
    S,
    T,
    encode,
    mutated,
    nested_proto,
    otlp_span,
    seeds,
)

FORMATS = {"flat": "flat_json", "otlp": "otlp_json", "langsmith": "langsmith", "langfuse": "langfuse_api",
           "jaeger": "jaeger", "whowhen": "whowhen", "auto": "files_sniff"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("hostile")


def read_or_refuse(fmt: str, path: Path) -> files.SourceBatch | None:
    """The reader's batch (checked storable), or None when it refused the file with its error."""
    started = time.perf_counter()
    try:
        batch = files.READERS[files.sniff(path) if fmt == "auto" else fmt](path)
    except SourceError as exc:
        assert str(path) in str(exc), exc  # the error names the file
        batch = None
    assert time.perf_counter() - started < TIME_BOUND_S
    if batch is not None:
        assert_storable(batch.spans, batch.logs)
        assert all(str(path) in where for where, _ in batch.skipped), batch.skipped
    return batch


# -- properties: every importer ---------------------------------------------------------------------
@pytest.mark.parametrize("fmt", list(FORMATS))
@PROPERTY
@given(data=st.data())
def test_importers_take_any_mutation_of_a_real_export(workdir, fmt, data):
    path = workdir / f"mutated-{fmt}.json"
    path.write_bytes(data.draw(mutated(FORMATS[fmt])))
    read_or_refuse(fmt, path)


@pytest.mark.parametrize("fmt", list(FORMATS))
@PROPERTY
@given(raw=st.binary(max_size=600))
@example(raw=b"")
@example(raw=b"\x1f\x8b\x08\x00")  # a gzip header and nothing else
@example(raw=b"\xef\xbb\xbf" + b'{"spans": []}')
@example(raw=b'{"a": 1}\n\xff\xfe\n[1e999]\n')
@example(raw=b"[" + b"9" * 5000 + b"]")  # past Python's int-digits limit (ValueError in json)
@example(raw=b'{"resourceSpans": NaN}')
def test_importers_take_any_bytes(workdir, fmt, raw):
    path = workdir / f"raw-{fmt}.json"
    path.write_bytes(raw)
    read_or_refuse(fmt, path)


# -- property: end to end into a real store -----------------------------------------------------------
SPAN_IDS = st.sampled_from([f"{i:016x}" for i in range(1, 5)] + ["0" * 16, "zz" * 8, "abc"])
TIMES = st.sampled_from([1_700_000_000_000_000_000, 1_700_000_000_000_000_000, 1.7e18, "1700000000000000001", -1,
                         2**63, 2**64, 1.5, "soon", None])


@st.composite
def hostile_trace(draw) -> list[dict]:
    """Flat spans of one trace: colliding ids, cycles, self-parents, times out of range, odd values."""
    spans = []
    for _ in range(draw(st.integers(1, 5))):
        attributes = chat_attributes(draw(st.text(max_size=5)))
        if draw(st.booleans()):
            attributes[draw(st.sampled_from(list(attributes) + ["gen_ai.usage.input_tokens"]))] = draw(HOSTILE_VALUES)
        spans.append({"trace_id": T, "span_id": draw(SPAN_IDS), "parent_span_id": draw(SPAN_IDS | st.none()),
                      "name": "chat m", "start_time_unix_nano": draw(TIMES), "end_time_unix_nano": draw(TIMES),
                      "attributes": attributes})
    return spans


@settings(PROPERTY, max_examples=8)
@given(spans=hostile_trace())
def test_what_an_import_keeps_stores_and_loads_as_a_trajectory(spans):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        path.write_text(json.dumps({"spans": spans}))  # ASCII: a lone surrogate stays an escape and gets stored
        batch = read_or_refuse("flat", path)
        assert batch is not None
        ingest(Path(tmp) / "store", batch.spans, batch.logs, source="import:flat")
        kept = {(s.trace_id, s.span_id) for s in batch.spans}
        assert len(kept) + len(batch.skipped) >= len({s["span_id"] for s in spans}) or not spans
        if kept:
            store = Store(Path(tmp) / "store")
            assert store.sql("select count(*) n from spans").column("n")[0].as_py() == len(kept)
            trajectory = store.trajectory(T)
            assert {s.span_id for s in trajectory.steps} <= {sid for _, sid in kept}


# -- the named cases -----------------------------------------------------------------------------------
def test_deeply_nested_input_is_refused_without_recursing_or_crashing(tmp_path):
    """100k levels in every format and in both receiver encodings, in a fresh interpreter: it must
    not die (a C stack overflow would kill it), and each gets its documented error."""
    deep = b"[" * 100_000 + b"]" * 100_000
    (tmp_path / "deep.json").write_bytes(deep)
    (tmp_path / "deep-otlp.json").write_bytes(b'{"resourceSpans": ' + deep + b"}")
    (tmp_path / "deep-attr.json").write_bytes(
        b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "%s", "spanId": "%s", "attributes": '
        b'[{"key": "k", "value": %s}]}]}]}]}' % (T.encode(), S.encode(), b'{"arrayValue": {"values": [' * 100 + b"{}"
                                               + b"]}}" * 100))
    (tmp_path / "deep.pb").write_bytes(nested_proto(100_000))
    script = textwrap.dedent("""
        import json, sys
        from pathlib import Path
        from otel_replay.capture.receiver_decode import RequestError, decode_body
        from otel_replay.normalize.sources import files
        from otel_replay.normalize.sources.errors import SourceError
        tmp, out = Path(sys.argv[1]), {}
        for name in ("deep.json", "deep-otlp.json", "deep-attr.json", "deep.pb"):
            for fmt in ("auto", "otlp", "flat", "langsmith", "langfuse", "jaeger", "whowhen"):
                try:
                    batch = files.read(fmt, tmp / name)
                    out[f"{name} {fmt}"] = [why for _, why in batch.skipped]
                except SourceError as exc:
                    out[f"{name} {fmt}"] = str(exc)
            for as_json in (True, False):
                try:
                    out[f"{name} receiver json={as_json}"] = decode_body("traces", (tmp / name).read_bytes(), as_json)[1]
                except RequestError as exc:
                    out[f"{name} receiver json={as_json}"] = f"{exc.status} {exc.message}"
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert "nested too deeply" in out["deep.json auto"] and "nested too deeply" in out["deep-otlp.json otlp"]
    assert out["deep.json receiver json=True"].startswith("400 body is not JSON")
    # the one record nested past protobuf's limit is refused alone (partial success), as JSON does
    assert [why.split(":")[0] for why in out["deep.pb receiver json=False"]] == ["resource_spans[0].scope_spans[0].spans[0]"]
    assert "nested past the protobuf runtime's limit" in out["deep.pb receiver json=False"][0]
    assert "not an OTLP protobuf request" in out["deep.pb otlp"]
    assert any("nested deeper than 64 levels" in why for why in out["deep-attr.json otlp"])
    assert any("nested deeper than 64 levels" in why for why in out["deep-attr.json receiver json=True"])
    for key, value in out.items():  # every outcome is a documented error, a skipped record, or nothing
        assert "RecursionError" not in json.dumps(value) and "malformed record" not in json.dumps(value), (key, value)


def test_a_100_mb_string_is_refused_with_memory_bounded(tmp_path):
    """A 100 MB attribute value: the record is skipped (limit: 32 M characters per string) and the
    reader peaks at three times the file size (the bytes, and orjson's transient copy of the
    string), not the ~12x that storing it would cost."""
    path = tmp_path / "big.otlp.json"
    with path.open("wb") as f:
        f.write(b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "%s", "spanId": "%s", "name": "chat m",'
                b' "attributes": [{"key": "gen_ai.input.messages", "value": {"stringValue": "' % (T.encode(), S.encode()))
        for _ in range(100):
            f.write(b"x" * (1 << 20))
        f.write(b'"}}]}]}]}]}\n')
    script = textwrap.dedent("""
        import json, resource, sys
        from pathlib import Path
        from otel_replay.normalize.sources import files
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        batch = files.read("auto", Path(sys.argv[1]))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"spans": len(batch.spans), "skipped": batch.skipped, "grew_mb": (peak - before) / 1024}))
    """)
    done = subprocess.run([sys.executable, "-c", script, str(path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["spans"] == 0
    ((where, why),) = out["skipped"]
    assert "spans[0]" in where and why.startswith("attributes.gen_ai.input.messages: a string of 100 M characters")
    assert out["grew_mb"] < 3.5 * 100, out  # measured: 300 MB


@pytest.mark.parametrize(("data", "message"), [
    (b'{"spans": [{"name": "caf\xe9"}]}', "not UTF-8 text at byte 24"),
    (b'\xff{"resourceSpans": []}', "not an OTLP protobuf request"),  # binary: tried as protobuf
])
def test_invalid_utf8_in_a_file_names_the_byte(tmp_path, data, message):
    path = tmp_path / "bad.json"
    path.write_bytes(data)
    with pytest.raises(files.UnreadableFile, match=message) as caught:
        files.read("auto", path)
    assert caught.value.file == str(path)


def test_invalid_utf8_on_one_line_skips_that_line(tmp_path):
    good = json.dumps(json.loads(seeds("otlp_json")[0]))
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(good.encode() + b'\n{"resourceSpans": "\xc3\x28"}\n' + good.encode() + b"\n")
    batch = files.read("otlp", path)
    assert batch.spans and batch.skipped == [(f"{path}:2", "not UTF-8 text at byte 19")]


@pytest.mark.parametrize(("fmt", "doc", "field"), [
    ("otlp", otlp_span(traceId="abc"), "traceId"),
    ("otlp", otlp_span(spanId="zz" * 8), "spanId"),
    ("otlp", otlp_span(spanId=S + "00"), "spanId"),
    ("otlp", otlp_span(parentSpanId=12.5), "parentSpanId"),
    ("otlp", otlp_span(traceId="0" * 32), "traceId"),
    ("flat", {"spans": [{"trace_id": T[:-1], "span_id": S}]}, "trace_id"),
    ("jaeger", {"data": [{"spans": [{"traceID": T, "spanID": "x" * 20}]}]}, "spanID"),
])
def test_ids_of_the_wrong_length_or_not_hex_skip_the_record_naming_the_field(tmp_path, fmt, doc, field):
    path = tmp_path / "ids.json"
    path.write_bytes(encode(doc))
    batch = files.read(fmt, path)
    assert not batch.spans
    ((where, why),) = batch.skipped
    assert where.startswith(str(path)) and why.startswith(f"{field}: ")


@pytest.mark.parametrize(("value", "accepted"), [
    (-1, False), ("-1", False), (2**63, False), ("99999999999999999999", False), (10**30, False),
    (1.5, False), (float("nan"), False), (True, False), ("soon", False), ("1e18", False), ({"ns": 1}, False),
    (1.7e18, True), ("1700000000000000000", True), (1_700_000_000_000_000_000, True), (0, True), (None, True),
])
@pytest.mark.parametrize("fmt", ["otlp", "flat"])
def test_nanosecond_timestamps_out_of_range_skip_the_record(tmp_path, fmt, value, accepted):
    doc = (otlp_span(startTimeUnixNano=value) if fmt == "otlp"
           else {"spans": [{"trace_id": T, "span_id": S, "start_time_unix_nano": value}]})
    path = tmp_path / "times.json"
    path.write_text(json.dumps(doc))  # NaN as the bare token NaN
    batch = files.read(fmt, path)
    if accepted:
        assert len(batch.spans) == 1 and batch.spans[0].start_ns in (None, 1_700_000_000_000_000_000)
    else:
        ((_, why),) = batch.skipped
        assert why.split(":")[0] in ("startTimeUnixNano", "start_time_unix_nano"), why


@pytest.mark.parametrize(("fmt", "make", "field"), [
    ("langsmith", lambda t: [{"id": "r1", "run_type": "llm", "start_time": t}], "start_time"),
    ("langfuse", lambda t: {"data": [{"id": "o1", "traceId": "t1", "startTime": t}]}, "startTime"),
    ("jaeger", lambda t: {"data": [{"spans": [{"traceID": T, "spanID": S, "startTime": t}]}]}, "startTime"),
])
@pytest.mark.parametrize("value", ["9999-12-31T23:59:59Z", "0001-01-01T00:00:00", "1969-12-31T23:59:59Z", -5,
                                   1e300, "not a time", 10**20, [2024]])
def test_times_of_other_formats_out_of_range_skip_the_record(tmp_path, fmt, make, field, value):
    path = tmp_path / "times.json"
    path.write_text(json.dumps(make(value)))
    batch = files.read(fmt, path)  # Jaeger times are numbers of µs: an ISO string is refused as well
    assert not batch.spans, batch.spans
    ((_, why),) = batch.skipped
    assert why.startswith(f"{field}: "), why


def test_duplicate_span_ids_within_a_trace_the_last_copy_wins_end_to_end(tmp_path):
    """Documented: one import keeps the last copy of a (trace id, span id); a later import of the
    same span stores nothing (imports are idempotent); `spans` shows each span once."""
    def chat(content: str, name: str) -> dict:
        return {"trace_id": T, "span_id": S, "name": name, "kind": "CLIENT", "start_time_unix_nano": 1_700_000_000_000_000_000,
                "end_time_unix_nano": 1_700_000_001_000_000_000, "attributes": chat_attributes(content)}

    first = tmp_path / "first.json"
    first.write_text(json.dumps({"spans": [chat("first", "chat a"), chat("second", "chat b")]}))
    result = CliRunner().invoke(cli, ["--store", str(tmp_path / "store"), "import", "auto", str(first)])
    assert result.exit_code == 0 and "1 spans stored (1 steps)" in result.output, result.output
    later = tmp_path / "later.json"
    later.write_text(json.dumps({"spans": [chat("third", "chat c")]}))
    result = CliRunner().invoke(cli, ["--store", str(tmp_path / "store"), "import", "auto", str(later)])
    assert "0 spans stored (0 steps), 1 already in the store" in result.output, result.output
    store = Store(tmp_path / "store")
    (step,) = store.trajectory(T).steps
    assert step.inputs[0]["parts"][0]["content"] == "second"
    assert store.sql("select name from spans").column("name").to_pylist() == ["chat b"]


def test_a_gzip_file_that_inflates_past_the_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "MAX_INFLATED_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b"[" + b" " * (8 << 20) + b"]"))
    with pytest.raises(files.UnreadableFile, match="inflates past 1 MB"):
        files.read("otlp", bomb)
    members = tmp_path / "members.json.gz"
    members.write_bytes(gzip.compress(b'{"spans": ') + gzip.compress(b"[]}") + b"\0" * 1024)  # padding, as tar writes
    assert files.read("flat", members).spans == []


def test_a_who_when_log_whose_history_would_expand_past_the_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(whowhen, "MAX_EXPANDED_BYTES", 100_000)
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"history": [{"name": f"agent{i % 3}", "content": "x" * 500} for i in range(40)],
                                "mistake_step": "1"}))
    with pytest.raises(files.UnreadableFile, match=r"history: 40 turns whose inputs repeat .* the limit is"):
        files.read("whowhen", path)


def test_the_error_says_file_line_record_and_field(tmp_path):
    path = tmp_path / "runs.jsonl"
    lines = [json.dumps({"id": f"r{i}", "run_type": "llm", "start_time": "2024-01-01T00:00:00"}) for i in range(3)]
    lines[1] = json.dumps({"id": "r1", "run_type": "llm", "start_time": "2024-13-01"})
    path.write_text("\n".join(lines) + "\n")
    batch = files.read("langsmith", path)
    assert len(batch.spans) == 2 and batch.skipped == [(f"{path}:2", "start_time: '2024-13-01' is not an ISO-8601 time")]
    error = BadId("'x' is not a 32-hex-digit id", field="traceId").located(file="f.json", line=3,
                                                                          within="resourceSpans[0]")
    assert (error.file, error.line, error.record, error.field) == ("f.json", 3, "resourceSpans[0]", "traceId")
    assert str(error) == "f.json:3 resourceSpans[0]: traceId: 'x' is not a 32-hex-digit id"
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is BadId and str(again) == str(error) and isinstance(again, ValueError)


def test_base64_ids_are_still_read_and_huge_ids_are_not_decoded():
    from otel_replay.normalize.sources.ids import hex_id

    assert hex_id(base64.b64encode(bytes.fromhex(T)).decode(), 32, "traceId") == T
    with pytest.raises(BadId) as caught:
        hex_id("A" * 10_000_000, 32, "traceId")
    assert len(str(caught.value)) < 200  # the message quotes a few dozen characters, not the input


def test_a_payload_nested_past_what_json_can_write_back_is_stored_cut(tmp_path):
    """orjson reads 1024 levels but writes only 254 back, and `json` writes as deep as the
    interpreter's recursion allows (not 1000 levels before Python 3.12): the payload is stored,
    cut at 128 levels where it cannot be written back whole, instead of failing the whole batch."""
    deep = "[" * 1000 + "]" * 1000
    messages = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "x", "extra": "@"}]}])
    attributes = {**chat_attributes(), "gen_ai.input.messages": messages.replace('"@"', deep)}
    path = tmp_path / "deep-payload.json"
    path.write_text(json.dumps({"spans": [{"trace_id": T, "span_id": S, "name": "chat m",
                                           "start_time_unix_nano": 1_700_000_000_000_000_000, "attributes": attributes}]}))
    batch = files.read("flat", path)
    ingest(tmp_path / "store", batch.spans, batch.logs, source="import:flat", privacy=None)
    (step,) = Store(tmp_path / "store").trajectory(T).steps
    text = json.dumps(step.inputs)
    assert '"content": "x"' in text and ("<nested too deeply>" in text or text.count("[") >= 1000)
