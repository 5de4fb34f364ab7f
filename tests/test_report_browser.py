"""The HTML report in a real browser: headless Chromium driven over the DevTools protocol.

Three reports, each from a real stored trace and a real attribution job: the demo's (written by
`otel-replay demo`), one whose messages, tool name, tool arguments, span and agent names carry
markup meant to run script, and a 61-step pipeline (once with its culprit found, once with a
budget too small to decide). The browser loads each page at 1280x800 and reports console errors,
script dialogs, script elements and where the culprit is. Chromium is driven over
`--remote-debugging-pipe` (NUL-separated JSON on fds 3 and 4), so no websocket client is needed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from otel_replay.attribution import Job, JobParams
from otel_replay.cli import main as cli
from otel_replay.export.html import CSP, render_html, report_fragment
from otel_replay.export.html_conversation import diff_html
from otel_replay.export.job import stored_reports
from otel_replay.replay.policies import Registry
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.model import ChatRequest, SimulatedModel, ToolCall
from otel_replay.testing.planted import Topology, planted_registry, record_planted, replay_model
from otel_replay.testing.recording import recording, run_tool_loop
from otel_replay.trajectory import Store
from tests.helpers import REPO, needs_openai_v2

pytestmark = needs_openai_v2  # every test here records or runs the demo's agent (openai-v2)

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), shutil.which("google-chrome"))
                 if p), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")
WIDTH, HEIGHT = 1280, 800
HOSTILE = '</pre><script>alert(1)</script>"><img src=x onerror=alert(2)></style></title><svg onload=alert(3)>'
TOOL = "lookup</pre><script>alert(4)</script>"
TRACE_URL = "http://tempo.example:3200/explore/trace/{trace_id}"
SCREENSHOT = REPO / "docs" / "report.png"


class Chromium:
    """One headless Chromium; `load(path)` opens a page in a fresh tab and reports what happened."""

    def __init__(self, profile: Path) -> None:
        ours_r, theirs_w = os.pipe()  # the browser writes replies on its fd 4
        theirs_r, ours_w = os.pipe()  # and reads commands on its fd 3

        def wire() -> None:
            r, w = os.dup(theirs_r), os.dup(theirs_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        args = [CHROMIUM, "--headless", "--remote-debugging-pipe", f"--user-data-dir={profile}", "--no-first-run",
                "--disable-gpu", "--disable-extensions", "--disable-background-networking", "--hide-scrollbars",
                *(["--no-sandbox"] if os.geteuid() == 0 else []), "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=wire, close_fds=False,  # noqa: PLW1509 - dup2 only
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(theirs_r)
        os.close(theirs_w)
        self._r, self._w, self._buf, self._id = ours_r, ours_w, b"", 0

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            if not select.select([self._r], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise EOFError("chromium exited")
            self._buf += chunk
        message, self._buf = self._buf.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             events: list[dict[str, Any]] | None = None, timeout: float = 30) -> dict[str, Any]:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {}, **({"sessionId": session} if session else {})}
        os.write(self._w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            if events is not None:
                events.append(reply)

    def load(self, page: Path, script: str, screenshot: Path | None = None) -> tuple[Any, list[dict[str, Any]]]:
        """Open `page` at 1280x800; returns (the value of `script` evaluated in it, the page's events)."""
        events: list[dict[str, Any]] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.send(domain, session=session, events=events)
        self.send("Emulation.setDeviceMetricsOverride", {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=session, events=events)
        self.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session, events=events)
        deadline = time.monotonic() + 30
        while not any(e.get("method") == "Page.loadEventFired" for e in events):
            event = self._read(deadline)
            events.append(event)
            if event.get("method") == "Page.javascriptDialogOpening":  # would block the load: dismiss, keep the record
                self.send("Page.handleJavaScriptDialog", {"accept": False}, session=session, events=events)
        value = self.send("Runtime.evaluate", {"expression": script, "returnByValue": True}, session=session,
                          events=events)["result"].get("value")
        if screenshot is not None:
            data = self.send("Page.captureScreenshot", {"format": "png"}, session=session, events=events)["data"]
            screenshot.write_bytes(base64.b64decode(data))
        self.send("Target.closeTarget", {"targetId": target}, events=events)
        return json.loads(value), [e for e in events if e.get("sessionId") in (None, session)]

    def close(self) -> None:
        with contextlib.suppress(EOFError, TimeoutError, OSError):
            self.send("Browser.close", timeout=10)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._r)
        os.close(self._w)


