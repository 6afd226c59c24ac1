"""Session windows: exact sessions, merged by a late message; the step held equal to the reference;
processing-time sessions and idle keys closed by timers."""

import sys
import time

import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from transforms.api import Context
from transforms.windowing import session_windows
from windows import (
    Aggregator,
    CloseReason,
    LateEvent,
    SessionState,
    SessionWindows,
    WindowResult,
    counting,
    reference_sessions,
)


def values() -> Aggregator:
    """The sorted tuple of message values: independent of order, as session merges need."""
    return Aggregator(create=tuple, add=lambda acc, m: tuple(sorted((*acc, m["v"]))),
                      merge=lambda a, b: tuple(sorted(a + b)))


def brief(windows):
    return [(w.window_id, w.start_ms, w.end_ms, w.value, w.close_reason.value, w.first_seq, w.last_seq, w.size)
            for w in windows]


def feed(step, events, key="k", now_ms=0):
    """events: (event_ms, value) in arrival order, sequence numbers from 1."""
    state, out = step.state(), []
    for seq, (t, v) in enumerate(events, 1):
        out.extend(step.apply({"t": t, "v": v}, state, Context(key, processing_time_ms=now_ms, seq=seq)))
    return out, state


def test_a_late_message_bridges_two_sessions_into_one():
    step = session_windows(10, event_time="t", allowed_lateness_ms=20, late="route").over(values())
    out, state = feed(step, [(0, "a"), (5, "b"), (20, "c")])  # sessions [0, 15) and [20, 30)
    assert out == [] and [(w.start_ms, w.end_ms) for w in state.sessions] == [(0, 15), (20, 30)]
    out, _ = [], None
    out += step.apply({"t": 12, "v": "bridge"}, state, Context("k", seq=4))  # [12, 22) overlaps both
    assert [(w.start_ms, w.end_ms, w.value, w.size) for w in state.sessions] == [
        (0, 30, ("a", "b", "bridge", "c"), 4)]
    out += step.apply({"t": 60, "v": "d"}, state, Context("k", seq=5))  # watermark 40 closes [0, 30)
    out += step.apply({"t": 25, "v": "too late"}, state, Context("k", seq=6))  # older than 40
    assert brief(out[:1]) == [("k/0-30", 0, 30, ("a", "b", "bridge", "c"), "watermark", 1, 4, 4)]
    assert out[1:] == [LateEvent("k", 6, 25, 40, {"t": 25, "v": "too late"})]


event = st.tuples(st.integers(0, 60), st.sampled_from("xyz"))


@examples(max_examples=200, deadline=None)
@given(events=st.lists(event, max_size=25), gap=st.integers(1, 15), lateness=st.integers(0, 20))
def test_the_step_equals_the_reference(events, gap, lateness):
    step = session_windows(gap, event_time="t", allowed_lateness_ms=lateness, late="route").over(values())
    out, state = feed(step, events)
    closed, still_open, late = reference_sessions(values(), gap, lateness, "k",
                                                  [(seq, t, {"t": t, "v": v}) for seq, (t, v) in enumerate(events, 1)])
    windows = [o for o in out if isinstance(o, WindowResult)]
    assert sorted(brief(windows), key=lambda b: (b[2], b[1])) == brief(closed)
    assert [(o.seq, o.event_ms) for o in out if isinstance(o, LateEvent)] == late
    # The sessions still open are the reference's open ones (closed here as they would be at the end).
    assert brief(step.window.close_all(state, "k", CloseReason.WATERMARK).windows) == brief(still_open)


def test_processing_time_sessions_keep_one_timer_and_close_by_it():
    wd = SessionWindows(counting(), 1000, processing_time=True)
    state = SessionState()
    assert wd.process(state, "k", 1, 5_000, "a", now_ms=5_000).timers == [6_000]
    assert wd.process(state, "k", 2, 5_400, "b", now_ms=5_400).timers == []  # one pending timer is enough
    early = wd.on_timer(state, "k", 6_000)  # the session grew to 6_400: nothing closes, the next timer
    assert early.windows == [] and early.timers == [6_400]
    closed = wd.on_timer(state, "k", 6_400)
    assert brief(closed.windows) == [("k/5000-6400", 5_000, 6_400, 2, "timer", 1, 2, 2)] and closed.timers == []
    assert wd.on_timer(state, "k", 6_400).windows == []  # never twice
    # A message that finds its key's session overdue (the timer has not run yet) closes it first.
    wd.process(state, "k", 3, 7_000, "c", now_ms=7_000)
    out = wd.process(state, "k", 4, 9_000, "d", now_ms=9_000)
    assert brief(out.windows) == [("k/7000-8000", 7_000, 8_000, 1, "timer", 3, 3, 1)]


def test_an_idle_key_closes_its_event_time_sessions_by_the_wall_clock():
    step = session_windows(10, event_time="t", idle_close_ms=5_000).over(values())
    assert step.on_timer is not None
    wd, state = step.window, SessionState()
    assert wd.process(state, "k", 1, 100, {"v": "a"}, now_ms=1_000).timers == [6_000]
    assert wd.process(state, "k", 2, 104, {"v": "b"}, now_ms=3_000).timers == []
    again = wd.on_timer(state, "k", 6_000)  # the key was busy until 3_000: idle from 8_000
    assert again.windows == [] and again.timers == [8_000]
    (idle,) = wd.on_timer(state, "k", 8_000).windows
    assert (idle.window_id, idle.value, idle.close_reason.value) == ("k/100-114", ("a", "b"), "idle")
    # Its watermark moved past the closed session: a message that would have joined it is late.
    assert wd.process(state, "k", 3, 110, {"v": "c"}, now_ms=9_000).windows == [] and state.dropped_late == 1


