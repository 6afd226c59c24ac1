"""Closing every open window at the end of a finite input (`eventide run --close-windows`): per kind in
plain Python, then through Spark (a close record per key with open windows, landed and run), exactly
once, and never unless asked."""

import sys

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from transforms.windowing import count_windows, event_time_windows, session_windows, trigger_windows
from windows import (
    Aggregator,
    CountState,
    CountWindows,
    QuietClose,
    TriggerState,
    TriggerWindows,
    WallClockState,
    WallClockWindows,
    reference_count_windows,
)


def collect() -> Aggregator:
    return Aggregator(create=list, add=lambda acc, m: acc + [m], merge=lambda a, b: a + b)


def brief(windows):
    return [(w.window_id, w.value, str(w.close_reason)) for w in windows]


# -- per kind, plain Python ------------------------------------------------------------------------
@hsettings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 30), st.data())
def test_count_windows_closed_at_the_end_equal_the_reference_with_partial_windows(size, slide, n, data):
    slide = min(slide, size)
    wd = CountWindows(collect(), size, slide)
    state, got = CountState(), []
    for i in range(n):
        got.extend(wd.process(state, "k", 100 + i, i).windows)
    got.extend(wd.close_all(state, "k", QuietClose.END_OF_INPUT).windows)
    seqs, msgs = list(range(100, 100 + n)), list(range(n))
    assert got == reference_count_windows(collect(), size, slide, "k", seqs, msgs, end_of_input=True)
    assert state.windows == {} and wd.close_all(state, "k", QuietClose.END_OF_INPUT).windows == []  # never twice
    # The next input counts afresh: its first message opens the key's first window again.
    assert [w.size for w in wd.process(state, "k", 500, "x").windows + wd.open_windows(state)][:1] == [1]


def test_a_count_windows_partial_last_window_says_end_of_input():
    wd = CountWindows(collect(), 3)
    state = CountState()
    closed = [w for i, m in enumerate("abcde") for w in wd.process(state, "k", i + 1, m).windows]
    assert brief(closed) == [("k/1-3", ["a", "b", "c"], "count")]
    assert brief(wd.close_all(state, "k", QuietClose.END_OF_INPUT).windows) == [("k/4-5", ["d", "e"], "end_of_input")]


def test_a_trigger_window_closes_at_the_end_as_at_its_marker():
    wd = TriggerWindows(collect(), is_marker=lambda m: m == "EOD")
    state = TriggerState()
    for i, m in enumerate(["a", "EOD", "b", "c"]):
        wd.process(state, "k", i + 1, m)
    assert brief(wd.close_all(state, "k", QuietClose.END_OF_INPUT).windows) == [("k/3-4", ["b", "c"], "end_of_input")]
    assert wd.close_all(state, "k", QuietClose.END_OF_INPUT).windows == []  # nothing open: nothing twice


def test_a_wall_clock_window_closed_early_ends_at_the_clock_and_the_next_starts_there():
    wd = WallClockWindows(collect(), size_ms=1_000)
    state = WallClockState()
    wd.process(state, "k", 1, 2_100, "a")
    assert brief(wd.close_all(state, "k", QuietClose.END_OF_INPUT, now_ms=2_400).windows) == [
        ("k/2000-2400", ["a"], "end_of_input")]
    assert wd.process(state, "k", 2, 2_500, "b").timers == [3_000]  # same period: [2400, 3000), no shared id
    assert brief(wd.on_timer(state, "k", 3_000).windows) == [("k/2400-3000", ["b"], "timer")]
    wd.process(state, "k", 3, 3_100, "c")
    assert wd.open_windows(state)[0].start_ms == 3_000  # a later period: aligned as ever


# -- through Spark ------------------------------------------------------------------------------------
# (Spark's workers cannot import tests: the module goes to them by value, see register_pickle_by_value.)
READING = pa.schema([("sensor", pa.string()), ("ms", pa.int64())])
ROW = pa.schema([("sensor", pa.string()), ("window_id", pa.string()), ("n", pa.int64()), ("reason", pa.string())])


