"""What bounds the receiver: request rate per client, connections per client, bytes in flight,
and the time a request may take to arrive.

Each limit answers a way a client (buggy or hostile) could take the receiver down: a flood of
requests (`RateLimiter`: 429 / RESOURCE_EXHAUSTED with a retry delay), many connections that
trickle bytes (`DeadlineReader`: a request must arrive whole within `request_timeout_s`, and a
connection that sends nothing for `read_timeout_s` is closed; `ConnectionSlots`: a client holds
at most so many connections), and many large bodies at once (`ByteBudget`: bodies in memory
are bounded in total, not just each).
"""

from __future__ import annotations

import io
import math
import socket
import threading
import time
from collections import OrderedDict

import grpc

from otel_replay.capture.receiver_decode import RequestError

DEFAULT_RATE = 200.0  # requests per second per client (an exporter sends a few)
DEFAULT_BURST = 400  # requests a client may send at once after a quiet spell
MAX_CLIENTS_TRACKED = 4096  # rate buckets kept (least recently seen dropped first)


class RateLimiter:
    """A token bucket per client address: `rate` requests per second, bursts up to `burst`.

    A client is told how long to wait; the others are not slowed by it. A bucket dropped from
    the table (more than `MAX_CLIENTS_TRACKED` clients) starts full again, which only errs on
    the side of serving.
    """

    def __init__(self, rate: float, burst: int | None = None) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.rate = rate
        self.burst = float(burst if burst is not None else max(1, math.ceil(2 * rate)))
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, when)
        self._lock = threading.Lock()

    def take(self, client: str) -> float:
        """0 if the client may send now (a token is spent), else the seconds until it may."""
        now = time.monotonic()
        with self._lock:
            tokens, then = self._buckets.pop(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - then) * self.rate)
            wait = 0.0
            if tokens >= 1:
                tokens -= 1
            else:
                wait = (1 - tokens) / self.rate
            self._buckets[client] = (tokens, now)
            if len(self._buckets) > MAX_CLIENTS_TRACKED:
                self._buckets.popitem(last=False)
        return wait


class Throttled(RequestError):
    """A client over its request rate: 429 / RESOURCE_EXHAUSTED, told when to come back."""

    def __init__(self, client: str, rate: float, wait_s: float) -> None:
        self.retry_after = max(1, math.ceil(wait_s))  # whole seconds, as Retry-After has them
        super().__init__(429, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"too many requests from {client}: the limit is {rate:g} per second "
                         f"(--max-requests-per-s); retry in {self.retry_after} s", retry=True)


class ConnectionSlots:
    """At most `total` connections at once, and at most `per_client` from one address."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total, self.per_client = total, per_client
        self._open: dict[str, int] = {}
        self._count = 0
        self._lock = threading.Lock()

    def acquire(self, client: str) -> bool:
        with self._lock:
            mine = self._open.get(client, 0)
            if self._count >= self.total or mine >= self.per_client:
                return False
            self._open[client] = mine + 1
            self._count += 1
            return True

    def release(self, client: str) -> None:
        with self._lock:
            mine = self._open.get(client, 0) - 1
            if mine > 0:
                self._open[client] = mine
            else:
                self._open.pop(client, None)
            self._count -= 1

    @property
    def open(self) -> int:
        return self._count


class ByteBudget:
    """Bytes of request bodies held in memory at once: `limit` in all, half of it per client
    address (so clients that stall mid-body cannot hold all of it from one address)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.per_client = max(limit // 2, 1)
        self._used = 0
        self._by_client: dict[str, int] = {}
        self._cond = threading.Condition()

    def reserve(self, client: str, size: int, wait_s: float) -> bool:
        """Reserve `size` bytes for `client`, waiting up to `wait_s` for room; False if there was none."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while (self._used + size > self.limit
                   or self._by_client.get(client, 0) + size > max(self.per_client, size)):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            self._used += size
            self._by_client[client] = self._by_client.get(client, 0) + size
            return True

    def release(self, client: str, size: int) -> None:
        if not size:
            return
        with self._cond:
            self._used -= size
            left = self._by_client.get(client, 0) - size
            if left > 0:
                self._by_client[client] = left
            else:
                self._by_client.pop(client, None)
            self._cond.notify_all()

    @property
    def used(self) -> int:
        return self._used


class RequestTimeout(TimeoutError):
    """A request did not arrive whole within the request timeout."""


class DeadlineReader(io.RawIOBase):
    """A socket's read side with two limits: `idle_s` without a byte, and `request_s` for a whole
    request from its first byte (`start_request()` re-arms it). A client that trickles a byte
    every few seconds passes the first and not the second."""

    def __init__(self, sock: socket.socket, idle_s: float, request_s: float) -> None:
        super().__init__()
        self._sock, self.idle_s, self.request_s = sock, idle_s, request_s
        self._deadline: float | None = None

    def start_request(self) -> None:
        """The next byte read starts a new request's clock."""
        self._deadline = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        timeout = self.idle_s
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise RequestTimeout(f"the request did not arrive within {self.request_s:g} s")
            timeout = min(timeout, left)
        self._sock.settimeout(timeout)
        try:
            count = self._sock.recv_into(buffer)
        except TimeoutError:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                raise RequestTimeout(f"the request did not arrive within {self.request_s:g} s") from None
            raise
        finally:
            self._sock.settimeout(self.idle_s)  # writes keep the plain timeout
        if count and self._deadline is None:
            self._deadline = time.monotonic() + self.request_s
        return count
