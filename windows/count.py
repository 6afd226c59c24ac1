"""Count windows: tumbling and sliding by message count per key (Quix's count windows).

A key's messages are numbered 0, 1, 2, ... in sequence order. A window starts at every multiple of
`slide` (tumbling: slide = size) and holds the `size` messages from there; it closes (reason `count`)
on its `size`-th message. Sliding windows (`slide < size`) overlap: a message is in up to
`ceil(size / slide)` windows. No window starts before a key's first message, so the first sliding
window is a full one too. A window's bounds are its messages' landing sequence numbers
(`first_seq`/`last_seq`); `start_ms`/`end_ms` stay None (count windows have no time).

`reference_count_windows` is the plain form: the closed windows of a whole list of messages, cut by
slicing. `CountWindows.process` (one message) and `process_frame` (a micro-batch's messages as a
DataFrame, folded run by run with `add_frame`) are the incremental forms the engine runs; tests hold
all three equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from windows.core import Aggregator, CloseReason, Emitted, OpenWindow, QuietClose, WindowResult, close


class CountState:
    """Keyed state of count windows: the key's message count and its open windows by start."""

    def __init__(self) -> None:
        self.seen: int = 0
        self.windows: dict[int, OpenWindow] = {}


@dataclass(frozen=True)
class CountWindows:
    """Window definition: windows of `size` messages starting every `slide` (None: tumbling)."""

    aggregator: Aggregator
    size: int
    slide: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"count windows: size must be a positive int, got {self.size!r}")
        if self.slide is not None and not (isinstance(self.slide, int) and 0 < self.slide <= self.size):
            raise ValueError(f"count windows: slide must be an int in [1, size={self.size}], got {self.slide!r}")

    @property
    def step(self) -> int:
        return self.slide or self.size

    def starts_of(self, index: int) -> range:
        """Starts of the windows holding a key's message number `index`, oldest first."""
        lowest = max(0, index - self.size + 1)
        first = -(-lowest // self.step) * self.step  # the first multiple of step at or after lowest
        return range(first, index - index % self.step + 1, self.step)

    # -- one message --------------------------------------------------------------------------
    def process(self, state: CountState, key: str, seq: int, msg: Any) -> Emitted:
        """Fold `msg` (landing sequence `seq`) into its windows; the window it completes closes."""
        out = Emitted()
        index = state.seen
        for start in self.starts_of(index):
            w = self._open(state, start)
            w.value = self.aggregator.add(w.value, msg)
            w.add_seq_range(seq, seq, 1)
        state.seen += 1
        self._close_full(state, key, out)
        return out

    # -- many messages ------------------------------------------------------------------------
    def process_frame(self, state: CountState, key: str, frame, seq: Sequence[int]) -> Emitted:
        """Feed a DataFrame of one key's messages in sequence order; the same windows as `process`
        row by row. Each window takes its slice of the frame in one `add_frame` call."""
        if self.aggregator.add_frame is None:
            raise ValueError("count windows: process_frame needs an aggregator with add_frame")
        out = Emitted()
        n = len(frame)
        if n == 0:
            return out
        seq = np.asarray(seq, dtype=np.int64)
        lo, hi = state.seen, state.seen + n  # the key's message numbers of this frame: [lo, hi)
        for start in range(self.starts_of(lo)[0], hi, self.step):
            a, b = max(start, lo) - lo, min(start + self.size, hi) - lo
            w = self._open(state, start)
            w.value = self.aggregator.add_frame(w.value, frame.iloc[a:b])
            w.add_seq_range(int(seq[a:b].min()), int(seq[a:b].max()), b - a)
        state.seen = hi
        self._close_full(state, key, out)
        return out

    def open_windows(self, state: CountState) -> list[OpenWindow]:
        return [state.windows[s] for s in sorted(state.windows)]

    def close_all(self, state: CountState, key: str, reason: CloseReason | QuietClose,
                  out: Emitted | None = None) -> Emitted:
        """Close every open (partial) window, oldest first, and count the key's messages from 0 again:
        the input ended, so its next message starts fresh windows rather than a partial one's remainder."""
        out = out if out is not None else Emitted()
        for start in sorted(state.windows):
            out.windows.append(close(key, state.windows.pop(start), reason))
        state.seen = 0
        return out

    # -- helpers ------------------------------------------------------------------------------
    def _open(self, state: CountState, start: int) -> OpenWindow:
        w = state.windows.get(start)
        if w is None:
            w = state.windows[start] = OpenWindow(self.aggregator.create())
        return w

    def _close_full(self, state: CountState, key: str, out: Emitted) -> None:
        for start in sorted(s for s, w in state.windows.items() if w.size >= self.size):
            out.windows.append(close(key, state.windows.pop(start), CloseReason.COUNT))


def reference_count_windows(aggregator: Aggregator, size: int, slide: int | None, key: str,
                            seqs: Sequence[int], messages: Sequence[Any],
                            end_of_input: bool = False) -> list[WindowResult]:
    """The closed count windows of one key's whole input (messages in sequence order), by slicing:
    the plain form the incremental ones must equal. `end_of_input`: the input ended and was closed
    (`close_all`): the partial windows it left follow, reason `end_of_input`."""
    CountWindows(aggregator, size, slide)  # the same checks
    out = []
    last_start = len(messages) - 1 if end_of_input else len(messages) - size
    for start in range(0, last_start + 1, slide or size):
        part = messages[start:start + size]
        value = aggregator.create()
        for m in part:
            value = aggregator.add(value, m)
        window = OpenWindow(value, first_seq=seqs[start], last_seq=seqs[start + len(part) - 1], size=len(part))
        out.append(close(key, window, CloseReason.COUNT if len(part) == size else QuietClose.END_OF_INPUT))
    return out
