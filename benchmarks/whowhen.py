"""Who&When failure attribution: frozen-log baselines scored by exact match, beside the upstream rule.

The dataset (`tests/fixtures/whowhen` of a source checkout: 58 Hand-Crafted Magentic-One logs,
126 Algorithm-Generated CaptainAgent logs) is imported into a temporary store with the real
importer, the same code path as `otel-replay import whowhen`; every prediction is read back from
the store (steps and the root span's `whowhen.*` labels), never from the JSON files.

Baselines need no model: the last / first step, the last / first agent turn (skipping the code
terminal and human observation steps), and a random step and agent (seeded, averaged over seeds).
Scored by exact match (step: index == int(mistake_step); agent: case-insensitive equality after
stripping a Hand-Crafted role's decoration) and, separately, by the upstream `evaluate.py` rule
(label is a case-sensitive substring of the prediction), which inflates step accuracy.

Interventional attribution (`otel_replay.attribution.Job` per trace) runs only with `policies`, a
module registering policies that call a real model; offline it is reported as skipped.
"""

from __future__ import annotations

import random
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from otel_replay.normalize.sources import files
from otel_replay.store.ingest import ingest
from otel_replay.trajectory import Store

SUBSETS = ("Hand-Crafted", "Algorithm-Generated")
SHORT = {"Hand-Crafted": "HC", "Algorithm-Generated": "AG"}
QUICK_LOGS = 10  # the first N logs of each subset (by file number) with --quick
W = 10  # table column width
SEEDS = 100  # random baseline: mean over seeds 0..SEEDS-1
DECORATION = re.compile(r" \((?:thought|termination condition|-> [^)]*)\)$")
OBSERVERS = {"computerterminal", "human"}  # names compared with case and non-letters removed
AGENT_RULE = ("agent: exact = the predicted step's author, with a trailing ' (thought)', ' (-> X)' or "
              "' (termination condition)' removed, equals mistake_agent ignoring case; upstream = mistake_agent "
              "is a case-sensitive substring of the author name as recorded (decoration kept)")
STEP_RULE = ("step: exact = predicted 0-based history index == int(mistake_step); upstream = the string "
             "mistake_step is a substring of str(predicted index), so a label '1' matches a prediction of 12")
SKIPPED = ("needs --policies with a real model (e.g. --policies otel_replay.replay.builtin.openai and "
           "OPENAI_API_KEY); no model is reachable offline")


def default_dataset() -> Path:
    """The copy in a source checkout (tests/fixtures/whowhen, MIT, see its README.md)."""
    return Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "whowhen"


@dataclass(frozen=True, slots=True)
class Log:
    """One imported log: its labels and its steps as (author as recorded, is an agent turn)."""

    subset: str
    file: int
    trace_id: str
    mistake_agent: str
    mistake_step: str
    ground_truth: str
    steps: tuple[tuple[str, bool], ...]


def strip_role(name: str) -> str:
    return DECORATION.sub("", name)


def exact_hit(pred_index: int, pred_agent: str, log: Log) -> tuple[bool, bool]:
    """(agent correct, step correct) by exact match."""
    return (strip_role(pred_agent).casefold() == log.mistake_agent.casefold(),
            pred_index == int(log.mistake_step))


def upstream_hit(pred_index: int, pred_agent: str, log: Log) -> tuple[bool, bool]:
    """(agent correct, step correct) by the upstream evaluate.py substring rule."""
    return (bool(log.mistake_agent) and log.mistake_agent in pred_agent,
            bool(log.mistake_step) and log.mistake_step in str(pred_index))


def _dataset_files(dataset: Path, quick: bool) -> list[Path]:
    if not dataset.is_dir():
        raise FileNotFoundError(f"Who&When dataset not found at {dataset} (expected {', '.join(SUBSETS)}/N.json)")
    chosen = []
    for subset in SUBSETS:
        logs = sorted((dataset / subset).glob("*.json"), key=lambda p: int(p.stem) if p.stem.isdigit() else 1 << 30)
        if not logs:
            raise FileNotFoundError(f"Who&When dataset at {dataset}: no {subset}/*.json logs")
        chosen += logs[:QUICK_LOGS] if quick else logs
    return chosen


