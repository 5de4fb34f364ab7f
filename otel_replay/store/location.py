"""Where a store lives: a local directory, or a URL on any fsspec filesystem (`s3://`, `gs://`, ...).

A local path or a `file:///` URL is a `Path` and keeps the local fast path: temp file, fsync,
`os.replace`, modes 0700/0600. Anything else goes through fsspec (`pip install 'otel-replay[s3]'`
for S3; gcsfs, adlfs, ... for the others), and DuckDB reads it through the same filesystem object
(`register_filesystem`), so no DuckDB extension is downloaded.

On object storage (S3, GCS, Azure) a rename is a copy plus a delete, so "temp name + rename" is
not atomic there. What is atomic is one PUT: an object becomes visible whole or not at all (a
multipart upload, used above 100 MB, also appears only when it completes). So a segment is
serialized in memory and written in one put under its final name. Other fsspec filesystems (SFTP,
HDFS, ...) do have an atomic rename: a temp name outside the read glob, then `mv`.
Credentials and endpoints come from the filesystem's usual sources (`AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, `~/.aws`, ...); file modes do not apply off the local disk.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Union
from urllib.parse import unquote, urlparse

DEFAULT_STORE = "otel-replay-store"
STORE_ENV = "OTEL_REPLAY_STORE"
DIR_MODE = 0o700
FILE_MODE = 0o600
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2"})
"""Protocols whose writes are one PUT under the final name (no rename, no directories)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One Parquet file of a table: `<table>/day=<day>/<name>` under the store root."""

    table: str
    day: str
    name: str
    size: int

    @property
    def rel(self) -> str:
        return f"{self.table}/day={self.day}/{self.name}"


def _local_path(url: str) -> Path | None:
    """The local directory a store string names, or None for a remote URL."""
    if "://" not in url:
        return Path(url)
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"store URL {url!r}: a file:// URL names a local path (file:///abs/path)")
        return Path(unquote(parsed.path))
    return None


class StoreLocation:
    """The root of a store, local or remote, with the few file operations the store layer needs.

    :param url: a directory, `file:///abs/path`, or `<protocol>://bucket/prefix`.
    :param filesystem: an fsspec filesystem to use instead of resolving the URL (a pyarrow
        filesystem is wrapped with `fsspec.implementations.arrow.ArrowFSWrapper`).
    :param storage_options: keyword arguments for the fsspec filesystem (endpoint, credentials).
    """

    __slots__ = ("url", "local", "_fs", "_fs_pid", "_path", "_options")

    def __init__(self, url: str | os.PathLike[str], *, filesystem: Any = None,
                 storage_options: dict[str, Any] | None = None) -> None:
        self.url = os.fspath(url)
        self.local = None if filesystem is not None else _local_path(self.url)
        self._fs = _as_fsspec(filesystem) if filesystem is not None else None
        self._fs_pid = None if filesystem is None else -1  # -1: the caller's filesystem, kept across forks
        self._options = storage_options or {}
        self._path: str | None = None  # the root as the filesystem spells it (set with the filesystem)

    @classmethod
    def of(cls, where: StoreLike | None) -> StoreLocation:
        """A location from a location, path or URL; None means the default store."""
        if isinstance(where, StoreLocation):
            return where
        return cls(where) if where is not None else default_location()

    def __str__(self) -> str:
        return str(self.local) if self.local is not None else self.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoreLocation) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    @property
    def is_local(self) -> bool:
        return self.local is not None

    @property
    def protocol(self) -> str:
        if self.local is not None:
            return "file"
        return self.url.split("://", 1)[0].lower() if "://" in self.url else _first(self.fs.protocol)

    @property
    def fs(self) -> Any:
        """The fsspec filesystem of a remote store (created on first use, and again in a forked child:
        an async filesystem's event loop and connections belong to the process that made them)."""
        if self._fs is None or (self._fs_pid != -1 and self._fs_pid != os.getpid()):
            try:
                import fsspec
            except ImportError as exc:
                raise OSError(f"the store {self.url} needs fsspec and its filesystem for {self.protocol}:// "
                              f"(pip install 'otel-replay[s3]' for s3://)") from exc
            try:
                try:  # no listing cache: writers on other hosts change the listings all the time
                    self._fs = fsspec.filesystem(self.protocol, **{"use_listings_cache": False, **self._options})
                except TypeError:  # a filesystem without listing caches
                    self._fs = fsspec.filesystem(self.protocol, **self._options)
                self._fs_pid = os.getpid()
            except (ImportError, ValueError) as exc:
                raise OSError(f"the store {self.url}: no filesystem for {self.protocol}:// ({exc})") from exc
        return self._fs

    @property
    def path(self) -> str:
        """The root of a remote store as its filesystem names it (no protocol)."""
        if self._path is None:
            self._path = str(self.fs._strip_protocol(self.url)).rstrip("/")  # noqa: SLF001 - fsspec's own rule
        return self._path

    def display(self) -> str:
        """The absolute path of a local store, the URL of a remote one."""
        return str(self.local.resolve()) if self.local is not None else self.url

    def uri(self, rel: str) -> str:
        """What DuckDB reads for a path under the root: a local path or a `protocol://` URL."""
        if self.local is not None:
            return str(self.local / rel)
        return f"{_first(self.fs.protocol)}://{self.path}/{rel}"  # the name DuckDB registers it under

    def _remote(self, rel: str) -> str:
        return f"{self.path}/{rel}" if rel else self.path

    # -- reading ----------------------------------------------------------------------------------
    def exists(self) -> bool:
        if self.local is not None:
            return self.local.is_dir()
        return bool(self.call("look at", "", lambda: self.fs.exists(self.path)))

    def segments(self, table: str) -> list[Segment]:
        """The table's Parquet files, every day partition; hidden and temp files excluded."""
        if self.local is not None:
            return _local_segments(self.local, table)
        base = self._remote(table)
        found = self.call("list", table, lambda: _fresh_find(self.fs, base))
        out = []
        for path, info in found.items():
            parts = path[len(base) + 1:].split("/") if path.startswith(base + "/") else []
            if len(parts) == 2 and parts[0].startswith("day=") and _is_segment(parts[1]):
                out.append(Segment(table, parts[0][4:], parts[1], int(info.get("size") or 0)))
        return sorted(out, key=lambda s: (s.day, s.name))

    def list_names(self, rel_dir: str) -> list[str]:
        """File names directly under a directory of the store (none if it does not exist)."""
        if self.local is not None:
            try:
                return sorted(e.name for e in os.scandir(self.local / rel_dir) if e.is_file())
            except FileNotFoundError:
                return []
        base = self._remote(rel_dir)
        found = self.call("list", rel_dir, lambda: _fresh_find(self.fs, base))
        return sorted(p.rsplit("/", 1)[-1] for p in found if p.startswith(base + "/") and "/" not in p[len(base) + 1:])

    def read_bytes(self, rel: str) -> bytes:
        """A file's bytes; FileNotFoundError if it is gone."""
        if self.local is not None:
            return (self.local / rel).read_bytes()
        return self.call("read", rel, lambda: self.fs.cat_file(self._remote(rel)))

    def size(self, rel: str) -> int:
        if self.local is not None:
            return (self.local / rel).stat().st_size
        return int(self.call("look at", rel, lambda: self.fs.size(self._remote(rel))) or 0)

    # -- writing ----------------------------------------------------------------------------------
    def ensure(self) -> None:
        """Create a local store directory (mode 0700); a remote prefix needs nothing."""
        if self.local is not None:
            make_dirs(self.local)

    def write(self, rel: str, produce: Callable[[IO[bytes]], object]) -> str | Path:
        """Write a file atomically under its final name; `produce` writes the bytes to a handle.

        Local: a temp name the read glob skips, fsync, `os.replace`. Object storage: one PUT of
        the whole object. Returns the local path or the URL.
        """
        if self.local is not None:
            return _write_local(self.local / rel, produce)
        buffer = io.BytesIO()
        produce(buffer)
        data = buffer.getvalue()
        path = self._remote(rel)
        if self.protocol in OBJECT_STORES:
            self.call("write", rel, lambda: self.fs.pipe_file(path, data))
        else:
            parent, name = path.rsplit("/", 1)
            temp = f"{parent}/.{name}.tmp"

            def put() -> None:
                self.fs.makedirs(parent, exist_ok=True)
                self.fs.pipe_file(temp, data)
                self.fs.mv(temp, path)

            self.call("write", rel, put)
        return self.uri(rel)

    def delete(self, rel: str) -> None:
        """Remove a file; one already gone is fine."""
        if self.local is not None:
            (self.local / rel).unlink(missing_ok=True)
            return
        with contextlib.suppress(FileNotFoundError):
            self.call("delete", rel, lambda: self.fs.rm_file(self._remote(rel)))

    def register(self, con: Any, segments: Iterable[Segment] = (), *, read_all: bool = False) -> None:
        """Let a DuckDB connection read this store's URLs (remote stores only). The segments of its
        snapshot are then read without a metadata request each, small ones (and with `read_all`,
        all of them) fetched ahead in one concurrent batch (`otel_replay.store.remote`)."""
        if self.local is None and not con.filesystem_is_registered(_first(self.fs.protocol)):
            from otel_replay.store.remote import SnapshotFS

            snapshot = SnapshotFS.over(self.fs, ((self._remote(s.rel), s.size) for s in segments))
            self.call("read", "", lambda: snapshot.prefetch(whole=read_all))
            con.register_filesystem(snapshot)

    def delete_many(self, rels: Iterable[str]) -> None:
        """Remove files (one request per thousand on object storage); ones already gone are fine."""
        rels = list(rels)
        if rels and self.local is None and self.protocol in OBJECT_STORES:
            paths = [self._remote(rel) for rel in rels]
            try:
                self.call("delete", rels[0], lambda: self.fs.rm(paths))
                return
            except FileNotFoundError:  # some were gone: make sure of the others, one by one
                pass
        for rel in rels:
            self.delete(rel)

    def call(self, what: str, rel: str, fn: Callable[[], Any]) -> Any:
        """Run a filesystem call; any failure becomes an OSError (of the same kind) naming the file."""
        try:
            return fn()
        except Exception as exc:  # botocore, aiohttp, gcsfs: one type for callers to catch
            message = f"cannot {what} {self.uri(rel) if rel else self.url}: {exc}"
            kind = type(exc) if isinstance(exc, OSError) else OSError
            try:
                error = kind(message)
            except Exception:  # noqa: BLE001 - a subclass with its own constructor
                error = OSError(message)
            raise error from exc


StoreLike = Union[StoreLocation, str, "os.PathLike[str]"]


def default_location() -> StoreLocation:
    """`$OTEL_REPLAY_STORE`, else `./otel-replay-store`."""
    return StoreLocation(os.environ.get(STORE_ENV) or DEFAULT_STORE)


def _first(protocol: str | tuple[str, ...]) -> str:
    return protocol if isinstance(protocol, str) else protocol[0]


def _as_fsspec(filesystem: Any) -> Any:
    try:
        import pyarrow.fs as pafs
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        return filesystem
    if isinstance(filesystem, pafs.FileSystem):
        from fsspec.implementations.arrow import ArrowFSWrapper

        return ArrowFSWrapper(filesystem)
    return filesystem


def _fresh_find(fs: Any, base: str) -> dict[str, dict[str, Any]]:
    """Every file under `base`, listed now (a caller's filesystem may cache listings; writers change them)."""
    fs.invalidate_cache()
    try:
        return fs.find(base, detail=True)
    except FileNotFoundError:
        return {}


def _is_segment(name: str) -> bool:
    return name.endswith(".parquet") and not name.startswith(".")


def _local_segments(root: Path, table: str) -> list[Segment]:
    out: list[Segment] = []
    try:
        days = [e for e in os.scandir(root / table) if e.name.startswith("day=") and e.is_dir()]
    except FileNotFoundError:
        return out
    for day in days:
        try:
            with os.scandir(day.path) as entries:
                for e in entries:
                    if _is_segment(e.name):
                        try:
                            out.append(Segment(table, day.name[4:], e.name, e.stat().st_size))
                        except FileNotFoundError:  # removed by a compaction since the listing
                            continue
        except FileNotFoundError:
            continue
    return sorted(out, key=lambda s: (s.day, s.name))


def make_dirs(directory: Path) -> None:
    """Create a directory and its missing parents, each 0700 (`Path.mkdir` gives parents the umask's mode)."""
    try:
        directory.mkdir(mode=DIR_MODE)
    except FileNotFoundError:
        make_dirs(directory.parent)
        directory.mkdir(mode=DIR_MODE, exist_ok=True)
    except FileExistsError:
        if not directory.is_dir():
            raise


def _write_local(final: Path, produce: Callable[[IO[bytes]], object]) -> Path:
    make_dirs(final.parent)
    temp = final.parent / f".{final.name}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as handle:
            produce(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return final


def cleanup_local_temp(root: Path, older_than_s: float) -> int:
    """Remove temp files a crashed local writer left behind; returns how many."""
    removed = 0
    cutoff = time.time() - older_than_s
    for path in [*root.glob("*/*/.*.tmp"), *root.glob("_*/.*.tmp")]:
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except OSError:
            continue
    return removed
