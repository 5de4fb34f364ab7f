"""Capture with one line (`configure()`) or with none (`OTEL_TRACES_EXPORTER=otel_replay`).

`configure()` puts a `ReplayProcessor` on the global TracerProvider and a `ReplayLogProcessor` on
the global LoggerProvider, making either if none is set. Under `opentelemetry-instrument` the
`otel_replay` traces exporter does the same without code: the SDK's configurator sets the global
TracerProvider before it builds the exporters, so building `ReplayExporter` puts the real processor
on that provider, and the exporter itself exports nothing. Capture is configured once per process,
whichever way comes first; later calls return the same processor.

Nothing here imports pyarrow or DuckDB (the writer thread does), and this module is cheap to
import: `opentelemetry-instrument` loads it in every process where otel-replay is installed.
"""

from __future__ import annotations

import inspect
import logging
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

    from otel_replay.capture.processor import ReplayProcessor
    from otel_replay.normalize.redact import Redactor
    from otel_replay.store.location import StoreLocation

logger = logging.getLogger("otel_replay")

BY_CODE = "otel_replay.configure()"
BY_EXPORTER = "OTEL_TRACES_EXPORTER=otel_replay"


@dataclass
class _Capture:
    """The process's capture, as configured the first time."""

    processor: ReplayProcessor
    options: dict[str, Any]  # every ReplayProcessor argument, as resolved
    logs: bool  # a log processor was asked for
    by: str  # BY_CODE or BY_EXPORTER
    logs_settled: bool = False  # the log processor is on a LoggerProvider, or cannot be


_lock = threading.Lock()
_capture: _Capture | None = None
_placeholders: list[ReplayExporter] = []  # exporters whose BatchSpanProcessor has nothing to do


def configure(store: str | Path | StoreLocation | None = None, *, max_queue_spans: int | None = None,
              max_queue_bytes: int | None = None, flush_interval_s: float | None = None,
              flush_rows: int | None = None, redact: Redactor | bool | None = None,
              capture_payloads: bool | Mapping[str, bool] | None = None,
              logs: bool | None = None) -> ReplayProcessor:
    """Capture this process's GenAI spans into a store, in one line; returns the processor.

    Adds a `ReplayProcessor` to the global TracerProvider and, unless `logs` is False, a
    `ReplayLogProcessor` to the global LoggerProvider, making either provider if none is set (so
    call it after your own OpenTelemetry set-up, if you have one). An argument left None takes its
    `OTEL_REPLAY_*` variable (`otel_replay.capture.env`), else the `ReplayProcessor` default.

    Idempotent: capture is configured once per process. A later call, or one after
    `OTEL_TRACES_EXPORTER=otel_replay` configured it, returns the same processor and adds nothing;
    if it asks for different options it also warns, and the first configuration stays.

    :raises CaptureConfigError: an `OTEL_REPLAY_*` variable holds a bad value (one line naming it).
    :raises ValueError: an argument is out of range.
    :raises TypeError: the global TracerProvider takes no span processors (a NoOpTracerProvider).
    """
    global _capture
    explicit = {name: value for name, value in (
        ("store", store), ("max_queue_spans", max_queue_spans), ("max_queue_bytes", max_queue_bytes),
        ("flush_interval_s", flush_interval_s), ("flush_rows", flush_rows), ("redact", redact),
        ("capture_payloads", capture_payloads)) if value is not None}
    with _lock:
        if _capture is not None:
            _warn_if_different(_capture, explicit, logs)
            if _capture.logs and not _capture.logs_settled:  # zero-code under a configurator without the hook
                _attach_logs(_capture, create=False)
            return _capture.processor
        from otel_replay.capture.env import options_from_env

        options = options_from_env()
        want_logs = options.pop("logs", True) if logs is None else logs
        options.update(explicit)
        provider = _global_tracer_provider()
        if provider is not None and not callable(getattr(provider, "add_span_processor", None)):
            raise TypeError(f"the global TracerProvider is a {type(provider).__name__}, which takes no span "
                            "processors: set an SDK TracerProvider (or none) before otel_replay.configure()")
        processor = _new_processor(options)
        if provider is None:
            provider = _set_tracer_provider()
        provider.add_span_processor(processor)
        _capture = _Capture(processor, _resolved(options, processor), want_logs, BY_CODE)
        if want_logs:
            _attach_logs(_capture, create=True)
        return processor


