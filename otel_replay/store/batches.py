"""A batch of segments (messages, spans, steps) that readers see whole or not at all.

A writer that writes more than one segment for one batch first writes a manifest
`_batches/<id>.json` naming every segment it is about to write, then the segments (each atomic on
its own). A reader lists the segments, then the manifests, and leaves out every segment of a
manifest whose segments it did not all list: a batch being written, or one torn by a crash
(kill -9 between two segments), is invisible, so spans are never seen without their steps and an
import rerun stores the torn batch again instead of calling it "already stored".

The manifest of a finished batch stays `LINGER_S`: a reader whose listing began before the last
segment appeared still finds it and hides the batch it listed in part. The writing process removes
its own finished manifests once that old; `settle` removes the ones left by processes that exited,
and rolls torn batches back (their segments deleted, then the manifest) once `torn_after_s` old.
Compaction takes only whole batches, and removes a batch's manifest before it deletes any of its
segments (their rows are in the compacted segment by then).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO

from otel_replay.errors import OtelReplayError
from otel_replay.store.location import StoreLike, StoreLocation

BATCH_DIR = "_batches"
TORN_AFTER_S = 3600.0  # a batch whose segments are not all there after this long was torn by a crash
LINGER_S = 2.0  # a reader lists a store in milliseconds (object storage: well under a second); one slower lists again


class ManifestError(OtelReplayError, ValueError):
    """A manifest (of a batch or of a compaction) cannot be read (it names the file)."""


class BatchManifestError(ManifestError):
    """A batch manifest cannot be read (it names the file)."""


@dataclass(frozen=True, slots=True)
class BatchManifest:
    """One batch: the segments (paths relative to the store root) its writer set out to write."""

    name: str
    segments: tuple[str, ...]
    created_ns: int
    host: str
    pid: int

    @property
    def rel(self) -> str:
        return f"{BATCH_DIR}/{self.name}"

    def to_json(self) -> bytes:
        return json.dumps({"version": 1, "segments": list(self.segments), "created_ns": self.created_ns,
                           "host": self.host, "pid": self.pid}, indent=1).encode()

    def complete(self, listed: set[str]) -> bool:
        return all(rel in listed for rel in self.segments)

    def age_s(self) -> float:
        return (time.time_ns() - self.created_ns) / 1e9


Produce = Callable[[IO[bytes]], None]

_own: list[tuple[float, StoreLocation, str]] = []  # (finished at, store, manifest rel) of this process
_own_lock = threading.Lock()
_settled: set[str] = set()


def write_batch_segments(root: StoreLike, items: list[tuple[str, Produce]], name: str) -> list:
    """Write `items` (relative path, producer) as one batch; returns the local paths or URLs in order.

    `name` is a fresh segment-style name for the manifest (the store's naming, for uniqueness)."""
    location = StoreLocation.of(root)
    if len(items) <= 1:
        return [location.write(rel, produce) for rel, produce in items]
    if location.url not in _settled:  # once per process and store: what exited writers left
        _settled.add(location.url)
        with contextlib.suppress(OSError, ManifestError):  # a reader says so; this write goes on
            settle(location, torn_after_s=TORN_AFTER_S)
    manifest = BatchManifest(name, tuple(rel for rel, _ in items), time.time_ns(), _here(), os.getpid())
    location.write(manifest.rel, lambda handle: handle.write(manifest.to_json()))
    written = [location.write(rel, produce) for rel, produce in items]
    with _own_lock:
        _own.append((time.monotonic(), location, manifest.rel))
    retire_own(location)
    return written


def retire_own(location: StoreLocation, older_than_s: float = LINGER_S) -> int:
    """Remove this process's finished manifests in `location` older than `older_than_s`; returns how
    many. Only that store's: a write never waits on another store (an object store that is down
    would hold a local write for the client's whole retry schedule). Another store's manifests go
    with its next write, or are settled once this process has exited."""
    cutoff = time.monotonic() - older_than_s
    url = location.url
    due: list[tuple[float, StoreLocation, str]] = []
    kept: list[tuple[float, StoreLocation, str]] = []
    with _own_lock:
        for entry in _own:
            (due if entry[0] <= cutoff and entry[1].url == url else kept).append(entry)
        _own[:] = kept
    for _, store, rel in due:
        try:
            store.delete(rel)
        except OSError:  # settled by a later writer or `doctor`
            continue
    return len(due)


def read_batch_manifests(root: StoreLike) -> list[BatchManifest]:
    """Every batch manifest in the store (one removed meanwhile is skipped)."""
    location = StoreLocation.of(root)
    out = []
    for name in location.list_names(BATCH_DIR):
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            raw = location.read_bytes(f"{BATCH_DIR}/{name}")
        except FileNotFoundError:
            continue
        try:
            doc = json.loads(raw)
            out.append(BatchManifest(name, tuple(str(s) for s in doc["segments"]), int(doc["created_ns"]),
                                     str(doc.get("host") or ""), int(doc.get("pid") or 0)))
        except (ValueError, KeyError, TypeError) as exc:
            raise BatchManifestError(f"{location.uri(f'{BATCH_DIR}/{name}')}: not a batch manifest ({exc}); "
                                     "it was not written by otel-replay: move it out of the store") from exc
    return out


def hidden_segments(manifests: Iterable[BatchManifest], listed: set[str]) -> set[str]:
    """The listed segments a reader must leave out: those of batches it did not list whole."""
    return {rel for m in manifests if not m.complete(listed) for rel in m.segments if rel in listed}


@dataclass(slots=True)
class Settled:
    """What `settle` found and did."""

    torn: list[tuple[BatchManifest, list[str]]]  # torn batches and their segments that were written
    finished: int = 0  # manifests of finished batches removed
    rolled_back: int = 0  # torn batches whose segments (then manifest) were deleted


def _here() -> str:
    """This host and pid namespace: two containers may share a hostname, never a pid namespace."""
    try:
        return f"{socket.gethostname()}/pidns:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return f"{socket.gethostname()}/pidns:?"


def _dead_here(manifest: BatchManifest) -> bool:
    """Whether the writer of `manifest` was a process of this host and pid namespace that is gone."""
    if manifest.host != _here() or manifest.host.endswith("?") or manifest.pid <= 0 or manifest.pid == os.getpid():
        return False
    try:
        os.kill(manifest.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def settle(root: StoreLike, *, torn_after_s: float, fix: bool = True, listed: set[str] | None = None) -> Settled:
    """Find torn batches (older than `torn_after_s`, or whose writer on this host is gone); with
    `fix`, roll them back and remove finished manifests older than `LINGER_S`."""
    location = StoreLocation.of(root)
    manifests = read_batch_manifests(location)
    if not manifests:
        return Settled(torn=[])
    if listed is None:
        tables = {rel.split("/", 1)[0] for m in manifests for rel in m.segments}
        listed = {s.rel for t in tables for s in location.segments(t)}
    result = Settled(torn=[])
    for m in manifests:
        if m.complete(listed):
            if fix and m.age_s() >= LINGER_S:
                location.delete(m.rel)
                result.finished += 1
            continue
        if m.age_s() < torn_after_s and not _dead_here(m):
            continue  # being written now
        written = [rel for rel in m.segments if rel in listed]
        result.torn.append((m, written))
        if fix:
            location.delete_many(written)
            location.delete(m.rel)
            result.rolled_back += 1
    return result
