"""`otel-replay import`: every shared export fixture lands as the same canonical steps."""

from __future__ import annotations

import base64
import json
import random

import pytest
from click.testing import CliRunner
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_replay import Store
from otel_replay.cli import main as cli
from tests.helpers import FIXTURES

LANGSMITH = FIXTURES / "langsmith"
LANGFUSE = FIXTURES / "langfuse"
WHOWHEN = FIXTURES / "whowhen"


def imp(store, fmt, *paths):
    return CliRunner().invoke(cli, ["--store", str(store), "import", fmt, *map(str, paths)])


def trajectory_for(store, where):
    (tid,) = Store(store).sql(f"select trace_id from traces where {where}").column("trace_id").to_pylist()
    return Store(store).trajectory(tid)


def shopping_steps(traj):
    return [(s.index, s.kind, s.name, s.status) for s in traj.steps]


WRONG_ANSWER = [
    (0, "llm", "chat gpt-4o-mini", "ok"), (1, "tool", "calculator", "error"), (2, "llm", "chat gpt-4o-mini", "ok"),
    (3, "tool", "calculator", "ok"), (4, "llm", "chat gpt-4o-mini", "ok"),
]


def assert_wrong_answer(traj):
    assert [(k, n) for _, k, n, _ in shopping_steps(traj)] == [(k, n) for _, k, n, _ in WRONG_ANSWER]
    llm0, tool1, llm2, tool3, llm4 = traj.steps
    assert tool1.status == "error" and tool1.error_message and "Unsupported characters" in tool1.error_message
    call = next(p for p in llm0.outputs[0]["parts"] if p["type"] == "tool_call")
    assert call["arguments"] == {"expression": "2,340 * 17%"} and tool1.tool_call_id == call["id"]
    assert tool3.outputs[0]["parts"][0]["response"] == "397.8"
    assert llm0.input_tokens == 212 and llm0.output_tokens == 21
    assert llm4.inputs[-1]["role"] == "tool" and llm4.inputs[-1]["parts"][0]["id"] == tool3.tool_call_id
    assert "$39.78" in traj.final_output
    edges = {(e.source, e.target, e.via) for e in traj.edges}
    assert {(0, 1, "tool_call"), (2, 3, "tool_call"), (3, 4, "tool_result")} <= edges


def test_langsmith_runs_json(tmp_path):
    result = imp(tmp_path, "langsmith", LANGSMITH / "trace_wrong_answer.runs.json")
    assert result.exit_code == 0, result.output
    assert "imported 1 traces: 23 spans stored (6 steps)" in result.output
    traj = trajectory_for(tmp_path, "true")
    assert_wrong_answer(traj)
    assert traj.trace_id == "01a22dcbe11576779a4f7792566b485f"  # the trace UUID's hex
    assert traj.steps[0].model == "gpt-4o-mini" and traj.steps[0].provider == "openai"
    ids = Store(tmp_path).sql("select json_extract_string(attributes, '$.\"langsmith.run_id\"') as id from spans")
    assert all(len(i) == 36 for i in ids.column("id").to_pylist())  # original run UUIDs are kept


def test_langsmith_order_comes_from_the_data_not_the_file(tmp_path):
    runs = json.loads((LANGSMITH / "trace_wrong_answer.runs.json").read_text())
    random.Random(4).shuffle(runs)
    (tmp_path / "shuffled.json").write_text(json.dumps(runs))
    assert imp(tmp_path / "a", "langsmith", tmp_path / "shuffled.json").exit_code == 0
    assert imp(tmp_path / "b", "langsmith", LANGSMITH / "trace_wrong_answer.runs.json").exit_code == 0
    a, b = trajectory_for(tmp_path / "a", "true"), trajectory_for(tmp_path / "b", "true")
    assert [s.span_id for s in a.steps] == [s.span_id for s in b.steps]


def test_langsmith_ingest_ops_equal_the_runs_dump(tmp_path):
    assert imp(tmp_path / "ops", "langsmith", LANGSMITH / "trace_wrong_answer.ingest_ops.jsonl").exit_code == 0
    assert imp(tmp_path / "runs", "langsmith", LANGSMITH / "trace_wrong_answer.runs.json").exit_code == 0
    ops, runs = trajectory_for(tmp_path / "ops", "true"), trajectory_for(tmp_path / "runs", "true")
    assert_wrong_answer(ops)
    assert [(s.span_id, s.inputs, s.outputs) for s in ops.steps] == [(s.span_id, s.inputs, s.outputs) for s in runs.steps]


