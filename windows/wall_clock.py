"""Wall-clock (processing-time) tumbling windows, closed by timers.

Windows are `[start, start + size)` of processing time, aligned to `size_ms`. The first message of a
window asks for a timer at its end (`Emitted.timers`; the state computation registers it with
`current_context().register_timer(ms)`), and the state computation's `on_timer(key, state,
expiry_ms)` calls `on_timer` here, which closes the window (reason `timer`).

With Spark's `availableNow` trigger a timer fires in the first micro-batch that runs after it is due
(the engine runs no empty batches), so a window can also be found overdue when a message arrives:
`process` closes it then, with the same reason, before opening the next one. A window never closes
twice: the later timer finds nothing to close.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from windows.core import Aggregator, CloseReason, Emitted, OpenWindow, close


class WallClockState:
    def __init__(self) -> None:
        self.open: OpenWindow | None = None


@dataclass(frozen=True)
class WallClockWindows:
    aggregator: Aggregator
    size_ms: int

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise ValueError(f"size_ms must be positive, got {self.size_ms}")

    def process(self, state: WallClockState, key: str, seq: int, now_ms: int, msg: Any) -> Emitted:
        out = self.on_timer(state, key, now_ms)
        if state.open is None:
            start = int(now_ms) - int(now_ms) % self.size_ms
            state.open = OpenWindow(self.aggregator.create(), start_ms=start, end_ms=start + self.size_ms)
            out.timers.append(state.open.end_ms)
        w = state.open
        w.value = self.aggregator.add(w.value, msg)
        w.add_seq_range(seq, seq, 1)
        return out

    def on_timer(self, state: WallClockState, key: str, now_ms: int) -> Emitted:
        """Close the open window if its end is due at `now_ms` (a timer's expiry or the current time)."""
        out = Emitted()
        if state.open is not None and state.open.end_ms <= now_ms:
            out.windows.append(close(key, state.open, CloseReason.TIMER))
            state.open = None
        return out
