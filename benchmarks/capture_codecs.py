"""The capture writer's CPU per span with other Parquet codecs: what a cheaper codec would save.

An experiment behind a line of docs/benchmarks/capture.md, not a setting of the product (the store
writes zstd): the live `ReplayProcessor`, the same distinct 4 KB spans as `bench capture`'s CPU row,
with pyarrow's `write_table` told to use another codec for the run. Codecs are interleaved round by
round so a change of machine load falls on all of them alike.

    python -m benchmarks.capture_codecs [rounds]
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from benchmarks.capture_vs_otlp import _cpu_per_span, rounds_argument
from benchmarks.spans import SeededText, SyntheticSpans
from otel_replay.capture import ReplayProcessor
from otel_replay.capture.writer import load_for_writing

CODECS = ("zstd", "none", "lz4", "snappy")
SPANS = 5000


def _with_codec(codec: str, write_table: Callable[..., Any]) -> Callable[..., Any]:
    def write(*args: Any, **kwargs: Any) -> Any:
        kwargs["compression"] = codec
        return write_table(*args, **kwargs)
    return write


def _bytes_under(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.parquet"))


def main(rounds: int = 6) -> None:
    spans = SyntheticSpans(SeededText(seed=7, corpus_bytes=1 << 21)).chat_spans(SPANS, 4096, distinct=True)
    load_for_writing()
    write_table = pq.write_table
    cpu: dict[str, list[float]] = {c: [] for c in CODECS}
    stored: dict[str, int] = dict.fromkeys(CODECS, 0)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for r in range(rounds):
                for codec in CODECS:
                    pq.write_table = _with_codec(codec, write_table)
                    store = Path(tmp) / f"{codec}-{r}"
                    cpu[codec].append(_cpu_per_span(ReplayProcessor(store), spans))
                    stored[codec] += _bytes_under(store)
        finally:
            pq.write_table = write_table
    print(f"{SPANS} distinct 4 KB spans a round, {rounds} rounds, codecs interleaved; CPU of this process "
          "from the first on_end until force_flush returned")
    print("| codec | least µs/span | median µs/span | Parquet bytes/span | bytes vs zstd |")
    print("|-------|---------------|----------------|--------------------|---------------|")
    for codec in CODECS:
        per_span = stored[codec] / (rounds * SPANS)
        print(f"| {codec} | {min(cpu[codec]):.1f} | {statistics.median(cpu[codec]):.1f} | {per_span:,.0f} "
              f"| {stored[codec] / stored['zstd']:.2f}x |")


if __name__ == "__main__":
    main(rounds_argument("capture_codecs", __doc__ or "", 6))