def test_langsmith_export_and_v2_page(tmp_path):
    result = imp(tmp_path, "langsmith", *sorted((LANGSMITH / "export_3_traces").glob("*.jsonl")))
    assert result.exit_code == 0 and "imported 3 traces" in result.output
    failed = trajectory_for(tmp_path, "status = 'error'")
    assert failed.steps[-1].kind == "llm" and failed.steps[-1].status == "error"
    assert "RateLimitError" in (failed.steps[-1].error_type or "")
    v2 = imp(tmp_path / "v2", "langsmith", LANGSMITH / "trace_rate_limited.runs_query_v2.json")
    assert v2.exit_code == 0, v2.output
    page = trajectory_for(tmp_path / "v2", "true")
    assert page.trace_id == failed.trace_id
    assert [(s.kind, s.name, s.status) for s in page.steps] == [(s.kind, s.name, s.status) for s in failed.steps]


@pytest.mark.parametrize("name", ["trace_wrong_answer.trace_get.json", "export_3_traces/trace_wrong_answer.observations_v2.json",
                                  "otlp/trace_wrong_answer.otlp.json"])
def test_langfuse_shapes(tmp_path, name):
    result = imp(tmp_path, "langfuse", LANGFUSE / name)
    assert result.exit_code == 0, result.output
    traj = trajectory_for(tmp_path, "true")
    assert [(s.kind, s.name.split(" ")[0]) for s in traj.steps] == [
        ("llm", "chat"), ("tool", "calculator"), ("llm", "chat"), ("tool", "calculator"), ("llm", "chat")]
    assert traj.steps[1].status == "error" and "Unsupported characters" in traj.steps[1].error_message
    assert traj.steps[0].input_tokens == 212 and "$39.78" in traj.final_output
    assert traj.trace_id == "2f8008e8158e2796ab22d019f151de79"


def test_langfuse_trace_scores_are_kept(tmp_path):
    assert imp(tmp_path, "langfuse", LANGFUSE / "trace_wrong_answer.trace_get.json").exit_code == 0
    score = Store(tmp_path).sql(
        "select json_extract(attributes, '$.\"langfuse.score.correctness\"')::DOUBLE as s from spans where parent_span_id is null")
    assert score.column("s").to_pylist() == [0.0]


def _otlp_proto_bytes(doc: dict) -> bytes:
    doc = json.loads(json.dumps(doc))
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):  # protobuf's JSON reader wants base64 ids
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return ParseDict(doc, ExportTraceServiceRequest()).SerializeToString()


def test_otlp_json_lines_and_protobuf_agree(tmp_path):
    otel = FIXTURES / "otel"
    doc = json.loads((otel / "openai-v2_span_only.otlp.json").read_text())
    (tmp_path / "spans.pb").write_bytes(_otlp_proto_bytes(doc))
    (tmp_path / "spans.jsonl").write_text(json.dumps(doc) + "\n" + json.dumps(doc) + "\n")
    assert imp(tmp_path / "json", "otlp", otel / "openai-v2_span_only.otlp.json").exit_code == 0
    assert imp(tmp_path / "pb", "otlp", tmp_path / "spans.pb").exit_code == 0
    assert imp(tmp_path / "jsonl", "auto", tmp_path / "spans.jsonl").exit_code == 0
    query = "select trace_id, span_id, kind, name, input_hashes, output_hashes from steps order by 1, 2"
    rows = [Store(tmp_path / d).sql(query).to_pylist() for d in ("json", "pb", "jsonl")]
    assert rows[0] == rows[1] == rows[2] and len(rows[0]) == 11


def test_otlp_logs_file_brings_content(tmp_path):
    otel = FIXTURES / "otel"
    alone = imp(tmp_path / "a", "otlp", otel / "openai-v2_event_only.otlp.json")
    both = imp(tmp_path / "b", "otlp", otel / "openai-v2_event_only.otlp.json", otel / "openai-v2_event_only.logs.otlp.json")
    assert alone.exit_code == both.exit_code == 0
    count = "select count(*) filter (where observation_only) as n from steps where kind = 'llm'"
    assert Store(tmp_path / "a").sql(count).column("n")[0].as_py() == 5
    assert Store(tmp_path / "b").sql(count).column("n")[0].as_py() == 0


