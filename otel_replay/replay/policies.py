"""The policy registry: who re-decides a step of each kind (and, optionally, of each name).

    from otel_replay import policies

    @policies.llm                    # every llm step
    def chat(step, inputs, rng): ...
    @policies.tool("get_weather")    # one tool; @policies.tool for every tool
    def get_weather(arguments, rng): ...

Resolution: `kind:name` beats `kind`. Policies may be `async`. They register from a module
(`--policies myproj.policies`, imported for its decorators) or the entry-point group
`otel_replay.policies` (each entry point names a module or a callable taking the registry).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, overload

from otel_replay.errors import OtelReplayError

KINDS = ("llm", "tool", "retrieval", "embedding")
ENTRY_POINT_GROUP = "otel_replay.policies"
Policy = Callable[..., Any]


class PolicyError(OtelReplayError):
    """A policy could not be loaded, or broke its contract."""


@dataclass
class Registry:
    """Policies by `kind` and `kind:name`."""

    _by_key: dict[str, Policy] = field(default_factory=dict)
    # resolve()'s answers (a rollout resolves once per policy call); replaced, never cleared, on a
    # change, so a resolve racing with register() can only fill the discarded dict
    _resolved: dict[tuple[str, str | None, str | None], Policy | None] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def register(self, kind: str, name: str | None, fn: Policy) -> Policy:
        if kind not in KINDS:
            raise PolicyError(f"unknown step kind {kind!r}; use one of {', '.join(KINDS)}")
        self._by_key[f"{kind}:{name}" if name else kind] = fn
        self._resolved = {}
        return fn

    def resolve(self, kind: str, name: str | None, model: str | None = None) -> Policy | None:
        """`kind:name`, then `kind:model` (llm steps), then `kind`; None when nothing applies."""
        resolved = self._resolved
        try:
            return resolved[kind, name, model]
        except KeyError:
            pass
        fn = None
        for key in (f"{kind}:{name}" if name else None, f"{kind}:{model}" if model else None, kind):
            if key and key in self._by_key:
                fn = self._by_key[key]
                break
        resolved[kind, name, model] = fn
        return fn

    def keys(self) -> list[str]:
        return sorted(self._by_key)

    def clear(self) -> None:
        self._by_key.clear()
        self._resolved = {}

    def copy(self) -> Registry:
        return Registry(dict(self._by_key))

    def _decorator(self, kind: str, arg: Any) -> Any:
        if callable(arg):
            return self.register(kind, None, arg)

        def wrap(fn: Policy) -> Policy:
            return self.register(kind, arg, fn)

        return wrap


registry = Registry()


@overload
def llm(arg: Policy) -> Policy: ...
@overload
def llm(arg: str | None = None) -> Callable[[Policy], Policy]: ...
def llm(arg: Any = None) -> Any:
    """Register an llm policy `(step, inputs, rng) -> output messages`."""
    return registry._decorator("llm", arg)


def tool(arg: Any = None) -> Any:
    """Register a tool policy `(arguments, rng) -> result`."""
    return registry._decorator("tool", arg)


def retrieval(arg: Any = None) -> Any:
    """Register a retrieval policy `(arguments, rng) -> documents`."""
    return registry._decorator("retrieval", arg)


def embedding(arg: Any = None) -> Any:
    return registry._decorator("embedding", arg)


def load_module(spec: str) -> None:
    """Import a module (or `module:function` taking the registry) so its policies register."""
    module_name, _, attr = spec.partition(":")
    try:
        # a module imported before registers again (its decorators run on import)
        module = importlib.reload(sys.modules[module_name]) if module_name in sys.modules and not attr \
            else importlib.import_module(module_name)
    except ImportError as exc:
        raise PolicyError(f"cannot import policies module {module_name!r}: {exc}") from exc
    if attr:
        hook = getattr(module, attr, None)
        if not callable(hook):
            raise PolicyError(f"{spec!r}: {module_name} has no callable {attr!r}")
        hook(registry)


def load_entry_points() -> list[str]:
    """Load every `otel_replay.policies` entry point; returns their names."""
    loaded = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        target = ep.load()
        if callable(target) and not isinstance(target, type(importlib)):
            target(registry)
        loaded.append(ep.name)
    return loaded
