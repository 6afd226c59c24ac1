"""Session windows: per key, a window stays open while messages arrive within a gap of each other.

A message at time t opens the session `[t, t + gap)`; a session is `[first time, last time + gap)`.
A message whose `[t, t + gap)` overlaps open sessions joins them: when it overlaps two (a late message
landing between them, "bridging" them), they merge into one, their accumulators combined with the
aggregator's `merge`. So the sessions of a key are the groups of its messages in time order where
each is less than `gap` after the one before.

Time is event time (a field of the message) or processing time (the micro-batch's clock):

- Event time: the key's watermark is its latest event time minus `allowed_lateness_ms`, as for
  `EventTimeWindows`; a session closes (reason `watermark`) once the watermark reaches its end. A
  message older than the watermark is late: dropped (counted) or routed as a `LateEvent`. A closed
  session never takes another message: anything that could have joined it is late. With
  `idle_close_ms`, a key that got no message for that long of processing time closes every open
  session (reason `idle`) and its watermark moves past them (later messages for them are late).
- Processing time: t is the micro-batch's clock (nothing is late); a session closes (reason `timer`)
  when the clock reaches its end, by a timer, with or without further messages.

Timers: the state keeps one pending timer at a time, at the earliest moment something may close
(`Emitted.timers`); a timer that fires early (the session grew) asks for the next one.

`reference_sessions` is the plain form: a key's whole input grouped by sorting, the late messages
found by the watermark in arrival order. The incremental form equals it for an aggregator whose
result does not depend on the order of messages (sessions merge: order across a merge is lost).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from windows.core import Aggregator, CloseReason, Emitted, OpenWindow, QuietClose, WindowResult, close
from windows.event_time import LatePolicy, handled_late


class SessionState:
    """Keyed state: the key's open sessions (by start), its watermark inputs, its pending timer."""

    def __init__(self) -> None:
        self.sessions: list[OpenWindow] = []  # sorted by start, never overlapping
        self.max_event_ms: int | None = None
        self.external_watermark_ms: int | None = None
        self.dropped_late: int = 0
        self.last_input_ms: int | None = None  # processing time of the key's last message
        self.timer_ms: int | None = None  # the pending timer this state asked for

    def watermark(self, allowed_lateness_ms: int) -> int | None:
        own = None if self.max_event_ms is None else self.max_event_ms - allowed_lateness_ms
        marks = [m for m in (own, self.external_watermark_ms) if m is not None]
        return max(marks) if marks else None


