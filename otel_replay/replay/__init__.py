"""Replay layer: plans, the policy registry and the trace-driven engine."""

from otel_replay.replay import policies
from otel_replay.replay.engine import LLMInputs, replay, replay_async, report_tokens
from otel_replay.replay.plan import Action, Intervention, ReplayPlan
from otel_replay.replay.run import ReplayRun, StepOutcome, Unreplayable

__all__ = ["Action", "Intervention", "LLMInputs", "ReplayPlan", "ReplayRun", "StepOutcome", "Unreplayable",
           "policies", "replay", "replay_async", "report_tokens"]
