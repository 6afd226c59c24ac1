"""The sinks of the benchmarks' Bytewax flows (bench/peers_bytewax.py, bench/sessions_bytewax.py).

Two small `DynamicSink`s: a buffered line writer (bytewax's FileSink fsyncs every batch for its
exactly-once resume, which a run without recovery does not need) and an upsert sink that keeps the
latest line per key and writes them when the flow ends. Only the standard library and bytewax are
imported here, so a timed Bytewax process starts as Bytewax alone would.
"""

from __future__ import annotations

from pathlib import Path

from bytewax.outputs import DynamicSink, StatelessSinkPartition

BATCH = 1000  # FileSource's default lines per batch


class _LinesPartition(StatelessSinkPartition):
    def __init__(self, path: Path) -> None:
        self._f = open(path, "w", buffering=1 << 20)

    def write_batch(self, items: list) -> None:
        self._f.writelines(f"{x}\n" for x in items)

    def close(self) -> None:
        self._f.close()


class LinesSink(DynamicSink):
    """Each item (a string) as a line of `path`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _LinesPartition:
        return _LinesPartition(self.path if worker_count == 1 else self.path.with_suffix(f".{worker_index}.txt"))


class _LatestPartition(StatelessSinkPartition):
    def __init__(self, path: Path) -> None:
        self._path = path
        self._latest: dict[str, str] = {}

    def write_batch(self, items: list) -> None:
        latest = self._latest
        for key, line in items:
            latest[key] = line

    def close(self) -> None:
        with open(self._path, "w") as f:
            f.writelines(f"{line}\n" for line in self._latest.values())


class LatestSink(DynamicSink):
    """Items (key, line): the last line per key, written to `path` when the flow ends (an upsert table)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _LatestPartition:
        return _LatestPartition(self.path if worker_count == 1 else self.path.with_suffix(f".{worker_index}.txt"))