def _to_jaeger(doc: dict) -> dict:
    """The Jaeger UI download shape of an OTLP/JSON request, as Jaeger's OTLP translator maps it."""
    def tag(key, value):
        for otlp, jaeger_type in (("stringValue", "string"), ("intValue", "int64"), ("doubleValue", "float64"),
                                  ("boolValue", "bool")):
            if otlp in value:
                return {"key": key, "type": jaeger_type, "value": int(value[otlp]) if jaeger_type == "int64" else value[otlp]}
        return {"key": key, "type": "string", "value": json.dumps([v.get("stringValue") for v in value["arrayValue"]["values"]])}

    traces: dict[str, dict] = {}
    for rs in doc["resourceSpans"]:
        process = {"serviceName": "otel-replay-fixture", "tags": []}
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                trace = traces.setdefault(span["traceId"], {"traceID": span["traceId"], "spans": [], "processes": {"p1": process}})
                tags = [tag(a["key"], a["value"]) for a in span.get("attributes", [])]
                tags += [{"key": "otel.scope.name", "type": "string", "value": ss["scope"]["name"]},
                         {"key": "span.kind", "type": "string", "value": {1: "internal", 3: "client"}[span["kind"]]}]
                if span.get("status", {}).get("code") == 2:
                    tags += [{"key": "otel.status_code", "type": "string", "value": "ERROR"},
                             {"key": "error", "type": "bool", "value": True}]
                start = int(span["startTimeUnixNano"]) // 1000
                trace["spans"].append({
                    "traceID": span["traceId"], "spanID": span["spanId"], "operationName": span["name"],
                    "references": [{"refType": "CHILD_OF", "traceID": span["traceId"], "spanID": span["parentSpanId"]}]
                    if span.get("parentSpanId") else [],
                    "startTime": start, "duration": int(span["endTimeUnixNano"]) // 1000 - start, "tags": tags,
                    "logs": [{"timestamp": int(e["timeUnixNano"]) // 1000,
                              "fields": [{"key": "event", "type": "string", "value": e["name"]}]
                              + [tag(a["key"], a["value"]) for a in e.get("attributes", [])]} for e in span.get("events", [])],
                    "processID": "p1", "warnings": None})
    return {"data": list(traces.values()), "total": 0, "limit": 0, "offset": 0, "errors": None}


def test_jaeger_json(tmp_path):
    doc = json.loads((FIXTURES / "otel" / "openai-v2_span_only.otlp.json").read_text())
    (tmp_path / "jaeger.json").write_text(json.dumps(_to_jaeger(doc)))
    result = imp(tmp_path / "store", "jaeger", tmp_path / "jaeger.json")
    assert result.exit_code == 0, result.output
    assert imp(tmp_path / "ref", "otlp", FIXTURES / "otel" / "openai-v2_span_only.otlp.json").exit_code == 0
    query = "select trace_id, span_id, kind, name, status, error_type, input_hashes, output_hashes from steps order by 1, 2"
    assert Store(tmp_path / "store").sql(query).to_pylist() == Store(tmp_path / "ref").sql(query).to_pylist()
    assert imp(tmp_path / "auto", "auto", tmp_path / "jaeger.json").exit_code == 0


def test_whowhen(tmp_path):
    result = imp(tmp_path, "whowhen", WHOWHEN)
    assert result.exit_code == 0 and "imported 184 traces" in result.output, result.output
    store = Store(tmp_path)
    labels = store.sql("""select json_extract_string(attributes, '$."whowhen.mistake_step"')::INT as step,
                                 json_extract_string(attributes, '$."whowhen.mistake_agent"') as agent, trace_id
                          from spans where parent_span_id is null""").to_pylist()
    assert len(labels) == 184
    doc = json.loads((WHOWHEN / "Hand-Crafted" / "1.json").read_text())
    traj = trajectory_for(tmp_path, "root_name = 'invoke_workflow Hand-Crafted/1'")
    assert len(traj.steps) == len(doc["history"]) and traj.status == "error"
    mistake = traj.step(int(doc["mistake_step"]))  # step_index equals the dataset's history index
    assert mistake.agent == doc["history"][int(doc["mistake_step"])]["role"] == doc["mistake_agent"]
    assert mistake.outputs[0]["parts"][0]["content"] == doc["history"][int(doc["mistake_step"])]["content"]
    assert traj.steps[0].kind == "tool" and traj.steps[0].tool_name == "human"
    algo = json.loads((WHOWHEN / "Algorithm-Generated" / "1.json").read_text())
    first = trajectory_for(tmp_path, "root_name = 'invoke_workflow Algorithm-Generated/1'").steps[0]
    assert first.system[0]["content"] == algo["system_prompt"][algo["history"][0]["name"]]


