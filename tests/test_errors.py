"""One base for every error otel-replay raises to its caller, caught once by the CLI."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import otel_replay
from otel_replay.errors import OtelReplayError

# control flow inside the engine and the receiver (a request's status), never raised to a caller
INTERNAL = {"CallRefused", "BudgetExhausted", "PolicyTimeout", "RequestError", "StoreUnwritable", "Throttled",
            "RequestTimeout"}


def _library_exceptions() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(otel_replay.__path__, "otel_replay."):
        if info.name.startswith(("otel_replay.testing", "otel_replay.bench", "otel_replay.pytest_plugin")):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == module.__name__ and name not in INTERNAL and not name.startswith("_")):
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_library_error_is_an_otel_replay_error():
    found = _library_exceptions()
    assert len(found) >= 15, sorted(found)
    assert [name for name, cls in found.items() if not issubclass(cls, OtelReplayError)] == []


def test_the_cli_turns_every_one_into_one_line():
    from otel_replay.cli.output import user_errors

    assert user_errors() == (OtelReplayError,)
    assert otel_replay.OtelReplayError is OtelReplayError
