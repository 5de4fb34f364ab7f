"""WHAT / WHERE / WHY / FIX in plain language, each true to what ran.

Every trace verdict gets its own text: a culprit names its interval and the later steps it was
decided against; an undecided result names the candidate steps, their intervals and what it would
take to separate them; a spent budget says how much was spent and what is left undecided; an
unreplayable run names the steps that lack a policy or their content and how to give them one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otel_replay.attribution.model import Culprit, Repair, ShapleyValue, StepBlame
from otel_replay.attribution.result import AttributionResult, preview
from otel_replay.trajectory import Trajectory

if TYPE_CHECKING:
    from otel_replay.attribution.rollouts import RolloutRunner

Row = StepBlame


def _name(row: Row) -> str:
    return f"step {row.index} ({row.kind} {row.name}{', agent ' + row.agent if row.agent else ''})"


def _interval(row: Row) -> str:
    if row.ci_low is None or row.ci_high is None or row.estimate is None:
        return "no interval"
    return f"{row.estimate:+.2f}, interval [{row.ci_low:+.2f}, {row.ci_high:+.2f}]"


def _steps(indices: list[int]) -> str:
    return ", ".join(str(i) for i in indices)


def explain(trajectory: Trajectory, result: AttributionResult, repair: Repair | None,
            runner: RolloutRunner | None = None, repair_searched: bool | None = None) -> dict[str, str]:
    """The four lines; `repair_searched` says whether a repair was looked for (None: unknown, as
    `repair` is None both when none was searched and when the search found no candidate)."""
    outcome = "succeeded" if result.credit else "failed"
    what = (f"The run {outcome} (verifier score {result.recorded_score:.2f}). Final output: "
            f"{trajectory.final_output[:200]!r}")
    band = (f"Intervals are {100 * (1 - result.alpha):.0f}% simultaneous over the {result.tests} step(s) the search "
            f"could test; an effect inside ±{result.epsilon:g} counts as no effect.")
    rows = result.steps or [_shapley_row(trajectory, s) for s in result.shapley]
    by_index = {r.index: r for r in rows}
    if result.verdict == "unreplayable":
        return {"what": what, **_unreplayable(trajectory, rows, runner), "causal_trace": ""}
    if result.verdict == "culprit-found" and result.culprit is not None:
        return {"what": what, **_culprit(result, result.culprit, by_index, repair, band, repair_searched),
                "causal_trace": _chain(rows, result)}
    if result.verdict == "undecided" or result.verdict == "partial":
        return {"what": what, **_undecided(result, by_index, band), "causal_trace": _chain(rows, result)}
    return {"what": what, **_no_culprit(result, rows, band), "causal_trace": _chain(rows, result)}


def _shapley_row(trajectory: Trajectory, value: ShapleyValue) -> Row:
    """A Shapley value as a step's row (its value as the estimate), for a Shapley-only result."""
    step = trajectory.step(value.index)
    return StepBlame(index=value.index, span_id=step.span_id, name=step.name, kind=step.kind, agent=step.agent,
                     estimate=value.value, ci_low=value.ci_low, ci_high=value.ci_high, verdict=value.verdict)