def test_importing_twice_stores_nothing_twice(tmp_path):
    for _ in range(2):
        assert imp(tmp_path, "auto", LANGSMITH / "trace_wrong_answer.runs.json", LANGFUSE / "trace_wrong_answer.trace_get.json").exit_code == 0
    second = imp(tmp_path, "langsmith", LANGSMITH / "trace_wrong_answer.runs.json")
    assert "0 spans stored (0 steps), 23 already in the store" in second.output
    raw = Store(tmp_path).sql("select count(*) n from span_rows").column("n")[0].as_py()
    assert raw == Store(tmp_path).sql("select count(*) n from spans").column("n")[0].as_py() == 46


@pytest.mark.parametrize(("content", "message"), [
    (b"", "the file is empty"),
    (b'{"resourceSpans": [{"scopeSpans": [', "invalid or truncated JSON at line 1"),
    (b'{"hello": "world"}', "cannot tell the format"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b"\xff\xfe garbage", "not an OTLP protobuf request"),
    (b"trace_id,span_id\nab,cd\n", "neither OTLP/JSON (it starts with 't', not '{' or '[') nor OTLP protobuf"),
])
def test_unreadable_files_give_a_clear_error_and_store_nothing(tmp_path, content, message):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    result = imp(tmp_path / "store", "auto", bad)
    assert result.exit_code == 1 and message in result.output and str(bad) in result.output, result.output
    assert not list((tmp_path / "store").glob("**/*.parquet"))


def test_missing_file_and_wrong_format(tmp_path):
    missing = imp(tmp_path, "otlp", tmp_path / "nope.json")
    assert missing.exit_code == 1 and "no such file" in missing.output
    wrong = imp(tmp_path, "jaeger", LANGSMITH / "trace_wrong_answer.runs.json")
    assert wrong.exit_code == 1 and "not Jaeger JSON" in wrong.output


def test_malformed_records_are_skipped_with_their_location(tmp_path):
    good = json.loads((FIXTURES / "otel" / "openai-v2_span_only.otlp.json").read_text())
    broken = json.loads(json.dumps(good))
    broken["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "not-hex"
    broken["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["attributes"] = "wrong type"
    lines = [json.dumps(broken), "{truncated", json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "chat huge", "startTimeUnixNano": "1",
         "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                        {"key": "gen_ai.input.messages", "value": {"stringValue": json.dumps(
                            [{"role": "user", "parts": [{"type": "text", "content": "x" * 5_000_000}]}])}}]}]}]}]})]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = imp(tmp_path / "store", "otlp", path)
    assert result.exit_code == 0, result.output
    assert "skipped 3 records" in result.output
    assert f"{path}:2" in result.output  # the truncated line, by number
    assert "resourceSpans[0].scopeSpans[0].spans[0]" in result.output  # the bad id, by path
    assert "traceId" in result.output
    assert Store(tmp_path / "store").sql("select count(*) n from steps where name = 'chat'").column("n")[0].as_py() == 1


def test_a_file_whose_every_record_is_skipped_exits_non_zero(tmp_path):
    path = tmp_path / "all-bad.jsonl"
    path.write_text('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "cd"}]}]}]}\n{truncated\n')
    result = imp(tmp_path / "store", "otlp", path)
    assert result.exit_code == 1, result.output
    assert "skipped 2 records" in result.output and f"{path}:2" in result.output
    assert "nothing imported: all 2 records read were skipped" in result.output
    assert not list((tmp_path / "store").glob("**/*.parquet"))
    empty = tmp_path / "empty-request.json"  # a valid export that holds nothing is not an error
    empty.write_text('{"resourceSpans": []}')
    assert imp(tmp_path / "store", "otlp", empty).exit_code == 0
