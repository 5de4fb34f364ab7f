"""Reliability benchmark: what capture and the store survive, measured, not assumed.

1. Overload: GenAI spans with distinct 32 KB prompts offered at 10x what the writer stores, for
   60 s (5 s quick), in a child process, under a byte cap of 64 MB: the queue's share of the cap
   against the peak bytes queued, the drops counted, the growth of resident memory over its level
   just before the overload (after a warm-up) against the cap, whether it stays flat, and the
   slowest `span.end()` on the service's thread.
2. Store failures: disk full, read-only, permission denied, directory deleted, path not a
   directory, each while a service produces spans: exceptions seen by the service, warnings,
   spans dropped and counted, and whether capture resumed once the fault was undone.
3. Receiver: `otel-replay collect` (one process) whose store fills up (a private tmpfs, else
   RLIMIT_FSIZE) while OTLP batches arrive over HTTP and gRPC: requests acknowledged and refused
   (503 + Retry-After, UNAVAILABLE + RetryInfo), acknowledged spans against spans stored, and
   whether accepting resumes once the disk has room. With `--token`, rounds of 64 concurrent
   unauthenticated 15 MB gRPC calls beside an exporter with the token: collect's resident memory,
   how the flood was refused, and the exporter's results.
4. Crashes: `kill -9` of a writing process at random moments, 50 times (5 quick), ten into each store:
   spans lost beyond the unflushed queue (must be 0), the queue lost, whether the store opens.
5. Readers during writes: queries and whole-file reads while a writer writes; spans seen
   without their steps (a batch seen in part). Torn batches: `import` killed right after its
   payload segment and right after its span segment: rows visible, what `doctor --check` finds,
   whether a rerun stores every span and step.
6. Damaged segments: truncated and bit-flipped segments; queries over the rest; what `doctor` finds.
7. Fuzzing: inputs fuzzed (count, time), from `tests.harness.fuzzing.fuzz_summary` when
   that module exists.

Every child process runs the real SDK, processor and store; nothing here is simulated.
"""

from __future__ import annotations

import importlib
import os
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from otel_replay.capture.receiver import DEFAULT_MAX_BODY_MB
from tests.harness.corruption import corruption_trials
from tests.harness.crashes import concurrent_reads, run_crash_trials
from tests.harness.faults import KINDS, run_fault_scenario
from tests.harness.overload import run_overload
from tests.harness.receiver_faults import full_disk_acknowledgement, grpc_flood
from tests.harness.torn import torn_trials

MB = 1024 * 1024
FLOOD_RSS_BOUND = int(DEFAULT_MAX_BODY_MB * MB)
"""What refusing the unauthenticated flood may add to collect's resident memory: less than one
message of the largest size it accepts (it is refused before its message is read)."""
WINDOW_SLACK_S = 1.0  # on top of the flush interval: the failed write's own time and one request's gap


@dataclass(frozen=True)
class Sizes:
    overload_s: float
    cap_bytes: int
    payload_bytes: int
    factor: float
    fault_s: float
    kills: int
    max_kill_delay_s: float
    read_s: float
    damaged: int
    fuzz_s: float
    full_disk_hold_s: float  # how long collect's store stays full after its first refusal
    flood_calls: int  # concurrent unauthenticated gRPC calls per round
    flood_rounds: int
    flood_mb: float  # each call's message
    kinds: tuple[str, ...] = KINDS  # store failures to run


QUICK = Sizes(overload_s=5, cap_bytes=64 * MB, payload_bytes=131_072, factor=10, fault_s=0.5, kills=5,
              max_kill_delay_s=0.8, read_s=2, damaged=10, fuzz_s=5, full_disk_hold_s=0.5, flood_calls=64,
              flood_rounds=3, flood_mb=15)
FULL = Sizes(overload_s=60, cap_bytes=64 * MB, payload_bytes=131_072, factor=10, fault_s=1.5, kills=50,
             max_kill_delay_s=1.2, read_s=10, damaged=40, fuzz_s=60, full_disk_hold_s=5, flood_calls=64,
             flood_rounds=3, flood_mb=15)


