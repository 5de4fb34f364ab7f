"""What bounds the receiver: request rate per client, connections per client, bytes in flight,
and the time a request may take to arrive.

Each limit answers a way a client (buggy or hostile) could take the receiver down: a flood of
requests (`RateLimiter`: 429 / RESOURCE_EXHAUSTED with a retry delay), many connections that
trickle bytes (`DeadlineReader`: a request must arrive whole within `request_timeout_s`, and a
connection that sends nothing for `read_timeout_s` is closed; `ConnectionSlots`: a client holds
at most so many connections, and those without the token cannot keep out those with it), and
many large bodies at once (`ByteBudget`: bodies in memory
are bounded in total, not just each).
"""

from __future__ import annotations

import contextlib
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
        retry_after = max(1, math.ceil(wait_s))  # whole seconds, as Retry-After has them
        super().__init__(429, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"too many requests from {client}: the limit is {rate:g} per second "
                         f"(--max-requests-per-s); retry in {retry_after} s", retry=True, retry_after=retry_after)


class Slot:
    """One connection's place in `ConnectionSlots`."""

    __slots__ = ("client", "evicted", "sock", "verified")

    def __init__(self, client: str, sock: socket.socket | None) -> None:
        self.client, self.sock = client, sock
        self.verified = self.evicted = False


class _Pool:
    """Connections counted in all and per client address, oldest first."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total, self.per_client = total, per_client
        self.slots: OrderedDict[Slot, None] = OrderedDict()
        self.by_client: dict[str, int] = {}

    def full_for(self, client: str) -> bool:
        return len(self.slots) >= self.total or self.by_client.get(client, 0) >= self.per_client

    def add(self, slot: Slot) -> None:
        self.slots[slot] = None
        self.by_client[slot.client] = self.by_client.get(slot.client, 0) + 1

    def remove(self, slot: Slot) -> None:
        if slot in self.slots:
            del self.slots[slot]
            left = self.by_client[slot.client] - 1
            if left:
                self.by_client[slot.client] = left
            else:
                del self.by_client[slot.client]

    def oldest(self, client: str | None) -> Slot | None:
        return next((s for s in self.slots if client is None or s.client == client), None)


class ConnectionSlots:
    """At most `total` connections at once, and at most `per_client` from one address.

    With `reserve_for_token`, the limits count two pools apart: connections that have not yet shown
    the token, and connections that have (`verify`, from their first authorized request on). When
    the first pool is full, a new connection takes the place of the oldest one in it (closed): a
    flood of idle or trickling connections cannot keep out a client with the token, whose connection
    leaves that pool as soon as its first request's headers are read. Without it, a connection over
    either limit is refused.
    """

    def __init__(self, total: int, per_client: int, reserve_for_token: bool = False) -> None:
        self.total, self.per_client = total, per_client
        self.reserve_for_token = reserve_for_token
        self._waiting = _Pool(total, per_client)  # not yet shown the token (every connection, without one)
        self._verified = _Pool(total, per_client)
        self.evicted = 0
        """Connections closed to make room for a newer one (only with `reserve_for_token`)."""
        self._lock = threading.Lock()

    def acquire(self, client: str, sock: socket.socket | None = None) -> Slot | None:
        """A slot for a new connection from `client`, or None when there is no room."""
        slot, victim = Slot(client, sock), None
        with self._lock:
            if self._waiting.full_for(client):
                if not self.reserve_for_token:
                    return None
                over_client = self._waiting.by_client.get(client, 0) >= self.per_client
                victim = self._waiting.oldest(client if over_client else None)
                if victim is None:
                    return None
                self._waiting.remove(victim)
                victim.evicted = True
                self.evicted += 1
            self._waiting.add(slot)
        if victim is not None and victim.sock is not None:
            with contextlib.suppress(OSError):  # its thread's next read sees the end of the stream
                victim.sock.shutdown(socket.SHUT_RDWR)
        return slot

    def verify(self, slot: Slot) -> bool:
        """Move a connection that has shown the token out of the waiting pool; False if it was closed
        meanwhile or its own pool is full (then it should be answered 503 and closed)."""
        if slot.verified:
            return True
        with self._lock:
            if slot.evicted or self._verified.full_for(slot.client):
                return False
            self._waiting.remove(slot)
            self._verified.add(slot)
            slot.verified = True
            return True

    def release(self, slot: Slot) -> None:
        with self._lock:
            if not slot.evicted:
                (self._verified if slot.verified else self._waiting).remove(slot)
            slot.sock = None

    @property
    def open(self) -> int:
        """Connections holding a slot (both pools)."""
        return len(self._waiting.slots) + len(self._verified.slots)

    @property
    def waiting(self) -> int:
        """Connections that have not shown the token (all of them, without `reserve_for_token`)."""
        return len(self._waiting.slots)


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
