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


# -- through Spark: timers fire under `eventide run`, also for keys without new messages -------------
# (Spark's workers cannot import tests: the module goes to them by value, see register_pickle_by_value.)
def clock_app():
    import pyarrow as pa

    from examples.words import decode_text
    from transforms.api import Application, DeltaSink, source
    from transforms.windowing import wall_clock_windows

    step = wall_clock_windows(2000).over(counting(), name="lines per 2 s").emit(
        lambda w: {"key": w.key, "lines": w.value, "reason": w.close_reason.value, "first_seq": w.first_seq,
                   "last_seq": w.last_seq})
    schema = pa.schema([("key", pa.string()), ("lines", pa.int64()), ("reason", pa.string()),
                        ("first_seq", pa.int64()), ("last_seq", pa.int64())])
    return Application("clock_windows", source("text", decoder=decode_text).key_by(lambda t: t.text.split()[0])
                       .to(step).to_sink(DeltaSink("clock_windows", schema=schema)))


class Noted:
    """State of the reminder test: nothing to keep."""


def reminder_app():
    import pyarrow as pa

    from examples.words import decode_text
    from transforms.api import Application, DeltaSink, computation, source, state_computation

    def remind(key, state, expiry_ms, ctx):
        if key == "boom":
            raise ValueError("no reminder for boom")
        return {"key": key, "expiry_ms": expiry_ms, "fired_ms": ctx.processing_time_ms}

    @state_computation("remind", state=Noted, on_timer=remind)
    def note(line, state, ctx):
        ctx.register_timer(ctx.processing_time_ms + 1)  # due at once: must fire without another message

    @computation("tag")  # a step after the state computation applies to timer outputs too
    def tag(row):
        return {**row, "tag": f"quiet {row['key']}"}

    schema = pa.schema([("key", pa.string()), ("expiry_ms", pa.int64()), ("fired_ms", pa.int64()),
                        ("tag", pa.string())])
    return Application("reminders", source("text", decoder=decode_text).key_by(lambda t: t.text.split()[0])
                       .to(note).to(tag).to_sink(DeltaSink("reminders", schema=schema)))


def _rows(settings, table):
    from transforms import lake

    path = settings.table_path(table)
    return lake.read(path).to_pylist() if lake.exists(path) else []


@pytest.mark.spark
def test_a_wall_clock_window_closes_by_its_timer_without_new_messages(spark, settings):
    from pyspark import cloudpickle

    from tests.conftest import land
    from transforms.engine import plan_queries, run_application

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    app = clock_app()
    assert plan_queries(app, settings)[0].timers
    land(settings, "text", [b"a 1", b"a 2", b"a 3"])
    run_application(spark, app, settings)
    ran_until = time.time()
    closed = [{"key": "a", "lines": 3, "reason": "timer", "first_seq": 1, "last_seq": 3}]
    # The window ends within 2 s of the batch that opened it: closed in this run if it was due by
    # the run's last batch, else (no new message at all) in the next run after its end.
    assert _rows(settings, "clock_windows") in ([], closed)
    # A restart with nothing new still runs a batch (the clock's tick), whether or not the last run
    # ended with its batches all committed.
    run_application(spark, app, settings)
    time.sleep(max(0.0, ran_until + 2.05 - time.time()))
    run_application(spark, app, settings)
    assert _rows(settings, "clock_windows") == closed


@pytest.mark.spark
def test_a_timer_due_at_once_fires_in_the_same_run_and_only_once(spark, settings):
    from pyspark import cloudpickle

    from tests.conftest import land
    from transforms.engine import run_application

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    app = reminder_app()
    land(settings, "text", [b"a 1", b"b 1", b"boom 1"])
    (report,) = run_application(spark, app, settings)
    rows = sorted(_rows(settings, "reminders"), key=lambda r: r["key"])
    assert [(r["key"], r["tag"]) for r in rows] == [("a", "quiet a"), ("b", "quiet b")]
    assert report.rows_written["reminders"] == 2
    assert all(r["fired_ms"] >= r["expiry_ms"] for r in rows)
    # A raising on_timer quarantines (no input message: sequence -1) instead of stopping the query.
    (bad,) = _rows(settings, "quarantine")
    assert (bad["seq"], bad["step"]) == (-1, "remind (on_timer)") and "no reminder for boom" in bad["reason"]
    run_application(spark, app, settings)  # no new data: the timers fired already, nothing more
    assert len(_rows(settings, "reminders")) == 2
