"""Windows that close when the input stops: event-time windows with an idle timeout close a quiet
key's last windows by the wall clock (reason `idle`); without one they stay open."""

import sys
import time

import pytest

from transforms.windowing import event_time_windows
from windows import Aggregator, EventTimeState, EventTimeWindows


def collect() -> Aggregator:
    return Aggregator(create=list, add=lambda acc, m: acc + [m])


def brief(windows):
    return [(w.window_id, w.value, w.close_reason.value) for w in windows]


def test_a_quiet_key_closes_its_last_windows_when_asked_and_not_otherwise():
    asked = EventTimeWindows(collect(), size_ms=10, idle_close_ms=5_000)
    never = EventTimeWindows(collect(), size_ms=10)
    for wd in (asked, never):
        state = EventTimeState()
        first = wd.process(state, "k", 1, 3, "a", now_ms=1_000)
        assert first.timers == ([6_000] if wd is asked else [])
        closed = wd.process(state, "k", 2, 14, "b", now_ms=2_000).windows  # closes [0, 10) by watermark
        assert brief(closed) == [("k/0-10", ["a"], "watermark")]
        assert brief(wd.process(state, "k", 3, 27, "c", now_ms=4_000).windows) == [("k/10-20", ["b"], "watermark")]
        if wd is never:  # no timer, no idle close: the last window [20, 30) stays open
            assert sorted(state.windows) == [20]
            continue
        early = wd.on_timer(state, "k", 6_000)  # the key had a message at 4_000: idle only from 9_000
        assert early.windows == [] and early.timers == [9_000]
        idle = wd.on_timer(state, "k", 9_000)
        assert brief(idle.windows) == [("k/20-30", ["c"], "idle")] and idle.timers == []
        assert state.windows == {} and wd.on_timer(state, "k", 9_000).windows == []  # never twice
        # The watermark moved past the closed window: a message for it is late, not a second result.
        assert wd.process(state, "k", 4, 25, "d", now_ms=9_500).windows == [] and state.dropped_late == 1


def test_a_state_pickled_before_idle_close_existed_takes_it_up():
    import pickle

    old = EventTimeState()
    EventTimeWindows(collect(), size_ms=10).process(old, "k", 1, 3, "a")
    old.__dict__.pop("last_input_ms")  # what a state pickled before idle_close_ms has: no such attribute
    assert "last_input_ms" not in old.__dict__ and "timer_ms" not in old.__dict__
    state = pickle.loads(pickle.dumps(old))
    assert state.last_input_ms is None and state.timer_ms is None  # the class defaults
    wd = EventTimeWindows(collect(), size_ms=10, idle_close_ms=1_000)
    assert wd.process(state, "k", 2, 4, "b", now_ms=5_000).timers == [6_000]
    assert brief(wd.on_timer(state, "k", 6_000).windows) == [("k/0-10", ["a", "b"], "idle")]


def test_the_step_has_timers_only_with_an_idle_timeout():
    assert event_time_windows(10, event_time="t").over(collect()).on_timer is None
    assert event_time_windows(10, event_time="t", idle_close_ms=100).over(collect()).on_timer is not None
    with pytest.raises(ValueError, match="idle_close_ms must be a positive int"):
        event_time_windows(10, event_time="t", idle_close_ms=0)


# -- through Spark -----------------------------------------------------------------------------------
# (Spark's workers cannot import tests: the module goes to them by value, see register_pickle_by_value.)
def idle_app():
    import pyarrow as pa

    from transforms.api import Application, DeltaSink, decoder, source
    from windows import counting

    @decoder
    def reading(payload: bytes) -> dict:  # b"sensor,ms"
        sensor, ms = payload.decode().split(",")
        return {"sensor": sensor, "ms": int(ms)}

    schema = pa.schema([("sensor", pa.string()), ("start_ms", pa.int64()), ("n", pa.int64()), ("reason", pa.string())])

    def pipeline(table, **idle):
        step = event_time_windows(10, event_time="ms", **idle).over(counting()).emit(
            lambda w: {"sensor": w.key, "start_ms": w.start_ms, "n": w.value, "reason": str(w.close_reason)})
        return source("readings", decoder=reading).key_by("sensor").to(step).named(table).to_sink(
            DeltaSink(table, schema=schema))

    return Application("idle_windows", pipeline("asked", idle_close_ms=1_500), pipeline("never"))


@pytest.mark.spark
def test_the_last_windows_of_a_finished_input_close_by_the_clock_when_asked(spark, settings):
    from pyspark import cloudpickle

    from tests.conftest import land
    from transforms import lake
    from transforms.engine import plan_queries, run_application
    from transforms.registry import registry_of
    from transforms.settings import Settings

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    app = idle_app()
    settings = Settings(home=settings.home, app_registry=registry_of([app]))
    assert [p.timers for p in plan_queries(app, settings)] == [True, False]
    land(settings, "readings", [b"s1,1", b"s1,5", b"s2,7", b"s1,12"])  # s1: [0, 10) closes by 12's watermark

    def rows(table):
        path = settings.table_path(table)
        return sorted(lake.read(path).to_pylist(), key=lambda r: (r["sensor"], r["start_ms"])) if lake.exists(path) else []

    run_application(spark, app, settings)
    ran_until = time.time()
    by_watermark = [{"sensor": "s1", "start_ms": 0, "n": 2, "reason": "watermark"}]
    # The finished input's last windows (s1's [10, 20), s2's [0, 10)) close 1.5 s of wall clock after
    # their last message: in this run if due by its last batch, else in the first run after that.
    time.sleep(max(0.0, ran_until + 1.6 - time.time()))
    run_application(spark, app, settings)
    assert rows("asked") == by_watermark + [{"sensor": "s1", "start_ms": 10, "n": 1, "reason": "idle"},
                                            {"sensor": "s2", "start_ms": 0, "n": 1, "reason": "idle"}]
    assert rows("never") == by_watermark  # not asked: they stay open, whatever the clock
