"""`ReplayLogProcessor`: GenAI content carried in log events, handed to a `ReplayProcessor`.

Apart from the span processor so that a service that does not use the logs SDK never imports it.
"""

from __future__ import annotations

from opentelemetry.sdk._logs import LogRecordProcessor

from otel_replay.capture.processor import ReplayProcessor
from otel_replay.capture.sizing import log_size
from otel_replay.normalize.content import CONTENT_EVENTS


class ReplayLogProcessor(LogRecordProcessor):
    """Feeds GenAI content log events to a `ReplayProcessor`, which joins them to their spans.

    Register it on the `LoggerProvider`: ``logger_provider.add_log_record_processor(ReplayLogProcessor(processor))``.
    """

    def __init__(self, processor: ReplayProcessor) -> None:
        self.processor = processor

    def on_emit(self, log_record: object) -> None:
        try:
            record = getattr(log_record, "log_record", log_record)
            name = getattr(record, "event_name", None)
            if name is None:
                name = (getattr(record, "attributes", None) or {}).get("event.name")
            if name in CONTENT_EVENTS:
                self.processor.enqueue_log(log_record, log_size(record))
        except Exception:  # noqa: BLE001
            self.processor.internal_errors.add()

    emit = on_emit  # SDKs before 1.39 call emit(log_data)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.processor.force_flush(timeout_millis)

    def shutdown(self) -> None:
        return None