def import_logs(root: Path, dataset: Path, quick: bool) -> list[Log]:
    """Import with the real reader and ingest, then read the logs back from the store."""
    chosen = _dataset_files(dataset, quick)  # raises a clear error naming a missing dataset
    paths = chosen if quick else [dataset]
    spans, logs = [], []
    for path in paths:
        batch = files.read("whowhen", path)
        if batch.skipped:
            raise ValueError(f"Who&When import skipped records: {batch.skipped[:3]}")
        spans += batch.spans
        logs += batch.logs
    ingest(root, spans, logs, source="import:whowhen", skip_existing=True)
    store = Store(root)
    by_trace: dict[str, list[tuple[str, bool]]] = {}
    for step in store.sql("select trace_id, step_index, kind, agent_name, tool_name from steps "
                          "where step_index is not null order by trace_id, step_index").to_pylist():
        author = (step["tool_name"] if step["kind"] == "tool" else step["agent_name"]) or ""
        observer = re.sub(r"[^a-z]", "", author.lower()) in OBSERVERS
        steps = by_trace.setdefault(step["trace_id"], [])
        if step["step_index"] != len(steps):
            raise ValueError(f"trace {step['trace_id']}: step {step['step_index']} after {len(steps)} steps")
        steps.append((author, step["kind"] == "llm" and not observer))
    out = []
    for row in store.sql("select trace_id, attributes from spans where parent_span_id is null").to_pylist():
        attrs = orjson.loads(row["attributes"])
        steps = by_trace.get(row["trace_id"], [])
        out.append(Log(attrs["whowhen.subset"], int(attrs["whowhen.file"]), row["trace_id"],
                       attrs["whowhen.mistake_agent"], attrs["whowhen.mistake_step"],
                       attrs.get("whowhen.ground_truth", ""), tuple(steps)))
    return sorted(out, key=lambda lg: (SUBSETS.index(lg.subset), lg.file))


Predictor = Callable[[Log, random.Random], tuple[int, str]]


def _pick(log: Log, agent_turn: bool, last: bool) -> tuple[int, str]:
    indices = [i for i, (_, turn) in enumerate(log.steps) if turn or not agent_turn]
    i = (indices[-1] if last else indices[0]) if indices else len(log.steps) - 1
    return i, log.steps[i][0]


def _random(log: Log, rng: random.Random) -> tuple[int, str]:
    agents = sorted({strip_role(a) for a, turn in log.steps if turn})
    return rng.randrange(len(log.steps)), rng.choice(agents) if agents else ""


BASELINES: dict[str, Predictor] = {
    "last step": lambda log, rng: _pick(log, False, True),
    "first step": lambda log, rng: _pick(log, False, False),
    "last agent turn": lambda log, rng: _pick(log, True, True),
    "first agent turn": lambda log, rng: _pick(log, True, False),
    f"random step + agent ({SEEDS} seeds)": _random,
}


