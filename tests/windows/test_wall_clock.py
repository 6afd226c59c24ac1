"""Wall-clock windows: pure timer logic, then through the engine's processing-time timers."""

import sys
import time

import pytest

from windows import Aggregator, WallClockState, WallClockWindows, counting


def test_a_window_asks_for_a_timer_at_its_end_and_the_timer_closes_it():
    wd = WallClockWindows(Aggregator(create=list, add=lambda acc, m: acc + [m]), size_ms=1000)
    state = WallClockState()
    first = wd.process(state, "k", 1, 10_250, "a")
    assert first.timers == [11_000] and first.windows == []
    assert wd.process(state, "k", 2, 10_900, "b").timers == []  # same window: no second timer
    assert wd.on_timer(state, "k", 10_999).windows == []  # not due yet
    closed = wd.on_timer(state, "k", 11_000).windows
    assert [(w.value, w.close_reason.value, w.first_seq, w.last_seq, w.start_ms, w.end_ms) for w in closed] == [
        (["a", "b"], "timer", 1, 2, 10_000, 11_000)
    ]
    assert wd.on_timer(state, "k", 11_000).windows == []  # never twice


def test_an_overdue_window_closes_when_the_next_message_arrives():
    wd = WallClockWindows(counting(), size_ms=1000)
    state = WallClockState()
    wd.process(state, "k", 1, 500, "a")
    out = wd.process(state, "k", 2, 2_100, "b")  # the timer for 1000 has not run yet
    assert [(w.value, w.close_reason.value, w.end_ms) for w in out.windows] == [(1, "timer", 1000)]
    assert out.timers == [3000] and state.open.value == 1


# -- through Spark: the engine registers timers and calls on_timer ------------------------------
CLOCK_WINDOWS = WallClockWindows(counting(), size_ms=1000)


def build_app():
    import pyarrow as pa

    from transforms.api import Application, DeltaSink, source, state_computation
    from transforms.apps.words import decode_text
    from transforms.engine import current_context

    def close_on_timer(key, state, expiry_ms):
        return [{"key": w.key, "lines": w.value, "reason": w.close_reason.value} for w in CLOCK_WINDOWS.on_timer(state, key, expiry_ms).windows]

    @state_computation("count per second", state=WallClockState, on_timer=close_on_timer)
    def count_lines(line, state):
        ctx = current_context()
        out = CLOCK_WINDOWS.process(state, ctx.key, 0, ctx.processing_time_ms, line)
        for at in out.timers:
            ctx.register_timer(at)
        return [{"key": w.key, "lines": w.value, "reason": w.close_reason.value} for w in out.windows]

    schema = pa.schema([("key", pa.string()), ("lines", pa.int64()), ("reason", pa.string())])
    return Application("clock_windows", source("text", decoder=decode_text).key_by(lambda t: t.text.split()[0])
                       .to(count_lines).to_sink(DeltaSink("clock_windows", schema=schema)))


@pytest.mark.spark
def test_processing_time_timers_close_windows_of_quiet_keys(spark, settings):
    from pyspark import cloudpickle

    from tests.conftest import land
    from transforms import lake
    from transforms.engine import run_application

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import tests
    app = build_app()
    land(settings, "text", [b"a 1", b"a 2", b"a 3"])
    run_application(spark, app, settings)
    assert not lake.exists(settings.table_path("clock_windows")) or lake.count(settings.table_path("clock_windows")) == 0
    time.sleep(1.1)  # past the end of key a's window
    land(settings, "text", [b"b 1"])  # a batch for key b; key a's timer is due and fires
    run_application(spark, app, settings)
    rows = lake.read(settings.table_path("clock_windows")).to_pylist()
    assert rows == [{"key": "a", "lines": 3, "reason": "timer"}]
