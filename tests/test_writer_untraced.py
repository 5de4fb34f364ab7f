"""The capture writer is not traced: a store client that is instrumented makes no spans of its own."""

from __future__ import annotations

from fsspec.implementations.memory import MemoryFileSystem
from opentelemetry import trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_replay import ReplayProcessor
from otel_replay.store.location import StoreLocation
from tests.helpers import chat_attributes


class InstrumentedMemoryFS(MemoryFileSystem):
    """An in-memory object store whose writes are traced the way instrumentations trace a client:
    a CLIENT span per call, unless instrumentation is suppressed in the caller's context."""

    protocol = "tracedmem"
    tracer: trace.Tracer | None = None
    calls = 0

    def pipe_file(self, path, value, **kwargs):  # noqa: ANN001, ANN201 - fsspec's signature
        type(self).calls += 1
        if is_instrumentation_enabled() and self.tracer is not None:
            with self.tracer.start_as_current_span("PUT object", kind=trace.SpanKind.CLIENT):
                return super().pipe_file(path, value, **kwargs)
        return super().pipe_file(path, value, **kwargs)


def test_the_writer_makes_no_spans_through_an_instrumented_store_client():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    fs = InstrumentedMemoryFS(skip_instance_cache=True)
    InstrumentedMemoryFS.tracer = provider.get_tracer("client-instrumentation")
    processor = ReplayProcessor(StoreLocation("tracedmem://store", filesystem=fs), flush_interval_s=0.05)
    provider.add_span_processor(processor)
    with provider.get_tracer("t").start_as_current_span("chat m", attributes=chat_attributes()):
        pass
    assert processor.force_flush(30_000)
    provider.shutdown()
    assert InstrumentedMemoryFS.calls >= 3  # the writer did write through the client (segments, manifest)
    assert [s.name for s in exporter.get_finished_spans()] == ["chat m"]  # and no "PUT object" span