def windows_app():
    """One stream, five window kinds (a query each): event time (bucketed state), count and trigger
    windows (batch form: the decoded columns), sessions with an idle timeout (timers: state by key)."""
    from transforms.api import Application, DeltaSink, decoder, source
    from windows import counting

    @decoder(schema=READING)
    def reading(payload: bytes) -> dict:  # b"sensor,ms"
        sensor, ms = payload.decode().split(",")
        return {"sensor": sensor, "ms": int(ms)}

    def row(w):
        return {"sensor": w.key, "window_id": w.window_id, "n": w.value, "reason": str(w.close_reason)}

    def pipeline(name, kind):
        return (source("readings", decoder=reading).key_by("sensor").to(kind.over(counting()).emit(row))
                .named(name).to_sink(DeltaSink(name, schema=ROW)))

    return Application("end_windows",
                       pipeline("event_time", event_time_windows(10, event_time="ms")),
                       pipeline("counts", count_windows(2)),
                       pipeline("days", trigger_windows(boundary=lambda m: m["ms"] // 100)),
                       pipeline("sessions", session_windows(5, event_time="ms", idle_close_ms=3_600_000)))


def _rows(settings, table):
    from transforms import lake

    path = settings.table_path(table)
    return sorted(lake.read(path).to_pylist(), key=lambda r: r["window_id"]) if lake.exists(path) else []


@pytest.fixture
def home(settings):
    from pyspark import cloudpickle

    from transforms.registry import registry_of
    from transforms.settings import Settings

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    app = windows_app()
    return app, Settings(home=settings.home, app_registry=registry_of([app]))


def _run(spark, app, settings, close: bool):
    import dataclasses

    from transforms.engine import run_application

    return run_application(spark, app, dataclasses.replace(settings, close_windows=close))


BY_DATA = {  # what the data closes by itself: s1 = 1, 3, 12, 14; s2 = 7
    "event_time": [{"sensor": "s1", "window_id": "s1/0-10", "n": 2, "reason": "watermark"}],
    "counts": [{"sensor": "s1", "window_id": "s1/1-2", "n": 2, "reason": "count"},
               {"sensor": "s1", "window_id": "s1/4-5", "n": 2, "reason": "count"}],
    "days": [],
    "sessions": [{"sensor": "s1", "window_id": "s1/1-8", "n": 2, "reason": "watermark"}],
}
AT_END = {  # what --close-windows closes at the end: every key's open windows, reason end_of_input
    "event_time": [{"sensor": "s1", "window_id": "s1/10-20", "n": 2, "reason": "end_of_input"},
                   {"sensor": "s2", "window_id": "s2/0-10", "n": 1, "reason": "end_of_input"}],
    "counts": [{"sensor": "s2", "window_id": "s2/3-3", "n": 1, "reason": "end_of_input"}],
    "days": [{"sensor": "s1", "window_id": "s1/1-5", "n": 4, "reason": "end_of_input"},
             {"sensor": "s2", "window_id": "s2/3-3", "n": 1, "reason": "end_of_input"}],
    "sessions": [{"sensor": "s1", "window_id": "s1/12-19", "n": 2, "reason": "end_of_input"},
                 {"sensor": "s2", "window_id": "s2/7-12", "n": 1, "reason": "end_of_input"}],
}
INPUT = [b"s1,1", b"s1,3", b"s2,7", b"s1,12", b"s1,14"]


def _all(settings):
    return {t: _rows(settings, t) for t in BY_DATA}


def _sorted(rows):
    return sorted(rows, key=lambda r: r["window_id"])


@pytest.mark.spark
def test_the_last_windows_of_every_kind_close_only_when_asked_and_once(spark, home):
    from tests.conftest import land
    from transforms import lake

    app, settings = home
    land(settings, "readings", INPUT)
    _run(spark, app, settings, close=False)
    assert _all(settings) == BY_DATA  # not asked: the last windows stay open
    reports = _run(spark, app, settings, close=True)  # nothing new, but asked: every open window closes
    assert _all(settings) == {t: _sorted(BY_DATA[t] + AT_END[t]) for t in BY_DATA}
    assert {r.query: r.closed_keys for r in reports} == {"end_windows.event_time": 2, "end_windows.counts": 1,
                                                         "end_windows.days": 2, "end_windows.sessions": 2}
    # Asked again with nothing new: nothing is open, nothing is landed or emitted twice.
    versions = {t: lake.version(settings.table_path(t)) for t in BY_DATA}
    reports = _run(spark, app, settings, close=True)
    assert _all(settings) == {t: _sorted(BY_DATA[t] + AT_END[t]) for t in BY_DATA}
    assert {t: lake.version(settings.table_path(t)) for t in BY_DATA} == versions
    assert [r.closed_keys for r in reports] == [0, 0, 0, 0]
    # A later input: late for what closed (dropped), its own windows open until the next close.
    land(settings, "readings", [b"s1,15", b"s2,30"])
    _run(spark, app, settings, close=False)
    assert _rows(settings, "event_time") == _sorted(BY_DATA["event_time"] + AT_END["event_time"])
    _run(spark, app, settings, close=True)
    assert _rows(settings, "event_time") == _sorted(BY_DATA["event_time"] + AT_END["event_time"] + [
        {"sensor": "s2", "window_id": "s2/30-40", "n": 1, "reason": "end_of_input"}])
    # s2 counts afresh after its close; s1 (nothing was open) goes on: each one message, closed at the end.
    before = [r["window_id"] for r in BY_DATA["counts"] + AT_END["counts"]]
    assert sorted((r["sensor"], r["n"], r["reason"]) for r in _rows(settings, "counts") if r["window_id"] not in before
                  ) == [("s1", 1, "end_of_input"), ("s2", 1, "end_of_input")]


@pytest.mark.spark
def test_a_close_interrupted_after_its_records_landed_is_done_by_the_next_run_once(spark, home):
    """A run killed after landing the close records, before its batch committed: the records are in
    the log, so the next run (asked or not) processes them from the checkpoint: each window once."""
    from tests.conftest import land
    from transforms.engine import plan_queries
    from transforms.engine.close_windows import land_close_records, open_keys
    from transforms.engine.state_layout import state_layout

    app, settings = home
    land(settings, "readings", INPUT)
    _run(spark, app, settings, close=False)
    for plan in plan_queries(app, settings):  # what --close-windows does before its run, then "kill -9"
        keys = open_keys(spark, plan, settings, state_layout(plan, plan.checkpoint(settings)))
        land_close_records(settings, plan, keys)
    _run(spark, app, settings, close=False)  # not asked, but the logged close records replay
    done = {t: _sorted(BY_DATA[t] + AT_END[t]) for t in BY_DATA}
    assert _all(settings) == done
    _run(spark, app, settings, close=True)
    assert _all(settings) == done


@pytest.mark.spark
def test_close_records_are_no_other_querys_input(spark, settings):
    """Close records land in the stream's log: a query that is not theirs (here an unkeyed copy of the
    stream, as bronze is) never sees them; the run_app(close_windows=True) form of the setting."""
    from pyspark import cloudpickle

    from transforms.api import Application, DeltaSink, decoder, source
    from transforms.testing import run_app
    from windows import counting

    cloudpickle.register_pickle_by_value(sys.modules[__name__])

    @decoder
    def reading(payload: bytes) -> dict:
        sensor, ms = payload.decode().split(",")
        return {"sensor": sensor, "ms": int(ms)}

    step = event_time_windows(10, event_time="ms").over(counting()).emit(
        lambda w: {"window_id": w.window_id, "reason": str(w.close_reason)})
    app = Application("close_others",
                      source("r", decoder=reading).key_by("sensor").to(step).named("w").to_sink(DeltaSink("w")),
                      source("r", decoder=reading).named("copy").to_sink(DeltaSink("copy")))
    asked = run_app(app, {"r": INPUT}, spark=spark, close_windows=True)
    assert sorted(r["window_id"] + " " + r["reason"] for r in asked.outputs("w")) == [
        "s1/0-10 watermark", "s1/10-20 end_of_input", "s2/0-10 end_of_input"]
    assert len(asked.outputs("copy")) == len(INPUT) and asked.quarantine == []
    not_asked = run_app(app, {"r": INPUT}, spark=spark)
    assert [r["window_id"] for r in not_asked.outputs("w")] == ["s1/0-10"]


def test_the_run_command_takes_close_windows_into_the_settings(monkeypatch):
    import os

    from orchestration.cli import _settings, build_parser
    from transforms.settings import Settings, reset_settings

    monkeypatch.setenv("EVENTIDE_CLOSE_WINDOWS", "0")  # restored after the test, whatever the command sets
    reset_settings()
    try:
        assert _settings(build_parser().parse_args(["run"])).close_windows is False  # never by default
        assert _settings(build_parser().parse_args(["run", "--close-windows"])).close_windows is True
        assert os.environ["EVENTIDE_CLOSE_WINDOWS"] == "1"  # the Dagster assets read their settings there
        assert Settings().close_windows is True
    finally:
        reset_settings()
