"""Normalized spans as stored rows: content addressing of payloads, JSON of attributes.

Each payload is serialized once in canonical form; its hash is of exactly those bytes, and the
same text is what `message_rows.body` stores.

A row is a tuple of its values in the table's column order (`SPAN_COLUMNS`, `STEP_COLUMNS`,
`MESSAGE_COLUMNS`, the order `schemas/store.sql` declares): cheaper to build than a dict, and the
Arrow conversion cuts the columns out of a chunk of rows in one `zip`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from xxhash import xxh3_128_hexdigest

from otel_replay.normalize.messages import canonical_bytes, is_shared
from otel_replay.store.layout import day_of

if TYPE_CHECKING:
    from otel_replay.normalize.pipeline import NormalizedSpan


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value, default=str).decode("utf-8")
    except (TypeError, orjson.JSONEncodeError):  # lone surrogates, huge ints: the slow, lenient path
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode(
            "utf-8", "replace"
        ).decode("utf-8")


def valid_text(value: Any) -> Any:
    """Strings with lone surrogates (invalid UTF-8) replaced, recursively; the rare slow path."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, list | tuple):
        return [valid_text(v) for v in value]
    if isinstance(value, dict):
        return {k: valid_text(v) for k, v in value.items()}
    return value


SPAN_COLUMNS = ("trace_id", "span_id", "parent_span_id", "name", "span_kind", "start_ns", "end_ns", "status_code",
                "status_message", "service_name", "scope_name", "scope_version", "attributes", "events", "links",
                "resource", "source", "ingested_ns")
STEP_COLUMNS = ("trace_id", "span_id", "parent_span_id", "kind", "operation", "name", "start_ns", "end_ns", "status",
                "error_type", "error_message", "provider", "request_model", "response_model", "input_tokens",
                "output_tokens", "agent_name", "conversation_id", "tool_name", "tool_call_id", "system_hash",
                "tools_hash", "input_hashes", "output_hashes", "request_params", "finish_reasons", "has_payload",
                "redacted", "convention", "service_name", "source", "ingested_ns")
MESSAGE_COLUMNS = ("hash", "kind", "role", "body")
COLUMNS = {"span_rows": SPAN_COLUMNS, "step_rows": STEP_COLUMNS, "message_rows": MESSAGE_COLUMNS}
"""Each table's columns in the order its rows' values come (the DDL's order; a test holds them to it)."""

Row = tuple[Any, ...]


@dataclass(slots=True)
class RowBatch:
    """Rows for one flush, grouped by table and day; each row a tuple in its table's `COLUMNS` order."""

    span_rows: dict[str, list[Row]] = field(default_factory=dict)
    step_rows: dict[str, list[Row]] = field(default_factory=dict)
    message_rows: list[Row] = field(default_factory=list)

    def __len__(self) -> int:
        return sum(map(len, self.span_rows.values()))

    def clear(self) -> None:
        self.span_rows.clear()
        self.step_rows.clear()
        self.message_rows.clear()

    # Read-only views with the column names, for tests and tools (the writer takes the tuples).
    @property
    def spans(self) -> dict[str, list[dict[str, Any]]]:
        return {day: [dict(zip(SPAN_COLUMNS, r, strict=True)) for r in rows] for day, rows in self.span_rows.items()}

    @property
    def steps(self) -> dict[str, list[dict[str, Any]]]:
        return {day: [dict(zip(STEP_COLUMNS, r, strict=True)) for r in rows] for day, rows in self.step_rows.items()}

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [dict(zip(MESSAGE_COLUMNS, r, strict=True)) for r in self.message_rows]


