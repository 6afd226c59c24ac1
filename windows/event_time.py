"""Event-time tumbling and sliding windows with a watermark and an explicit late-data policy.

Windows are `[start, start + size)` with starts aligned to `slide` (tumbling: slide = size), in
milliseconds of event time. Each key keeps its own watermark in its state:

    watermark = (max event time seen by the key) - allowed_lateness

A message is *late* when its event time is below the watermark; the policy says what happens to it:
`drop` (counted in the state, never emitted) or `route` (returned as a LateEvent, for a late table).
After each message, every open window whose end is at or below the watermark closes (reason
`watermark`), in order of end time, inside the same call. So results appear in the same micro-batch
and the same `availableNow` run that saw the data.

Relation to Spark's watermark: Spark's `withWatermark` is global (the minimum over the query's
inputs) and only moves between micro-batches, so windows it closes appear one batch (with
availableNow: one *run*) later, and transformWithState has no event-time timers in processing-time
mode. The per-key watermark here moves with the key's own data and closes windows immediately; the
price is that a key that stops receiving data keeps its last windows open. `advance(state, key,
watermark_ms)` closes windows from an outside clock: Spark's watermark when the query defines one
(`ctx.watermark_ms` of the state computation's context) or a processing-time timer (see windows.wall_clock).
With `idle_close_ms`, a key that got no message for that long of processing time closes every open
window (reason `idle`) by a timer, and its watermark moves past them: the last windows of a quiet key
or a finished input close without later events. The state keeps one pending timer at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from windows.core import Aggregator, CloseReason, Emitted, OpenWindow, QuietClose, close


class LatePolicy(str, Enum):
    DROP = "drop"
    ROUTE = "route"


@dataclass(frozen=True)
class LateEvent:
    """A message that arrived after the watermark passed its event time (late policy `route`)."""

    key: str
    seq: int
    event_ms: int
    watermark_ms: int
    message: Any


def late_event_schema():
    """The Arrow schema of routed `LateEvent` rows for `DeltaSink(schema=..., accepts=LateEvent)`: the
    key, sequence, event time and the watermark it fell behind (the message itself is not a column)."""
    import pyarrow as pa

    return pa.schema([("key", pa.string()), ("seq", pa.int64()), ("event_ms", pa.int64()),
                      ("watermark_ms", pa.int64())])


def handled_late(policy: LatePolicy, state, allowed_lateness_ms: int, key: str, seq: int, event_ms: int, msg: Any,
                 out: Emitted) -> bool:
    """True when `event_ms` is behind the key's watermark (`state.watermark`): the message is then routed
    as a LateEvent or counted in `state.dropped_late`, as the late policy says, and folded nowhere."""
    wm = state.watermark(allowed_lateness_ms)
    if wm is None or event_ms >= wm:
        return False
    if policy is LatePolicy.ROUTE:
        out.late.append(LateEvent(key, seq, event_ms, wm, msg))
    else:
        state.dropped_late += 1
    return True


class EventTimeState:
    """Keyed state: open windows by start, the key's max event time and late-message count."""

    # Idle close (class defaults: a state pickled before they existed reads them as None).
    last_input_ms: int | None = None  # processing time of the key's last message
    timer_ms: int | None = None  # the pending timer this state asked for

    def __init__(self) -> None:
        self.windows: dict[int, OpenWindow] = {}
        self.max_event_ms: int | None = None
        self.dropped_late: int = 0
        self.external_watermark_ms: int | None = None

    def watermark(self, allowed_lateness_ms: int) -> int | None:
        own = None if self.max_event_ms is None else self.max_event_ms - allowed_lateness_ms
        marks = [m for m in (own, self.external_watermark_ms) if m is not None]
        return max(marks) if marks else None