class ReplayExporter(SpanExporter):
    """`OTEL_TRACES_EXPORTER=otel_replay`: capture with no code change (entry point of the SDK's configurator).

    The configurator puts each exporter behind a BatchSpanProcessor, which would queue every
    sampled span, GenAI or not, on the service's thread. So this exporter is a placeholder: building
    it puts a real `ReplayProcessor` (settings from `OTEL_REPLAY_*`) on the global TracerProvider,
    which the configurator has set by then, and `export` has nothing to do. `after_sdk_setup` then
    takes the idle BatchSpanProcessor off the provider and adds the log processor.

    A bad variable is one error line at start-up, and capture stays off; the service runs on (a
    bad value raised here would stop the configurator, and with it the service's other telemetry).
    Built where no SDK TracerProvider is set, it feeds the spans it is given to its processor.
    """

    def __init__(self) -> None:
        self._feed: ReplayProcessor | None = None  # the processor `export` feeds, when not on a provider
        try:
            self._feed = _zero_code()
        except ValueError as exc:  # CaptureConfigError is one: a bad OTEL_REPLAY_* value
            logger.error("otel-replay: %s; capture is off in this process (the service runs on)", exc)
        except Exception:  # noqa: BLE001 - never stop the service's start
            logger.exception("otel-replay: capture could not start; it is off in this process")
        if self._feed is None:
            with _lock:
                _placeholders.append(self)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        feed = self._feed
        if feed is not None:
            for span in spans:
                feed.on_end(span)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._feed.force_flush(timeout_millis) if self._feed is not None else True

    def shutdown(self) -> None:
        if self._feed is not None:
            self._feed.shutdown()


def after_sdk_setup() -> None:
    """Finish zero-code capture once the SDK is set up (`opentelemetry_pre_instrument` hook).

    `opentelemetry-instrument` calls it after the configurator, before the instrumentations. It
    takes the idle BatchSpanProcessor around the placeholder exporter off the provider, and adds
    the log processor now that the LoggerProvider exists. Without `otel_replay` among the exporters
    it does nothing. It never raises: an exception here would stop every instrumentation.
    """
    if _capture is None and not _placeholders:
        return
    try:
        with _lock:
            while _placeholders:
                _drop_batch_processor(_placeholders.pop())
            if _capture is not None and _capture.logs and not _capture.logs_settled:
                _attach_logs(_capture, create=False)
    except Exception:  # noqa: BLE001
        logger.warning("otel-replay: finishing the zero-code set-up failed (capture runs on)", exc_info=True)


# -- internals -------------------------------------------------------------------------------------
def _zero_code() -> ReplayProcessor | None:
    """Configure capture from `OTEL_REPLAY_*` for an exporter; the processor it must feed, if any."""
    global _capture
    with _lock:
        if _capture is not None:  # configured already (by code, or by another placeholder)
            return None
        from otel_replay.capture.env import options_from_env

        options = options_from_env()
        want_logs = options.pop("logs", True)
        provider = _global_tracer_provider()
        processor = _new_processor(options)
        _capture = _Capture(processor, _resolved(options, processor), want_logs, BY_EXPORTER)
        add_span_processor = getattr(provider, "add_span_processor", None)
        if not callable(add_span_processor):
            logger.info("otel-replay: no SDK TracerProvider is set yet; spans reach capture through the "
                        "exporter's BatchSpanProcessor")
            return processor
        add_span_processor(processor)
        if want_logs:
            _attach_logs(_capture, create=False)  # the configurator sets the LoggerProvider after this
        return None


