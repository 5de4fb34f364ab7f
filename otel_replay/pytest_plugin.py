"""A pytest gate: when a test that ran an agent fails, name the step that made the agent fail.

Opt in per test with a marker (or use the fixture):

    @pytest.mark.otel_replay(verifier=ok, policies="myproj.policies", max_policy_calls=2000)
    def test_refund(): ...

Capture: while an opted-in test runs, a `ReplayProcessor` on a temporary store receives the spans
of the global tracer provider (an SDK `TracerProvider` is installed as the global one when none
is set), so instrumentations that use the global provider, as they do by default, are captured
without change. It is reached through one relay processor added to that provider once (an SDK
provider cannot remove a processor), which forwards to the current test's processor and to
nothing between tests. A test with its own provider adds `otel_replay_capture.processor` to it.

On a failing test the captured runs are attributed (`otel_replay.attribute`, repair on by default)
and the culprit, its interval, WHAT / WHERE / WHY / FIX and the repair are added to the report as
an "otel-replay attribution" section. A passing test is only captured. The store is deleted after
each test unless `--otel-replay-keep`.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import weakref
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

if TYPE_CHECKING:
    from pluggy import Result

MARKER = "otel_replay"
SECTION = "otel-replay attribution"
GATE_DEFAULTS = {"repair": True}  # the report names a validated repair, as the issue asks of a gate
_CAPTURE = pytest.StashKey["Capture"]()
_RESULTS = pytest.StashKey[list[tuple[str, str]]]()  # (test, culprit line) of attributed failures
_KEPT = pytest.StashKey[list[tuple[str, Path]]]()  # (test, store) kept with --otel-replay-keep
_RELAYS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("otel-replay", "otel-replay: attribute the agent runs of failing tests")
    group.addoption("--otel-replay-html", metavar="DIR", type=Path,
                    help="Write the HTML attribution report of each failing test into DIR.")
    group.addoption("--otel-replay-max-policy-calls", metavar="N", type=int,
                    help="Budget of policy calls per attributed run (a marker's own max_policy_calls may be lower).")
    group.addoption("--otel-replay-keep", action="store_true",
                    help="Keep each test's capture store (deleted after the test otherwise); paths are printed.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(verifier=..., policies=..., **options): capture the agent runs "
                                       "of this test; when it fails, name the step that made the run fail")
    config.stash[_RESULTS] = []
    config.stash[_KEPT] = []


def _relay() -> Any:
    """The span processor added once to the global provider: it forwards to the current test's
    capture, and to nothing between tests. (Built on first use: loading this plugin, which pytest
    does in every run, must not import the OpenTelemetry SDK.)"""
    from opentelemetry.sdk.trace import SpanProcessor

    class Relay(SpanProcessor):
        def __init__(self) -> None:
            self.target: Any = None

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            target = self.target
            if target is not None:
                target.on_start(span, parent_context=parent_context)

        def on_end(self, span: Any) -> None:
            target = self.target
            if target is not None:
                target.on_end(span)

        def shutdown(self) -> None:
            self.target = None

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            target = self.target
            return True if target is None else target.force_flush(timeout_millis)

    return Relay()


def global_relay() -> Any:
    """The relay on the global tracer provider (an SDK provider is set when there is none); None
    when the global provider takes no span processors."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    if not hasattr(provider, "add_span_processor"):
        return None
    if provider not in _RELAYS:
        relay = _relay()
        provider.add_span_processor(relay)
        _RELAYS[provider] = relay
    return _RELAYS[provider]


class Capture:
    """The agent runs one test makes, in a temporary store; `set` what attributes them."""

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        from otel_replay.capture import ReplayProcessor

        self.path = Path(tempfile.mkdtemp(prefix=f"otel-replay-{_safe(name)[:60]}-"))
        self.options = dict(options)
        self.processor = ReplayProcessor(str(self.path))
        self.relay = global_relay()
        if self.relay is not None:
            self.relay.target = self.processor
        self.stopped = False

    @property
    def provider(self) -> Any:
        """The global tracer provider, whose spans are captured."""
        from opentelemetry import trace

        return trace.get_tracer_provider()

    def set(self, **options: Any) -> None:
        """Verifier, policies or attribution options, for policies that depend on fixtures."""
        self.options.update(options)

    def stop(self) -> None:
        """Detach and write everything captured to the store."""
        if self.stopped:
            return
        self.stopped = True
        if self.relay is not None and self.relay.target is self.processor:
            self.relay.target = None
        self.processor.shutdown()

    def trace_ids(self) -> list[str]:
        """The captured traces, in the order they started."""
        from otel_replay.trajectory import Store

        self.stop()
        ids = Store(str(self.path)).sql("SELECT trace_id FROM traces ORDER BY start_ns").column("trace_id")
        # cast: `traces.trace_id` is never NULL, so the column holds str only (pyarrow types it list[Any | None])
        return cast("list[str]", ids.to_pylist())

    def close(self, keep: bool) -> None:
        self.stop()
        if not keep:
            shutil.rmtree(self.path, ignore_errors=True)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "test"


