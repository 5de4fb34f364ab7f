"""One process per job id on a remote store too: a lease object, created exclusively, renewed by a
heartbeat, taken over once its holder stopped renewing it (a `kill -9` leaves it behind). On an
fsspec in-memory filesystem and on a real S3-compatible server (moto)."""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from otel_replay.attribution.lock import JobLock, JobLocked
from otel_replay.store.location import StoreLocation
from tests.helpers import local_s3


def _memory() -> StoreLocation:
    return StoreLocation(f"memory://otel-replay-locks-{uuid.uuid4().hex[:8]}")


def _holder(location: StoreLocation, lock: JobLock) -> dict:
    return json.loads(location.read_bytes(lock.lease))


def _exercise(location: StoreLocation) -> None:
    first = JobLock(location, "j1", heartbeat_s=0.05, stale_after_s=5).acquire()
    try:
        with pytest.raises(JobLocked, match=rf"job j1 is already running in process {os.getpid()} on host .*--resume j1"):
            JobLock(location, "j1").acquire()
        JobLock(location, "j2").acquire().release()  # other job ids do not contend
        renewed = _holder(location, first)["renewed_ns"]
        time.sleep(0.3)
        assert _holder(location, first)["renewed_ns"] > renewed  # the heartbeat renews it
    finally:
        first.release()
    assert not location.fs.exists(f"{location.path}/{first.lease}")
    second = JobLock(location, "j1").acquire()  # released: free again
    second.release()


def test_a_remote_job_is_held_by_a_renewed_lease():
    _exercise(_memory())


def test_a_released_lease_is_never_revived_by_a_heartbeat_in_flight():
    """A beat that was putting while release deleted used to land after the delete (seen on S3 in
    CI): the job then looked held for `stale_after_s`. Beats every millisecond make the overlap likely."""
    location = _memory()
    for _ in range(300):
        lock = JobLock(location, "j1", heartbeat_s=0.0005).acquire()
        time.sleep(0.002)
        lock.release()
        time.sleep(0.002)  # a beat that escaped the release would land here
        assert not location.fs.exists(f"{location.path}/{lock.lease}")


def test_a_lease_its_holder_stopped_renewing_is_taken_over():
    location = _memory()
    dead = {"host": "gone", "pid": 4242, "renewed_ns": time.time_ns() - int(200e9)}  # what a kill -9 leaves
    location.fs.pipe_file(f"{location.path}/locks/job-j1.lease", json.dumps(dead).encode())
    lock = JobLock(location, "j1", stale_after_s=90).acquire()
    try:
        assert lock.took_over == 4242 and _holder(location, lock)["pid"] == os.getpid()
    finally:
        lock.release()
    fresh = {**dead, "renewed_ns": time.time_ns()}
    location.fs.pipe_file(f"{location.path}/locks/job-j1.lease", json.dumps(fresh).encode())
    with pytest.raises(JobLocked, match="process 4242 on host gone"):
        JobLock(location, "j1").acquire()


def test_on_s3_the_lease_is_created_exclusively(tmp_path_factory):
    s3fs = pytest.importorskip("s3fs", reason="the s3 extra: pip install 'otel-replay[s3,s3-test]'")
    pytest.importorskip("moto.server", reason="the s3-test extra: pip install 'otel-replay[s3-test]'")
    with local_s3(tmp_path_factory.mktemp("aws")):
        bucket = f"b-{uuid.uuid4().hex[:12]}"
        s3fs.S3FileSystem().mkdir(bucket)
        _exercise(StoreLocation(f"s3://{bucket}/store"))
