"""The simulated model: a script maps (request, rng) to a reply; faults can be planted.

The rng of each request is seeded from the model's seed, the request's `seed` parameter and the
request's messages, so the same request always gets the same answer, and a caller that varies
`seed` (as replay policies do) samples the model's randomness.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import xxhash


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str | None = None


Reply = str | ToolCall | list[ToolCall]


@dataclass(slots=True)
class ChatRequest:
    """An OpenAI chat-completions request body, with helpers for scripts."""

    body: dict[str, Any]
    faults: set[str] = field(default_factory=set)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def model(self) -> str:
        return str(self.body.get("model") or "sim-model")

    @property
    def last(self) -> dict[str, Any]:
        return self.messages[-1] if self.messages else {}

    def user_text(self) -> str:
        return " ".join(str(m.get("content") or "") for m in self.messages if m.get("role") == "user")

    def tool_results(self) -> list[tuple[str, str]]:
        """(tool name, content) of every tool message, in order."""
        names = {c["id"]: c["function"]["name"] for m in self.messages for c in m.get("tool_calls") or []}
        return [(names.get(m.get("tool_call_id"), "?"), str(m.get("content"))) for m in self.messages
                if m.get("role") == "tool"]

    def turn(self) -> int:
        """How many assistant messages the conversation already has."""
        return sum(1 for m in self.messages if m.get("role") == "assistant")


Script = Callable[[ChatRequest, random.Random], Reply]


class SimulatedModel:
    """`script(request, rng) -> reply`; `plant(fault, times)` makes the next requests carry a fault."""

    def __init__(self, script: Script, seed: int = 0) -> None:
        self.script = script
        self.seed = seed
        self.requests = 0
        self._planted: dict[str, int] = {}
        self._lock = threading.Lock()

    def plant(self, fault: str, times: int = 1) -> None:
        """The next `times` requests see `fault` in `request.faults` (the script decides what it does)."""
        with self._lock:
            self._planted[fault] = self._planted.get(fault, 0) + times

    def _take_faults(self) -> set[str]:
        with self._lock:
            faults = {f for f, n in self._planted.items() if n > 0}
            for fault in faults:
                self._planted[fault] -= 1
            return faults

    def rng_for(self, body: dict[str, Any]) -> random.Random:
        digest = xxhash.xxh3_64_hexdigest(json.dumps(body.get("messages"), sort_keys=True).encode())
        return random.Random(f"{self.seed}:{body.get('seed')}:{digest}")

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """A chat-completions response body for a request body."""
        with self._lock:
            self.requests += 1
            number = self.requests
        request = ChatRequest(body, self._take_faults())
        rng = self.rng_for(body)
        reply = self.script(request, rng)
        call_ids = random.Random(rng.random())  # ids from the request too, never from arrival order
        calls = [reply] if isinstance(reply, ToolCall) else reply if isinstance(reply, list) else []
        if calls:
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
                {"id": c.id or f"call_{call_ids.getrandbits(48):012x}",
                 "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for i, c in enumerate(calls)]}
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": str(reply)}, "stop"
        prompt = sum(len(str(m.get("content") or "")) for m in request.messages) // 4 + 10
        completion = len(json.dumps(message)) // 4
        return {
            "id": f"chatcmpl-sim-{number}", "object": "chat.completion", "created": 1764527400,
            "model": request.model, "system_fingerprint": "fp_sim",
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }
