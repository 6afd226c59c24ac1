"""Windows closed by what the data itself says (Wallaroo's log example, made robust).

A source's messages form one open window at a time. It closes when

- a marker message arrives (`END_OF_DAY`, trailing CR/LF ignored): reason `marker`;
- a message's boundary value differs from the open window's (a new calendar day): reason
  `day_change`, and the message opens the next window. Logs without markers, or with two days
  between markers, still give one window per day (Wallaroo crashed there);
- the window reaches `max_count` messages: reason `count`.

A marker closing an empty window emits nothing. `process` takes one message; `process_frame` takes
many as a pandas DataFrame (batch state computations) and returns exactly the same windows: it cuts
the frame at markers, boundary changes and count limits and folds each run with `add_frame`.

`prefold` folds runs of a key's messages ahead of the key's state (where the engine decodes, on every
core): a run that no marker, boundary change or gap in the key's order cuts becomes one `Folded`
row, which `process_frame` merges into the window as if it had folded the run's messages itself.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from windows.core import Aggregator, CloseReason, Emitted, OpenWindow, QuietClose, close

DEFAULT_MARKER = "END_OF_DAY"


def is_marker(payload: bytes | str | None, marker: str = DEFAULT_MARKER) -> bool:
    """True if the payload is exactly the marker, ignoring trailing CR/LF."""
    if payload is None:
        return False
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload).rstrip(b"\r\n") == marker.encode()
    return payload.rstrip("\r\n") == marker


@dataclass(frozen=True)
class Folded:
    """A run of one key's consecutive messages, folded ahead of the key's state: the accumulator, the
    sequence numbers it covers (`seq_ranges`: inclusive (first, last) pairs, ascending; the key's own
    messages only) and how many messages it holds. Its messages share one boundary value and hold no
    marker."""

    value: Any
    seq_ranges: tuple[tuple[int, int], ...]
    size: int

    @property
    def first_seq(self) -> int:
        return self.seq_ranges[0][0]

    @property
    def last_seq(self) -> int:
        return self.seq_ranges[-1][1]

    def seqs(self) -> list[int]:
        return [s for first, last in self.seq_ranges for s in range(first, last + 1)]


def _ranges(seq: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Ascending sequence numbers as inclusive (first, last) ranges of consecutive numbers."""
    cuts = np.flatnonzero(np.diff(seq) != 1) + 1
    starts, ends = np.r_[0, cuts], np.r_[cuts, len(seq)] - 1
    return tuple(zip(seq[starts].tolist(), seq[ends].tolist()))


class TriggerState:
    """Keyed state of trigger windows: the source's open window (None between windows)."""

    def __init__(self) -> None:
        self.open: OpenWindow | None = None


