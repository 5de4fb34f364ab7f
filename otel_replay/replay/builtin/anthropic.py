"""The built-in Anthropic llm policy (the `anthropic` SDK, imported lazily).

Importing this module registers it as the llm policy: `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`,
`OTEL_REPLAY_MODEL` (model override), `OTEL_REPLAY_TEMPERATURE`.
"""

from __future__ import annotations

import os
from typing import Any

from otel_replay.replay import policies
from otel_replay.replay.builtin.anthropic_policy import anthropic_policy


def _from_env() -> Any:
    temperature = os.environ.get("OTEL_REPLAY_TEMPERATURE")
    return anthropic_policy(os.environ.get("ANTHROPIC_BASE_URL"), model=os.environ.get("OTEL_REPLAY_MODEL"),
                            temperature=float(temperature) if temperature else None)


policies.llm(_from_env())
