"""`Tally` and `SharedCount`: exact under many threads, and a tally forgets the cells of ended threads."""

from __future__ import annotations

import gc
import sys
import threading

import pytest

from otel_replay.capture.tally import SharedCount, Tally


@pytest.fixture(autouse=True)
def fast_switching():
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def run(target, threads: int) -> None:
    started = [threading.Thread(target=target) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()


def test_a_tally_keeps_every_add_of_threads_that_ended():
    tally = Tally()

    def add() -> None:
        for _ in range(5_000):
            tally.local.cell.n += 1
        tally.add(7)

    for _ in range(3):  # three waves of threads, each wave gone before the next
        run(add, 8)
    gc.collect()
    assert tally.value == 3 * 8 * 5_007
    assert len(tally._cells) == 1  # the ended threads' cells were folded; the one left is this thread's


def test_a_tally_counts_the_calling_thread_and_reads_while_others_add():
    tally = Tally()
    tally.add(3)
    stop = threading.Event()
    seen: list[int] = []

    def read() -> None:
        while not stop.is_set():
            seen.append(tally.value)

    reader = threading.Thread(target=read)
    reader.start()
    run(lambda: [tally.add() for _ in range(2_000)], 4)
    stop.set()
    reader.join()
    assert tally.value == 3 + 4 * 2_000
    assert seen == sorted(seen)  # a read never sees a count go back


def test_shared_count_in_place_add_is_exact_and_reads_as_an_int():
    count = SharedCount()
    holder = type("Holder", (), {})()
    holder.errors = count

    def bump() -> None:
        for _ in range(3_000):
            holder.errors += 1  # what `ReplayLogProcessor.on_emit` does on an error

    run(bump, 8)
    assert holder.errors is count and count == 24_000 and int(count) == 24_000 and count.value == 24_000
    with pytest.raises(TypeError):
        hash(count)
    assert count.after_fork() == 24_000 and count.after_fork() is not count
