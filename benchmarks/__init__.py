"""Benchmarks that back the performance claims in the README (`otel-replay bench ...`)."""

from benchmarks.capture import format_capture_table, run_capture_bench

__all__ = ["format_capture_table", "run_capture_bench"]