def _new_processor(options: dict[str, Any]) -> ReplayProcessor:
    from otel_replay.capture.processor import ReplayProcessor

    return ReplayProcessor(**options)


def _resolved(options: dict[str, Any], processor: ReplayProcessor) -> dict[str, Any]:
    """Every argument the processor was made with: the given ones, the defaults for the rest."""
    from otel_replay.capture.processor import ReplayProcessor

    defaults = {name: p.default for name, p in inspect.signature(ReplayProcessor).parameters.items()}
    return {**defaults, **options, "store": processor.store}


def _warn_if_different(capture: _Capture, explicit: dict[str, Any], logs: bool | None) -> None:
    from otel_replay.store.location import StoreLocation

    ignored = []
    for name, value in explicit.items():
        first = capture.options[name]
        same = StoreLocation.of(value) == first if name == "store" else value == first
        if not same:
            ignored.append(f"{name}={value!r}")
    if logs is not None and logs != capture.logs:
        ignored.append(f"logs={logs!r}")
    if ignored:
        warnings.warn(f"otel-replay: capture was configured already (by {capture.by}, into {capture.processor.store}); "
                      f"keeping that configuration and ignoring {', '.join(ignored)}", stacklevel=3)


def _global_tracer_provider() -> Any | None:
    """The global TracerProvider, or None when none is set (the API's proxy stands in for it)."""
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    return None if isinstance(provider, trace.ProxyTracerProvider) else provider


def _set_tracer_provider() -> Any:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    return trace.get_tracer_provider()  # another thread may have set one first: that one is global


def _attach_logs(capture: _Capture, *, create: bool) -> None:
    """Add the log processor to the global LoggerProvider (made if `create` and none is set)."""
    from opentelemetry import _logs

    provider = _logs.get_logger_provider()
    if _is_proxy(provider):
        if not create:
            return  # not set yet: `after_sdk_setup` (or a later `configure()`) tries again
        from opentelemetry.sdk._logs import LoggerProvider

        _logs.set_logger_provider(LoggerProvider())
        provider = _logs.get_logger_provider()
    capture.logs_settled = True
    add = getattr(provider, "add_log_record_processor", None)
    if not callable(add):
        logger.warning("otel-replay: the global LoggerProvider is a %s, which takes no log processors: GenAI "
                       "content carried in log events is not captured", type(provider).__name__)
        return
    from otel_replay.capture.logs import ReplayLogProcessor

    add(ReplayLogProcessor(capture.processor))


def _is_proxy(provider: object) -> bool:
    """Whether no LoggerProvider is set (the API's proxy is not exported: found by name if it moves)."""
    try:
        from opentelemetry._logs._internal import ProxyLoggerProvider
    except ImportError:
        return type(provider).__name__ == "ProxyLoggerProvider"
    return isinstance(provider, ProxyLoggerProvider)


def _drop_batch_processor(exporter: ReplayExporter) -> None:
    """Take the BatchSpanProcessor the configurator put around `exporter` off the global provider.

    It would cost each span an append on the service's thread, for an export that does nothing.
    This reaches into the SDK (the provider's `_active_span_processor`, its `_span_processors`
    tuple and `_lock`, used as `add_span_processor` uses them); where they are not as expected,
    the BatchSpanProcessor stays (idle, and costing what it costs).
    """
    from opentelemetry import trace

    multi: Any = getattr(trace.get_tracer_provider(), "_active_span_processor", None)
    lock = getattr(multi, "_lock", None)
    if lock is None or not isinstance(getattr(multi, "_span_processors", None), tuple):
        return
    with lock:
        current = multi._span_processors  # noqa: SLF001
        idle = [p for p in current if getattr(p, "span_exporter", None) is exporter]
        if not idle:
            return
        multi._span_processors = tuple(p for p in current if all(p is not q for q in idle))  # noqa: SLF001
    for processor in idle:
        processor.shutdown()
