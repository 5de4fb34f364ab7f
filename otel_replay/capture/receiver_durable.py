"""`collect --durable`: a request is acknowledged only once its body is in a fsynced write-ahead log.

A request's path: decode it (a bad body is refused as before, and nothing is logged), append the
body to the log and wait for a group-commit fsync (`wal.WriteAheadLog`), queue the records on the
processor as without `--durable`, answer 200. An append that fails (disk full, read-only store)
is a 503 with Retry-After (`StoreUnwritable`), and nothing of the request is queued.

A maintenance thread seals the current segment every `SEAL_AFTER_S` (or at `wal.SEGMENT_BYTES`)
and removes a sealed segment once (1) every request in it has queued its records, (2) a
`force_flush` asked after that returned True with no span lost by the writer since the segment
opened, and (3) for a segment with log records, a second such flush was asked `LOG_WAIT_S` after
the first (a log event waits in memory up to that long for its span: until it is joined, its
content is in no Parquet segment). A segment whose spans the writer lost (the store refused a
batch) is replayed once the store is writable again.

Replay (of a dead owner's directory, or of a segment the writer lost) sends each logged body
through the same path again, into this owner's log, and is idempotent: spans already in the store
(and log events of those spans) are skipped, and the writer is told which of the traces hold
stored GenAI spans, so their root spans are kept as the live path keeps them. The views keep one
row per span, step and message, so a span stored twice by a race is still read once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import xxhash

from otel_replay.capture.processor import ReplayProcessor
from otel_replay.capture.receiver_decode import TRACES, RequestError, StoreUnwritable, decode_body
from otel_replay.capture.wal import (
    OrphanDir,
    Segment,
    SegmentReader,
    WalRecord,
    WriteAheadLog,
    claim_orphans,
    new_owner_dir,
)
from otel_replay.capture.writer import LOG_WAIT_S, store_failure_reason
from otel_replay.errors import OtelReplayError
from otel_replay.normalize.records import TracePart
from otel_replay.store.location import StoreLocation

SEAL_AFTER_S = 2.0  # the writer's flush interval: a segment waits about one flush to be removed
TICK_S = 0.2
FLUSH_TIMEOUT_MS = 60_000
RETRY_REPLAY_S = 5.0  # a segment the writer lost is replayed at most this often while the store fails
REPLAY_TIMEOUT_S = 120.0  # how long a replayed request may wait for room in the queue
SNAPSHOT_REUSE_S = 5.0  # how long replays reuse one snapshot of the store to skip the spans it holds
STORED_SPANS_SQL = "SELECT trace_id, span_id FROM span_rows WHERE trace_id IN (SELECT unnest(?::VARCHAR[]))"
logger = logging.getLogger("otel_replay")


class DurableError(OtelReplayError):
    """`--durable` cannot run here (the store is not a local directory)."""


class ReplayStuck(OtelReplayError):
    """A replayed request could not be stored in time (its log is kept for the next start)."""


@dataclass(slots=True)
class _Held:
    """A sealed segment of this owner, waiting to be removed."""

    segment: Segment
    lost_before: int  # the writer's lost-span counter when the segment opened
    ready_at: float  # monotonic: no flush asked before this counts for it
    flushed_once: bool = False  # (log segments) the first lossless flush passed


@dataclass(slots=True)
class DurableStats:
    """What the log did; `OtlpReceiver.stats` adds these up over workers."""

    replayed_requests: int = 0  # logged bodies of dead owners (or lost by the writer) sent again
    replayed_records: int = 0  # their records queued (stored ones skipped)
    skipped_stored: int = 0  # records of replayed bodies already in the store
    torn_bytes: int = 0  # bytes past the last whole record of replayed segments (an append cut short)
    removed_segments: int = 0
    lost_segments: list[str] = field(default_factory=list)  # segments the writer lost, to replay


class DurableIngest:
    """One owner's write-ahead log in front of one `ReplayProcessor`.

    :param store: a local store (the log lives in `<store>/_wal/`).
    :param processor: the processor whose queue the records go to.
    :param part: this worker's share of the traces (index, count); None: every trace (one process).
    :param seal_after_s: how old the current segment may grow before it is sealed.
    :param segment_bytes: how large.
    """

    def __init__(self, store: StoreLocation, processor: ReplayProcessor, *, part: TracePart | None = None,
                 seal_after_s: float = SEAL_AFTER_S, segment_bytes: int | None = None) -> None:
        if store.local is None:
            raise DurableError(f"--durable needs a local store directory (its write-ahead log is a local file); "
                               f"{store.url} is not one")
        self.store, self.root, self.processor, self.part = store, store.local, processor, part
        self.seal_after_s = seal_after_s
        self.stats = DurableStats()
        prefix = f"w{part[0]}of{part[1]}" if part is not None else "p"
        self._prefix = prefix
        options = {"segment_bytes": segment_bytes} if segment_bytes else {}
        self.wal = WriteAheadLog(new_owner_dir(self.root, prefix), on_segment=self._lost, **options)
        self._held: list[_Held] = []
        self._lost_segments: list[Segment] = []
        self._last_retry = 0.0
        self._last_adopt = time.monotonic()  # at start the receiver's process replays every dead owner's log
        self._catalog: Any = None  # a DuckDB connection over one snapshot of the store, while replaying
        self._catalog_at = 0.0
        self._catalog_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-replay-wal-maintenance", daemon=True)
        self._thread.start()

    # -- the request path ----------------------------------------------------------------------
    @contextlib.contextmanager
    def log_body(self, signal: str, body: bytes | memoryview, as_json: bool) -> Iterator[Callable[[], None]]:
        """Hand the body to the log at once (it is written and fsynced while the block decodes it);
        the block calls the `wait` it gets before it queues records: StoreUnwritable (503) if the
        body may not be on disk. On leaving, the body has been written or given up."""
        ticket = self.wal.submit(signal, as_json, body)

        def wait() -> None:
            try:
                ticket.wait()
            except OSError as exc:
                raise StoreUnwritable(f"write-ahead log: {store_failure_reason(exc)}") from None

        try:
            yield wait
        finally:
            ticket.done.wait()  # the caller's buffer is in use until then
            if ticket.error is None and ticket.segment is not None:
                self.wal.release(ticket.segment)

    @contextlib.contextmanager
    def logged(self, signal: str, body: bytes | memoryview, as_json: bool) -> Iterator[None]:
        """Log the body (fsynced) before the block queues its records; StoreUnwritable (503) if it
        cannot be."""
        with self.log_body(signal, body, as_json) as wait:
            wait()
            yield

    def unstored(self, signal: str, records: list[Any]) -> list[Any]:
        """`records` less the spans (and the log events of spans) the store holds already; tells the
        writer which traces hold stored GenAI spans (so their roots are kept)."""
        traces = sorted({r.trace_id for r in records if r.trace_id})
        if not traces:
            return records
        stored = self._stored_spans(traces)
        if not stored:
            return records
        self.processor.remember_genai_traces({trace for trace, _ in stored})
        kept = [r for r in records if (r.trace_id, r.span_id) not in stored]
        self.stats.skipped_stored += len(records) - len(kept)
        return kept

    def _stored_spans(self, traces: list[str]) -> set[tuple[str, str]]:
        """The (trace, span) ids of `traces` in the store, through one snapshot reused for
        `SNAPSHOT_REUSE_S` (opening one costs ~60 ms; a span stored since is only stored again)."""
        with self._catalog_lock:
            for attempt in range(2):
                try:
                    if self._catalog is None or time.monotonic() - self._catalog_at > SNAPSHOT_REUSE_S:
                        self._close_catalog()
                        from otel_replay.store.catalog import Catalog

                        self._catalog, self._catalog_at = Catalog(self.store).connect(), time.monotonic()
                    return {(trace, span) for trace, span in self._catalog.execute(STORED_SPANS_SQL, [traces]).fetchall()}
                except Exception as exc:  # noqa: BLE001 - then store them again: the views read each span once
                    self._close_catalog()
                    if attempt:
                        logger.warning("otel-replay collect: cannot read the store to skip the spans it holds "
                                       "(%r); replaying them all", exc)
        return set()

    def _close_catalog(self) -> None:
        if self._catalog is not None:
            with contextlib.suppress(Exception):
                self._catalog.close()
            self._catalog = None

    def replay(self, record: WalRecord, deadline_s: float = REPLAY_TIMEOUT_S) -> None:
        """Store one logged body again (its unstored records, through this log); ReplayStuck if the
        queue had no room for it within `deadline_s`."""
        try:
            records, _ = decode_body(record.signal, record.body, record.as_json, self.part)
        except RequestError:  # it decoded when it arrived; a body that no longer does is skipped
            return
        records = self.unstored(record.signal, records)
        self.stats.replayed_requests += 1
        if not records:
            return
        spans, logs = (records, ()) if record.signal == TRACES else ((), records)
        deadline = time.monotonic() + deadline_s
        with self.logged(record.signal, record.body, record.as_json):
            while self.processor.accept_records(spans, logs):
                if time.monotonic() > deadline:
                    raise ReplayStuck(f"the queue had no room for {len(records)} replayed records in {deadline_s:g} s")
                time.sleep(0.05)
        self.stats.replayed_records += len(records)

    def counters(self) -> dict[str, int]:
        """`durable_counters`, with the log's appends and fsyncs (fewer: group commit)."""
        return {**durable_counters(self.stats), "wal_records": self.wal.records, "wal_syncs": self.wal.syncs}

    # -- maintenance -----------------------------------------------------------------------------
    def _lost(self) -> int:
        lost = self.processor.stats.get("lost_store_unwritable")
        return lost if isinstance(lost, int) else 0

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 - the log keeps its segments; the next tick tries again
                logger.warning("otel-replay collect: write-ahead log maintenance failed (%r); retrying", exc)

    def _tick(self) -> None:
        """Seal an old segment, remove those the store now holds, replay those the writer lost."""
        self.wal.seal(self.seal_after_s)
        self._take_sealed()
        self._retire()
        if self._lost_segments and time.monotonic() - self._last_retry >= RETRY_REPLAY_S \
                and not self.processor.stats.get("store_error"):
            self._last_retry = time.monotonic()
            self._replay_lost()
        if self.part is not None and time.monotonic() - self._last_adopt >= RETRY_REPLAY_S:
            self._last_adopt = time.monotonic()
            self._adopt_siblings()

    def _take_sealed(self) -> None:
        for segment in self.wal.take_sealed():
            self._held.append(_Held(segment, segment.note, segment.sealed_at or time.monotonic()))

    def _retire(self, final: bool = False, timeout_ms: int = FLUSH_TIMEOUT_MS) -> None:
        """Remove the held segments a lossless flush asked after they were ready covers."""
        now = time.monotonic()
        ready = [h for h in self._held if h.segment.pending == 0 and (final or h.ready_at <= now)]
        if not ready:
            return
        flushed = self.processor.force_flush(timeout_ms)
        lost = self._lost()
        for held in ready:
            if lost != held.lost_before:  # the writer dropped a batch since: some of these spans may be in it
                self._held.remove(held)
                self._lost_segments.append(held.segment)
                self.stats.lost_segments.append(held.segment.path.name)
            elif flushed and held.segment.has_logs and not held.flushed_once and not final:
                held.flushed_once, held.ready_at = True, time.monotonic() + LOG_WAIT_S
            elif flushed:
                self._held.remove(held)
                self.stats.removed_segments += 1  # counted first: a reader who sees the file gone sees the count
                _unlink(held.segment.path)

    def _replay_lost(self) -> None:
        """Send the records of segments the writer lost through the log again, then remove them."""
        while self._lost_segments:
            segment = self._lost_segments[0]
            reader = SegmentReader(segment.path)
            try:
                for record in reader:
                    self.replay(record)
            except (ReplayStuck, StoreUnwritable) as exc:
                logger.warning("otel-replay collect: replaying %s failed (%s); trying again later", segment.path, exc)
                return
            self.stats.torn_bytes += reader.torn
            self._lost_segments.pop(0)
            _unlink(segment.path)

    def _adopt_siblings(self) -> None:
        """A worker replays the logs of a dead worker of its own share (one it replaced)."""
        for orphan in claim_orphans(self.root, f"{self._prefix}-"):
            replay_dirs([orphan], self.replay, self.stats)

    # -- stopping ------------------------------------------------------------------------------
    def close(self, timeout_s: float) -> bool:
        """Stop the maintenance, seal the log, write what was queued and remove what is stored;
        True if nothing is left (else the directory stays for the next start to replay)."""
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():  # stuck in a flush: keep every segment for the next start to replay
            self.wal.close()
            self.wal.release_lock()
            return False
        if self._lost_segments and not self.processor.stats.get("store_error"):
            self._replay_lost()  # through the log, so the final flush below covers them
        self.wal.close()
        self._take_sealed()
        self._retire(final=True, timeout_ms=int(max(timeout_s, 0) * 1000))
        with self._catalog_lock:
            self._close_catalog()
        if self._held or self._lost_segments:
            self.wal.release_lock()
            return False
        self.wal.remove()
        return True


