"""Caveats of a rollout that a pass/fail cannot show: policies that ran on redacted text.

Redaction happens before storage (`normalize/redact.py`), so a recorded step's inputs may hold
`[REDACTED:<rule>]` where a secret was. Holding such a step is exact: the recording is served,
and placeholders are deterministic, so live inputs still match the cassette. Re-running it is
not: its policy gets the placeholder instead of the original text. `redaction_caveats` names
every such policy call of a rollout, so a result that may depend on the redacted text says so.
"""

from __future__ import annotations

from otel_replay.replay.run import ReplayRun
from otel_replay.trajectory import Trajectory

NEEDS_TEXT = ("input", "system", "tools")
"""Parts of a step a policy is given; a redaction in its output is only replayed, never re-sent."""


def _needed(redacted: tuple[str, ...]) -> list[str]:
    return [r for r in redacted if r.split(":", 1)[0] in NEEDS_TEXT]


def redaction_caveats(trajectory: Trajectory, run: ReplayRun) -> tuple[str, ...]:
    """One line per policy call in `run` whose inputs were redacted in the recording."""
    if not any(s.redacted for s in trajectory.steps):
        return ()
    caveats: list[str] = []
    history = sorted({r for s in trajectory.steps if s.kind == "llm" for r in _needed(s.redacted)}
                     | {r.replace("output:", "input:", 1) for s in trajectory.steps for r in s.redacted
                        if r.startswith("output:")})
    for outcome in run.steps:
        if outcome.source != "policy":
            continue
        if outcome.index is not None:
            needed = _needed(trajectory.step(outcome.index).redacted)
            where = f"step {outcome.index} ({outcome.kind} {outcome.name})"
        else:  # past the recording: the history it gets is built from recorded messages
            needed = history
            where = f"a step past the recording ({outcome.kind} {outcome.name})"
        if needed:
            caveats.append(f"{where} was re-run by its policy on redacted text ({', '.join(needed)}): "
                           "the policy saw placeholders, not the original values")
    return tuple(dict.fromkeys(caveats))
