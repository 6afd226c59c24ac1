"""Count windows: the plain reference (slicing), the incremental forms, and the engine's step on Spark."""

import dataclasses
import sys

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from transforms.api import Context
from transforms.windowing import count_windows
from windows import Aggregator, CountState, CountWindows, reference_count_windows


def collect() -> Aggregator:
    return Aggregator(create=list, add=lambda acc, m: acc + [m["v"]], add_frame=lambda acc, f: acc + f["v"].tolist())


def brief(windows):
    return [(w.key, w.window_id, w.value, w.close_reason.value, w.first_seq, w.last_seq, w.size) for w in windows]


def test_tumbling_and_sliding_windows_by_count_exactly():
    msgs = [{"v": c} for c in "abcdefg"]
    seqs = list(range(11, 18))
    tumbling = CountWindows(collect(), 3)
    state, out = CountState(), []
    for s, m in zip(seqs, msgs):
        out.extend(tumbling.process(state, "k", s, m).windows)
    assert brief(out) == [("k", "k/11-13", ["a", "b", "c"], "count", 11, 13, 3),
                          ("k", "k/14-16", ["d", "e", "f"], "count", 14, 16, 3)]
    assert state.seen == 7 and [w.value for w in state.windows.values()] == [["g"]]
    sliding = CountWindows(collect(), 3, slide=2)
    state, out = CountState(), []
    for s, m in zip(seqs, msgs):
        out.extend(sliding.process(state, "k", s, m).windows)
    assert [w.value for w in out] == [["a", "b", "c"], ["c", "d", "e"], ["e", "f", "g"]]
    assert {s: w.value for s, w in state.windows.items()} == {6: ["g"]}
    assert brief(out) == brief(reference_count_windows(collect(), 3, 2, "k", seqs, msgs))


def run_one_by_one(step, msgs, state=None, key="k", first_seq=1):
    state, out = state or step.state(), []
    for seq, m in enumerate(msgs, first_seq):
        out.extend(step.apply(m, state, Context(key, seq=seq)))
    return out, state


def run_frames(step, msgs, cuts, key="k"):
    """The messages as micro-batch DataFrames cut at `cuts`, as the engine's batch path feeds them."""
    state, out = step.state(), []
    frame = pd.DataFrame(msgs, columns=["v"])
    frame["_seq"] = range(1, len(frame) + 1)
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(frame)}), len(frame)]
    for a, b in zip(bounds, bounds[1:]):
        out.extend(step.fn(frame.iloc[a:b].reset_index(drop=True), state, Context(key)))
    return out, state


@examples(max_examples=200, deadline=None)
@given(n=st.integers(0, 40), size=st.integers(1, 6), slide_less=st.one_of(st.none(), st.integers(0, 5)),
       cuts=st.lists(st.integers(0, 40), max_size=5))
def test_the_step_in_both_forms_equals_the_reference(n, size, slide_less, cuts):
    slide = None if slide_less is None else max(1, size - slide_less)
    msgs = [{"v": i} for i in range(n)]
    step = count_windows(size, slide).over(collect())
    assert step.batch and not step.one_message().batch
    expected = reference_count_windows(collect(), size, slide, "k", list(range(1, n + 1)), msgs)
    one, s1 = run_one_by_one(step.one_message(), msgs)
    frames, s2 = run_frames(step, msgs, cuts)
    assert brief(one) == brief(expected) and brief(frames) == brief(expected)
    open_windows = [{s: (w.value, w.first_seq, w.size) for s, w in st_.windows.items()} for st_ in (s1, s2)]
    assert open_windows[0] == open_windows[1] and s1.seen == s2.seen == n


def test_bad_count_windows_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match="size must be a positive int"):
        count_windows(0)
    with pytest.raises(ValueError, match=r"slide must be an int in \[1, size=3\]"):
        count_windows(3, slide=4)
    with pytest.raises(TypeError, match="windows.Aggregator"):
        count_windows(3).over(len)


