"""Continuous blame: find new failing traces in the store and attribute them, once each.

Each poll (every `interval_s`):

1. **Score.** Traces that match `where` (default: every trace), ended at least `settle_s` ago and
   have no outcome under the verifier yet are scored as an attribution job scores them
   (`outcomes.evaluate`); the outcomes go to the store. Failure is what the verifier says.
2. **Pick.** The failures to handle are those with no report from any job, no group link and no
   finished watch job (named query `watch_pending`): the store decides, so a restarted watcher
   skips what is done and resumes what is not (unfinished jobs first).
3. **Group.** Failures with one signature (root name, failing step name, normalized final-output
   hash) are one group. Under the group's lock (`locks/job-group-<hash>.lock`) the watcher looks
   again, then links the group's failures to the representative attributed in the current
   interval (clock-aligned windows of `interval_s`) or, if there is none, attributes one (the
   oldest; a trace the job skips hands over to the next) and links the others to its result
   (`group_links`). A group another watcher holds is left to it.
4. **Attribute.** A watch job's id is derived from the watch configuration and the trace
   (`'w' || md5(fingerprint:trace)`), so every watcher of one configuration names the same job and
   the job's own lock keeps it to one process; a job killed mid-way is resumed under its id. Each
   job is granted calls from the store's sliding-hour ledger (`ledger.Ledger`) before it runs, at
   most `calls_per_job` over its whole life; a job whose hourly grant runs out pauses and resumes
   when calls are free again.

`stop()` (a signal handler may call it) ends the loop after the current job stops at its next
checkpoint (resumable). The watcher prints nothing: it reports through `on_event` (dicts with an
`event` key), and memory stays bounded (at most `batch` traces a poll, nothing kept across polls).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from otel_replay.attribution import outcomes
from otel_replay.attribution.job import AttributionError, Job, JobInterrupted, spent_calls
from otel_replay.attribution.ledger import Clock, Grant, Ledger
from otel_replay.attribution.lock import JobLock, JobLocked
from otel_replay.attribution.result import AttributionResult
from otel_replay.attribution.verifiers import Verifier
from otel_replay.errors import OtelReplayError
from otel_replay.store import StoreError, queries
from otel_replay.store.catalog import QueryError, check_predicate
from otel_replay.store.writer import write_rows
from otel_replay.trajectory import Store

LEDGER = "watch"  # the ledger every watcher of a store shares
Event = dict[str, Any]
JobMaker = Callable[[str, str, int | None], Job]
"""(trace id, job id, max policy calls over the job's life or None) -> the job, not yet run."""


def fingerprint(verifier: str, policies: str, options: Mapping[str, Any]) -> str:
    """What makes two watchers ask the same question: the verifier, the policies and the job options."""
    text = json.dumps({"verifier": verifier, "policies": policies, "options": dict(options)}, sort_keys=True,
                      default=str)
    return hashlib.md5(text.encode()).hexdigest()  # noqa: S324 - a name, not a secret


@dataclass(frozen=True, slots=True)
class WatchOptions:
    verifier: Verifier
    verifier_name: str  # as outcomes name it: the spec, or a callable's module:name
    fingerprint: str
    threshold: float = 0.5
    seed: int = 0
    where: str | None = None
    interval_s: float = 30.0
    settle_s: float = 10.0
    calls_per_hour: int | None = None
    calls_per_job: int | None = None
    batch: int = 100


@dataclass(slots=True)
class Totals:
    """What a poll (or a whole run) did."""

    scored: int = 0
    failed: int = 0
    attributed: int = 0
    linked: int = 0
    skipped: int = 0
    busy: int = 0  # groups another watcher held

    def add(self, other: Totals) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def worked(self) -> bool:
        return bool(self.scored or self.attributed or self.linked)


@dataclass
class Watcher:
    store: Store
    options: WatchOptions
    make_job: JobMaker
    run_job: Callable[[Job], list[AttributionResult]]
    after: Callable[[AttributionResult], Event | None] | None = None  # e.g. export the blame
    on_event: Callable[[Event], None] | None = None
    clock: Clock = time.time_ns
    totals: Totals = field(default_factory=Totals)

    def __post_init__(self) -> None:
        if self.options.where is not None:
            try:
                check_predicate(self.options.where)
            except StoreError as exc:
                raise AttributionError(f"--where: {exc}") from None
        self.ledger = Ledger(self.store, LEDGER, self.options.calls_per_hour, self.clock)
        self._stop_reason: str | None = None
        self._wake = threading.Event()
        self._current: Job | None = None

    # -- control --------------------------------------------------------------------------------
    def stop(self, reason: str = "stopped") -> None:
        """Stop soon (safe from a signal handler): the current job stops at its next checkpoint."""
        self._stop_reason = reason
        self._wake.set()
        job = self._current
        if job is not None:
            job.request_stop(f"stopped by the watcher ({reason})")

    @property
    def stopping(self) -> bool:
        return self._stop_reason is not None

    def run(self, once: bool = False) -> Totals:
        """Poll until stopped; `once`: until a poll finds nothing to do (the backlog is handled)."""
        while not self.stopping:
            started = time.monotonic()
            done = self.poll()
            self.totals.add(done)
            if once and not done.worked:
                break
            if not once:
                self._wake.wait(max(0.0, self.options.interval_s - (time.monotonic() - started)))
        if self.stopping:
            self._emit("stopped", reason=self._stop_reason)
        return self.totals

    def poll(self) -> Totals:
        """One round: score new traces, then handle the failures, group by group."""
        done = Totals()
        now = self.clock()
        self._score(now, done)
        groups: dict[str, list[tuple[str, str, str | None]]] = {}
        for trace_id, signature, job_id, status in self._pending(None):
            groups.setdefault(signature, []).append((trace_id, job_id, status))
        for signature in groups:
            if self.stopping:
                break
            self._group(signature, now, done)
        state = self.ledger.state()
        self._emit("status", scored=done.scored, failed=done.failed, attributed=done.attributed,
                   linked=done.linked, skipped=done.skipped, busy_groups=done.busy,
                   calls_last_hour=state.counted, calls_per_hour=state.cap, calls_left=state.left,
                   frees_at_ns=state.frees_at_ns if state.left == 0 else None)
        return done

    # -- 1. score ------------------------------------------------------------------------------
    def _score(self, now: int, done: Totals) -> None:
        o = self.options
        sql = queries.query("watch_unscored").replace("{where}", o.where or "TRUE")
        try:
            ids = self.store.sql(sql, [now - int(o.settle_s * 1e9), o.verifier_name, o.batch]).column("trace_id")
        except QueryError as exc:
            raise AttributionError(f"--where {o.where!r}: SQL error: {exc.detail.splitlines()[0]}") from exc
        rows = []
        # cast: `trace_id` is never NULL, so the column holds str only (pyarrow types it list[Any | None])
        for trace_id in cast("list[str]", ids.to_pylist()):
            if self.stopping:
                break
            row = outcomes.evaluate(self.store.trajectory(trace_id), o.verifier, o.verifier_name, o.threshold, o.seed)
            rows.append(row)
            if row["score"] is None:
                self._emit("unscored", trace_id=trace_id, reason=row["reason"])
        outcomes.write(self.store, rows)
        done.scored = len(rows)
        done.failed = sum(1 for r in rows if r["score"] is not None and r["score"] < o.threshold)
        if rows:
            self._emit("scored", traces=done.scored, failed=done.failed, verifier=o.verifier_name)

    def _pending(self, signature: str | None) -> list[tuple[str, str, str, str | None]]:
        o = self.options
        return self.store.named("watch_pending", [o.fingerprint, o.verifier_name, o.threshold, signature, signature,
                                                  o.batch])

    # -- 2-3. groups ---------------------------------------------------------------------------
    def _group(self, signature: str, now: int, done: Totals) -> None:
        lock = JobLock(self.store.root, "group-" + hashlib.md5(signature.encode()).hexdigest()[:16])  # noqa: S324
        try:
            lock.acquire()
        except JobLocked:
            done.busy += 1
            self._emit("busy", signature=signature, reason="another watcher is handling this group")
            return
        try:
            members = [(t, j) for t, _, j, _ in self._pending(signature)]  # again, under the lock
            interval_ns = max(1, int(self.options.interval_s * 1e9))
            found = self.store.named("group_representative", [signature, now - now % interval_ns])
            representative = (found[0][0], found[0][1]) if found else None
            while representative is None and members and not self.stopping:
                trace_id, job_id = members.pop(0)
                result = self._attribute(trace_id, job_id, done)
                if result is _BLOCKED:
                    done.skipped += len(members)
                    if members:
                        self._emit("skipped", trace_ids=[t for t, _ in members], reason="waiting: " + (
                            "the watcher is stopping" if self.stopping else "the group's representative is not done"))
                    return
                if isinstance(result, AttributionResult):
                    representative = (trace_id, job_id)
                    self._link([(trace_id, job_id)], representative, signature, "representative")
            if representative is not None and members and not self.stopping:
                self._link(members, representative, signature, "member")
                done.linked += len(members)
        finally:
            lock.release()

    def _link(self, members: list[tuple[str, str]], representative: tuple[str, str], signature: str,
              role: str) -> None:
        now = self.clock()
        write_rows(self.store.root, "group_links", [{
            "trace_id": trace_id, "representative": representative[0], "job_id": representative[1],
            "signature": signature, "role": role, "linked_ns": now} for trace_id, _ in members])
        if role == "member":
            for trace_id, _ in members:
                self._emit("linked", trace_id=trace_id, representative=representative[0], job_id=representative[1])

    # -- 4. attribute --------------------------------------------------------------------------
    def _attribute(self, trace_id: str, job_id: str, done: Totals) -> AttributionResult | object | None:
        """The trace's result; None when its job skipped it (listed in `jobs --skipped`); _BLOCKED
        when it must wait (no calls left this hour, another process runs its job, a stop)."""
        base = spent_calls(self.store, job_id)
        per_job = self.options.calls_per_job
        want = None if per_job is None else max(0, per_job - base)
        grant: Grant | None = None
        if want != 0:  # else the job ends on the calls it already has
            grant = self.ledger.grant(job_id, want)
            if grant is None:
                done.skipped += 1
                state = self.ledger.state()
                reason = f"the budget of {state.cap} policy calls per hour is spent"
                self._defer(trace_id, f"deferred by watch: {reason}; attributed once the hour frees calls")
                self._emit("skipped", trace_ids=[trace_id], job_id=job_id, frees_at_ns=state.frees_at_ns, reason=reason)
                return _BLOCKED
        limit = base if want == 0 else None if grant is None or grant.calls is None else base + grant.calls
        job: Job | None = None
        try:
            job = self.make_job(trace_id, job_id, limit)
            # calls the hour may grant again later pause the job; its own cap (calls_per_job) ends it
            job.pause_when_spent = grant is not None and grant.calls is not None and (want is None or grant.calls < want)
            self._current = job
            if self.stopping:
                job.request_stop(f"stopped by the watcher ({self._stop_reason})")
            self._emit("attributing", trace_id=trace_id, job_id=job_id, resumed=base > 0,
                       granted=None if grant is None else grant.calls)
            results = self.run_job(job)
        except JobInterrupted as exc:
            done.skipped += 1
            self._emit("paused" if exc.status == "paused" else "interrupted", trace_id=trace_id, job_id=job_id,
                       reason=str(exc))
            return _BLOCKED
        except AttributionError as exc:  # another process runs this job, or it cannot start
            done.skipped += 1
            self._emit("skipped", trace_ids=[trace_id], job_id=job_id, reason=str(exc))
            return _BLOCKED
        except OtelReplayError as exc:  # the job failed (its state says so): the next trace goes on
            self._emit("failed", trace_id=trace_id, job_id=job_id, reason=f"{type(exc).__name__}: {exc}")
            return None
        finally:
            self._current = None
            if grant is not None:
                self.ledger.settle(grant, 0 if job is None else job.budget.spent - base)
        if not results:
            done.skipped += 1
            self._emit("skipped", trace_ids=[trace_id], job_id=job_id, reason=job.skipped.get(trace_id, "skipped"))
            return None
        result = results[0]
        done.attributed += 1
        self._emit("attributed", trace_id=trace_id, job_id=job_id, verdict=result.verdict, headline=result.headline,
                   policy_calls=result.policy_calls)
        if self.after is not None:
            followed = self.after(result)
            if followed:
                self._emit(**followed)
        return result

    def _defer(self, trace_id: str, reason: str) -> None:
        """List a failure the hourly budget keeps waiting in `otel-replay jobs --skipped` (job
        `watch`, once per trace; the list leaves it out once the trace has a report)."""
        if trace_id not in dict(self.store.named("job_skips", [LEDGER])):
            write_rows(self.store.root, "skip_rows", [{"job_id": LEDGER, "trace_id": trace_id, "reason": reason,
                                                      "skipped_ns": self.clock()}])

    def _emit(self, event: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event({"event": event, **fields})


_BLOCKED = object()
