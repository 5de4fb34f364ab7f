"""Readers that turn each source format into `SpanRecord`s and `LogEvent`s."""
