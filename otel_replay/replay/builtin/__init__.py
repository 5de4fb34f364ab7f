"""Built-in llm policies that re-issue the recorded request to a real endpoint.

`--policies otel_replay.replay.builtin.openai` (or `.anthropic`) registers one as the llm policy,
configured by environment variables; `openai_policy(...)` / `anthropic_policy(...)` build one
in code. A model override is the swap-model intervention.
"""
