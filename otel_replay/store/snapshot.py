"""Which segments a reader reads: those listed now, minus the inputs of committed compactions.

Compaction runs beside writers and readers (one compactor at a time per store):

1. list the live segments of a (table, day): only these are rewritten;
2. write a manifest `_compactions/<id>.json` = {table, day, output, inputs} (atomically);
3. write the compacted segment `output` (atomically: rename locally, one PUT on object storage);
4. after a grace period, delete the inputs, then the manifest.

A manifest is *committed* once its output is listed, or once its output is the input of another
manifest (a later compaction listed it, so it was written). A reader lists the segments first and
the manifests second, then drops the inputs of committed manifests:

- it lists an output ⇒ the manifest existed before that listing ended, and a manifest is removed
  only after its inputs are: either the reader sees the manifest and drops the inputs, or the
  inputs were deleted before it listed the manifests, and reading them fails (the reader then
  takes a fresh snapshot, see `vanished`). A row is never counted twice.
- it does not list the output ⇒ it reads the inputs, which exist until after the output does. A
  row is never lost.

Writers need no part in this: a segment written after step 1 is not an input and stays live.
A batch manifest naming an input is removed before the input (`otel_replay.store.batches`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from otel_replay.store.batches import LINGER_S, ManifestError, hidden_segments, read_batch_manifests
from otel_replay.store.layout import segment_name
from otel_replay.store.location import Segment, StoreLike, StoreLocation

MANIFEST_DIR = "_compactions"
ATTEMPTS = 3  # listings tried when one is slower than half a batch manifest's linger
# Dependents first: a reader that lists a step also lists the payloads and span written before it,
# and one that lists a finished job also lists its results.
READ_ORDER = ("step_rows", "span_rows", "message_rows", "job_rows", "report_rows", "result_rows", "rollout_rows",
              "capture_stats")


@dataclass(frozen=True, slots=True)
class Manifest:
    """One compaction: `output` replaces `inputs` (paths relative to the store root)."""

    name: str
    table: str
    day: str
    output: str
    inputs: tuple[str, ...]
    created_ns: int

    @property
    def rel(self) -> str:
        return f"{MANIFEST_DIR}/{self.name}"

    def to_json(self) -> bytes:
        return json.dumps({"version": 1, "table": self.table, "day": self.day, "output": self.output,
                           "inputs": list(self.inputs), "created_ns": self.created_ns}, indent=1).encode()


def write_manifest(root: StoreLike, table: str, day: str, output: str, inputs: Iterable[str]) -> Manifest:
    location = StoreLocation.of(root)
    name = segment_name().removesuffix(".parquet") + ".json"
    manifest = Manifest(name, table, day, output, tuple(inputs), time.time_ns())
    location.write(manifest.rel, lambda handle: handle.write(manifest.to_json()))
    return manifest


def read_manifests(root: StoreLike) -> list[Manifest]:
    """Every pending compaction manifest, oldest first (one removed meanwhile is skipped)."""
    location = StoreLocation.of(root)
    out = []
    for name in location.list_names(MANIFEST_DIR):
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            raw = location.read_bytes(f"{MANIFEST_DIR}/{name}")
        except FileNotFoundError:
            continue
        try:
            doc = json.loads(raw)
            out.append(Manifest(name, doc["table"], doc["day"], doc["output"], tuple(doc["inputs"]),
                                int(doc["created_ns"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ManifestError(f"{location.uri(f'{MANIFEST_DIR}/{name}')}: not a compaction manifest ({exc}); "
                                "it was not written by otel-replay: move it out of the store") from exc
    return out


def committed(manifests: Iterable[Manifest], listed: set[str]) -> list[Manifest]:
    """The manifests whose output was written: listed now, or consumed by a later compaction."""
    manifests = list(manifests)
    consumed = {rel for m in manifests for rel in m.inputs}
    return [m for m in manifests if m.output in listed or m.output in consumed]


@dataclass(slots=True)
class Snapshot:
    """The live segments of each table at one moment, and the superseded ones left out."""

    location: StoreLocation
    live: dict[str, list[Segment]] = field(default_factory=dict)
    superseded: dict[str, list[Segment]] = field(default_factory=dict)
    manifests: list[Manifest] = field(default_factory=list)

    def segments(self) -> list[Segment]:
        """Every live segment, all tables."""
        return [s for segments in self.live.values() for s in segments]

    def uris(self, table: str) -> list[str]:
        return [self.location.uri(s.rel) for s in self.live.get(table, [])]

    def vanished(self) -> bool:
        """Whether a live segment of this snapshot is gone now (a compaction finished meanwhile)."""
        for table, segments in self.live.items():
            if not segments:
                continue
            now = {s.rel for s in self.location.segments(table)}
            if any(s.rel not in now for s in segments):
                return True
        return False


def take(root: StoreLike, tables: Iterable[str]) -> Snapshot:
    """List the tables (dependents first), then the manifests; leave out superseded inputs and the
    segments of batches not listed whole (being written, or torn: `otel_replay.store.batches`)."""
    location = StoreLocation.of(root)
    wanted = set(tables)
    order = [t for t in READ_ORDER if t in wanted] + sorted(wanted - set(READ_ORDER))
    for _ in range(ATTEMPTS):
        began = time.monotonic()
        listed = {table: location.segments(table) for table in order}
        manifests = read_manifests(location)
        batches = read_batch_manifests(location)
        if time.monotonic() - began < LINGER_S / 2:  # else a batch's manifest may be gone: list again
            break
    names = {s.rel for segments in listed.values() for s in segments}
    dropped = {rel for m in committed(manifests, names) for rel in m.inputs}
    hidden = hidden_segments(batches, names)
    snap = Snapshot(location, manifests=manifests)
    for table, segments in listed.items():
        snap.live[table] = [s for s in segments if s.rel not in dropped and s.rel not in hidden]
        snap.superseded[table] = [s for s in segments if s.rel in dropped]
    return snap
