"""`otel_replay.configure()`: one line puts capture on the global providers, once per process.

Global providers can be set once per process, so each case that sets them runs in a fresh
interpreter (real SDK, real instrumentation, real store); the variables' parsing runs here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_replay import Store
from otel_replay.capture.env import CaptureConfigError, options_from_env
from otel_replay.normalize.redact import Redactor
from otel_replay.store.location import StoreLocation
from tests.helpers import REPO, needs_openai_v2


def _probe(code: str, env: dict[str, str] | None = None, *args: str) -> dict:
    """Run `code` in a fresh interpreter without the caller's OTEL_* settings; its last line, as JSON."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the OTEL_REPLAY_* variables ---------------------------------------------------------------------
def test_each_variable_sets_its_processor_argument(tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"patterns": {"customer": r"CUST-\d{8}"}}))
    options = options_from_env({
        "OTEL_REPLAY_STORE": str(tmp_path / "store"), "OTEL_REPLAY_MAX_QUEUE_SPANS": "1000",
        "OTEL_REPLAY_MAX_QUEUE_BYTES": "64MiB", "OTEL_REPLAY_FLUSH_INTERVAL_S": "0.5",
        "OTEL_REPLAY_FLUSH_ROWS": "500", "OTEL_REPLAY_REDACT_RULES": str(rules),
        "OTEL_REPLAY_CAPTURE_PAYLOADS": "llm,tool", "OTEL_REPLAY_LOGS": "False",
        "OTEL_REPLAY_MODEL": "not ours: ignored",
    })
    redactor = options.pop("redact")
    assert isinstance(redactor, Redactor) and "[REDACTED:customer]" in redactor.text("id CUST-12345678")[0]
    assert options == {"store": StoreLocation(str(tmp_path / "store")), "max_queue_spans": 1000,
                       "max_queue_bytes": 64 * 1024**2, "flush_interval_s": 0.5, "flush_rows": 500,
                       "capture_payloads": {"llm": True, "tool": True, "retrieval": False, "embedding": False,
                                            "agent": False},
                       "logs": False}


def test_unset_and_empty_variables_leave_the_defaults():
    assert options_from_env({"OTEL_REPLAY_FLUSH_ROWS": "", "OTEL_REPLAY_REDACT": "  "}) == {}
    assert options_from_env({"OTEL_REPLAY_REDACT": "false", "OTEL_REPLAY_CAPTURE_PAYLOADS": "none"}) == {
        "redact": False, "capture_payloads": False}


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("OTEL_REPLAY_MAX_QUEUE_SPANS", "0", "whole number above 0"),
    ("OTEL_REPLAY_MAX_QUEUE_SPANS", "lots", "whole number above 0"),
    ("OTEL_REPLAY_MAX_QUEUE_BYTES", "256MB", "KiB, MiB, GiB"),
    ("OTEL_REPLAY_FLUSH_INTERVAL_S", "2s", "number of seconds above 0"),
    ("OTEL_REPLAY_FLUSH_INTERVAL_S", "nan", "number of seconds above 0"),
    ("OTEL_REPLAY_FLUSH_ROWS", "-5", "whole number above 0"),
    ("OTEL_REPLAY_REDACT", "yes", "expected true or false"),
    ("OTEL_REPLAY_LOGS", "1", "expected true or false"),
    ("OTEL_REPLAY_CAPTURE_PAYLOADS", "llm,chat", "step kinds among llm, tool"),
    ("OTEL_REPLAY_REDACT_RULES", "{missing}", "cannot read redaction rules"),
    ("OTEL_REPLAY_REDACT_RULES", "{bad_yaml}", "not valid YAML"),
    ("OTEL_REPLAY_REDACT_RULES", "{bad_field}", "unknown field(s) pattern"),
    ("OTEL_REPLAY_STORE", "{a_file}/store", "is a file; expected a directory"),
    ("OTEL_REPLAY_STORE", "file://host/x", "a file:// URL names a local path"),
])
def test_a_bad_value_is_one_line_that_names_the_variable(tmp_path, variable, value, says):
    (tmp_path / "bad.yaml").write_text("patterns: [oops\n  - x: {\n")
    (tmp_path / "field.yaml").write_text("pattern: {a: b}\n")
    (tmp_path / "file").write_text("")
    value = value.format(missing=tmp_path / "none.yaml", bad_yaml=tmp_path / "bad.yaml",
                         bad_field=tmp_path / "field.yaml", a_file=tmp_path / "file")
    with pytest.raises(CaptureConfigError) as caught:
        options_from_env({variable: value})
    message = str(caught.value)
    assert message.startswith(f"{variable}={value!r}: ") and says in message, message
    assert "\n" not in message and caught.value.variable == variable


