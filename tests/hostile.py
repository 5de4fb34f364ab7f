"""Shared by the hostile-input tests: seeds cut from the fixtures, strategies that mutate them,
and inputs too deep to build with the protobuf API. Real data only; nothing here fakes a component."""

from __future__ import annotations

import copy
import functools
import json

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.harness import fuzz_seeds

PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
TIME_BOUND_S = 5.0  # per input; every input here is a few KB
T, S = "ab" * 16, "cd" * 8


@functools.cache
def seeds(target: str) -> list[bytes]:
    """The target's seeds that are one JSON document (protobuf seeds: all of them)."""
    corpus = fuzz_seeds.corpus(target)
    if target.endswith("proto"):
        return corpus
    return [s for s in corpus if s.lstrip()[:1] in (b"{", b"[") and b"\n" not in s.strip()]


# -- strategies -------------------------------------------------------------------------------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
HOSTILE_VALUES = st.sampled_from(fuzz_seeds.HOSTILE).map(copy.deepcopy) | JSON_VALUES  # a copy: mutated in place


def encode(doc: object) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")


@st.composite
def mutated(draw, target: str) -> bytes:
    """A real export of the target's format with a few nodes replaced, deleted, duplicated or nested."""
    doc = json.loads(draw(st.sampled_from(seeds(target))))
    for _ in range(draw(st.integers(1, 3))):
        found: list = []
        fuzz_seeds.nodes(doc, found)
        if not found:
            return encode(draw(HOSTILE_VALUES))
        container, key = found[draw(st.integers(0, len(found) - 1))]
        action = draw(st.sampled_from(("replace", "replace", "delete", "duplicate", "nest")))
        if action == "replace":
            container[key] = draw(HOSTILE_VALUES)
        elif action == "delete":
            del container[key]
        elif action == "duplicate" and isinstance(container, list):
            container.insert(key, json.loads(json.dumps(container[key])))  # same ids twice
        elif action == "nest":
            for _ in range(draw(st.sampled_from((3, 70, 300)))):
                container[key] = [container[key]]
    return encode(doc)


# -- inputs -------------------------------------------------------------------------------------------
def nested_proto(depth: int) -> bytes:
    """An ExportTraceServiceRequest whose one attribute is an array nested `depth` deep (built
    without recursion: protobuf's Python API cannot build it)."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    inner = b"\x0a\x01x"  # AnyValue{string_value: "x"}
    prefixes, size = [], len(inner)
    for _ in range(depth):  # AnyValue{array_value: ArrayValue{values: [inner]}}
        array = b"\x0a" + varint(size)
        size += len(array)
        wrap = b"\x2a" + varint(size)
        size += len(wrap)
        prefixes.append(wrap + array)
    value = b"".join(reversed(prefixes)) + inner
    kv = b"\x0a\x01k" + b"\x12" + varint(len(value)) + value
    span = b"\x0a\x10" + bytes.fromhex(T) + b"\x12\x08" + bytes.fromhex(S) + b"\x4a" + varint(len(kv)) + kv
    scope = b"\x12" + varint(len(span)) + span
    resource = b"\x12" + varint(len(scope)) + scope
    return b"\x0a" + varint(len(resource)) + resource


def otlp_span(**fields) -> dict:
    return {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": T, "spanId": S, "name": "s", **fields}]}]}]}
