"""The one error type of every importer and OTLP decoder: `SourceError`, naming where and what.

Contract (tested by tests/test_hostile_input.py and fuzzed by tests/harness/fuzzing.py):

- Every function in `otel_replay.normalize.sources` that reads outside data raises, for bad
  input, only `SourceError` (a `ValueError`) or one of its subclasses, never a bare TypeError,
  KeyError, RecursionError, OverflowError, ... and never hangs or recurses without bound.
- A `SourceError` carries `file` (a path, or None for a request body), `line` (1-based line of a
  JSON-lines file) or `record` (the record's path inside the document, e.g.
  `resourceSpans[0].scopeSpans[0].spans[3]` or `record 4`), and `field` (the field at fault,
  e.g. `traceId`, `startTimeUnixNano`, `attributes.gen_ai.usage.input_tokens`), when known.
- `files.read` raises `UnreadableFile` (a `SourceError`) only when nothing can be read; a bad
  record is skipped and listed in `SourceBatch.skipped` as (where, reason).
- The OTLP receiver turns a `SourceError` into HTTP 400 / gRPC INVALID_ARGUMENT for the whole
  request, or skips the record and reports it in `partial_success`.

Limits (each a documented error, never a crash):
- ids: 32 (trace) / 16 (span) hex digits, or base64 or bytes of that size, not all zeros (`BadId`);
  LangSmith and Langfuse ids are any text and are hashed to ids of that form.
- times: 1970-01-01 .. 2262-04-11 as int64 nanoseconds (`times.py`, `BadTime`): negative, later,
  NaN, fractional nanoseconds, non-numeric strings are refused; 0 means unset.
- attribute values (`checks.py`, `BadValue`): ints within int64, at most 64 levels of nesting,
  strings of at most 32 M characters (a 100 MB string is refused before it costs ~1 GB to store).
- JSON: ~1000 levels of nesting (deeper: "nested too deeply"); invalid UTF-8: the file (or its
  JSON line) is refused naming the byte; a .gz file inflates to at most 1 GiB.
- Who&When: a log whose steps would repeat more than 256 MB of history is refused.
- Duplicate span ids: one import keeps the last copy of a (trace id, span id); importing a span
  already in the store stores nothing; the store's `spans` view shows each span once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from otel_replay.errors import OtelReplayError

# Python errors that malformed input provokes in a converter; they become a `BadRecord`.
INPUT_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, KeyError, IndexError, AttributeError,
                                             OverflowError, RecursionError, UnicodeError)
MAX_SHOWN = 60  # characters of an offending value quoted in a message

T = TypeVar("T")


class SourceError(OtelReplayError, ValueError):
    """Input an importer or decoder cannot read: `file`, `line` or `record`, and `field` say where."""

    def __init__(self, reason: str, *, field: str | None = None, file: str | None = None,
                 line: int | None = None, record: str | None = None) -> None:
        self.reason, self.field, self.file, self.line, self.record = reason, field, file, line, record
        super().__init__(self._message())

    @property
    def problem(self) -> str:
        """The reason, prefixed by the field when there is one."""
        if self.field and not self.reason.startswith(f"{self.field}:"):
            return f"{self.field}: {self.reason}"
        return self.reason

    @property
    def where(self) -> str:
        """`file:line record`, as much of it as is known ('' for none)."""
        text = self.file or ""
        if self.line is not None:
            text += f":{self.line}"
        if self.record:
            text = f"{text} {self.record}" if text else self.record
        return text

    def _message(self) -> str:
        return f"{self.where}: {self.problem}" if self.where else self.problem

    def located(self, *, file: str | None = None, line: int | None = None, record: str | None = None,
                within: str | None = None) -> SourceError:
        """The same error with its location filled in (`within` prefixes the record path)."""
        record = record or self.record
        if within:
            record = f"{within}.{record}" if record else within
        copy = type(self).__new__(type(self))
        SourceError.__init__(copy, self.reason, field=self.field, file=file or self.file,
                             line=line if line is not None else self.line, record=record)
        return copy

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across processes, with its fields
        return (_rebuild, (type(self), self.reason, self.field, self.file, self.line, self.record))


def _rebuild(cls: type[SourceError], reason: str, field: str | None, file: str | None, line: int | None,
             record: str | None) -> SourceError:
    return cls(reason, field=field, file=file, line=line, record=record)


class BadRecord(SourceError):
    """A record of the wrong shape (a list where an object belongs, a missing key, ...)."""


class BadValue(SourceError):
    """A value out of range or of the wrong type: an int beyond int64, nesting past the limit."""


def shown(value: object) -> str:
    """`repr(value)` cut to a few dozen characters: error messages never copy a huge input."""
    if isinstance(value, (str, bytes, bytearray)) and len(value) > MAX_SHOWN:
        return f"{value[:MAX_SHOWN]!r}... ({len(value)} long)"
    if isinstance(value, (dict, list, tuple)):  # never repr a container: it may be huge or deeply nested
        return f"<{type(value).__name__} of {len(value)}>"
    text = repr(value) if isinstance(value, (str, bytes, bytearray, int, float, bool, type(None))) \
        else f"<{type(value).__name__}>"
    return text if len(text) <= MAX_SHOWN + 10 else text[:MAX_SHOWN] + "..."


def bad_record(exc: BaseException, record: str | None = None) -> SourceError:
    """`exc` as a SourceError: itself if it is one, else a BadRecord saying what Python hit."""
    if isinstance(exc, SourceError):
        return exc.located(record=record) if record and not exc.record else exc
    if isinstance(exc, RecursionError):
        return BadRecord("nested too deeply", record=record)
    text = str(exc)
    if isinstance(exc, KeyError):
        text = f"missing key {text}"
    text = text if len(text) <= 200 else text[:200] + "..."
    return BadRecord(f"malformed record ({type(exc).__name__}: {text})" if text else
                     f"malformed record ({type(exc).__name__})", record=record)


@contextmanager
def reading(record: str | None = None) -> Iterator[None]:
    """Turn the Python errors malformed input provokes into one `SourceError` naming `record`."""
    try:
        yield
    except INPUT_ERRORS as exc:
        raise bad_record(exc, record) from None


def guarded(convert: Callable[..., T]) -> Callable[..., T]:
    """Decorate a converter so it raises only `SourceError` for bad input."""
    @functools.wraps(convert)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return convert(*args, **kwargs)
        except INPUT_ERRORS as exc:
            raise bad_record(exc) from None

    return wrapper