def test_redaction_off_and_a_rules_file_together_are_refused(tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text("{}")
    with pytest.raises(CaptureConfigError, match="set OTEL_REPLAY_REDACT=false or OTEL_REPLAY_REDACT_RULES, not both"):
        options_from_env({"OTEL_REPLAY_REDACT": "false", "OTEL_REPLAY_REDACT_RULES": str(rules)})


def test_configure_raises_on_a_bad_variable_before_touching_any_provider(monkeypatch):
    from opentelemetry import trace

    import otel_replay

    monkeypatch.setenv("OTEL_REPLAY_FLUSH_ROWS", "many")
    before = trace.get_tracer_provider()
    with pytest.raises(CaptureConfigError, match=r"^OTEL_REPLAY_FLUSH_ROWS='many': expected a whole number"):
        otel_replay.configure()
    assert trace.get_tracer_provider() is before


# -- configure() on the global providers ----------------------------------------------------------
_TWICE = r"""
import json, sys, warnings
import otel_replay
from opentelemetry import trace
first = otel_replay.configure(sys.argv[1], flush_rows=100)
again = otel_replay.configure()  # nothing asked: no warning
same_options = otel_replay.configure(sys.argv[1], flush_rows=100)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    other = otel_replay.configure(sys.argv[2], flush_rows=7, logs=False)
tracer = trace.get_tracer("t")
with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
    with tracer.start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat",
            "gen_ai.request.model": "m", "gen_ai.input.messages": "[]"}):
        pass
trace.get_tracer_provider().shutdown()
print(json.dumps({"same": first is again is same_options is other, "store": str(first.store),
                  "provider": type(trace.get_tracer_provider()).__name__,
                  "warnings": [f"{w.filename.endswith('<string>')}:{w.message}" for w in caught],
                  "written": first.stats["written_spans"]}))
"""


@pytest.fixture(scope="module")
def configured_twice(tmp_path_factory) -> tuple[dict, Path, list[Path]]:
    """The `_TWICE` run: its report, the store it wrote, and the stores it must not have written."""
    root = tmp_path_factory.mktemp("twice")
    first, other, from_env = root / "first", root / "other", root / "from-env"
    report = _probe(_TWICE, {"OTEL_REPLAY_STORE": str(from_env)}, str(first), str(other))
    return report, first, [other, from_env]


def test_configure_twice_is_one_processor_and_each_span_is_stored_once(configured_twice):
    report, first, _ = configured_twice
    assert report["same"] and report["provider"] == "TracerProvider"  # made, as none was set
    assert report["written"] == 2 and report["store"] == str(first)  # the argument beats OTEL_REPLAY_STORE
    store = Store(first)
    assert store.sql("select count(*) n from spans").column("n")[0].as_py() == 2
    assert sorted(store.sql("select name from steps").column("name").to_pylist()) == ["chat m", "invoke_agent a"]


def test_configure_with_other_options_warns_at_the_caller_and_keeps_the_first(configured_twice):
    report, first, unwritten = configured_twice
    (warning,) = report["warnings"]
    assert warning.startswith("True:otel-replay: capture was configured already (by otel_replay.configure(), "
                              f"into {first}); keeping that configuration and ignoring "), warning
    assert "store=" in warning and "flush_rows=7" in warning and "logs=False" in warning
    assert not any(p.exists() for p in unwritten)  # neither the second store nor $OTEL_REPLAY_STORE


_LOG_EVENTS = r"""
import json, os, sys
os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "event_only"
import httpx2, openai
import otel_replay
from opentelemetry import _logs, trace
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from tests.agents.weather_loop import TOOLS, handler
processor = otel_replay.configure()
OpenAIInstrumentor().instrument()  # on the global providers, as an application would
client = openai.OpenAI(api_key="test", max_retries=0, http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))
client.chat.completions.create(model="gpt-4o-mini", tools=TOOLS,
                               messages=[{"role": "user", "content": "What's the weather in Paris?"}])
providers = [type(trace.get_tracer_provider()).__name__, type(_logs.get_logger_provider()).__name__]
trace.get_tracer_provider().shutdown()
print(json.dumps({"providers": providers, "store": str(processor.store)}))
"""


@needs_openai_v2
def test_configure_makes_both_providers_and_captures_content_carried_in_log_events(tmp_path):
    report = _probe(_LOG_EVENTS, {"OTEL_REPLAY_STORE": str(tmp_path)})
    assert report == {"providers": ["TracerProvider", "LoggerProvider"], "store": str(tmp_path)}
    store = Store(tmp_path)
    (trace_id,) = store.list_traces().column("trace_id").to_pylist()
    (step,) = store.trajectory(trace_id).steps
    # event_only: the span has no content; the messages came through the log processor
    assert step.kind == "llm" and not step.observation_only
    assert step.inputs == ({"role": "user", "parts": [{"type": "text", "content": "What's the weather in Paris?"}]},)
    assert step.outputs[0]["parts"][0]["name"] == "get_weather"


_EXISTING = r"""
import json
import otel_replay
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
mine = TracerProvider()
trace.set_tracer_provider(mine)
processor = otel_replay.configure(logs=False)
with mine.get_tracer("t").start_as_current_span("chat m", attributes={"gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m", "gen_ai.input.messages": '[{"role": "user", "content": "hi"}]'}):
    pass
mine.shutdown()
from opentelemetry import _logs
print(json.dumps({"kept": trace.get_tracer_provider() is mine, "logs": type(_logs.get_logger_provider()).__name__,
                  "written": processor.stats["written_spans"]}))
"""


def test_configure_joins_a_provider_already_set_and_takes_the_variables(tmp_path):
    report = _probe(_EXISTING, {"OTEL_REPLAY_STORE": str(tmp_path), "OTEL_REPLAY_CAPTURE_PAYLOADS": "none"})
    assert report == {"kept": True, "logs": "ProxyLoggerProvider", "written": 1}  # logs=False: none made
    (step,) = Store(tmp_path).sql("select observation_only from steps").to_pylist()
    assert step["observation_only"]  # OTEL_REPLAY_CAPTURE_PAYLOADS=none


def test_configure_refuses_a_provider_that_takes_no_processors():
    code = ("import json, otel_replay\nfrom opentelemetry import trace\n"
            "trace.set_tracer_provider(trace.NoOpTracerProvider())\n"
            "try:\n    otel_replay.configure()\nexcept TypeError as exc:\n    print(json.dumps(str(exc)))\n")
    message = _probe(code)
    assert message.startswith("the global TracerProvider is a NoOpTracerProvider, which takes no span processors")
