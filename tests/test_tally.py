"""`Ticker` and `SharedCount`: exact under many threads."""

from __future__ import annotations

import sys
import threading

import pytest

from otel_replay.capture.tally import SharedCount, Ticker


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


def test_a_ticker_keeps_every_tick_of_many_threads_and_of_threads_that_ended():
    ticker = Ticker()

    def tick() -> None:
        for _ in range(5_000):
            next(ticker.counter)

    for _ in range(3):  # three waves of threads, each wave gone before the next
        run(tick, 8)
    assert ticker.value == 3 * 8 * 5_000
    assert ticker.value == 3 * 8 * 5_000  # reading does not tick


def test_a_ticker_reads_while_others_tick_and_never_goes_back():
    ticker = Ticker()
    next(ticker.counter)
    stop = threading.Event()
    seen: list[int] = []

    def read() -> None:
        while not stop.is_set():
            seen.append(ticker.value)

    reader = threading.Thread(target=read)
    reader.start()
    run(lambda: [next(ticker.counter) for _ in range(2_000)], 4)
    stop.set()
    reader.join()
    assert ticker.value == 1 + 4 * 2_000
    assert seen and seen == sorted(seen) and seen[0] >= 1


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
