"""The built-in Anthropic llm policy factory (the `anthropic` SDK, imported lazily)."""

from __future__ import annotations

import os
import random
from typing import Any

from otel_replay.normalize.message_types import Message, is_text
from otel_replay.normalize.messages import canonical_tool_definitions
from otel_replay.replay.builtin.wire import anthropic_tools, from_anthropic_content, to_anthropic
from otel_replay.replay.engine import LLMInputs, report_tokens
from otel_replay.trajectory import Step


def anthropic_policy(base_url: str | None = None, api_key: str | None = None, model: str | None = None,
                     temperature: float | None = None, client: Any = None,
                     tools: list[dict[str, Any]] | None = None) -> Any:
    """An llm policy that sends the live request to the Anthropic Messages API."""
    state: dict[str, Any] = {"client": client}

    def chat(step: Step, inputs: LLMInputs, rng: random.Random) -> list[Message]:
        if state["client"] is None:
            try:
                import anthropic
            except ImportError as exc:
                raise RuntimeError("the Anthropic policy needs the anthropic SDK: pip install 'otel-replay[anthropic]'") from exc
            state["client"] = anthropic.Anthropic(base_url=base_url, api_key=api_key or os.environ.get("ANTHROPIC_API_KEY"))
        system_from_messages, messages = to_anthropic(inputs.messages)
        system = "\n".join(p.get("content", "") for p in inputs.system if is_text(p)) or system_from_messages
        request: dict[str, Any] = {"model": model or inputs.model or step.model or "claude-sonnet-4-5",
                                   "max_tokens": int(inputs.params.get("max_tokens") or 1024), "messages": messages}
        if system:
            request["system"] = system
        tool_defs = inputs.tools or canonical_tool_definitions(tools)
        if tool_defs:
            request["tools"] = anthropic_tools(tool_defs)
        if temperature is not None or inputs.params.get("temperature") is not None:
            request["temperature"] = temperature if temperature is not None else inputs.params["temperature"]
        reply = state["client"].messages.create(**request)
        usage = getattr(reply, "usage", None)
        if usage is not None:
            report_tokens((getattr(usage, "input_tokens", 0) or 0) + (getattr(usage, "output_tokens", 0) or 0))
        return from_anthropic_content([block.model_dump() for block in reply.content])

    return chat
