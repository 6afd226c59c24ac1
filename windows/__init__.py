"""Window triggers and their state machinery, as plain Python (no Spark, no Dagster).

- `TriggerWindows`: closed by the data itself: a marker message, a new day, a count limit.
- `EventTimeWindows`: tumbling/sliding event-time windows, per-key watermark, late-data policy.
- `WallClockWindows`: processing-time windows closed by timers.
- `CountWindows`: tumbling and sliding windows of a key's message count.
- `SessionWindows`: per key, sessions of messages within a gap (event or processing time).

Each kind has a definition (frozen, a module constant) and a state class (kept in keyed state);
`process(...)` returns an `Emitted` with the closed `WindowResult`s (each saying how it closed and
which sequence range it covers), late messages, and timers to register.

This package is the window logic alone. In an application, a window is a pipeline step built by
`transforms.windowing`: `key_by(...).to(trigger_windows(...).over(aggregator))`, which keeps each
key's window state in the engine's keyed state and gets the key and the clock from the context.
"""

from windows.core import (
    Aggregator,
    CloseReason,
    Emitted,
    OpenWindow,
    QuietClose,
    WindowResult,
    counting,
    early_changed,
    early_results,
    window_result_schema,
)
from windows.count import CountState, CountWindows, reference_count_windows
from windows.event_time import EventTimeState, EventTimeWindows, LateEvent, LatePolicy, late_event_schema
from windows.session import SessionState, SessionWindows, reference_sessions
from windows.triggers import DEFAULT_MARKER, Folded, TriggerState, TriggerWindows, is_marker
from windows.wall_clock import WallClockState, WallClockWindows

__all__ = [
    "DEFAULT_MARKER",
    "Aggregator",
    "CloseReason",
    "CountState",
    "CountWindows",
    "Emitted",
    "EventTimeState",
    "EventTimeWindows",
    "Folded",
    "LateEvent",
    "LatePolicy",
    "OpenWindow",
    "QuietClose",
    "SessionState",
    "SessionWindows",
    "TriggerState",
    "TriggerWindows",
    "WallClockState",
    "WallClockWindows",
    "WindowResult",
    "counting",
    "early_changed",
    "early_results",
    "is_marker",
    "late_event_schema",
    "reference_count_windows",
    "reference_sessions",
    "window_result_schema",
]