@dataclass(frozen=True)
class TriggerWindows:
    """Window definition: the aggregator and which triggers close a window.

    `is_marker(msg)` says whether a message is a marker; `boundary(msg)` gives the value whose change
    closes the window (e.g. the message's day); `max_count` caps the messages per window. Leave any
    of them None to disable that trigger. In a pipeline:
    `transforms.windowing.trigger_windows(is_marker=..., boundary=..., max_count=...).over(aggregator)`.
    """

    aggregator: Aggregator
    is_marker: Callable[[Any], bool] | None = None
    boundary: Callable[[Any], Hashable] | None = None
    max_count: int | None = None

    def __post_init__(self) -> None:
        if self.max_count is not None and self.max_count < 1:
            raise ValueError(f"max_count must be at least 1, got {self.max_count}")

    # -- one message --------------------------------------------------------------------------
    def process(self, state: TriggerState, key: str, seq: int, msg: Any) -> Emitted:
        """Feed one message (landing sequence `seq`); the windows it closes."""
        out = Emitted()
        if self.is_marker is not None and self.is_marker(msg):
            self._close(state, key, CloseReason.MARKER, out)
            return out
        b = self.boundary(msg) if self.boundary is not None else None
        if state.open is not None and state.open.size and state.open.boundary != b:
            self._close(state, key, CloseReason.DAY_CHANGE, out)
        w = self._open(state, b)
        w.value = self.aggregator.add(w.value, msg)
        w.add_seq_range(seq, seq, 1)
        if self.max_count is not None and w.size >= self.max_count:
            self._close(state, key, CloseReason.COUNT, out)
        return out

    # -- many messages ------------------------------------------------------------------------
    def process_frame(
        self,
        state: TriggerState,
        key: str,
        frame,
        seq: Sequence[int],
        markers: Sequence[bool] | None = None,
        boundaries: Sequence[Hashable] | None = None,
        folded: Sequence[Folded | None] | None = None,
    ) -> Emitted:
        """Feed a DataFrame of messages in sequence order; same windows as `process` row by row.

        `markers` and `boundaries` are per-row arrays (what `is_marker` and `boundary` would say);
        `aggregator.add_frame` folds each run of rows between cuts. `folded` (from `prefold`): per row,
        None for a message, or the `Folded` run the row stands for (its markers and boundary columns
        are those of the run's messages), merged in with `aggregator.merge`.
        """
        if self.aggregator.add_frame is None:
            raise ValueError("process_frame needs an aggregator with add_frame")
        if folded is not None and not any(f is not None for f in folded):
            folded = None
        if folded is not None and not self.can_prefold:
            raise ValueError("folded runs need an aggregator with merge and no max_count (see can_prefold)")
        n = len(frame)
        seq = np.asarray(seq, dtype=np.int64)
        is_mark = np.zeros(n, dtype=bool) if markers is None else np.asarray(markers, dtype=bool)
        bnd = np.full(n, None, dtype=object) if boundaries is None else np.asarray(boundaries, dtype=object)
        if self.boundary is None:
            bnd = np.full(n, None, dtype=object)
        out = Emitted()
        # Cut points: every marker, and every message whose boundary differs from the message before
        # it (markers do not count as "before": the open window's boundary is its last message's).
        data_pos = np.flatnonzero(~is_mark)
        cuts = set(np.flatnonzero(is_mark).tolist())
        if len(data_pos):
            b = bnd[data_pos]
            prev = np.empty(len(b), dtype=object)
            prev[0] = state.open.boundary if state.open is not None and state.open.size else b[0]
            prev[1:] = b[:-1]
            changed = np.fromiter((x != y for x, y in zip(b, prev)), dtype=bool, count=len(b))
            cuts.update(data_pos[changed].tolist())
        pos = 0
        for cut in [*sorted(cuts), n]:
            if cut > pos:  # a run of data messages [pos, cut)
                if folded is None:
                    self._fold_run(state, key, frame, seq, bnd, pos, cut, out)
                else:
                    self._fold_mixed_run(state, frame, seq, bnd, folded, pos, cut)
            if cut == n:
                break
            if is_mark[cut]:
                self._close(state, key, CloseReason.MARKER, out)
                pos = cut + 1
            else:
                if state.open is not None and state.open.size:
                    self._close(state, key, CloseReason.DAY_CHANGE, out)
                pos = cut
        return out

    def _fold_run(self, state, key, frame, seq, bnd, start: int, stop: int, out: Emitted) -> None:
        while start < stop:
            w = self._open(state, bnd[start])
            take = stop - start
            if self.max_count is not None:
                take = min(take, self.max_count - w.size)
            w.value = self.aggregator.add_frame(w.value, frame.iloc[start : start + take])
            w.add_seq_range(int(seq[start : start + take].min()), int(seq[start : start + take].max()), take)
            start += take
            if self.max_count is not None and w.size >= self.max_count:
                self._close(state, key, CloseReason.COUNT, out)

    def _fold_mixed_run(self, state, frame, seq, bnd, folded, start: int, stop: int) -> None:
        """A run of one boundary value whose rows are messages or folded runs (no count limit)."""
        w = self._open(state, bnd[start])
        k = start
        while k < stop:
            f = folded[k]
            if f is not None:
                w.value = self.aggregator.merge(w.value, f.value)
                w.add_seq_range(f.first_seq, f.last_seq, f.size)
                k += 1
                continue
            j = k
            while j < stop and folded[j] is None:
                j += 1
            w.value = self.aggregator.add_frame(w.value, frame.iloc[k:j])
            w.add_seq_range(int(seq[k:j].min()), int(seq[k:j].max()), j - k)
            k = j

    # -- folding ahead of the state ---------------------------------------------------------------
    @property
    def can_prefold(self) -> bool:
        """Whether runs may be folded apart and merged later: the aggregator can merge, and no count
        limit makes where a window ends depend on the state's count so far."""
        return self.aggregator.add_frame is not None and self.aggregator.merge is not None and self.max_count is None

    def prefold(
        self,
        frame,
        seq: Sequence[int],
        breaks: Sequence[bool],
        markers: Sequence[bool] | None = None,
        boundaries: Sequence[Hashable] | None = None,
        min_run: int = 2,
    ) -> list[tuple[int, int, Folded]]:
        """The runs of `frame` (messages in sequence order, of one key between any two `breaks`) that
        `process_frame` may take as one `Folded` row each: [(start, stop, folded)], ascending. A run
        holds at least `min_run` messages, no marker, one boundary value, and no row with `breaks`
        set after its first (breaks[i]: message i may not directly follow message i-1 in its key's
        order, e.g. another key's message or a gap in the sequence numbers lies between them)."""
        if not self.can_prefold:
            raise ValueError("prefold needs an aggregator with merge and no max_count (see can_prefold)")
        n = len(frame)
        if n < min_run:
            return []
        seq = np.asarray(seq, dtype=np.int64)
        is_mark = np.zeros(n, dtype=bool) if markers is None else np.asarray(markers, dtype=bool)
        starts = np.asarray(breaks, dtype=bool).copy()
        starts[0] = True
        starts[1:] |= is_mark[1:] | is_mark[:-1]
        if self.boundary is not None and boundaries is not None:
            bnd = np.asarray(boundaries, dtype=object)
            starts[1:] |= bnd[1:] != bnd[:-1]
        first = np.flatnonzero(starts)
        stops = np.r_[first[1:], n]
        runs = []
        for lo, hi in zip(first.tolist(), stops.tolist()):
            if hi - lo < min_run or is_mark[lo]:
                continue
            value = self.aggregator.add_frame(self.aggregator.create(), frame.iloc[lo:hi])
            runs.append((lo, hi, Folded(value, _ranges(seq[lo:hi]), hi - lo)))
        return runs

    def open_windows(self, state: TriggerState) -> list[OpenWindow]:
        return [state.open] if state.open is not None and state.open.size else []

    def close_all(self, state: TriggerState, key: str, reason: CloseReason | QuietClose,
                  out: Emitted | None = None) -> Emitted:
        """Close the open window (if it holds messages) as if its marker had come, with `reason`."""
        out = out if out is not None else Emitted()
        self._close(state, key, reason, out)
        return out

    # -- helpers ------------------------------------------------------------------------------
    def _open(self, state: TriggerState, boundary: Hashable) -> OpenWindow:
        if state.open is None:
            state.open = OpenWindow(self.aggregator.create(), boundary=boundary)
        return state.open

    def _close(self, state: TriggerState, key: str, reason: CloseReason | QuietClose, out: Emitted) -> None:
        if state.open is not None and state.open.size:
            out.windows.append(close(key, state.open, reason))
        state.open = None
