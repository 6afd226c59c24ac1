"""Early results: a window's running aggregate every N messages (final=False), then its final once."""

import sys

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from transforms.api import Context
from transforms.windowing import count_windows, event_time_windows, session_windows
from windows import Aggregator, window_result_schema


def collect() -> Aggregator:
    return Aggregator(create=list, add=lambda acc, m: acc + [m["v"]], merge=lambda a, b: a + b)


def run(step, msgs, key="k"):
    state, out = step.state(), []
    for seq, m in enumerate(msgs, 1):
        out.extend(step.apply(m, state, Context(key, seq=seq)))
    return out


def brief(results):
    return [(w.window_id, w.value, w.final, w.close_reason and str(w.close_reason)) for w in results]


def test_partials_every_n_messages_then_the_final_once():
    step = event_time_windows(10, event_time="t").over(collect()).early(every=2)
    assert not step.batch
    out = run(step, [{"t": t, "v": v} for t, v in [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e"), (12, "f")]])
    assert brief(out) == [("k/0-10", ["a", "b"], False, None), ("k/0-10", ["a", "b", "c", "d"], False, None),
                          ("k/0-10", ["a", "b", "c", "d", "e"], True, "watermark")]


def test_a_window_closed_by_the_message_that_would_give_a_partial_gives_only_its_final():
    step = count_windows(4).over(collect()).early(every=2)
    out = run(step, [{"v": c} for c in "abcdef"])
    assert brief(out) == [("k/1-2", ["a", "b"], False, None), ("k/1-4", ["a", "b", "c", "d"], True, "count"),
                          ("k/5-6", ["e", "f"], False, None)]
    assert [(w.first_seq, w.last_seq) for w in out] == [(1, 2), (1, 4), (5, 6)]  # a count window: same first_seq


def test_a_session_merge_passing_several_multiples_gives_one_partial():
    step = session_windows(10, event_time="t", allowed_lateness_ms=100).over(collect()).early(every=2)
    out = run(step, [{"t": t, "v": v} for t, v in [(0, "a"), (15, "b"), (20, "c"), (8, "bridge")]])
    # 1 + 2 messages merged with the bridge: 4, past 2 (given already by [15, 30)) and at 4: one partial.
    assert brief(out) == [("k/15-30", ["b", "c"], False, None), ("k/0-30", ["a", "b", "c", "bridge"], False, None)]


def test_early_needs_a_positive_count():
    with pytest.raises(ValueError, match=r"early\(every=...\) must be a positive int"):
        count_windows(4).over(collect()).early(every=0)


@examples(max_examples=150, deadline=None)
@given(events=st.lists(st.integers(0, 50), max_size=30), every=st.integers(1, 4), lateness=st.integers(0, 10),
       slide=st.sampled_from([None, 5]))
def test_the_finals_are_unchanged_and_each_partial_is_its_window_so_far(events, every, lateness, slide):
    kind = event_time_windows(10, slide, event_time="t", allowed_lateness_ms=lateness)
    msgs = [{"t": t, "v": i} for i, t in enumerate(events)]
    plain = run(kind.over(collect()), msgs)
    out = run(kind.over(collect()).early(every=every), msgs)
    assert [w for w in out if w.final] == plain
    finals = {w.window_id: w for w in plain}
    seen: dict = {}
    for w in out:
        assert w.window_id not in finals or not any(p.final for p in seen.get(w.window_id, ())), "nothing after a final"
        seen.setdefault(w.window_id, []).append(w)
        if not w.final:  # the running aggregate at a multiple of `every` messages
            assert w.size % every == 0 and w.close_reason is None and len(w.value) == w.size
            if w.window_id in finals:
                assert finals[w.window_id].value[:w.size] == w.value


# -- through Spark -----------------------------------------------------------------------------------
def early_app():
    from transforms.api import Application, DeltaSink, decoder, source
    from windows import counting

    @decoder
    def reading(payload: bytes) -> dict:  # b"sensor,ms"
        sensor, ms = payload.decode().split(",")
        return {"sensor": sensor, "ms": int(ms)}

    step = event_time_windows(10, event_time="ms").over(counting()).early(every=2)
    return Application("early_windows", source("readings", decoder=reading).key_by("sensor").to(step)
                       .to_sink(DeltaSink("early_windows", schema=window_result_schema(pa.int64()))))


@pytest.mark.spark
def test_an_early_result_then_the_final_one_in_the_table(spark):
    from pyspark import cloudpickle

    from transforms.testing import run_app

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    result = run_app(early_app(), {"readings": ["s,1", "s,2", "s,3", "s,11"]}, spark=spark)
    assert [(r["window_id"], r["value"], r["final"], r["close_reason"], r["first_seq"], r["last_seq"])
            for r in result.outputs("early_windows")] == [("s/0-10", 2, False, None, 1, 2),
                                                           ("s/0-10", 3, True, "watermark", 1, 3)]


def test_a_timer_gives_partials_only_of_windows_that_changed():
    from windows import OpenWindow, early_changed

    grown, same = OpenWindow(["a", "b"], 1, 2, 2, start_ms=0, end_ms=10), OpenWindow(["c"], 3, 3, 1, start_ms=10, end_ms=20)
    same.early_size = 1  # its partial was given at one message already
    assert brief(early_changed("k", [grown, same])) == [("k/0-10", ["a", "b"], False, None)]
    assert early_changed("k", [grown, same]) == []  # nothing new since: no partial


def test_early_by_time_gives_the_step_timers():
    plain = event_time_windows(10, event_time="t").over(collect())
    assert plain.on_timer is None and plain.early(every=2).on_timer is None
    assert plain.early(every_ms=500).on_timer is not None
    with pytest.raises(ValueError, match=r"early\(\) needs every=N"):
        plain.early()


def early_by_time_app():
    from transforms.api import Application, DeltaSink, decoder, source
    from windows import counting

    @decoder
    def reading(payload: bytes) -> dict:  # b"sensor,ms"
        sensor, ms = payload.decode().split(",")
        return {"sensor": sensor, "ms": int(ms)}

    step = event_time_windows(10, event_time="ms").over(counting()).early(every_ms=1)
    return Application("early_by_time", source("readings", decoder=reading).key_by("sensor").to(step)
                       .to_sink(DeltaSink("early_by_time", schema=window_result_schema(pa.int64()))))


@pytest.mark.spark
def test_an_early_result_by_the_clock_then_the_final_one(spark, settings):
    from pyspark import cloudpickle

    from tests.conftest import land
    from transforms import lake
    from transforms.engine import run_application
    from transforms.registry import registry_of
    from transforms.settings import Settings

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    app = early_by_time_app()
    settings = Settings(home=settings.home, app_registry=registry_of([app]))

    def rows():
        return sorted((r["window_id"], r["value"], r["final"], r["close_reason"])  # a window's partials first
                      for r in lake.read(settings.table_path("early_by_time")).to_pylist())

    land(settings, "readings", [b"s,1", b"s,2"])
    # The early timer is due 1 ms after the batch that folded them: it fires in the run's next batch
    # (each run with timers ends with one without new messages), and then in every batch after it.
    run_application(spark, app, settings)
    assert rows() == [("s/0-10", 2, False, None)]  # once: later timers find the window unchanged
    land(settings, "readings", [b"s,3", b"s,15"])  # 15 closes [0, 10) by the watermark and opens [10, 20)
    run_application(spark, app, settings)
    # The batch's messages come before its timers: [0, 10) closed (final), [10, 20)'s first partial.
    assert rows() == [("s/0-10", 2, False, None), ("s/0-10", 3, True, "watermark"), ("s/10-20", 1, False, None)]