# What the page looks like to a reader, measured in the page (no script of ours is in the page itself).
PROBE = """JSON.stringify((() => {
  const box = (sel) => { const e = document.querySelector(sel); if (!e) return null;
                         const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom}; };
  const onAttrs = [...document.querySelectorAll('*')].filter(e => [...e.attributes].some(a => /^on/i.test(a.name)));
  return {title: document.title, scripts: document.querySelectorAll('script').length,
          handlers: onAttrs.map(e => e.tagName), iframes: document.querySelectorAll('iframe,object,embed').length,
          csp: document.querySelector('meta[http-equiv="Content-Security-Policy"]')?.content,
          text: document.body.innerText, all: document.body.textContent, scrollY: window.scrollY, innerHeight: window.innerHeight,
          culprit: box('#culprit'), culpritHeading: box('#culprit h2'), undecided: box('#undecided h2'),
          open: [...document.querySelectorAll('details.step[open]')].map(e => e.id),
          steps: document.querySelectorAll('details.step').length,
          links: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
          del: [...document.querySelectorAll('.diff del')].map(e => e.textContent),
          ins: [...document.querySelectorAll('.diff ins')].map(e => e.textContent),
          legend: [...document.querySelectorAll('ul.legend li b')].map(e => e.textContent)};
})())"""


def problems(events: list[dict[str, Any]]) -> list[str]:
    """Console errors, uncaught exceptions and script dialogs among a page's events."""
    out = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
            out.append(params["entry"]["text"])
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert", "warning"):
            out.append(str(params.get("args")))
        elif method in ("Runtime.exceptionThrown", "Page.javascriptDialogOpening"):
            out.append(f"{method}: {params}")
    return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    chromium = Chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield chromium
    chromium.close()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`otel-replay demo` in a fresh store, its page written with a trace link: (store, page, report)."""
    root = tmp_path_factory.mktemp("demo")
    page = root / "demo.html"
    out = CliRunner().invoke(cli, ["--store", str(root / "store"), "demo", "--html", str(page), "--trace-url", TRACE_URL])
    assert out.exit_code == 0, out.output
    job_id = out.output.split(" job ")[-1].split()[0]
    (report,) = stored_reports(Store(root / "store"), job_id)
    return Store(root / "store"), page, report


def _hostile_script(recorded: bool):
    """The hostile agent's model: calls TOOL with hostile arguments, answers with hostile text.
    Re-decided, it mostly asks for the harmless query, and then answers OK."""
    def script(request: ChatRequest, rng) -> Any:
        if not request.tool_results():
            query = HOSTILE if recorded or rng.random() < 0.1 else "weather"
            return ToolCall(TOOL, {"query": query, HOSTILE: [HOSTILE]})
        result = json.loads(request.tool_results()[-1][1])
        return "OK: sunny" if result["query"] == "weather" else f"FAIL {HOSTILE}"
    return script


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A recorded run whose prompts, tool name, tool arguments, span and agent names are HOSTILE, attributed."""
    root = tmp_path_factory.mktemp("hostile")
    tools = [{"type": "function", "function": {"name": TOOL, "description": HOSTILE, "parameters": {"type": "object"}}}]

    def tool(query: str, **_: Any) -> str:
        return json.dumps({"query": query, "note": HOSTILE})

    with recording(root, HOSTILE, SimulatedModel(_hostile_script(True))) as (client, tracer):
        messages = [{"role": "system", "content": HOSTILE}, {"role": "user", "content": f"weather? {HOSTILE}"}]
        _, trace_id = run_tool_loop(client, tracer, f"agent{HOSTILE}", messages, tools, {TOOL: tool})
    store = Store(root)
    assert store.trajectory(trace_id).steps[1].name == TOOL  # stored as sent: only the page escapes it
    with SimulatedModelServer(SimulatedModel(_hostile_script(False))) as server:
        from otel_replay.replay.builtin.openai_policy import openai_policy

        registry = Registry()
        registry.register("llm", None, openai_policy(base_url=server.base_url, api_key="sim", tools=tools))
        registry.register("tool", TOOL, lambda arguments, rng: tool(**{"query": arguments["query"]}))
        job = Job(store, JobParams([trace_id], "contains:OK", repair=True, concurrency=4), registry)
        (result,) = job.run()
    return store, result.report()