def test_bad_session_windows_are_refused_with_what_to_do():
    with pytest.raises(TypeError, match="merge=.*acc"):
        session_windows(10, event_time="t").over(Aggregator(create=int, add=lambda a, m: a + 1))
    with pytest.raises(ValueError, match="gap_ms must be a positive int"):
        session_windows(0, event_time="t")
    with pytest.raises(ValueError, match="late must be 'drop' or 'route'"):
        session_windows(10, event_time="t", late="keep")
    with pytest.raises(ValueError, match="allowed_lateness_ms and idle_close_ms are for event time"):
        session_windows(10, idle_close_ms=100)


# -- through Spark -----------------------------------------------------------------------------------
# (Spark's workers cannot import tests: the module goes to them by value, see register_pickle_by_value.)
def session_app(**kind):
    import pyarrow as pa

    from transforms.api import Application, DeltaSink, decoder, source

    @decoder
    def reading(payload: bytes) -> dict:  # b"key,ms,value"
        k, t, v = payload.decode().split(",")
        return {"k": k, "t": int(t), "v": v}

    # Late messages (late="route") leave as LateEvents: their key and event_ms land in the same table.
    step = session_windows(**kind).over(values()).emit(
        lambda w: {"key": w.key, "start_ms": w.start_ms, "end_ms": w.end_ms, "values": ",".join(w.value),
                   "reason": str(w.close_reason), "size": w.size})
    schema = pa.schema([("key", pa.string()), ("start_ms", pa.int64()), ("end_ms", pa.int64()),
                        ("values", pa.string()), ("reason", pa.string()), ("size", pa.int64()),
                        ("event_ms", pa.int64())])
    return Application("sessions", source("readings", decoder=reading).key_by("k").to(step)
                       .to_sink(DeltaSink("sessions", schema=schema)))


@pytest.mark.spark
def test_the_engine_merges_a_session_bridged_by_a_late_message(spark):
    from pyspark import cloudpickle

    from transforms.testing import run_app

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    app = session_app(gap_ms=10, event_time="t", allowed_lateness_ms=20, late="route")
    # a: sessions [0, 10) and [15, 25) until 8 bridges them; 60 moves the watermark to 40 (closing the
    # merged [0, 25)), so 25 is late. b: 50 closes [3, 13).
    result = run_app(app, {"readings": ["a,0,p", "b,3,q", "a,15,r", "a,8,bridge", "a,60,s", "a,25,late", "b,50,t"]},
                     spark=spark)
    assert [{k: v for k, v in r.items() if v is not None} for r in result.outputs("sessions")] == [
        {"key": "a", "start_ms": 0, "end_ms": 25, "values": "bridge,p,r", "reason": "watermark", "size": 3},
        {"key": "a", "event_ms": 25},
        {"key": "b", "start_ms": 3, "end_ms": 13, "values": "q", "reason": "watermark", "size": 1},
    ]
    assert result.quarantine == []


@pytest.mark.spark
def test_processing_time_sessions_close_by_their_timer_without_new_messages(spark, settings):
    from pyspark import cloudpickle

    from tests.conftest import land
    from transforms import lake
    from transforms.engine import plan_queries, run_application
    from transforms.registry import registry_of
    from transforms.settings import Settings

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    app = session_app(gap_ms=1500)
    settings = Settings(home=settings.home, app_registry=registry_of([app]))
    assert plan_queries(app, settings)[0].timers
    land(settings, "readings", [b"a,0,x", b"b,0,y", b"a,0,z"])

    def rows():
        path = settings.table_path("sessions")
        return sorted(lake.read(path).to_pylist(), key=lambda r: r["key"]) if lake.exists(path) else []

    run_application(spark, app, settings)
    ran_until = time.time()
    # Each session ends 1.5 s after the batch that opened it: closed in this run if due by its last
    # batch, else (no message at all) in the first run after that.
    time.sleep(max(0.0, ran_until + 1.6 - time.time()))
    run_application(spark, app, settings)
    closed = [{"key": "a", "values": "x,z", "reason": "timer", "size": 2}, {"key": "b", "values": "y", "reason": "timer", "size": 1}]
    got = rows()
    assert [{k: r[k] for k in ("key", "values", "reason", "size")} for r in got] == closed
    assert all(r["end_ms"] - r["start_ms"] == 1500 for r in got)
    run_application(spark, app, settings)  # nothing new, nothing due: no session twice
    assert len(rows()) == 2


def test_the_example_app_plans_with_timers_and_its_step_merges_visits():
    from examples.session_windows import GAP_MS, app
    from transforms.engine.plan import plan_queries
    from transforms.registry import registry_of
    from transforms.settings import Settings

    (plan,) = plan_queries(app, Settings(app_registry=registry_of([app])))
    assert plan.timers  # the idle close is a wall-clock timer
    step = plan.branches[0].post_steps[0]
    state, out = step.state(), []
    clicks = [(0, "/"), (GAP_MS + 60_000, "/b"), (GAP_MS - 1, "/a"), (4 * GAP_MS, "/")]
    for seq, (ms, page) in enumerate(clicks, 1):  # the window itself: a Context without the engine has no timers
        out += step.window.process(state, "u", seq, ms, {"user": "u", "ms": ms, "page": page}).windows
    assert [step.outputs(w) for w in out] == [{"user": "u", "start_ms": 0, "end_ms": 2 * GAP_MS + 60_000, "clicks": 3, "pages": 3,
                    "close_reason": "watermark"}]
