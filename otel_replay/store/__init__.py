"""Store layer: Parquet segments on disk, DuckDB views over them, named SQL."""

from otel_replay.store.catalog import Catalog, StoreError, UnknownTrace
from otel_replay.store.layout import default_root
from otel_replay.store.location import StoreLocation

__all__ = ["Catalog", "StoreError", "StoreLocation", "UnknownTrace", "default_root"]