class RowBuilder:
    """Turns normalized spans into rows, storing each distinct payload once per builder."""

    def __init__(self, source: str, max_known_hashes: int = 500_000, max_identity_bytes: int = 16 * 1024 * 1024) -> None:
        self.source = source
        self._known: set[str] = set()
        self._max_known = max_known_hashes
        self._resource_cache: tuple[Any, str] | None = None
        self._by_identity: dict[int, tuple[Any, str]] = {}
        # the identity cache keeps payloads alive: bounded by their bytes, so memory stays bounded
        self._max_identity_bytes = max_identity_bytes
        self._identity_bytes = 0

    def _resource_json(self, resource: Any) -> str:
        """Spans of one process share one resource: serialize it once."""
        cached = self._resource_cache
        if cached is not None and cached[0] is resource:
            return cached[1]
        text = _json(resource)
        self._resource_cache = (resource, text)
        return text

    def _address(self, batch: RowBatch, kind: str, role: str | None, value: Any) -> str:
        """The content address of a payload, storing its body the first time it is seen.

        Repeated messages arrive as the very same object (normalize memoizes them, `is_shared`), so
        an identity cache skips re-serializing a history's old messages on every turn; it keeps only
        those, as no other object comes back.
        """
        seen = self._by_identity.get(id(value))
        if seen is not None and seen[0] is value:
            return seen[1]
        try:  # `canonical_bytes` and `content_hash` (xxh3-128), inline: this runs for every payload
            data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except (TypeError, orjson.JSONEncodeError):
            data = canonical_bytes(value)
        digest = xxh3_128_hexdigest(data)
        if digest not in self._known:
            if len(self._known) >= self._max_known:
                self._known.clear()
            self._known.add(digest)
            batch.message_rows.append((digest, kind, role, data.decode("utf-8")))
        if not is_shared(value):
            return digest
        if len(self._by_identity) >= self._max_known or self._identity_bytes + len(data) > self._max_identity_bytes:
            self._by_identity.clear()
            self._identity_bytes = 0
        self._by_identity[id(value)] = (value, digest)
        self._identity_bytes += len(data)
        return digest

    def add(self, batch: RowBatch, item: NormalizedSpan, ingested_ns: int | None = None) -> None:
        """Add the span's row, and its step's row and the payloads not stored before."""
        now = ingested_ns or time.time_ns()
        span = item.span
        day = day_of(span.start_ns)
        source = self.source
        rows = batch.span_rows.get(day)
        if rows is None:
            rows = batch.span_rows[day] = []
        rows.append((  # SPAN_COLUMNS
            span.trace_id, span.span_id, span.parent_span_id, span.name, span.kind, span.start_ns, span.end_ns,
            span.status_code, span.status_message, span.service_name, span.scope_name, span.scope_version,
            _json(item.attributes),
            _json([{"name": e.name, "time_ns": e.time_ns, "attributes": e.attributes}
                   for e in span.events]) if span.events else "[]",
            "[]" if span.links == [] else _json(span.links),
            self._resource_json(span.resource), source, now,
        ))
        step = item.step
        if step is None:
            return
        content = step.content
        address = self._address
        system = address(batch, "system", None, content.system) if content.system else None
        tools = address(batch, "tools", None, content.tools) if content.tools else None
        # tuples: the collector untracks them at its first pass, so a batch waiting for its flush
        # adds one tracked object per step (the row), not four, to what full collections walk
        inputs = tuple([address(batch, "message", m.get("role"), m) for m in content.inputs])
        outputs = tuple([address(batch, "message", m.get("role"), m) for m in content.outputs])
        rows = batch.step_rows.get(day)
        if rows is None:
            rows = batch.step_rows[day] = []
        rows.append((  # STEP_COLUMNS
            step.trace_id, step.span_id, step.parent_span_id, step.kind, step.operation, step.name, step.start_ns,
            step.end_ns, step.status, step.error_type, step.error_message, step.provider, step.request_model,
            step.response_model, step.input_tokens, step.output_tokens, step.agent_name, step.conversation_id,
            step.tool_name, step.tool_call_id, system, tools, inputs, outputs,
            _json(step.request_params) if step.request_params else None,
            tuple(step.finish_reasons), step.has_payload, tuple(step.redacted), step.convention,
            step.service_name, source, now,
        ))

    def add_all(self, batch: RowBatch, items: Iterable[NormalizedSpan]) -> None:
        now = time.time_ns()
        for item in items:
            self.add(batch, item, now)
