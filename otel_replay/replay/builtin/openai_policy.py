"""The built-in OpenAI-compatible llm policy factory (the `openai` SDK, imported lazily)."""

from __future__ import annotations

import os
import random
from typing import Any

from otel_replay.normalize.message_types import Message
from otel_replay.normalize.messages import canonical_tool_definitions
from otel_replay.replay.builtin.wire import from_openai_choice, openai_tools, to_openai
from otel_replay.replay.engine import LLMInputs, report_tokens
from otel_replay.trajectory import Step

SAMPLING = ("temperature", "top_p", "max_tokens", "frequency_penalty", "presence_penalty", "stop")


def openai_policy(base_url: str | None = None, api_key: str | None = None, model: str | None = None,
                  temperature: float | None = None, client: Any = None,
                  tools: list[dict[str, Any]] | None = None) -> Any:
    """An llm policy that sends the live request to an OpenAI-compatible chat-completions endpoint."""
    state: dict[str, Any] = {"client": client}

    def chat(step: Step, inputs: LLMInputs, rng: random.Random) -> list[Message]:
        if state["client"] is None:
            try:
                import openai
            except ImportError as exc:
                raise RuntimeError("the OpenAI policy needs the openai SDK: pip install 'otel-replay[openai]'") from exc
            state["client"] = openai.OpenAI(base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none",
                                            max_retries=2)
        request: dict[str, Any] = {
            "model": model or inputs.model or step.model or "gpt-4o-mini",
            "messages": to_openai(inputs.messages, inputs.system),
            "seed": rng.randrange(2**31),
        }
        request.update({k: inputs.params[k] for k in SAMPLING if inputs.params.get(k) is not None})
        if temperature is not None:
            request["temperature"] = temperature
        tool_defs = inputs.tools or canonical_tool_definitions(tools)
        if tool_defs:
            request["tools"] = openai_tools(tool_defs)
        reply = state["client"].chat.completions.create(**request)
        usage = getattr(reply, "usage", None)
        if usage is not None:
            report_tokens(getattr(usage, "total_tokens", 0) or 0)
        return from_openai_choice(reply.choices[0].message.model_dump(exclude_none=True))

    return chat