def _culprit(result: AttributionResult, culprit: Culprit, by_index: dict[int, Row], repair: Repair | None,
             band: str, repair_searched: bool | None = None) -> dict[str, str]:
    c = by_index.get(culprit.index) or StepBlame(  # the culprit is always one of the rows; its own entry else
        index=culprit.index, span_id=culprit.span_id, name=culprit.name, kind=culprit.kind, agent=culprit.agent,
        estimate=culprit.estimate, ci_low=culprit.ci_low, ci_high=culprit.ci_high, fail_held=culprit.fail_held,
        fail_resampled=culprit.fail_resampled, verdict="decisive", culprit=True)
    verb = "succeeds" if result.credit else "fails"
    later = [r for i, r in sorted(by_index.items()) if i > c.index and r.verdict in ("locked-in", "protective")]
    locked = [r.index for r in later if r.verdict == "locked-in"]
    protective = [r.index for r in later if r.verdict == "protective"]
    if result.method == "shapley":
        why = (f"Its Shapley value is {_interval(c)}, clearly above every other step's. {band}")
    else:
        why = (f"With steps up to {c.index} as recorded, the run {verb} {100 * (c.fail_held or 0):.0f}% of the "
               f"time; re-deciding step {c.index} brings that to {100 * (c.fail_resampled or 0):.0f}% (effect "
               f"{_interval(c)}). ")
        decided = [f"step(s) {_steps(locked)} locked-in (no effect)"] if locked else []
        decided += [f"step(s) {_steps(protective)} protective"] if protective else []
        why += (f"Every later step that can be re-decided was decided ({'; '.join(decided)}), so this is the point "
                "of commitment. " if later else "No later step can be re-decided, so this is the point of commitment. ")
        why += band
    where = f"{_name(c).capitalize()}: {c.output!r}"
    if repair is not None and repair.valid:
        fix = (f"Replace step {repair.step_index}'s output with {preview(repair.output)!r}: the run then {verb} "
               f"{100 * repair.fail_rate:.0f}% of the time ({repair.rollouts} rollouts, interval "
               f"[{repair.ci_low:.2f}, {repair.ci_high:.2f}]), drift {repair.drift:.2f}.")
    elif repair is not None:
        fix = (f"No candidate output was shown to fix the run (the best failed {100 * repair.fail_rate:.0f}% of "
               f"{repair.rollouts} rollouts{'; undecided' if repair.verdict == 'undecided' else ''}); change step "
               f"{c.index}'s decision by hand and attribute again.")
    elif repair_searched:
        fix = (f"A repair was searched, but no re-decided rollout of step {c.index} passed, so there was no "
               f"candidate output to test; change what step {c.index} decides (its prompt, inputs or tool) by "
               "hand and attribute again.")
    else:
        fix = (f"No repair was searched (add --repair to search one). Change what step {c.index} decides (its "
               "prompt, inputs or tool).")
    return {"where": where, "why": why, "fix": fix}


def _undecided(result: AttributionResult, by_index: dict[int, Row], band: str) -> dict[str, str]:
    candidates = [by_index[i] for i in result.candidates if i in by_index]
    harmful = [r for r in candidates if r.verdict == "contributing"]
    open_rows = [r for r in candidates if r.verdict != "contributing"]
    if candidates:
        where = "Undecided between " + " and ".join(f"{_name(r)} ({_interval(r)})" for r in candidates) + "."
    else:
        where = "Undecided: no step could be tested before the budget ran out."
    parts = []
    if harmful and open_rows:
        h = harmful[0]
        parts.append(f"Step {h.index}'s effect is bigger than ±{result.epsilon:g} ({_interval(h)}), but the later "
                     f"step(s) {_steps([r.index for r in open_rows])} could be neither cleared (shown inside "
                     f"±{result.epsilon:g}) nor shown to matter, and one of them may be the point of commitment.")
    elif open_rows:
        parts.append(f"No step was shown to matter (an effect beyond ±{result.epsilon:g}), and step(s) "
                     f"{_steps([r.index for r in open_rows])} could not be cleared either.")
    if result.untested:
        parts.append(f"Step(s) {_steps(result.untested)} were not tested.")
    if result.budget_exhausted:
        parts.append(f"The budget of {result.max_policy_calls} policy calls ran out ({result.policy_calls} spent).")
    parts.append(band)
    costs = []
    for r in open_rows:
        if r.to_decide:
            more = max(0, r.to_decide - (r.n_held or 0))
            calls = f", ~{more * r.calls_per_rollout:,.0f} more policy calls" if r.calls_per_rollout else ""
            costs.append(f"step {r.index} needs about {r.to_decide} rollouts per plan ({more} more{calls})")
        elif r.ci_low is not None:
            costs.append(f"step {r.index} is too close to ±{result.epsilon:g} to settle with any practical number "
                         f"of rollouts (widen --epsilon)")
    fix = ("Raise --max-policy-calls and continue the job with --resume; the rollouts already run are kept."
           if result.budget_exhausted else "")
    if costs:
        most = max((r.to_decide for r in open_rows if r.to_decide), default=None)
        rerun = ""
        if most and not result.budget_exhausted:
            rerun = (f" (rerun with --rollouts {most}, or without --rollouts: the default samples until decided)"
                     if not result.sequential else f" (rerun with --max-rollouts {most})")
        fix += (" " if fix else "") + "To separate them: " + "; ".join(costs) + rerun + "."
    if not fix:
        fix = "Give the candidates' steps more rollouts (--max-rollouts) or a narrower question (--epsilon)."
    return {"where": where, "why": " ".join(parts), "fix": fix}


