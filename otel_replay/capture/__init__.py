"""Capture layer: span and log processors that feed the store without slowing the service."""

from otel_replay.capture.processor import ReplayLogProcessor, ReplayProcessor

__all__ = ["ReplayLogProcessor", "ReplayProcessor"]
