"""Outcomes: what a verifier says of a recorded run, stored so that "failed" means the verifier's word.

A run's span status says whether something raised; a wrong answer delivered with status ok is a
failure only a verifier sees. `attribute` stores the recorded run's score before replaying it, and
`watch` scores new traces to find failures; both write `outcome_rows`, and the `outcomes` view
keeps the latest per trace and verifier (`traces --failed` lists verifier failures beside span
errors).

Each outcome carries the failure's signature (`signature`): the root's name, the failing step's
name and a hash of the normalized final output. Identical failures share it, so `watch` attributes
one of them and links the others to its result.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

from otel_replay.attribution import verifiers
from otel_replay.attribution.plans import rollout_seed
from otel_replay.replay import ReplayPlan, replay
from otel_replay.replay.policies import Registry
from otel_replay.store.writer import write_rows
from otel_replay.trajectory import Store, Trajectory

_DIGITS = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")


def output_hash(text: str) -> str:
    """A hash of the text with case, whitespace and numbers normalized away: two answers that differ
    only in an id, a count or a line break hash alike."""
    normal = _SPACE.sub(" ", _DIGITS.sub("0", text.casefold())).strip()
    return hashlib.blake2b(normal.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def failing_step(trajectory: Trajectory) -> str:
    """The name of the step a failure shows at: the last step whose span failed, else the last model
    call that answered (its text is the final output), else the last step."""
    steps = trajectory.steps
    errored = [s for s in steps if s.status == "error"]
    if errored:
        return errored[-1].name
    answered = [s for s in steps if s.kind == "llm" and s.output_text]
    return answered[-1].name if answered else (steps[-1].name if steps else "")


def signature(trajectory: Trajectory) -> str:
    """JSON `[root name, failing step name, final-output hash]`: identical failures share it."""
    root = trajectory.root_name or next((a.name for a in trajectory.agents), "")
    return json.dumps([root, failing_step(trajectory), output_hash(trajectory.final_output)], ensure_ascii=False)


def outcome_row(trajectory: Trajectory, verifier: str, score: float | None, threshold: float, source: str,
                job_id: str | None = None, reason: str | None = None) -> dict[str, Any]:
    """An `outcome_rows` row (`passed` is score >= threshold; both NULL when the run was not scored)."""
    return {"trace_id": trajectory.trace_id, "verifier": verifier, "score": score, "threshold": threshold,
            "passed": None if score is None else score >= threshold, "signature": signature(trajectory),
            "source": source, "job_id": job_id, "reason": reason, "scored_ns": time.time_ns()}


def evaluate(trajectory: Trajectory, verifier: verifiers.Verifier, name: str, threshold: float, seed: int = 0,
             source: str = "watch") -> dict[str, Any]:
    """Score a recorded run as an attribution job with this seed scores it: its factual replay (every
    step served from the recording, no policy called), or its recorded final output when it cannot be
    replayed. A verifier that raises leaves the run unscored, with the reason."""
    run = replay(trajectory, ReplayPlan.factual(), rollout_seed(seed, trajectory.trace_id, 0), policies=Registry())
    output = trajectory.final_output if run.unreplayable else run.final_output
    try:
        score = verifiers.score(verifier, output, run)
    except Exception as exc:  # the user's verifier: one bad trace must not stop a watcher
        return outcome_row(trajectory, name, None, threshold, source,
                           reason=f"the verifier raised {type(exc).__name__}: {exc}"[:500])
    return outcome_row(trajectory, name, score, threshold, source)


def write(store: Store, rows: list[dict[str, Any]]) -> None:
    """Append outcomes as one segment."""
    write_rows(store.root, "outcome_rows", rows)
