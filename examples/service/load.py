"""Send support questions to the example service and count the answers that refunded correctly.

    python examples/service/load.py --url http://127.0.0.1:8080 [-n 20] [--record outcomes.json]

Every question is a customer owed a refund for late order A-1042, asked in different words (so
the simulated model samples independently for each). An answer is correct when the verifier of
the support agent, `otel_replay.testing.support_agent:refunded`, passes it. `--record` writes the
trace ids of the passing and failing requests (the service returns each request's trace id).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

from otel_replay.testing.support_agent import refunded

OPENINGS = ("Hi,", "Hello,", "Good morning,", "Hey there,", "Hi team,")
ASKS = ("Can I get my money back?", "I'd like a refund please.", "Could you refund me?",
        "What can you do about it?")


def question(i: int) -> str:
    """The i-th customer's question (deterministic, varied wording)."""
    return (f"{OPENINGS[i % len(OPENINGS)]} my order A-1042 arrived {2 + i % 6} days late. "
            f"{ASKS[i % len(ASKS)]} (ticket #{1000 + i})")


def ask(url: str, text: str, timeout: float = 30.0) -> dict[str, str]:
    """POST /ask; returns {"answer", "trace_id"}."""
    request = urllib.request.Request(f"{url.rstrip('/')}/ask", data=json.dumps({"question": text}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - a local http URL
        return json.loads(response.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the service (default http://127.0.0.1:8080)")
    parser.add_argument("-n", "--requests", type=int, default=20, help="how many questions (default 20)")
    parser.add_argument("--record", type=Path, help="write {passed: [trace ids], failed: [trace ids]} here")
    args = parser.parse_args()
    passed: list[str] = []
    failed: list[str] = []
    for i in range(args.requests):
        reply = ask(args.url, question(i))
        ok = refunded(reply["answer"]) >= 0.5
        (passed if ok else failed).append(reply["trace_id"])
        if not ok:
            print(f"  request {i}: trace {reply['trace_id']} FAILED: {reply['answer']}")
    print(f"{len(passed)}/{args.requests} answers refunded correctly, {len(failed)} failed")
    if args.record:
        args.record.write_text(json.dumps({"passed": passed, "failed": failed}, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