def memory_bound(cap_bytes: int) -> int:
    """What resident growth over the level before the overload may reach: the cap itself (the queue
    admits its share, the rest is reserved for writing a batch and for the caches)."""
    return cap_bytes


def fuzz_figures(seconds: float) -> dict[str, Any]:
    """Inputs fuzzed (count, time) from `tests.harness.fuzzing.fuzz_summary`, when it can run.

    Returns {"available": False, "why": ...} without the module (or atheris), else
    {"available": True, "targets": {name: {"inputs", "seconds", "crashes", ...}}}.
    """
    if seconds <= 0:
        return {"available": False, "why": "not run (no time given)"}
    try:
        fuzzing = importlib.import_module("tests.harness.fuzzing")
        summary = fuzzing.fuzz_summary
    except (ImportError, AttributeError) as exc:
        return {"available": False, "why": f"tests.harness.fuzzing.fuzz_summary not installed ({exc})"}
    try:
        return {"available": True, "targets": summary(seconds)}
    except Exception as exc:  # noqa: BLE001 - e.g. FuzzingUnavailable without atheris: say so, do not fail the bench
        return {"available": False, "why": f"{type(exc).__name__}: {exc}"}


def fuzz_text(fuzz: dict[str, Any]) -> str:
    """One line: total inputs and time, crashes, inputs per target; then any target whose fuzzer did
    not run (a harness failure, not a crash) and any that needed a second start."""
    if not fuzz.get("available"):
        return f"not available: {fuzz.get('why')}"
    targets = fuzz["targets"]
    inputs = sum(int(t.get("inputs", 0)) for t in targets.values())
    seconds = sum(float(t.get("seconds", 0)) for t in targets.values())
    crashes = sum(int(t.get("crashes", 0)) for t in targets.values())
    each = ", ".join(f"{name} {int(t.get('inputs', 0)):,}" for name, t in targets.items())
    line = f"{inputs:,} inputs in {seconds:.0f} s over {len(targets)} targets, {crashes} crashes ({each})"
    failed = [f"{name}: {t['harness_error'][:300]}" for name, t in targets.items() if t.get("harness_error")]
    if failed:
        line += f"; {len(failed)} did not run (harness failure, not a crash): " + "; ".join(failed)
    restarted = [name for name, t in targets.items() if t.get("harness_retries") and not t.get("harness_error")]
    if restarted:
        line += f"; restarted after a harness failure: {', '.join(restarted)}"
    return line


def _failures(fault_s: float, kinds: tuple[str, ...]) -> dict[str, Any]:
    out = {}
    for kind in kinds:
        r = run_fault_scenario(kind, fault_s)
        out[kind] = {
            "mechanism": r["mechanism"], "euid": r["euid"], "exceptions": len(r["exceptions"]),
            "max_end_ms": r["max_end_ms"], "spans_during": r["during"], "lost_counted": r["lost"],
            "failure_warnings": len(r["failure_warnings"]), "warning": (r["failure_warnings"] or [""])[0],
            "reason": r["store_error"], "flush_during": r["flushed_during"], "resumed": r["flushed_after"]
            and r["visible"]["after"] == 50, "visible": r["visible"],
        }
    return out