@dataclass(frozen=True)
class EventTimeWindows:
    """Tumbling (`slide_ms` None) or sliding event-time windows over `aggregator`.

    In a pipeline: `transforms.windowing.event_time_windows(size_ms, ...).over(aggregator)`.
    """

    aggregator: Aggregator
    size_ms: int
    slide_ms: int | None = None
    allowed_lateness_ms: int = 0
    late_policy: LatePolicy = LatePolicy.DROP
    idle_close_ms: int | None = None  # close a key's windows after this long without a message (wall clock)

    def __post_init__(self) -> None:
        if self.idle_close_ms is not None and (not isinstance(self.idle_close_ms, int) or self.idle_close_ms <= 0):
            raise ValueError(f"idle_close_ms must be a positive int, got {self.idle_close_ms!r}")
        if self.size_ms <= 0:
            raise ValueError(f"size_ms must be positive, got {self.size_ms}")
        if self.slide_ms is not None and not 0 < self.slide_ms <= self.size_ms:
            raise ValueError(f"slide_ms must be in (0, size_ms], got {self.slide_ms}")
        if self.allowed_lateness_ms < 0:
            raise ValueError("allowed_lateness_ms must not be negative")
        object.__setattr__(self, "late_policy", LatePolicy(self.late_policy))

    @property
    def slide(self) -> int:
        return self.slide_ms or self.size_ms

    def starts_of(self, event_ms: int) -> list[int]:
        """Starts of the windows containing `event_ms`, oldest first."""
        last = event_ms - event_ms % self.slide
        first = last - ((self.size_ms - 1) // self.slide) * self.slide
        return [s for s in range(first, last + 1, self.slide) if s <= event_ms < s + self.size_ms]

    def process(self, state: EventTimeState, key: str, seq: int, event_ms: int, msg: Any, now_ms: int = 0) -> Emitted:
        """Fold `msg` (event time `event_ms`, received at processing time `now_ms`) into its windows, or
        treat it as late; close what the key's watermark passed."""
        out = Emitted()
        event_ms = int(event_ms)
        if handled_late(self.late_policy, state, self.allowed_lateness_ms, key, seq, event_ms, msg, out):
            return out
        for start in self.starts_of(event_ms):
            w = state.windows.get(start)
            if w is None:
                w = state.windows[start] = OpenWindow(self.aggregator.create(), start_ms=start, end_ms=start + self.size_ms)
            w.value = self.aggregator.add(w.value, msg)
            w.add_seq_range(seq, seq, 1)
        state.max_event_ms = event_ms if state.max_event_ms is None else max(state.max_event_ms, event_ms)
        state.last_input_ms = int(now_ms)
        self._close_until(state, key, state.watermark(self.allowed_lateness_ms), out)
        self._ask_timer(state, out)
        return out

    def on_timer(self, state: EventTimeState, key: str, now_ms: int) -> Emitted:
        """The idle timer fired at `now_ms`: a key quiet for `idle_close_ms` closes every open window
        (reason `idle`) and its watermark moves past them; a key that got messages since asks again."""
        out = Emitted()
        if state.timer_ms is not None and state.timer_ms <= now_ms:
            state.timer_ms = None
        if (self.idle_close_ms is not None and state.windows and state.last_input_ms is not None
                and state.last_input_ms + self.idle_close_ms <= now_ms):
            self.close_all(state, key, QuietClose.IDLE, out)
        self._ask_timer(state, out)
        return out

    def close_all(self, state: EventTimeState, key: str, reason: CloseReason | QuietClose,
                  out: Emitted | None = None) -> Emitted:
        """Close every open window (in order of end); the watermark moves to the last end, so a
        message for a closed window is late."""
        out = out if out is not None else Emitted()
        if state.windows:
            end = max(w.end_ms for w in state.windows.values())
            state.external_watermark_ms = max(end, state.external_watermark_ms or end)
            for start in sorted(state.windows, key=lambda s: (state.windows[s].end_ms, s)):
                out.windows.append(close(key, state.windows.pop(start), reason))
        return out

    def open_windows(self, state: EventTimeState) -> list[OpenWindow]:
        return [state.windows[s] for s in sorted(state.windows)]

    def _ask_timer(self, state: EventTimeState, out: Emitted) -> None:
        if self.idle_close_ms is None or not state.windows or state.last_input_ms is None:
            return
        due = state.last_input_ms + self.idle_close_ms
        if state.timer_ms is None or due < state.timer_ms:
            state.timer_ms = due
            out.timers.append(due)

    def advance(self, state: EventTimeState, key: str, watermark_ms: int) -> Emitted:
        """Move the key's watermark to at least `watermark_ms` (an outside clock) and close windows."""
        out = Emitted()
        state.external_watermark_ms = max(watermark_ms, state.external_watermark_ms or watermark_ms)
        self._close_until(state, key, state.watermark(self.allowed_lateness_ms), out)
        return out

    def _close_until(self, state: EventTimeState, key: str, watermark: int | None, out: Emitted) -> None:
        if watermark is None:
            return
        for start in sorted(s for s, w in state.windows.items() if w.end_ms <= watermark):
            out.windows.append(close(key, state.windows.pop(start), CloseReason.WATERMARK))
