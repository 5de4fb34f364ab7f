"""`messages_from_json`: the capture path's parse and canonicalization of message JSON gives what
`canonical_messages(parse_json(text), owned=True)` gives, integers past 64 bits included."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from otel_replay.normalize.content import from_semconv_attributes
from otel_replay.normalize.messages import (
    canonical_bytes,
    canonical_messages,
    messages_from_json,
    parse_json,
)


def _text(content: Any) -> dict[str, Any]:
    return {"role": "user", "parts": [{"type": "text", "content": content}]}


def _call(arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "parts": [{"type": "tool_call", "id": "c", "name": "f", "arguments": arguments}]}


CASES = [
    [_text("hello"), _call({"q": "x"})],
    [_text("plain"), _call({"big": 2**70, "low": -(2**64), "small": 5, "real": 1e300})],  # a huge one second
    [_call({"big": 2**64 + 1}), _text("after it")],
    [_call({"edge": 2**63, "under": 2**63 - 1, "u64": 2**64 - 1})],
    [{"role": "assistant", "finish_reason": 10**30, "parts": [{"type": "text", "content": "x"}]}],
    [_text("a + b, c+d, e+f and 1e+19 written as text")],  # '+' in text: walked, nothing found
    [_call({"float": 1e19, "neg": -1.5e300, "small": 2.5})],  # real floats of that size
    {"role": "user", "parts": [{"type": "text", "content": "one message, not a list"}]},
    [{"role": "user", "content": "openai shape", "tool_calls": [{"id": "t", "function": {"name": "f",
                                                                                         "arguments": "{\"n\": 123456789012345678901}"}}]}],
    [_text(None), "a bare string", 12345678901234567890123, None],
]


@pytest.mark.parametrize("value", CASES)
def test_messages_from_json_is_canonical_messages_of_parse_json(value):
    text = json.dumps(value)
    expected_parsed = parse_json(text)
    expected = canonical_messages(parse_json(text), True)
    messages, parsed = messages_from_json(text)
    assert messages == expected
    assert parsed == expected_parsed
    assert [canonical_bytes(m) for m in messages] == [canonical_bytes(m) for m in expected]  # stored alike


@pytest.mark.parametrize("text", ["12345678901234567890123", "1e+400", "not json", "[1, 2", "{\"a\": NaN}", "[]", "null"])
def test_messages_from_json_raises_or_returns_as_the_slow_path(text):
    try:
        expected: Any = canonical_messages(parse_json(text), True)
    except ValueError as exc:
        with pytest.raises(ValueError, match=str(exc)):
            messages_from_json(text)
    else:
        assert messages_from_json(text)[0] == expected


def test_integers_past_64_bits_keep_every_digit_in_a_step_and_its_finish_reasons():
    inputs = [_call({"big": 2**70})]
    outputs = [{"role": "assistant", "finish_reason": 2**65, "parts": [{"type": "text", "content": "done"}]}]
    content, finish = from_semconv_attributes({"gen_ai.input.messages": json.dumps(inputs),
                                               "gen_ai.output.messages": json.dumps(outputs)})
    assert content.inputs[0]["parts"][0]["arguments"] == {"big": 2**70}
    assert type(content.inputs[0]["parts"][0]["arguments"]["big"]) is int
    assert finish == [str(2**65)]


def test_a_float_of_2_to_the_63_or_more_is_written_with_a_plus():
    """What the check on each message's bytes relies on: orjson writes such a float as 9.2...e+18."""
    for value in (float(2**63), -float(2**63), 1e19, 1.8446744073709552e19, 1e300, -1e300, float(10**30)):
        assert b"+" in orjson.dumps(value)