def _no_culprit(result: AttributionResult, rows: list[Row], band: str) -> dict[str, str]:
    fixed = [r for r in rows if r.verdict in ("no policy", "observation-only")]
    why = (f"Every step that can be re-decided was decided: re-deciding any one of them moves the failure rate by "
           f"less than ±{result.epsilon:g}, or lowers it. The failure is settled before the first re-decidable step, "
           f"shared by steps that only matter together, or chance. {band}")
    fix = "Profile interactions with --method shapley, or check the verifier and the run's inputs."
    if fixed:
        fix = (f"Steps {_steps([r.index for r in fixed])} cannot be re-decided "
               f"({', '.join(sorted({r.verdict for r in fixed}))}) and may hold the cause: give them a policy. " + fix)
    return {"where": "No step's decision changes the outcome.", "why": why, "fix": fix}


def _unreplayable(trajectory: Trajectory, rows: list[Row], runner: RolloutRunner | None) -> dict[str, str]:
    no_policy = [r for r in rows if r.verdict == "no policy"]
    hidden = [r for r in rows if r.verdict == "observation-only"]
    failed = [r for r in rows if r.verdict == "unreplayable"]
    parts, fixes = [], []
    if no_policy:
        names = sorted({(r.kind, trajectory.step(r.index).tool_name or r.name) for r in no_policy})
        parts.append(f"no policy for step(s) {_steps([r.index for r in no_policy])}")
        fixes.append("register policies in a module and pass it with --policies MODULE: "
                     + ", ".join("@policies.llm" if kind == "llm" else f'@policies.{kind}("{name}")'
                                 for kind, name in names))
    if hidden:
        parts.append(f"the content of step(s) {_steps([r.index for r in hidden])} was not captured")
        fixes.append("capture message content (e.g. OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true) and record "
                     "the run again")
    if failed:
        reasons = _reasons(runner, [r.index for r in failed])
        parts.append(f"re-deciding step(s) {_steps([r.index for r in failed])} never produced a scored rollout"
                     + (f" ({reasons})" if reasons else ""))
        fixes.append("register the policies those rollouts needed")
    where = "No step could be re-decided: " + "; ".join(parts or ["the trajectory has no re-decidable step"]) + "."
    return {"where": where, "why": "Without re-deciding a step there is nothing to compare the recorded run with, "
                                   "so no step is blamed and no step is cleared.",
            "fix": "; ".join(fixes).capitalize() + "." if fixes else "Register policies with --policies MODULE."}


def _reasons(runner: RolloutRunner | None, indices: list[int]) -> str:
    if runner is None:
        return ""
    reasons = {r["reason"] for r in runner.done.values() if r["reason"] and r["step_index"] in indices}
    return "; ".join(sorted(reasons)[:3])


def _chain(rows: list[Row], result: AttributionResult) -> str:
    last = result.culprit.index if result.culprit else max(result.candidates, default=None)
    return " → ".join(f"{r.index}:{r.name}[{r.verdict}]" for r in rows
                      if last is None or r.index <= last or r.verdict not in ("not scored",))

