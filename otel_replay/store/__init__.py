"""Store layer: Parquet segments on disk, DuckDB views over them, named SQL.

Names load on first use: a service that only writes (capture) never imports DuckDB.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_replay.store.catalog import Catalog, QueryError, Session, StoreError, UnknownTrace
    from otel_replay.store.layout import default_root
    from otel_replay.store.location import StoreLocation

_WHERE = {"Catalog": "otel_replay.store.catalog", "StoreError": "otel_replay.store.catalog",
          "QueryError": "otel_replay.store.catalog", "Session": "otel_replay.store.catalog",
          "UnknownTrace": "otel_replay.store.catalog", "default_root": "otel_replay.store.layout",
          "StoreLocation": "otel_replay.store.location"}
__all__ = ["Catalog", "QueryError", "Session", "StoreError", "StoreLocation", "UnknownTrace", "default_root"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