def run_reliability_bench(quick: bool = False, store_dir: Path | None = None, sizes: Sizes | None = None
                          ) -> dict[str, Any]:
    """Every part in turn; `sizes` overrides QUICK / FULL (tests use tiny ones)."""
    sizes = sizes or (QUICK if quick else FULL)
    started = time.perf_counter()
    seconds: dict[str, float] = {}

    def timed(part: str, fn: Any, *args: Any) -> Any:
        begun = time.perf_counter()
        try:
            return fn(*args)
        finally:
            seconds[part] = time.perf_counter() - begun

    work = Path(store_dir) if store_dir is not None else Path(tempfile.mkdtemp(prefix="otel-replay-reliability-"))
    try:
        result: dict[str, Any] = {"quick": quick, "sizes": asdict(sizes), "machine": {
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "load_avg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}}
        result["overload"] = timed("overload", run_overload, work / "overload", sizes.overload_s, sizes.cap_bytes,
                                   sizes.payload_bytes, sizes.factor)
        result["overload"]["memory_bound"] = memory_bound(sizes.cap_bytes)
        result["failures"] = timed("failures", _failures, sizes.fault_s, sizes.kinds)
        result["receiver"] = {
            "full_disk": timed("full_disk", full_disk_acknowledgement, sizes.full_disk_hold_s),
            "flood": timed("flood", grpc_flood, sizes.flood_calls, sizes.flood_rounds, sizes.flood_mb)}
        crashes = timed("crashes", run_crash_trials, work / "crashes", sizes.kills, 0, sizes.max_kill_delay_s)
        crashes.pop("trials")
        result["crashes"] = crashes
        result["readers"] = timed("readers", concurrent_reads, work / "readers", sizes.read_s)
        result["torn"] = timed("torn", torn_trials, work / "torn")
        result["corruption"] = timed("corruption", corruption_trials, work / "corruption", sizes.damaged)
        result["fuzz"] = timed("fuzz", fuzz_figures, sizes.fuzz_s)
    finally:
        if store_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    result["seconds"] = seconds
    result["elapsed_s"] = time.perf_counter() - started
    return result


# -- the table ------------------------------------------------------------------------------------
def _verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def _overload_rows(o: dict[str, Any]) -> list[list[str]]:
    timeline = o["rss_growth_timeline"] or [o["rss_growth"]]
    creep = timeline[-1] - timeline[0]
    offered_x = o["offered_spans_per_s"] / o["writer_spans_per_s"]
    stored_x = o["offered_spans_per_s"] / max(o["accepted_spans_per_s"], 1e-9)
    return [
        ["overload: offered vs writer capacity", f"{offered_x:.1f}x ({o['offered_spans_per_s']:,.0f} vs "
         f"{o['writer_spans_per_s']:,.0f} spans/s of {o['payload_bytes'] // 1024} KB, the writer's rate alone) for "
         f"{o['seconds']:.0f} s; {o['accepted_spans_per_s']:,.0f}/s accepted, so {stored_x:.0f}x what it stored",
         f">= {o['factor'] * 0.8:g}x", _verdict(offered_x >= o["factor"] * 0.8)],
        ["overload: byte cap vs peak held", f"cap {o['cap_bytes'] / MB:.1f} MB, queue's share "
         f"{o['queue_bytes'] / MB:.1f} MB vs {o['peak_held_bytes'] / MB:.1f} MB held at peak", "peak <= share",
         _verdict(o["peak_held_bytes"] <= o["queue_bytes"] <= o["cap_bytes"])],
        ["overload: drops counted", f"{o['dropped']:,} dropped + {o['accepted']:,} accepted of {o['offered']:,}; "
         f"{o['written']:,} written", "all counted; written = accepted",
         _verdict(o["dropped"] + o["accepted"] == o["offered"] and o["written"] == o["accepted"])],
        ["overload: resident memory growth", f"{o['rss_growth'] / MB:.0f} MB over {o['rss_baseline'] / MB:.0f} MB "
         f"before the overload (growth after the first tenth {creep / MB:+.0f} MB)",
         f"<= {o['memory_bound'] / MB:.0f} MB (the cap), flat",
         _verdict(o["rss_growth"] <= o["memory_bound"] and creep <= 32 * MB)],
        ["overload: service thread span.end()", f"max {o['max_end_ms']:.1f} ms; {o['end_over_10ms']} of "
         f"{o['offered']:,} over 10 ms; {len(o['exceptions'])} exceptions", "no exception",
         _verdict(not o["exceptions"] and not o["internal_errors"])],
    ]


def _failure_rows(failures: dict[str, Any]) -> list[list[str]]:
    rows = []
    for kind, f in failures.items():
        ok = (not f["exceptions"] and f["failure_warnings"] == 1 and f["resumed"] and not f["flush_during"]
              and f["lost_counted"] == f["spans_during"])
        rows.append([f"store failure: {kind.replace('_', ' ')} ({f['mechanism']})",
                     f"{f['exceptions']} exceptions, max end {f['max_end_ms']:.1f} ms, {f['lost_counted']:,} of "
                     f"{f['spans_during']:,} spans dropped and counted, {f['failure_warnings']} warning "
                     f"({(f['reason'] or '').split(':')[0]}), resumed: {'yes' if f['resumed'] else 'no'}",
                     "0 exceptions, 1 warning, resumes", _verdict(ok)])
    return rows


def _receiver_rows(receiver: dict[str, Any] | None) -> list[list[str]]:
    if not receiver:
        return []
    d, f = receiver["full_disk"], receiver["flood"]
    during = d["answers"]["during"]
    interval = d["flush_interval_s"]
    return [
        [f"collect, store full ({d['mechanism']}): acknowledged vs stored", f"{d['acked_spans']:,} spans acknowledged "
         f"(200 / OK; {d['spans_per_request']} a request, HTTP and gRPC in turn), {d['stored_acked_spans']:,} stored; {d['lost_in_window']:,} lost, all acknowledged in the "
         f"{d['window_s']:.1f} s before the first refusal ({d['acked_in_fault_before_refusal']} requests acknowledged "
         f"after the disk filled); {d['lost_beyond_window']} lost after it", f"all stored but those acknowledged <= one flush interval "
         f"({interval:g} s, +{WINDOW_SLACK_S:g} s) before the writer's first failed write",
         _verdict(d["written_before"] and d["lost_beyond_window"] == 0 and d["acked_spans"] > 0
                  and d["window_s"] <= interval + WINDOW_SLACK_S)],
        ["collect, store full: answers while it is", f"{d['refused_with_retry']} of {d['during_after_refusal']} "
         f"requests from the first refusal on refused with a retry delay (HTTP 503 + Retry-After "
         f"{during.get('http 503', 0)}, gRPC UNAVAILABLE + RetryInfo {during.get('grpc UNAVAILABLE', 0)}) with "
         f"the disk full for {d['fault_s']:.1f} s; writer warnings: {d['failure_warnings']} failure, {d['resume_warnings']} resumed",
         "every one refused, with a retry delay",
         _verdict(d["refused_with_retry"] == d["during_after_refusal"] > 0)],
        ["collect, store full: after room is made", ("accepting again after " + f"{d['resumed_s']:.1f} s"
                                                     if d["resumed_s"] is not None else "not accepting again")
         + f"; {d['acked_after_mend']} requests acknowledged, {d['lost_after_mend']} of their spans lost; "
         f"collect exited {'0' if d['exit_ok'] else 'non-zero'}", "resumes, nothing lost, exits 0",
         _verdict(d["resumed_s"] is not None and d["acked_after_mend"] > 0 and d["lost_after_mend"] == 0
                  and d["exit_ok"])],
        ["gRPC flood without the token: collect's memory", f"VmRSS {f['rss_before'] / MB:.0f} -> "
         f"{f['rss_peak'] / MB:.0f} MB (+{f['rss_growth'] / MB:.0f} MB) under {f['rounds']} x {f['calls']} concurrent "
         f"{f['megabytes']:g} MB calls (one process, {f['samples']} samples)",
         f"< {FLOOD_RSS_BOUND / MB:.0f} MB (one largest message)", _verdict(f["rss_growth"] < FLOOD_RSS_BOUND)],
        ["gRPC flood without the token: refused; exporter with it", f"{f['unauthenticated']} of {f['flood_calls']} "
         f"refused UNAUTHENTICATED ({', '.join(f'{k} {v}' for k, v in sorted(f['codes'].items()))}); exporter with "
         f"the token: {f['legitimate_successes']} of {f['legitimate_exports']} exports succeeded, "
         f"{f['legitimate_stored']} of {f['legitimate_spans']} spans stored",
         "none accepted; every export succeeds and is stored",
         _verdict(f["flood_ok"] == 0 and f["legitimate_exports"] > 0 and f["exit_ok"]
                  and f["legitimate_successes"] == f["legitimate_exports"]
                  and f["legitimate_stored"] == f["legitimate_spans"])],
    ]


def _store_rows(result: dict[str, Any]) -> list[list[str]]:
    c, r, d, fuzz = result["crashes"], result["readers"], result["corruption"], result["fuzz"]
    fuzz_ok = "-" if not fuzz.get("available") else _verdict(not any(
        t.get("crashes") or t.get("harness_error") for t in fuzz["targets"].values()))
    return [
        ["crashes: kill -9 while writing", f"{c['kills']} kills ({c['mid_write_kills']} left a temp file), "
         f"{c['survived']} stores opened whole", "all open, no partial segment", _verdict(c["survived"] == c["kills"])],
        ["crashes: spans lost beyond the unflushed queue", f"max {c['lost_flushed_max']}, mean "
         f"{c['lost_flushed_mean']:.2f} per crash ({c['flushed_spans']:,} flushed spans checked)", "0",
         _verdict(c["lost_flushed_max"] == 0)],
        ["crashes: unflushed queue lost (allowed)", f"max {c['lost_unflushed_max']}, mean "
         f"{c['lost_unflushed_mean']:.1f} spans per crash", "-", "-"],
        ["readers during writes", f"{r['queries']:,} queries, {r['files_read']} segments read whole, "
         f"{len(r['errors'])} errors, count went down {r['count_went_down']} times", "0 errors",
         _verdict(not r["errors"] and not r["count_went_down"])],
        ["readers during writes: batches seen in part", f"{r.get('partial_batches_seen', 0)} of {r['queries']:,} "
         "queries saw a span without its step", "0", _verdict(not r.get("partial_batches_seen"))],
        *_torn_rows(result.get("torn")),
        ["damaged segments: found by doctor", f"{d['detected']} of {d['damaged']} ({d['by_mode']['truncate']} "
         f"truncated: {d['detected_by_mode']['truncate']}; {d['by_mode']['flip']} bit flips: "
         f"{d['detected_by_mode']['flip']}); undetected flips reading back identical: {d['undetected_harmless']}, "
         f"differing: {d['undetected_harmful']}", "every damaging one",
         _verdict(d["undetected_harmful"] == 0 and not d["false_positives"])],
        ["damaged segments: queries over the rest", ("answered" if d["query"]["answered"] else "refused, pointing "
         "at doctor") + f"; {d['skip_warnings']} skip warnings; after doctor: "
         f"{d['quarantined']} quarantined, store clean: {'yes' if d['clean_after_doctor'] else 'no'}",
         "answered, or refused naming doctor", _verdict(d["clean_after_doctor"] and (d["query"]["answered"] or
                                                                                     "doctor" in d["query"]["refused"]))],
        ["inputs fuzzed (count, time)", fuzz_text(fuzz), "no crash, every target ran", fuzz_ok],
    ]


def _torn_rows(torn: dict[str, Any] | None) -> list[list[str]]:
    if not torn:
        return []
    rows = []
    for k in torn["kills"]:
        ok = (k["killed"] and k["visible_rows"] == 0 and k["torn_found"] == 1 and k["rerun_ok"]
              and k["stored_spans"] == k["stored_steps"] == torn["spans"])
        rows.append([f"torn batch: import killed after its {k['after'].removesuffix('_rows')} segment",
                     f"{k['visible_rows']} rows visible; doctor --check found {k['torn_found']} torn batch; rerun "
                     f"stored {k['stored_spans']:,} spans and {k['stored_steps']:,} steps of {torn['spans']:,}",
                     "nothing visible, found, all stored on rerun", _verdict(ok)])
    return rows


def format_reliability_table(result: dict[str, Any]) -> str:
    """The figures as a Markdown table (readable as plain text), then a line on the run."""
    header = ["figure", "measured", "must hold", "result"]
    rows = [header, *_overload_rows(result["overload"]), *_failure_rows(result["failures"]),
            *_receiver_rows(result.get("receiver")), *_store_rows(result)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    machine = result["machine"]
    load = ", ".join(f"{x:.2f}" for x in machine.get("load_avg_start") or []) or "n/a"
    parts = ", ".join(f"{k} {v:.0f} s" for k, v in result.get("seconds", {}).items())
    lines += ["", f"{'Quick' if result['quick'] else 'Full'} run, {result['elapsed_s']:.0f} s ({parts}); {machine['cpus']} CPUs, "
              f"Python {machine['python']}, load average at start {load}. Latencies include GIL waits and "
              f"preemption on a shared machine; memory growth is the peak resident size (sampled every 50 ms) "
              f"less the size just before the overload, after a warm-up; collect's is its VmRSS (sampled every 20 ms) "
              "less its level after its first write."]
    return "\n".join(lines)