def replay_dirs(orphans: list[OrphanDir], send: Callable[[WalRecord], None], stats: DurableStats) -> None:
    """Send every logged body of the orphans' segments once (the same body in several workers'
    logs is sent once: each worker logged the whole request); remove each orphan once all of its
    bodies were sent, else release it for the next start."""
    sent: set[bytes] = set()
    for orphan in orphans:
        try:
            for path in orphan.segments():
                reader = SegmentReader(path)
                for record in reader:
                    key = xxhash.xxh3_128_digest(record.body) + record.signal.encode() + bytes([record.as_json])
                    if key not in sent:
                        send(record)
                        sent.add(key)
                stats.torn_bytes += reader.torn
        except (ReplayStuck, StoreUnwritable, OSError) as exc:
            logger.warning("otel-replay collect: the write-ahead log in %s could not be replayed now (%s); it is "
                           "kept for the next start", orphan.path, exc)
            orphan.release()
            continue
        orphan.remove()


def replay_orphans(root: Path, send: Callable[[WalRecord], None], stats: DurableStats) -> None:
    """Replay what dead receivers (and workers) left under `<root>/_wal/` through `send`."""
    replay_dirs(claim_orphans(root), send, stats)


def retrying(send: Callable[[WalRecord], Any], deadline_s: float = REPLAY_TIMEOUT_S) -> Callable[[WalRecord], None]:
    """`send` again while a queue is full, up to `deadline_s` per body; ReplayStuck on any other
    "retry later" (an unwritable store: replaying now is pointless)."""
    def call(record: WalRecord) -> None:
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                send(record)
                return
            except RequestError as exc:
                if not exc.retry:
                    return  # refused for good (it decoded when it arrived: nothing of it can be stored)
                if exc.code != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                    raise ReplayStuck(exc.message) from None
                time.sleep(0.1)
    return call


def durable_counters(stats: DurableStats) -> dict[str, int]:
    """`stats` as `wal_*` counters (numbers, so `receiver_workers.add_stats` adds them up)."""
    return {"wal_replayed_requests": stats.replayed_requests, "wal_replayed_records": stats.replayed_records,
            "wal_skipped_stored": stats.skipped_stored, "wal_torn_bytes": stats.torn_bytes,
            "wal_removed_segments": stats.removed_segments, "wal_lost_segments": len(stats.lost_segments)}


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
