"""The built-in OpenAI-compatible llm policy (the `openai` SDK, imported lazily).

Importing this module registers it as the llm policy, configured by environment variables:
`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OTEL_REPLAY_MODEL` (model override), `OTEL_REPLAY_TEMPERATURE`.
"""

from __future__ import annotations

import os
from typing import Any

from otel_replay.replay import policies
from otel_replay.replay.builtin.openai_policy import openai_policy


def _from_env() -> Any:
    temperature = os.environ.get("OTEL_REPLAY_TEMPERATURE")
    return openai_policy(os.environ.get("OPENAI_BASE_URL"), model=os.environ.get("OTEL_REPLAY_MODEL"),
                         temperature=float(temperature) if temperature else None)


policies.llm(_from_env())
