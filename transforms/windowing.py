"""Windows as a pipeline step (Wallaroo 0.6's `key_by(...).to(range_windows(...).over(Aggregation))`).

    source("logs", decoder=decode_line)
        .key_by("stream")
        .to(trigger_windows(is_marker=field_is("kind", "marker"), boundary="day").over(counting()))
        .to_sink(DeltaSink("windows", accepts=WindowResult))

A window kind (`trigger_windows`, `count_windows`, `event_time_windows`, `session_windows`,
`wall_clock_windows`) says when windows close; `.over(aggregator)` (a `windows.Aggregator`:
`create()`, `add(acc, msg)`, optional `add_frame(acc, df)` and `merge(acc, acc)`) says what they hold,
and returns a `WindowComputation`: a state computation like any other (`.to()` takes it after
`key_by`), whose state is the key's open windows and whose outputs are the closed windows as
`windows.WindowResult`s. `.emit(fn)` (or `over(..., outputs=fn)`) maps each closed window to output
rows instead (one object, a list, or None); late messages of event-time and session windows with
`late="route"` are output as `windows.LateEvent`s as they are. `.early(every=n, every_ms=t)` also
outputs open windows' running aggregates (`final=False`) before their final result.

The window's key is the pipeline's key (`ctx.key`, see `transforms.api.Context`): each key has its
own windows. Count windows run in the batch form when the aggregator has `add_frame`. Trigger
windows run in the batch form (a key's messages of a micro-batch as one
DataFrame, folded with `add_frame`) when the aggregator has `add_frame` and `is_marker`/`boundary`
are field names or `field_is(...)`; otherwise, and for the time windows, one message at a time. Both
forms give the same windows (`.one_message()` is the reference form, for tests).

Wall-clock windows, processing-time sessions, event-time windows and sessions with an idle timeout,
and early results by the clock use processing-time timers: a window closes when its timer fires (see
`transforms.api.Context` for when that is under `eventide run`), or when the key's next message
finds it overdue.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from transforms.api import Context, StateComputation, check_ttl_ms
from windows import (
    Aggregator,
    CountState,
    CountWindows,
    Emitted,
    EventTimeState,
    EventTimeWindows,
    LatePolicy,
    QuietClose,
    SessionState,
    SessionWindows,
    TriggerState,
    TriggerWindows,
    WallClockState,
    WallClockWindows,
    early_changed,
    early_results,
)

__all__ = [
    "FieldIs",
    "WindowComputation",
    "count_windows",
    "event_time_windows",
    "field_is",
    "session_windows",
    "trigger_windows",
    "wall_clock_windows",
]


# -- reading a message's fields (one message, or a frame of them) -----------------------------------
def _field(msg: Any, name: str) -> Any:
    if isinstance(msg, dict):
        if name not in msg:
            raise KeyError(f"message has no field {name!r}: {msg!r}")
        return msg[name]
    try:
        return getattr(msg, name)
    except AttributeError:
        raise KeyError(f"message has no field {name!r}: {msg!r}") from None


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    if name not in frame.columns:
        raise KeyError(f"messages have no field {name!r} (columns: {list(frame.columns)})")
    return frame[name]


@dataclass(frozen=True)
class FieldIs:
    """True when a message's field equals `value`; works on one message and on a frame of them."""

    name: str
    value: Any

    def __call__(self, msg: Any) -> bool:
        return _field(msg, self.name) == self.value

    def frame(self, frame: pd.DataFrame) -> np.ndarray:
        return (_column(frame, self.name) == self.value).to_numpy(dtype=bool)


def field_is(name: str, value: Any) -> FieldIs:
    """`trigger_windows(is_marker=field_is("kind", "marker"))`: a marker is a message whose `kind`
    is "marker". Unlike a lambda it has a frame form, so the window step can run in batch form."""
    return FieldIs(name, value)


@dataclass(frozen=True)
class _Reader:
    """A field name as a function of the message (and of a frame)."""

    name: str
    truthy: bool = False  # is_marker given as a field name: the field holds a bool

    def __call__(self, msg: Any) -> Any:
        value = _field(msg, self.name)
        return bool(value) if self.truthy else value

    def frame(self, frame: pd.DataFrame) -> np.ndarray:
        col = _column(frame, self.name)
        return col.fillna(False).to_numpy(dtype=bool) if self.truthy else col.to_numpy(dtype=object)