LONG = Topology("sixty-one-steps", {29: "bad"}, lambda c: c[29] == "bad", culprit=58, turns=30, effect=0.9)


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    """A 61-step pipeline with its culprit at step 58: (store, culprit found, left undecided by a budget)."""
    root = tmp_path_factory.mktemp("long")
    trace_id = record_planted(root, LONG)
    reports = []
    for budget in (None, 40):  # 40 calls: step 60 tested but undecided, the rest untested
        with SimulatedModelServer(replay_model(LONG)) as server:
            params = JobParams([trace_id], "otel_replay.testing.planted:ok", concurrency=4, max_policy_calls=budget)
            (result,) = Job(Store(root), params, planted_registry(LONG, server.base_url)).run()
        reports.append(result.report())
    return Store(root), *reports


def _page(tmp_path: Path, name: str, report: dict[str, Any], store: Store, strip_csp: bool = False) -> Path:
    text = render_html(report, store.trajectory(report["trace_id"]), trace_url=TRACE_URL)
    if strip_csp:  # the escaping alone, without the policy that would also stop a missed one
        text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", text)
        assert "Content-Security-Policy" not in text
    path = tmp_path / name
    path.write_text(text)
    return path


def _assert_culprit_on_first_screen(seen: dict[str, Any]) -> None:
    assert seen["scrollY"] == 0 and seen["innerHeight"] == HEIGHT
    assert 0 <= seen["culprit"]["top"] < HEIGHT, seen["culprit"]
    heading = seen["culpritHeading"]
    assert heading["top"] >= 0 and heading["bottom"] <= HEIGHT, heading


def test_fragment_diff_and_link_without_a_browser(demo):
    store, _, report = demo
    fragment = report_fragment(report)  # what a notebook gets: no page, no trajectory needed
    assert not re.search(r"<(html|head|body|meta)\b", fragment) and fragment.startswith('<div class="orr">')
    assert f'id="step-{report["culprit"]["index"]}" open' in fragment and "<svg" in fragment
    page = render_html(report, store.trajectory(report["trace_id"]))
    assert fragment.split("<header>")[0] in page and f'content="{CSP}"' in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # no link unless configured
    assert diff_html("lookup(id=\"A-1024\")", "lookup(id=\"A-1042\")") == (
        '<div class="code diff">lookup(id=&quot;A-<del>1024</del><ins>1042</ins>&quot;)</div>')
    for unsafe in ("javascript:alert(1)//{trace_id}", "data:text/html,x{trace_id}"):
        assert "javascript:" not in render_html(report, trace_url=unsafe) and "data:text" not in render_html(
            report, trace_url=unsafe)


def test_report_command_links_the_trace(demo, tmp_path, monkeypatch):
    """`report --trace-url` (or $OTEL_REPLAY_TRACE_URL) re-renders with the link; a URL that is not
    http(s) or has no {trace_id} is a usage error naming the option."""
    store, _, report = demo
    args = ["--store", str(store.root), "report", "--job", report["job_id"], "--trace-id", report["trace_id"],
            "--html", str(tmp_path / "r.html")]
    out = CliRunner().invoke(cli, [*args, "--trace-url", "https://grafana.example/trace/{trace_id}?x=1&y=2"])
    assert out.exit_code == 0, out.output
    assert f'href="https://grafana.example/trace/{report["trace_id"]}?x=1&amp;y=2"' in (tmp_path / "r.html").read_text()
    monkeypatch.setenv("OTEL_REPLAY_TRACE_URL", "http://jaeger:16686/trace/{trace_id}")
    assert CliRunner().invoke(cli, args).exit_code == 0
    assert f'href="http://jaeger:16686/trace/{report["trace_id"]}"' in (tmp_path / "r.html").read_text()
    for bad in ("javascript:alert(1)//{trace_id}", "http://jaeger/trace/"):
        out = CliRunner().invoke(cli, [*args, "--trace-url", bad])
        assert out.exit_code == 2 and "--trace-url" in out.output and "{trace_id}" in out.output, out.output