def _start(item: pytest.Item) -> Capture:
    capture = item.stash.get(_CAPTURE, None)
    if capture is None:
        marker = item.get_closest_marker(MARKER)
        capture = Capture(item.name, marker.kwargs if marker else {})
        item.stash[_CAPTURE] = capture
    return capture


@pytest.fixture
def otel_replay_capture(request: pytest.FixtureRequest) -> Iterator[Capture]:
    """The capture of this test's agent runs: `.provider` (the global one, captured), `.processor`
    (add it to a provider of your own), `.set(verifier=..., policies=...)`, `.trace_ids()`."""
    yield _start(request.node)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker(MARKER) is not None:
        _start(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                               ) -> Generator[None, Result[pytest.TestReport], None]:
    outcome = yield
    report = outcome.get_result()
    capture = item.stash.get(_CAPTURE, None)
    if capture is None or report.when != "call":
        return
    capture.stop()
    if report.failed:
        text, headline = attribute_failure(item, capture)
        report.sections.append((SECTION, text))
        report.user_properties.append(("otel_replay", headline))
        item.config.stash[_RESULTS].append((item.nodeid, headline))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield
    capture = item.stash.get(_CAPTURE, None)
    if capture is not None:
        keep = item.config.getoption("otel_replay_keep")
        capture.close(keep)
        if keep:
            item.config.stash[_KEPT].append((item.nodeid, capture.path))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    results, kept = config.stash.get(_RESULTS, []), config.stash.get(_KEPT, [])
    if results or kept:
        terminalreporter.section("otel-replay")
        for nodeid, headline in results:
            terminalreporter.line(f"{nodeid}: {headline}")
        for nodeid, path in kept:
            terminalreporter.line(f"{nodeid}: store kept at {path}")


def attribute_failure(item: pytest.Item, capture: Capture) -> tuple[str, str]:
    """The report section of a failing test and its one-line summary; never raises."""
    config = item.config
    lines: list[str] = []
    headlines: list[str] = []
    try:
        options = {**GATE_DEFAULTS, **capture.options}
        cap = config.getoption("otel_replay_max_policy_calls")
        if cap is not None:
            options["max_policy_calls"] = min(cap, options.get("max_policy_calls") or cap)
        if options.get("verifier") is None:
            return (f"not attributed: no verifier; give @pytest.mark.{MARKER}(verifier=...) or "
                    "otel_replay_capture.set(verifier=...)"), "not attributed: no verifier"
        trace_ids = capture.trace_ids()
        if not trace_ids:
            return ("not attributed: no agent run was captured (no GenAI span reached the global tracer provider; "
                    "an instrumentation given its own provider needs otel_replay_capture.processor added to it, and "
                    "message content must be captured)"), "not attributed: nothing captured"
        html_dir = config.getoption("otel_replay_html")
        for trace_id in trace_ids:
            text, headline = _one(trace_id, capture, options, html_dir, item.nodeid, len(trace_ids) > 1)
            lines.append(text)
            headlines.append(headline)
    except Exception as exc:  # the test's own failure must still be reported as it is
        lines.append(f"not attributed: {type(exc).__name__}: {exc}")
        headlines.append("not attributed: an error")
    if config.getoption("otel_replay_keep"):
        lines.append(f"store kept at {capture.path}")
    return "\n\n".join(lines), "; ".join(headlines)


def _one(trace_id: str, capture: Capture, options: dict[str, Any], html_dir: Path | None, name: str,
         several: bool) -> tuple[str, str]:
    from otel_replay.api import attribute
    from otel_replay.attribution import AttributionError

    try:
        result = attribute(trace_id, store=str(capture.path), **options)
    except AttributionError as exc:
        return f"trace {trace_id}: not attributed: {exc}", "not attributed"
    text = [f"trace {trace_id}", str(result), result.repair_line,
            f"{result.rollouts} rollouts, {result.policy_calls} policy calls, job {result.job_id}"]
    if html_dir is not None:
        path = Path(html_dir) / (_safe(name) + (f"-{trace_id[:12]}" if several else "") + ".html")
        path.parent.mkdir(parents=True, exist_ok=True)
        result.to_html(path)
        text.append(f"HTML report: {path}")
    return "\n".join(text), result.headline
