"""Wall-clock (processing-time) tumbling windows, closed by timers.

Windows are `[start, start + size)` of processing time, aligned to `size_ms`. The first message of a
window asks for a timer at its end (`Emitted.timers`; the state computation registers it with
`ctx.register_timer(ms)`), and the state computation's `on_timer(key, state, expiry_ms)` calls
`on_timer` here, which closes the window (reason `timer`). In a pipeline,
`transforms.windowing.wall_clock_windows(size_ms).over(aggregator)` does that wiring.

Timers fire in micro-batches: under `eventide run` each run of a query with timers ends with a batch
without new messages, so a window whose end has passed by then closes in that run, and a later one
in the first run after its end, with or without new messages. A message can also find its key's
window overdue (its timer has not run yet): `process` closes it then, with the same reason, before
opening the next one. A window never closes twice: the later timer finds nothing to close.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from windows.core import Aggregator, CloseReason, Emitted, OpenWindow, QuietClose, close


class WallClockState:
    """Keyed state of wall-clock windows: the key's open window (None between windows)."""

    # A window closed early (end of input) ended here: the next one of its period starts here, not at
    # the period's start, so no two windows share bounds. (A class default: older pickles lack it.)
    resume_ms: int | None = None

    def __init__(self) -> None:
        self.open: OpenWindow | None = None


@dataclass(frozen=True)
class WallClockWindows:
    """Window definition: processing-time tumbling windows of `size_ms` over `aggregator`."""

    aggregator: Aggregator
    size_ms: int

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise ValueError(f"size_ms must be positive, got {self.size_ms}")

    def process(self, state: WallClockState, key: str, seq: int, now_ms: int, msg: Any) -> Emitted:
        """Fold `msg`, received at processing time `now_ms`; a new window asks for its timer."""
        out = self.on_timer(state, key, now_ms)
        if state.open is None:
            start = int(now_ms) - int(now_ms) % self.size_ms
            end = start + self.size_ms
            if state.resume_ms is not None and start < state.resume_ms < end:
                start = state.resume_ms
            state.open = OpenWindow(self.aggregator.create(), start_ms=start, end_ms=end)
            out.timers.append(state.open.end_ms)
        w = state.open
        w.value = self.aggregator.add(w.value, msg)
        w.add_seq_range(seq, seq, 1)
        return out

    def open_windows(self, state: WallClockState) -> list[OpenWindow]:
        return [state.open] if state.open is not None else []

    def close_all(self, state: WallClockState, key: str, reason: CloseReason | QuietClose,
                  out: Emitted | None = None, now_ms: int | None = None) -> Emitted:
        """Close the open window before its end, with `reason`: it ends at `now_ms` (if earlier), and a
        message later in its period opens `[now_ms, period end)`. Its timer later finds nothing to close."""
        out = out if out is not None else Emitted()
        if state.open is not None:
            w, state.open = state.open, None
            if now_ms is not None and int(now_ms) < w.end_ms:
                w.end_ms = max(int(now_ms), w.start_ms + 1)  # never empty bounds
            state.resume_ms = w.end_ms
            out.windows.append(close(key, w, reason))
        return out

    def on_timer(self, state: WallClockState, key: str, now_ms: int) -> Emitted:
        """Close the open window if its end is due at `now_ms` (a timer's expiry or the current time)."""
        out = Emitted()
        if state.open is not None and state.open.end_ms <= now_ms:
            out.windows.append(close(key, state.open, CloseReason.TIMER))
            state.open = None
        return out