def score(logs: list[Log], predict: Predictor, seeds: int = 1) -> dict[str, dict[str, dict[str, float]]]:
    """{subset: {"exact"|"upstream": {"agent", "step"}}} accuracies in [0, 1], mean over seeds."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for subset in SUBSETS:
        mine = [lg for lg in logs if lg.subset == subset]
        sums = {"exact": [0, 0], "upstream": [0, 0]}
        for seed in range(seeds):
            rng = random.Random(seed)
            for log in mine:
                index, agent = predict(log, rng)
                for rule, hit in (("exact", exact_hit), ("upstream", upstream_hit)):
                    a, s = hit(index, agent, log)
                    sums[rule][0] += a
                    sums[rule][1] += s
        n = max(1, len(mine) * seeds)
        out[subset] = {rule: {"agent": v[0] / n, "step": v[1] / n} for rule, v in sums.items()}
    return out


def interventional(store: Store, logs: list[Log], policies: str | None, rollouts: int = 10) -> dict[str, Any]:
    """Contrastive attribution per trace with a real model; the verifier wants the ground truth."""
    if policies is None:
        return {"skipped": SKIPPED}
    from otel_replay.attribution import Job, JobParams
    from otel_replay.replay import policies as registry

    registry.load_module(policies)
    out: dict[str, Any] = {"verifier": "contains:<ground_truth> (a crude proxy for the GAIA/AssistantBench scorer)",
                           "rollouts": rollouts, "errors": []}
    for subset in SUBSETS:
        hits, n = [0, 0], 0
        for log in (lg for lg in logs if lg.subset == subset):
            n += 1
            params = JobParams([log.trace_id], f"contains:{log.ground_truth}", rollouts=rollouts, policies=policies)
            try:
                culprit = Job(store, params, registry.registry.copy()).run()[0].culprit
            except Exception as exc:  # a failed trace counts as a miss and is reported
                out["errors"].append(f"{subset}/{log.file}: {type(exc).__name__}: {exc}"[:300])
                continue
            if culprit is not None:
                a, s = exact_hit(culprit["index"], culprit.get("agent") or "", log)
                hits[0] += a
                hits[1] += s
        out[subset] = {"agent": hits[0] / max(1, n), "step": hits[1] / max(1, n), "logs": n}
    return out


def run_whowhen_bench(quick: bool = False, dataset: Path | None = None, policies: str | None = None) -> dict[str, Any]:
    """Import the dataset into a temporary store and score the baselines (and, with policies, attribution)."""
    dataset = Path(dataset) if dataset is not None else default_dataset()
    root = Path(tempfile.mkdtemp(prefix="otel-replay-whowhen-"))
    try:
        logs = import_logs(root, dataset, quick)
        methods = {name: score(logs, fn, SEEDS if name.startswith("random") else 1) for name, fn in BASELINES.items()}
        return {"benchmark": "whowhen", "quick": quick, "dataset": str(dataset),
                "logs": {s: sum(1 for lg in logs if lg.subset == s) for s in SUBSETS},
                "steps": {s: sum(len(lg.steps) for lg in logs if lg.subset == s) for s in SUBSETS},
                "rules": {"agent": AGENT_RULE, "step": STEP_RULE}, "seeds": SEEDS, "methods": methods,
                "interventional": interventional(Store(root), logs, policies)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def format_whowhen_table(result: dict[str, Any]) -> str:
    """Rows = methods; columns = subset x {agent-level, step-level}, exact then the upstream rule (in %)."""
    cols = [f"{SHORT[s]} {lvl}" for s in SUBSETS for lvl in ("agent", "step")]
    width = max(len(m) for m in result["methods"]) + 2
    counts = ", ".join(f"{SHORT[s]} = {s} ({result['logs'][s]} logs)" for s in SUBSETS)
    lines = [f"Who&When failure attribution, frozen-log baselines (no model){' [quick]' if result['quick'] else ''}",
             counts, "",
             " " * width + "| " + "exact match (ours)".ljust(W * 4) + "| upstream substring rule (evaluate.py)",
             "method".ljust(width) + "| " + "".join(c.ljust(W) for c in cols) + "| " + "".join(c.ljust(W) for c in cols)]
    lines.append("-" * len(lines[-1]))
    for name, by_subset in result["methods"].items():
        cells = [[f"{100 * by_subset[s][rule][lvl]:.1f}".ljust(W) for s in SUBSETS for lvl in ("agent", "step")]
                 for rule in ("exact", "upstream")]
        lines.append(name.ljust(width) + "| " + "".join(cells[0]) + "| " + "".join(cells[1]))
    lines += ["", "Accuracy in % of logs; a log has one labelled (agent, step).",
              "- " + result["rules"]["step"], "- " + result["rules"]["agent"],
              "- agent turn = an llm step whose author is not the code terminal or the human; "
              "random = a uniform step and, independently, a uniform agent among the log's agent-turn authors"]
    inter = result["interventional"]
    if "skipped" in inter:
        lines.append(f"interventional attribution: skipped: {inter['skipped']}")
    else:
        lines.append("interventional attribution (exact match): " + ", ".join(
            f"{SHORT[s]} agent {100 * inter[s]['agent']:.1f} step {100 * inter[s]['step']:.1f}" for s in SUBSETS)
            + f"; {len(inter['errors'])} traces failed")
    return "\n".join(line.rstrip() for line in lines)
