"""Normalized spans as stored rows: content addressing of payloads, JSON of attributes.

Each payload is serialized once in canonical form; its hash is of exactly those bytes, and the
same text is what `message_rows.body` stores.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from xxhash import xxh3_128_hexdigest

from otel_replay.normalize.messages import canonical_bytes, is_shared
from otel_replay.normalize.pipeline import NormalizedSpan
from otel_replay.store.layout import day_of


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
    if isinstance(value, list):
        return [valid_text(v) for v in value]
    if isinstance(value, dict):
        return {k: valid_text(v) for k, v in value.items()}
    return value


@dataclass(slots=True)
class RowBatch:
    """Rows for one flush, grouped by table and day."""

    spans: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    steps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return sum(map(len, self.spans.values()))

    def clear(self) -> None:
        self.spans.clear()
        self.steps.clear()
        self.messages.clear()


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
            batch.messages.append({"hash": digest, "kind": kind, "role": role, "body": data.decode("utf-8")})
        if not is_shared(value):
            return digest
        if len(self._by_identity) >= self._max_known or self._identity_bytes + len(data) > self._max_identity_bytes:
            self._by_identity.clear()
            self._identity_bytes = 0
        self._by_identity[id(value)] = (value, digest)
        self._identity_bytes += len(data)
        return digest

    def add(self, batch: RowBatch, item: NormalizedSpan, ingested_ns: int | None = None) -> None:
        now = ingested_ns or time.time_ns()
        span = item.span
        day = day_of(span.start_ns)
        batch.spans.setdefault(day, []).append(
            {
                "trace_id": span.trace_id,
                "span_id": span.span_id,
                "parent_span_id": span.parent_span_id,
                "name": span.name,
                "span_kind": span.kind,
                "start_ns": span.start_ns,
                "end_ns": span.end_ns,
                "status_code": span.status_code,
                "status_message": span.status_message,
                "service_name": span.service_name,
                "scope_name": span.scope_name,
                "scope_version": span.scope_version,
                "attributes": _json(item.attributes),
                "events": _json([{"name": e.name, "time_ns": e.time_ns, "attributes": e.attributes}
                                 for e in span.events]) if span.events else "[]",
                "links": "[]" if span.links == [] else _json(span.links),
                "resource": self._resource_json(span.resource),
                "source": self.source,
                "ingested_ns": now,
            }
        )
        step = item.step
        if step is None:
            return
        content = step.content
        batch.steps.setdefault(day, []).append(
            {
                "trace_id": step.trace_id,
                "span_id": step.span_id,
                "parent_span_id": step.parent_span_id,
                "kind": step.kind,
                "operation": step.operation,
                "name": step.name,
                "start_ns": step.start_ns,
                "end_ns": step.end_ns,
                "status": step.status,
                "error_type": step.error_type,
                "error_message": step.error_message,
                "provider": step.provider,
                "request_model": step.request_model,
                "response_model": step.response_model,
                "input_tokens": step.input_tokens,
                "output_tokens": step.output_tokens,
                "agent_name": step.agent_name,
                "conversation_id": step.conversation_id,
                "tool_name": step.tool_name,
                "tool_call_id": step.tool_call_id,
                "system_hash": self._address(batch, "system", None, content.system) if content.system else None,
                "tools_hash": self._address(batch, "tools", None, content.tools) if content.tools else None,
                # tuples: the collector untracks them at its first pass, so a batch waiting for its flush
                # adds one tracked object per step (the row), not four, to what full collections walk
                "input_hashes": tuple([self._address(batch, "message", m.get("role"), m) for m in content.inputs]),
                "output_hashes": tuple([self._address(batch, "message", m.get("role"), m) for m in content.outputs]),
                "request_params": _json(step.request_params) if step.request_params else None,
                "finish_reasons": tuple(step.finish_reasons),
                "has_payload": step.has_payload,
                "redacted": tuple(step.redacted),
                "convention": step.convention,
                "service_name": step.service_name,
                "source": self.source,
                "ingested_ns": now,
            }
        )

    def add_all(self, batch: RowBatch, items: Iterable[NormalizedSpan]) -> None:
        now = time.time_ns()
        for item in items:
            self.add(batch, item, now)