@dataclass(frozen=True)
class SessionWindows:
    """Window definition: sessions of `gap_ms` over `aggregator` (which must have `merge`).

    `processing_time`: t is the clock passed to `process` and sessions close by timers. Else event
    time with `allowed_lateness_ms`, `late_policy` and optional `idle_close_ms`."""

    aggregator: Aggregator
    gap_ms: int
    allowed_lateness_ms: int = 0
    late_policy: LatePolicy = LatePolicy.DROP
    processing_time: bool = False
    idle_close_ms: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.gap_ms, int) or self.gap_ms <= 0:
            raise ValueError(f"session windows: gap_ms must be a positive int, got {self.gap_ms!r}")
        if self.allowed_lateness_ms < 0:
            raise ValueError("session windows: allowed_lateness_ms must not be negative")
        if self.idle_close_ms is not None and (not isinstance(self.idle_close_ms, int) or self.idle_close_ms <= 0):
            raise ValueError(f"session windows: idle_close_ms must be a positive int, got {self.idle_close_ms!r}")
        if self.processing_time and (self.allowed_lateness_ms or self.idle_close_ms is not None):
            raise ValueError("session windows of processing time have no lateness and close by the clock: "
                             "allowed_lateness_ms and idle_close_ms are for event time")
        if self.aggregator.merge is None:
            raise TypeError("session windows merge the sessions a message bridges: give the Aggregator a "
                            "merge=(acc, acc) -> acc (e.g. lambda a, b: a + b for a count)")
        object.__setattr__(self, "late_policy", LatePolicy(self.late_policy))

    @property
    def timers(self) -> bool:
        return self.processing_time or self.idle_close_ms is not None

    # -- messages -----------------------------------------------------------------------------
    def process(self, state: SessionState, key: str, seq: int, event_ms: int, msg: Any, now_ms: int = 0) -> Emitted:
        """Fold `msg` of time `event_ms` (processing time: pass the clock as both) received at `now_ms`."""
        out = Emitted()
        t = int(event_ms)
        if handled_late(self.late_policy, state, self.allowed_lateness_ms, key, seq, t, msg, out):
            return out
        joined = [w for w in state.sessions if w.start_ms < t + self.gap_ms and t < w.end_ms]
        if joined:
            session = joined[0]
            for other in joined[1:]:  # bridged: merge into the earliest
                session.value = self.aggregator.merge(session.value, other.value)
                session.add_seq_range(other.first_seq, other.last_seq, other.size)
                session.end_ms = max(session.end_ms, other.end_ms)
            state.sessions = [w for w in state.sessions if not any(w is o for o in joined[1:])]
            session.start_ms = min(session.start_ms, t)
            session.end_ms = max(session.end_ms, t + self.gap_ms)
        else:
            session = OpenWindow(self.aggregator.create(), start_ms=t, end_ms=t + self.gap_ms)
            state.sessions.append(session)
            state.sessions.sort(key=lambda w: w.start_ms)
        session.value = self.aggregator.add(session.value, msg)
        session.add_seq_range(seq, seq, 1)
        state.max_event_ms = t if state.max_event_ms is None else max(state.max_event_ms, t)
        state.last_input_ms = int(now_ms)
        self._close_until(state, key, state.watermark(self.allowed_lateness_ms), out, self._reason)
        self._ask_timer(state, out)
        return out

    # -- clocks -------------------------------------------------------------------------------
    def advance(self, state: SessionState, key: str, watermark_ms: int) -> Emitted:
        """Move the key's watermark to at least `watermark_ms` (an outside clock) and close sessions."""
        out = Emitted()
        state.external_watermark_ms = max(watermark_ms, state.external_watermark_ms or watermark_ms)
        self._close_until(state, key, state.watermark(self.allowed_lateness_ms), out, CloseReason.WATERMARK)
        return out

    def on_timer(self, state: SessionState, key: str, now_ms: int) -> Emitted:
        """A timer fired at `now_ms`: close what the clock closes, then ask for the next timer."""
        out = Emitted()
        if state.timer_ms is not None and state.timer_ms <= now_ms:
            state.timer_ms = None
        if self.processing_time:
            self._close_until(state, key, int(now_ms), out, CloseReason.TIMER)
        elif (self.idle_close_ms is not None and state.sessions and state.last_input_ms is not None
              and state.last_input_ms + self.idle_close_ms <= now_ms):
            self.close_all(state, key, QuietClose.IDLE, out)
        self._ask_timer(state, out)
        return out

    def close_all(self, state: SessionState, key: str, reason: CloseReason | QuietClose, out: Emitted | None = None) -> Emitted:
        """Close every open session (idle key, end of input); the watermark moves past them, so a
        message that would have joined one is late."""
        out = out if out is not None else Emitted()
        if state.sessions:
            end = max(w.end_ms for w in state.sessions)
            state.external_watermark_ms = max(end, state.external_watermark_ms or end)
            self._close_until(state, key, end, out, reason)
        return out

    def open_windows(self, state: SessionState) -> list[OpenWindow]:
        return list(state.sessions)

    # -- helpers ------------------------------------------------------------------------------
    @property
    def _reason(self) -> CloseReason:
        return CloseReason.TIMER if self.processing_time else CloseReason.WATERMARK

    def _close_until(self, state: SessionState, key: str, watermark: int | None, out: Emitted,
                     reason: CloseReason | QuietClose) -> None:
        if watermark is None:
            return
        done = sorted((w for w in state.sessions if w.end_ms <= watermark), key=lambda w: (w.end_ms, w.start_ms))
        if done:
            state.sessions = [w for w in state.sessions if w.end_ms > watermark]
            out.windows.extend(close(key, w, reason) for w in done)

    def _next_due(self, state: SessionState) -> int | None:
        if not state.sessions:
            return None
        if self.processing_time:
            return min(w.end_ms for w in state.sessions)
        if self.idle_close_ms is not None and state.last_input_ms is not None:
            return state.last_input_ms + self.idle_close_ms
        return None

    def _ask_timer(self, state: SessionState, out: Emitted) -> None:
        due = self._next_due(state)
        if due is not None and (state.timer_ms is None or due < state.timer_ms):
            state.timer_ms = due
            out.timers.append(due)


def reference_sessions(aggregator: Aggregator, gap_ms: int, allowed_lateness_ms: int, key: str,
                       events: Sequence[tuple[int, int, Any]]):
    """The sessions of one key's whole event-time input, `events` = (seq, event_ms, message) in
    arrival order: (closed WindowResults by end, open sessions as WindowResults, late (seq, event_ms)).
    Late: older than the watermark when it arrived; the rest grouped by sorting on time."""
    late, kept, max_t = [], [], None
    for seq, t, msg in events:
        if max_t is not None and t < max_t - allowed_lateness_ms:
            late.append((seq, t))
            continue
        kept.append((t, seq, msg))
        max_t = t if max_t is None else max(max_t, t)
    groups: list[list] = []
    for t, seq, msg in sorted(kept, key=lambda e: (e[0], e[1])):
        if groups and t < max(e[0] for e in groups[-1]) + gap_ms:
            groups[-1].append((t, seq, msg))
        else:
            groups.append([(t, seq, msg)])
    closed, still_open = [], []
    for g in groups:
        value = aggregator.create()
        for _, _, msg in g:
            value = aggregator.add(value, msg)
        w = OpenWindow(value, first_seq=min(e[1] for e in g), last_seq=max(e[1] for e in g), size=len(g),
                       start_ms=g[0][0], end_ms=max(e[0] for e in g) + gap_ms)
        if max_t is not None and w.end_ms <= max_t - allowed_lateness_ms:
            closed.append(close(key, w, CloseReason.WATERMARK))
        else:
            still_open.append(close(key, w, CloseReason.WATERMARK))
    return sorted(closed, key=_order), sorted(still_open, key=_order), late


def _order(w: WindowResult):
    return (w.end_ms, w.start_ms)
