"""A policy-call budget per sliding hour, kept in the store so every watcher of it obeys one cap.

Before a job runs it is *granted* calls (`budget_rows`: a row with `spent` NULL); when it stops, the
grant is *settled* with the calls it spent (a second row; the settled row of a grant wins). At a
moment `t` the ledger counts every grant whose job ended after `t - 1 h` or has not ended: its
spent calls, or its whole grant while it runs. A grant is made only when the count plus the grant
stays within the cap.

Why that is a hard cap on every hour `[a, a + 1 h)`: take the last grant `g` made before `a + 1 h`
among the jobs that made calls in that hour. Every other such job was granted earlier and ended at
or after `a > g - 1 h`, so it was counted at `g` (by its grant while running, by its spent calls
once settled), and the jobs' calls in the hour are at most what was counted at `g` plus `g`'s own
grant, which is at most the cap. A job's own `Budget` refuses any call past its grant.

A grant whose process died is never settled: it keeps counting in full until its job is granted
again (the next grant of a job first settles the open ones at their whole grant, ended now, which
is never less than what they spent). Grants and their checks run under a store lock
(`locks/job-ledger-<name>.lock`), so two watchers never both spend the same calls.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from otel_replay.attribution.lock import JobLock, JobLocked
from otel_replay.store.writer import write_rows
from otel_replay.trajectory import Store

HOUR_NS = 3600 * 10**9
LOCK_WAIT_S = 30.0  # a grant holds the ledger's lock for one read and one write: a long wait means trouble
Clock = Callable[[], int]
"""Now, in epoch nanoseconds (time.time_ns; tests inject their own)."""


@dataclass(frozen=True, slots=True)
class Grant:
    grant_id: str
    job_id: str
    calls: int | None  # None: no cap (the ledger then only records what was spent)
    granted_ns: int


@dataclass(frozen=True, slots=True)
class LedgerState:
    counted: int  # calls the last hour counts (grants of running jobs in full)
    cap: int | None
    frees_at_ns: int | None  # when the earliest counted call leaves the hour (None: nothing ended yet)

    @property
    def left(self) -> int | None:
        return None if self.cap is None else max(0, self.cap - self.counted)


class Ledger:
    """The sliding-hour policy-call budget named `name` in `store` (None cap: unlimited, still recorded)."""

    def __init__(self, store: Store, name: str, per_hour: int | None, clock: Clock = time.time_ns) -> None:
        self.store = store
        self.name = name
        self.per_hour = per_hour
        self.clock = clock

    def state(self) -> LedgerState:
        now = self.clock()
        counted, first_ended = self.store.named("ledger_counted", [self.name, now - HOUR_NS])[0]
        return LedgerState(int(counted), self.per_hour, None if first_ended is None else first_ended + HOUR_NS)

    def grant(self, job_id: str, want: int | None) -> Grant | None:
        """Up to `want` calls for `job_id` (None: as many as the hour has left), or None when none is left."""
        lock = self._acquire()
        try:
            now = self.clock()
            self._settle_open(job_id, now)
            left = self.state().left
            calls = want if left is None else left if want is None else min(want, left)
            if calls is not None and calls <= 0:
                return None
            grant = Grant("g" + os.urandom(8).hex(), job_id, calls, now)
            self._write(grant, None, None, now)
            return grant
        finally:
            lock.release()

    def settle(self, grant: Grant, spent: int) -> None:
        """The job stopped, having spent `spent` calls of its grant."""
        now = self.clock()
        spent = max(0, spent) if grant.calls is None else min(max(0, spent), grant.calls)
        self._write(grant, spent, now, now)

    def _settle_open(self, job_id: str, now: int) -> None:
        """Close the grants of `job_id` a dead process left open, at their whole grant, ended now."""
        for grant_id, job, granted, granted_ns in self.store.named("ledger_open_grants", [self.name, job_id]):
            self._write(Grant(grant_id, job, int(granted), int(granted_ns)), int(granted), now, now)

    def _write(self, grant: Grant, spent: int | None, ended_ns: int | None, now: int) -> None:
        write_rows(self.store.root, "budget_rows", [{
            "ledger": self.name, "grant_id": grant.grant_id, "job_id": grant.job_id,
            "granted": grant.calls or 0, "spent": spent, "granted_ns": grant.granted_ns, "ended_ns": ended_ns,
            "written_ns": now}])

    def _acquire(self) -> JobLock:
        """The ledger's lock, waited for (it is held for one read and one write)."""
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                return JobLock(self.store.root, f"ledger-{self.name}").acquire()
            except JobLocked:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