def _reader(what: str, spec: Any, truthy: bool = False) -> Callable | None:
    if spec is None or callable(spec):
        return spec
    if isinstance(spec, str):
        return _Reader(spec, truthy)
    raise TypeError(f"{what} must be a field name (str), a function of the message, or None; got {spec!r}")


def _has_frame_form(fn: Callable | None) -> bool:
    return fn is None or callable(getattr(fn, "frame", None))


def _to_ms(value: Any, where: str) -> int:
    """An event time as epoch milliseconds: int/float ms, datetime (naive = UTC), pandas Timestamp."""
    if isinstance(value, pd.Timestamp):
        value = value.to_pydatetime()
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return int(value.timestamp() * 1000)
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"{where}: event time must be epoch milliseconds or a datetime, got {value!r}")


# -- the step ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WindowComputation(StateComputation):
    """A window step: a state computation whose outputs are the closed windows (or `emit`'s rows).

    `window` is the window definition (`windows.TriggerWindows`, `EventTimeWindows` or
    `WallClockWindows`) holding the aggregator.
    """

    window: Any = None
    kind: Any = None  # the _WindowKind that built it
    outputs: Callable | None = None
    early_every: int | None = None
    early_every_ms: int | None = None

    def emit(self, fn: Callable[[Any], Any]) -> WindowComputation:
        """Map each closed window (`WindowResult`) to its output rows: one object, a list, or None."""
        return replace(self.kind.build(self.window, self.name, self.state, fn, self.batch, self.early_every,
                                       self.early_every_ms), ttl_ms=self.ttl_ms)

    @property
    def reads(self) -> tuple[str, ...] | None:
        """The window's own fields and its aggregator's declared `columns`; None when either is unknown."""
        own, declared = self.kind.fields(), self.window.aggregator.columns
        if not self.batch or own is None or declared is None:
            return None
        return tuple(dict.fromkeys((*own, *declared)))

    @property
    def prefolds(self) -> bool:
        """Whether the engine may fold runs of a key's messages ahead of this step (see `prefold`): a
        batch-form step without early results, whose window kind and aggregator allow it."""
        return self.batch and self.early_every is None and self.early_every_ms is None and \
            self.kind.can_prefold(self.window)

    def prefold(self, frame: pd.DataFrame, breaks: np.ndarray, min_run: int = 2) -> list:
        """Runs of `frame` (messages in sequence order with their `_seq`, keys apart by `breaks`) the
        step may take folded: [(start, stop, windows.Folded)]. A frame the step later gets may hold a
        `_folded` column: per row None, or the Folded run it stands for."""
        return self.kind.prefold(self.window, frame, breaks, min_run)

    def one_message(self) -> WindowComputation:
        """The same step, one message at a time: the reference its batch form must equal."""
        return replace(self.kind.build(self.window, self.name, self.state, self.outputs, False, self.early_every,
                                       self.early_every_ms), ttl_ms=self.ttl_ms)

    def ttl(self, ms: int) -> WindowComputation:
        """The same step whose key's state (its open windows included) Spark removes after `ms`
        milliseconds of processing time without a message of the key."""
        check_ttl_ms(self.name, ms)
        return replace(self, ttl_ms=ms)

    def early(self, every: int | None = None, every_ms: int | None = None) -> WindowComputation:
        """Also output each open window's running aggregate before its one final result, as a
        `WindowResult` with `final=False` (and `close_reason` None): every `every` messages it folds in
        (a window that closes on such a message gives only the final), and/or every `every_ms` of
        wall clock while it is open, if it folded messages since its last one (timers). Runs one
        message at a time."""
        for name, value in (("every", every), ("every_ms", every_ms)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{self.name}: early({name}=...) must be a positive int, got {value!r}")
        if every is None and every_ms is None:
            raise ValueError(f"{self.name}: early() needs every=N (messages) or every_ms=T (wall clock), or both")
        return replace(self.kind.build(self.window, self.name, self.state, self.outputs, False, every, every_ms),
                       ttl_ms=self.ttl_ms)

    # -- end of input (`eventide run --close-windows`; the engine calls these, see close_windows.py) --
    def open_at_end(self, state: Any) -> bool:
        """Whether the key's window state has an open window (one `close_at_end` would close)."""
        return state is not None and bool(self.window.open_windows(state))

    def close_at_end(self, key: str, state: Any, ctx: Context) -> list:
        """Close every open window of the key (reason `end_of_input`): its output rows."""
        run = _Run(self.kind, self.window, self.outputs)
        return run.rows(self.kind.close_all(self.window, state, ctx))


@dataclass(frozen=True)
class _Run:
    """The functions a WindowComputation runs (picklable: Spark ships them to its workers)."""

    kind: Any
    window: Any
    outputs: Callable | None
    early_every: int | None = None
    early_every_ms: int | None = None

    def rows(self, emitted: Emitted) -> list:
        out: list = []
        for w in emitted.windows:
            if self.outputs is None:
                out.append(w)
                continue
            rows = self.outputs(w)
            if isinstance(rows, (list, tuple)):
                out.extend(r for r in rows if r is not None)
            elif rows is not None:
                out.append(rows)
        out.extend(emitted.late)
        return out

    def one(self, msg: Any, state: Any, ctx: Context) -> list:
        emitted = self.kind.process(self.window, state, _need(ctx), msg)
        for at in emitted.timers:
            ctx.register_timer(at)
        if self.early_every is not None:  # after the finals: a window closed by this message has none
            emitted.windows.extend(early_results(ctx.key, self.window.open_windows(state), self.early_every))
        if self.early_every_ms is not None and getattr(state, "early_timer_ms", None) is None \
                and self.window.open_windows(state):  # one pending early-results timer per key
            state.early_timer_ms = ctx.processing_time_ms + self.early_every_ms
            ctx.register_timer(state.early_timer_ms)
        return self.rows(emitted)

    def frame(self, frame: pd.DataFrame, state: Any, ctx: Context) -> list:
        return self.rows(self.kind.process_frame(self.window, state, _need(ctx), frame))

    def timer(self, key: str, state: Any, expiry_ms: int, ctx: Context) -> list:
        own = getattr(self.window, "on_timer", None)  # the kind's timers (trigger and count windows have none)
        emitted = own(state, key, expiry_ms) if own is not None else Emitted()
        pending = getattr(state, "early_timer_ms", None)
        if self.early_every_ms is not None and pending is not None and pending <= expiry_ms:
            state.early_timer_ms = None  # after the kind's own closes: a closed window has no partial
            emitted.windows.extend(early_changed(key, self.window.open_windows(state)))
            if self.window.open_windows(state):
                state.early_timer_ms = expiry_ms + self.early_every_ms
                emitted.timers.append(state.early_timer_ms)
        for at in emitted.timers:  # the next timer a kind asks for when one fires
            ctx.register_timer(at)
        return self.rows(emitted)


def _need(ctx: Context | None) -> Context:
    if ctx is None:
        raise TypeError("a window step needs its Context (the key): call it as fn(message, state, Context(key=...))")
    return ctx


@dataclass(frozen=True)
class _WindowKind:
    """A window kind waiting for its aggregator: `.over(aggregator)` makes the step."""

    state_class: ClassVar[type]
    default_name: ClassVar[str]
    timers: ClassVar[bool] = False  # closed by processing-time timers: the step gets on_timer

    def definition(self, aggregator: Aggregator) -> Any:
        raise NotImplementedError

    def uses_timers(self) -> bool:
        return self.timers

    def batch_form(self, window: Any) -> bool:
        return False

    def fields(self) -> tuple[str, ...] | None:
        """The message fields the batch form reads itself (None: unknown, e.g. a function of the message)."""
        return None

    def process(self, window: Any, state: Any, ctx: Context, msg: Any) -> Emitted:
        raise NotImplementedError

    def process_frame(self, window: Any, state: Any, ctx: Context, frame: pd.DataFrame) -> Emitted:
        raise NotImplementedError

    def can_prefold(self, window: Any) -> bool:
        return False

    def prefold(self, window: Any, frame: pd.DataFrame, breaks: np.ndarray, min_run: int) -> list:
        raise NotImplementedError

    def close_all(self, window: Any, state: Any, ctx: Context) -> Emitted:
        """The input ended: close every open window of the key (`QuietClose.END_OF_INPUT`)."""
        return window.close_all(state, ctx.key, QuietClose.END_OF_INPUT)

    def over(self, aggregator: Aggregator, *, name: str | None = None, state: type | None = None,
             outputs: Callable[[Any], Any] | None = None) -> WindowComputation:
        """The window step folding each window's messages with `aggregator`.

        `name` names the step (quarantine rows say which step failed); `state` may be a subclass of
        the kind's state class (to keep an existing keyed state's class name); `outputs` maps each
        closed window to its output rows (default: the `WindowResult` itself).
        """
        if not isinstance(aggregator, Aggregator):
            raise TypeError(f"{self.default_name}: .over() takes a windows.Aggregator (e.g. windows.counting()), "
                            f"got {aggregator!r}")
        state = state or self.state_class
        if not (isinstance(state, type) and issubclass(state, self.state_class)):
            raise TypeError(f"{self.default_name}: state must be a subclass of {self.state_class.__name__}, got {state!r}")
        window = self.definition(aggregator)
        return self.build(window, name or self.default_name, state, outputs, self.batch_form(window))

    def build(self, window, name, state, outputs, batch, early_every=None, early_every_ms=None) -> WindowComputation:
        run = _Run(self, window, outputs, early_every, early_every_ms)
        return WindowComputation(
            fn=run.frame if batch else run.one,
            name=name,
            state=state,
            batch=batch,
            on_timer=run.timer if self.uses_timers() or early_every_ms is not None else None,
            with_context=True,
            window=window,
            kind=self,
            outputs=outputs,
            early_every=early_every,
            early_every_ms=early_every_ms,
        )


@dataclass(frozen=True)
class TriggerWindowKind(_WindowKind):
    state_class: ClassVar[type] = TriggerState
    default_name: ClassVar[str] = "trigger windows"

    is_marker: Callable | None = None
    boundary: Callable | None = None
    max_count: int | None = None

    def definition(self, aggregator: Aggregator) -> TriggerWindows:
        return TriggerWindows(aggregator, is_marker=self.is_marker, boundary=self.boundary, max_count=self.max_count)

    def batch_form(self, window: TriggerWindows) -> bool:
        return (window.aggregator.add_frame is not None and _has_frame_form(self.is_marker)
                and _has_frame_form(self.boundary))

    def fields(self) -> tuple[str, ...] | None:
        triggers = [t for t in (self.is_marker, self.boundary) if t is not None]
        if not all(isinstance(t, (FieldIs, _Reader)) for t in triggers):
            return None
        return tuple(t.name for t in triggers)

    def process(self, window: TriggerWindows, state, ctx: Context, msg) -> Emitted:
        return window.process(state, ctx.key, ctx.seq, msg)

    def process_frame(self, window: TriggerWindows, state, ctx: Context, frame: pd.DataFrame) -> Emitted:
        folded = None
        if "_folded" in frame.columns:  # the aggregator sees the messages' own columns only
            folded, frame = frame["_folded"].to_numpy(), frame.drop(columns="_folded")
        return window.process_frame(
            state, ctx.key, frame, seq=frame["_seq"].to_numpy(),
            markers=None if self.is_marker is None else self.is_marker.frame(frame),
            boundaries=None if self.boundary is None else self.boundary.frame(frame),
            folded=folded,
        )

    def can_prefold(self, window: TriggerWindows) -> bool:
        return self.batch_form(window) and window.can_prefold

    def prefold(self, window: TriggerWindows, frame: pd.DataFrame, breaks: np.ndarray, min_run: int) -> list:
        return window.prefold(
            frame, frame["_seq"].to_numpy(), breaks,
            markers=None if self.is_marker is None else self.is_marker.frame(frame),
            boundaries=None if self.boundary is None else self.boundary.frame(frame),
            min_run=min_run,
        )


def trigger_windows(*, is_marker: str | Callable | None = None, boundary: str | Callable | None = None,
                    max_count: int | None = None) -> TriggerWindowKind:
    """Windows closed by the data: one open window per key, closed by a marker message (reason
    `marker`; the marker itself is in no window), by a message whose `boundary` value differs from the
    window's (`day_change`; that message opens the next window), or at `max_count` messages (`count`).

    `is_marker`: a field name holding a bool, `field_is(name, value)`, or a function of the message.
    `boundary`: a field name or a function of the message. None turns a trigger off.
    """
    if is_marker is None and boundary is None and max_count is None:
        raise ValueError("trigger_windows: give at least one of is_marker, boundary, max_count (else no window closes)")
    if max_count is not None and (not isinstance(max_count, int) or max_count < 1):
        raise ValueError(f"trigger_windows: max_count must be a positive int, got {max_count!r}")
    return TriggerWindowKind(_reader("trigger_windows(is_marker=...)", is_marker, truthy=True),
                             _reader("trigger_windows(boundary=...)", boundary), max_count)


@dataclass(frozen=True)
class EventTimeWindowKind(_WindowKind):
    state_class: ClassVar[type] = EventTimeState
    default_name: ClassVar[str] = "event-time windows"

    size_ms: int = 0
    slide_ms: int | None = None
    event_time: Callable | None = None
    allowed_lateness_ms: int = 0
    late: LatePolicy = LatePolicy.DROP
    idle_close_ms: int | None = None

    def definition(self, aggregator: Aggregator) -> EventTimeWindows:
        return EventTimeWindows(aggregator, self.size_ms, self.slide_ms, self.allowed_lateness_ms, self.late,
                                self.idle_close_ms)

    def uses_timers(self) -> bool:
        return self.idle_close_ms is not None

    def process(self, window: EventTimeWindows, state, ctx: Context, msg) -> Emitted:
        event_ms = _to_ms(self.event_time(msg), "event_time_windows(event_time=...)")
        return window.process(state, ctx.key, ctx.seq, event_ms, msg, now_ms=ctx.processing_time_ms)


def event_time_windows(size_ms: int, slide_ms: int | None = None, *, event_time: str | Callable,
                       allowed_lateness_ms: int = 0, late: str = "drop",
                       idle_close_ms: int | None = None) -> EventTimeWindowKind:
    """Tumbling (`slide_ms` None) or sliding windows `[start, start + size_ms)` of event time.

    `event_time`: a field name or function giving the message's time (epoch ms or a datetime). Each key
    keeps its own watermark, its max event time minus `allowed_lateness_ms`; a window closes (reason
    `watermark`) as soon as the watermark passes its end, in the same micro-batch. A message older than
    the watermark is late: `late="drop"` counts it in the state, `late="route"` outputs it as a
    `windows.LateEvent` (give it a sink with `accepts=LateEvent`). `idle_close_ms`: a key that got no
    message for that long by the wall clock closes every open window (reason `idle`, by a timer), so
    the last windows of a quiet key or a finished input close without later events.
    """
    if event_time is None:
        raise ValueError("event_time_windows: event_time=... (a field name or a function of the message) is required")
    try:
        policy = LatePolicy(late)
    except ValueError:
        raise ValueError(f"event_time_windows: late must be 'drop' or 'route', got {late!r}") from None
    kind = EventTimeWindowKind(size_ms, slide_ms, _reader("event_time_windows(event_time=...)", event_time),
                               allowed_lateness_ms, policy, idle_close_ms)
    kind.definition(Aggregator(create=int, add=lambda a, m: a))  # check the sizes now, not at .over()
    return kind


@dataclass(frozen=True)
class WallClockWindowKind(_WindowKind):
    state_class: ClassVar[type] = WallClockState
    default_name: ClassVar[str] = "wall-clock windows"
    timers: ClassVar[bool] = True

    size_ms: int = 0

    def definition(self, aggregator: Aggregator) -> WallClockWindows:
        return WallClockWindows(aggregator, self.size_ms)

    def process(self, window: WallClockWindows, state, ctx: Context, msg) -> Emitted:
        return window.process(state, ctx.key, ctx.seq, ctx.processing_time_ms, msg)

    def close_all(self, window: WallClockWindows, state, ctx: Context) -> Emitted:
        # Cut at the clock: a later message of the same period opens a window with other bounds.
        return window.close_all(state, ctx.key, QuietClose.END_OF_INPUT, now_ms=ctx.processing_time_ms or None)


def wall_clock_windows(size_ms: int) -> WallClockWindowKind:
    """Tumbling windows of processing time (aligned to `size_ms`), closed by a timer at their end
    (reason `timer`): a key's window closes even if the key gets no further message."""
    WallClockWindows(Aggregator(create=int, add=lambda a, m: a), size_ms)  # check the size now
    return WallClockWindowKind(size_ms)



@dataclass(frozen=True)
class CountWindowKind(_WindowKind):
    state_class: ClassVar[type] = CountState
    default_name: ClassVar[str] = "count windows"

    size: int = 0
    slide: int | None = None

    def definition(self, aggregator: Aggregator) -> CountWindows:
        return CountWindows(aggregator, self.size, self.slide)

    def batch_form(self, window: CountWindows) -> bool:
        return window.aggregator.add_frame is not None

    def fields(self) -> tuple[str, ...]:
        return ()  # a count window reads no field

    def process(self, window: CountWindows, state, ctx: Context, msg) -> Emitted:
        return window.process(state, ctx.key, ctx.seq, msg)

    def process_frame(self, window: CountWindows, state, ctx: Context, frame: pd.DataFrame) -> Emitted:
        return window.process_frame(state, ctx.key, frame, seq=frame["_seq"].to_numpy())


def count_windows(size: int, slide: int | None = None) -> CountWindowKind:
    """Windows of `size` messages per key, a new one every `slide` messages (None: tumbling, one after
    the other; smaller: sliding, overlapping). A window closes (reason `count`) on its `size`-th
    message; its bounds are its messages' sequence numbers (`first_seq`, `last_seq`)."""
    CountWindows(Aggregator(create=int, add=lambda a, m: a), size, slide)  # check the sizes now
    return CountWindowKind(size, slide)


@dataclass(frozen=True)
class SessionWindowKind(_WindowKind):
    state_class: ClassVar[type] = SessionState
    default_name: ClassVar[str] = "session windows"

    gap_ms: int = 0
    event_time: Callable | None = None  # None: processing time
    allowed_lateness_ms: int = 0
    late: LatePolicy = LatePolicy.DROP
    idle_close_ms: int | None = None

    def definition(self, aggregator: Aggregator) -> SessionWindows:
        return SessionWindows(aggregator, self.gap_ms, self.allowed_lateness_ms, self.late,
                              processing_time=self.event_time is None, idle_close_ms=self.idle_close_ms)

    def uses_timers(self) -> bool:
        return self.event_time is None or self.idle_close_ms is not None

    def process(self, window: SessionWindows, state, ctx: Context, msg) -> Emitted:
        now = ctx.processing_time_ms
        t = now if self.event_time is None else _to_ms(self.event_time(msg), "session_windows(event_time=...)")
        return window.process(state, ctx.key, ctx.seq, t, msg, now_ms=now)


def session_windows(gap_ms: int, *, event_time: str | Callable | None = None, allowed_lateness_ms: int = 0,
                    late: str = "drop", idle_close_ms: int | None = None) -> SessionWindowKind:
    """Per key, a session stays open while messages come less than `gap_ms` apart; `.over(aggregator)`
    needs an aggregator with `merge` (a late message may bridge two sessions into one).

    `event_time`: a field name or function of the message (epoch ms or a datetime): sessions close
    (reason `watermark`) when the key's watermark (latest event time minus `allowed_lateness_ms`)
    reaches their end (last message + gap); older messages are late (`late="drop"` or `"route"`, as
    for event_time_windows). `idle_close_ms`: also close a key's sessions (reason `idle`) once it got
    no message for that long by the wall clock (timers). `event_time=None`: processing time, sessions
    close by a timer at their end (reason `timer`), also when no message comes."""
    try:
        policy = LatePolicy(late)
    except ValueError:
        raise ValueError(f"session_windows: late must be 'drop' or 'route', got {late!r}") from None
    kind = SessionWindowKind(gap_ms, _reader("session_windows(event_time=...)", event_time), allowed_lateness_ms,
                             policy, idle_close_ms)
    kind.definition(Aggregator(create=int, add=lambda a, m: a, merge=lambda a, b: a))  # check now, not at .over()
    return kind