# -- through Spark -----------------------------------------------------------------------------------
# (Spark's workers cannot import tests: the module goes to them by value, see register_pickle_by_value.)
def count_app(size, slide):
    import pyarrow as pa

    from transforms.api import Application, DeltaSink, decoder, source

    @decoder(schema=pa.schema([("k", pa.string()), ("v", pa.string())]))
    def key_value(payload: bytes) -> dict:  # b"k,v"
        k, v = payload.decode().split(",")
        return {"k": k, "v": v}

    step = count_windows(size, slide).over(collect()).emit(
        lambda w: {"key": w.key, "window_id": w.window_id, "values": "".join(w.value), "reason": str(w.close_reason),
                   "first_seq": w.first_seq, "last_seq": w.last_seq})
    schema = pa.schema([("key", pa.string()), ("window_id", pa.string()), ("values", pa.string()),
                        ("reason", pa.string()), ("first_seq", pa.int64()), ("last_seq", pa.int64())])
    return Application("counted", source("kv", decoder=key_value).key_by("k").to(step)
                       .to_sink(DeltaSink("count_windows", schema=schema)))


def expected_rows(payloads, size, slide):
    by_key: dict = {}
    for seq, p in enumerate(payloads, 1):
        k, v = p.split(",")
        by_key.setdefault(k, ([], []))
        by_key[k][0].append(seq)
        by_key[k][1].append({"v": v})
    rows = [{"key": w.key, "window_id": w.window_id, "values": "".join(w.value), "reason": "count",
             "first_seq": w.first_seq, "last_seq": w.last_seq}
            for k, (seqs, msgs) in by_key.items() for w in reference_count_windows(collect(), size, slide, k, seqs, msgs)]
    return sorted(rows, key=lambda r: (r["last_seq"], r["first_seq"]))


@pytest.mark.spark
def test_the_engine_gives_the_reference_windows(spark):
    from pyspark import cloudpickle

    from transforms.testing import run_app

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    size, slide = 3, 2  # sliding: windows overlap by one message (tumbling: the next test)
    payloads = ["a,1", "b,1", "a,2", "a,3", "b,2", "a,4", "b,3", "c,1", "a,5", "b,4", "b,5"]
    result = run_app(count_app(size, slide), {"kv": payloads}, spark=spark)
    got = sorted(result.outputs("count_windows"), key=lambda r: (r["last_seq"], r["first_seq"]))
    assert got == expected_rows(payloads, size, slide) and got
    assert result.quarantine == []


@pytest.mark.spark
def test_a_count_window_across_two_micro_batches(spark, settings):
    from pyspark import cloudpickle

    from tests.conftest import land
    from transforms import lake
    from transforms.engine import run_application
    from transforms.registry import registry_of

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    app = count_app(3, None)
    # one landed segment per batch
    settings = dataclasses.replace(settings, max_files_per_trigger=1, app_registry=registry_of([app]))
    land(settings, "kv", [b"a,x", b"a,y", b"b,p"])  # segment 1: a's window is 2 of 3 when batch 1 ends
    land(settings, "kv", [b"a,z", b"b,q", b"a,w"])  # segment 2: its third message closes it
    (report,) = run_application(spark, app, settings)
    assert report.batches == 2
    rows = lake.read(settings.table_path("count_windows")).to_pylist()
    assert rows == [{"key": "a", "window_id": "a/1-4", "values": "xyz", "reason": "count", "first_seq": 1,
                     "last_seq": 4}]


def test_the_example_app_plans_and_its_batch_form_equals_the_reference():
    from examples.count_windows import app, mean_price
    from transforms.engine.plan import QueryMode, plan_queries
    from transforms.registry import registry_of
    from transforms.settings import Settings

    plans = plan_queries(app, Settings(app_registry=registry_of([app])))
    assert [(p.name, p.mode) for p in plans] == [("trade_means.tumbling", QueryMode.COLUMNAR),
                                                 ("trade_means.sliding", QueryMode.COLUMNAR)]
    trades = [{"symbol": "X", "price": float(p)} for p in range(1, 26)]
    frame = pd.DataFrame(trades).assign(_seq=range(1, 26))
    step = count_windows(10, slide=5).over(mean_price)
    got = step.fn(frame.iloc[:7], state := step.state(), Context("X")) + step.fn(frame.iloc[7:], state, Context("X"))
    expected = reference_count_windows(mean_price, 10, 5, "X", list(range(1, 26)), trades)
    assert brief(got) == brief(expected) and [w.value for w in got] == [(10, 55.0), (10, 105.0), (10, 155.0), (10, 205.0)]
