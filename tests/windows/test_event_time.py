"""Event-time tumbling and sliding windows: watermark, late-data policy, exact windows out."""

import pytest

from windows import Aggregator, EventTimeState, EventTimeWindows, LateEvent, LatePolicy


def collect() -> Aggregator:
    return Aggregator(create=list, add=lambda acc, m: acc + [m])


def feed(wd, events, state=None, key="k"):
    """events: (event_ms, value); sequence numbers from 1. Returns (windows, late, state)."""
    state = state or EventTimeState()
    windows, late = [], []
    for seq, (t, v) in enumerate(events, 1):
        out = wd.process(state, key, seq, t, v)
        windows.extend(out.windows)
        late.extend(out.late)
    return windows, late, state


def brief(windows):
    return [(w.start_ms, w.end_ms, w.value, w.close_reason.value, w.first_seq, w.last_seq) for w in windows]


def test_tumbling_windows_close_when_the_watermark_passes_their_end():
    wd = EventTimeWindows(collect(), size_ms=10)
    windows, late, state = feed(wd, [(1, "a"), (5, "b"), (12, "c"), (19, "d"), (20, "e")])
    assert brief(windows) == [(0, 10, ["a", "b"], "watermark", 1, 2), (10, 20, ["c", "d"], "watermark", 3, 4)]
    assert windows[0].window_id == "k/0-10"
    assert late == [] and list(state.windows) == [20]


def test_allowed_lateness_keeps_windows_open_and_late_events_are_routed():
    wd = EventTimeWindows(collect(), size_ms=10, allowed_lateness_ms=5, late_policy="route")
    windows, late, state = feed(wd, [(1, "a"), (12, "b"), (8, "c"), (16, "d"), (3, "e"), (14, "f")])
    # (8) arrives after 12 but within the lateness: still in [0, 10). 16 - 5 = 11 closes [0, 10).
    assert brief(windows) == [(0, 10, ["a", "c"], "watermark", 1, 3)]
    assert late == [LateEvent("k", 5, 3, 11, "e")]
    assert state.windows[10].value == ["b", "d", "f"]


def test_drop_policy_counts_late_events():
    wd = EventTimeWindows(collect(), size_ms=10, late_policy=LatePolicy.DROP)
    windows, late, state = feed(wd, [(15, "a"), (2, "late")])
    assert windows == [] and late == [] and state.dropped_late == 1


def test_sliding_windows_hold_each_event_in_every_window_covering_it():
    wd = EventTimeWindows(collect(), size_ms=10, slide_ms=5)
    assert wd.starts_of(7) == [0, 5] and wd.starts_of(5) == [0, 5] and wd.starts_of(4) == [-5, 0]
    windows, _, state = feed(wd, [(1, "a"), (7, "b"), (12, "c"), (21, "d")])
    assert brief(windows) == [
        (-5, 5, ["a"], "watermark", 1, 1),
        (0, 10, ["a", "b"], "watermark", 1, 2),
        (5, 15, ["b", "c"], "watermark", 2, 3),
        (10, 20, ["c"], "watermark", 3, 3),
    ]
    assert sorted(state.windows) == [15, 20]


def test_advance_closes_windows_from_an_outside_clock():
    wd = EventTimeWindows(collect(), size_ms=10, allowed_lateness_ms=100)
    windows, _, state = feed(wd, [(1, "a"), (11, "b")])
    assert windows == []
    out = wd.advance(state, "k", 20)
    assert brief(out.windows) == [(0, 10, ["a"], "watermark", 1, 1), (10, 20, ["b"], "watermark", 2, 2)]
    assert wd.process(state, "k", 3, 19, "too late").windows == [] and state.dropped_late == 1


def test_bad_definitions_are_refused():
    with pytest.raises(ValueError):
        EventTimeWindows(collect(), size_ms=0)
    with pytest.raises(ValueError):
        EventTimeWindows(collect(), size_ms=10, slide_ms=20)
    with pytest.raises(ValueError):
        EventTimeWindows(collect(), size_ms=10, late_policy="keep")
