"""The gate: a failing agent test names the step that made the agent fail.

    pytest examples/pytest_gate            # one test passes, one fails with the culprit named

`@pytest.mark.otel_replay` captures the agent run the test makes; when the test fails, the run is
attributed and the report shows the culprit, its interval, WHAT / WHERE / WHY / FIX and a
validated repair. The policies depend on a fixture (the model's address), so the test hands them
over with `otel_replay_capture.set`.
"""

from __future__ import annotations

import pytest
from agent import answer, policies, refunded


@pytest.mark.otel_replay(verifier=refunded, max_policy_calls=2000)
def test_a_late_order_is_refunded(model, client, otel_replay_capture):
    otel_replay_capture.set(policies=policies(model.base_url))
    reply = answer(client)
    assert refunded(reply), reply


@pytest.mark.otel_replay(verifier=refunded, max_policy_calls=2000)
def test_a_late_order_is_refunded_on_a_bad_day(model, client, otel_replay_capture):
    otel_replay_capture.set(policies=policies(model.base_url))
    model.model.plant("wrong_order_id")  # the model copies the order id wrong this time
    reply = answer(client)
    assert refunded(reply), reply