@needs_chromium
def test_demo_report_reads_in_the_browser(demo, browser, tmp_path):
    """The page `otel-replay demo` wrote: no console error, the culprit on the first screen with its
    repair as a diff, the other steps folded, the legend, the trace link; its screenshot is the docs' one."""
    store, page, report = demo
    shot = tmp_path / "report.png"
    seen, events = browser.load(page, PROBE, screenshot=shot)
    assert problems(events) == []
    assert seen["title"] == f"otel-replay · {report['trace_id']}" and seen["scripts"] == 0 and seen["csp"] == CSP
    _assert_culprit_on_first_screen(seen)
    culprit = report["culprit"]["index"]
    assert seen["open"] == [f"step-{culprit}"] and seen["steps"] == len(store.trajectory(report["trace_id"]).steps)
    assert seen["del"] == ["1024"] and seen["ins"] == ["1042"]  # the repair: A-1024 -> A-1042
    assert 'lookup_order(order_id="A-1024")' in seen["text"] and "ASSISTANT" in seen["text"]
    assert {"decisive", "locked-in"} <= set(seen["legend"])
    assert TRACE_URL.replace("{trace_id}", report["trace_id"]) in seen["links"]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == WIDTH
    if not SCREENSHOT.exists() or os.environ.get("OTEL_REPLAY_UPDATE_SCREENSHOT"):
        SCREENSHOT.write_bytes(png)


@needs_chromium
@pytest.mark.parametrize("strip_csp", [False, True], ids=["with-csp", "escaping-alone"])
def test_hostile_text_stays_text(hostile, browser, tmp_path, strip_csp):
    """Markup in messages, the tool's name and arguments, span, agent and service names: shown, never run,
    with or without the Content-Security-Policy."""
    store, report = hostile
    page = _page(tmp_path, "hostile.html", report, store, strip_csp=strip_csp)
    seen, events = browser.load(page, PROBE)
    assert problems(events) == []  # a CSP violation (a missed escape) would be a console error
    assert seen["title"] == f"otel-replay · {report['trace_id']}"  # `</title>` in content did not end it early
    assert seen["scripts"] == 0 and seen["handlers"] == [] and seen["iframes"] == 0
    text = seen["all"]  # folded steps included
    assert text.count(HOSTILE) >= 5  # system and user prompts, the answer, tool arguments and result, names
    assert f"agent{HOSTILE}" in text and f"{TOOL}(query=" in text


@pytest.mark.slow
@needs_chromium
def test_sixty_one_steps_culprit_on_the_first_screen(long_run, browser, tmp_path):
    store, found, _ = long_run
    assert found["verdict"] == "culprit-found" and found["culprit"]["index"] == LONG.culprit
    seen, events = browser.load(_page(tmp_path, "long.html", found, store), PROBE)
    assert problems(events) == [] and seen["scripts"] == 0
    _assert_culprit_on_first_screen(seen)
    assert seen["steps"] == 61 and seen["open"] == [f"step-{LONG.culprit}"]


@pytest.mark.slow
@needs_chromium
def test_undecided_says_what_would_decide_it(long_run, browser, tmp_path):
    store, _, undecided = long_run
    assert undecided["verdict"] == "undecided" and undecided["budget_exhausted"]
    seen, events = browser.load(_page(tmp_path, "undecided.html", undecided, store), PROBE)
    assert problems(events) == [] and seen["culprit"] is None and seen["open"] == []
    assert seen["undecided"]["top"] >= 0 and seen["undecided"]["bottom"] <= HEIGHT
    (candidate,) = undecided["candidates"]
    row = next(r for r in undecided["steps"] if r["index"] == candidate)
    assert row["verdict"] == "undecided" and row["to_decide"]
    first_screen = seen["text"].split("Timeline")[0]  # the card above the timeline says what would decide it
    assert f"About {row['to_decide']} rollouts per plan would decide it" in first_screen
    assert f"raise --max-policy-calls and continue with --resume {undecided['job_id']}" in first_screen
    assert "Not tested: steps 0–" in first_screen and "To decide:" in first_screen
