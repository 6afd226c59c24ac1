"""What every window kind shares: the aggregator, the open window, the closed window and why it closed.

Windows here are plain Python objects driven by plain function calls (no Spark, no Dagster), so a
test can feed a stream of messages and assert the exact windows that come out. A state computation
keeps the window *state* object in its keyed state (pickled into RocksDB by the engine) and holds
the window *definition* (trigger settings, aggregator) as a module-level constant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class CloseReason(str, Enum):
    """How a window closed; stored with every window result."""

    MARKER = "marker"  # an END_OF_DAY style message of the window's source
    DAY_CHANGE = "day_change"  # the data moved to a new boundary value (a new calendar day)
    COUNT = "count"  # the window reached its message limit
    WATERMARK = "watermark"  # event time passed the window's end (allowed lateness included)
    TIMER = "timer"  # wall clock passed the window's end (processing-time timer)

    def __str__(self) -> str:
        return self.value


class QuietClose(str, Enum):
    """How a window closed before its own trigger did, because its input went quiet (a close reason
    too: `WindowResult.close_reason` is a CloseReason or a QuietClose, stored as the string)."""

    IDLE = "idle"  # the key got no message for the window's idle timeout (wall clock)
    END_OF_INPUT = "end_of_input"  # closed at the end of a finite input, when the run was asked to

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Aggregator:
    """How a window folds its messages into one value.

    `create()` makes an empty accumulator, `add(acc, msg)` folds one message and returns the
    accumulator. `add_frame(acc, frame)` (optional) folds a pandas DataFrame of messages at once for
    batch state computations; it must agree with folding the rows one by one. `merge(acc, acc)`
    (optional; session windows need it) combines two accumulators into one, as if one had folded
    both's messages. `columns` (optional) names the message fields `add_frame` reads: declared, a
    query that decodes into columns carries only those (and the window's own fields) to the keyed
    step, which is most of that step's cost for wide messages; None: every field.
    """

    create: Callable[[], Any]
    add: Callable[[Any, Any], Any]
    add_frame: Callable[[Any, Any], Any] | None = None
    merge: Callable[[Any, Any], Any] | None = None
    columns: tuple[str, ...] | None = None


def counting() -> Aggregator:
    """Counts messages (the accumulator is an int)."""
    return Aggregator(create=int, add=lambda acc, _msg: acc + 1, add_frame=lambda acc, frame: acc + len(frame),
                      merge=lambda a, b: a + b, columns=())


@dataclass
class OpenWindow:
    """A window still collecting messages. Lives in keyed state, so it must pickle."""

    value: Any
    first_seq: int | None = None
    last_seq: int | None = None
    size: int = 0  # messages folded in
    boundary: Any = None  # trigger windows: the boundary value (day) of its messages
    start_ms: int | None = None  # time windows: [start_ms, end_ms)
    end_ms: int | None = None
    early_marks: int = 0  # early results: size // every at the last partial result emitted
    early_size: int = 0  # early results by time: size at the last partial result emitted

    def add_seq_range(self, first: int, last: int, n: int) -> None:
        self.first_seq = first if self.first_seq is None else min(self.first_seq, first)
        self.last_seq = last if self.last_seq is None else max(self.last_seq, last)
        self.size += n


@dataclass(frozen=True)
class WindowResult:
    """A window's result: its aggregate, its bounds, how it closed, and whether it is final.

    - `key`: the pipeline's key (whose window); `window_id`: `key/start_ms-end_ms` for time windows,
      `key/first_seq-last_seq` otherwise (unique per key and window);
    - `close_reason`: how it closed (`CloseReason` or `QuietClose`, stored as its string value; None
      for an early result: the window is still open);
    - `value`: the aggregator's accumulator;
    - `first_seq`/`last_seq`: the lowest and highest landing sequence numbers folded in (for trigger
      windows a contiguous run of the source's messages, markers excluded); `size`: messages folded in;
    - `boundary`: trigger windows' boundary value (the day), else None;
    - `start_ms`/`end_ms`: time windows' bounds `[start_ms, end_ms)` in ms (event or processing time),
      else None;
    - `final`: True for the one result of a closed window; False for an early (partial) result of a
      window still open, which a later result of the same `window_id` supersedes.

    `window_result_schema(value_type)` is its Delta table's schema, every column typed from the start.
    """

    key: str
    window_id: str
    close_reason: CloseReason | QuietClose
    value: Any
    first_seq: int
    last_seq: int
    size: int
    boundary: Any = None
    start_ms: int | None = None
    end_ms: int | None = None
    final: bool = True


def window_result_schema(value_type, boundary_type=None):
    """The Arrow schema of `WindowResult` rows (the default emit) for `DeltaSink(schema=...)`: with it
    the table has every column from its first batch, also those None so far (an inferred schema leaves
    a column out until some row has a value). `value_type`: the accumulator's Arrow type;
    `boundary_type`: trigger windows' boundary values (default string)."""
    import pyarrow as pa

    return pa.schema([
        ("key", pa.string()), ("window_id", pa.string()), ("close_reason", pa.string()), ("value", value_type),
        ("first_seq", pa.int64()), ("last_seq", pa.int64()), ("size", pa.int64()),
        ("boundary", boundary_type or pa.string()), ("start_ms", pa.int64()), ("end_ms", pa.int64()),
        ("final", pa.bool_()),
    ])


def close(key: str, window: OpenWindow, reason: CloseReason | QuietClose | None) -> WindowResult:
    if window.start_ms is not None:
        window_id = f"{key}/{window.start_ms}-{window.end_ms}"
    else:
        window_id = f"{key}/{window.first_seq}-{window.last_seq}"
    return WindowResult(
        key=key,
        window_id=window_id,
        close_reason=reason,
        value=window.value,
        first_seq=int(window.first_seq),
        last_seq=int(window.last_seq),
        size=window.size,
        boundary=window.boundary,
        start_ms=window.start_ms,
        end_ms=window.end_ms,
    )


def early_results(key: str, windows, every: int) -> list[WindowResult]:
    """Partial results (`final=False`, `close_reason` None) of the open `windows` whose message count
    reached a new multiple of `every` since their last one: the running aggregate every `every`
    messages. (A merge of sessions may pass several multiples at once: one partial for them.)"""
    out = []
    for w in windows:
        marks = w.size // every
        if marks > w.early_marks:
            w.early_marks = marks
            out.append(dataclasses.replace(close(key, w, None), final=False))
    return out


def early_changed(key: str, windows) -> list[WindowResult]:
    """Partial results (`final=False`) of the open `windows` that folded messages since their last
    partial: what an early-results timer outputs (an unchanged window gives none)."""
    out = []
    for w in windows:
        if w.size > w.early_size:
            w.early_size = w.size
            out.append(dataclasses.replace(close(key, w, None), final=False))
    return out


@dataclass
class Emitted:
    """What feeding messages produced: closed windows, and late messages (event-time windows)."""

    windows: list[WindowResult] = field(default_factory=list)
    late: list = field(default_factory=list)
    timers: list[int] = field(default_factory=list)  # processing-time timers to register (ms)

    def extend(self, other: Emitted) -> Emitted:
        self.windows.extend(other.windows)
        self.late.extend(other.late)
        self.timers.extend(other.timers)
        return self
