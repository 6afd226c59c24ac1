"""What a query's run did (filled in by the batch writer, read by the runner and its callers)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunReport:
    query: str
    batches: int = 0
    input_rows: int = 0
    rows_written: dict[str, int] = field(default_factory=dict)
    quarantined: int = 0
    skipped_batches: int = 0  # replayed batches whose commits were already in the lake
    seconds: float = 0.0
    max_lag_seconds: float | None = None
    held_by: str | None = None  # not run: another process holds the query's lock (see locks.py)
    tcp_in_doubt: list[int] = field(default_factory=list)  # TCP batches found in doubt (sinks.TCPSinkWriter)
    closed_keys: int = 0  # --close-windows: keys whose open windows this run closed at the end of input
