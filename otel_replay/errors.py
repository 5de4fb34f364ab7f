"""`OtelReplayError`: the base of every error otel-replay raises for its caller to handle.

Catch it to catch them all (a bad input file, a store that cannot be read or written, a policy or
verifier that cannot be loaded, an export that failed, ...); each subclass says which, and many
are also the built-in error of their kind (`SourceError` is a `ValueError` too).
"""

from __future__ import annotations


class OtelReplayError(Exception):
    """An error of otel-replay's that the caller can act on; its message says what and where."""
