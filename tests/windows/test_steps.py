"""Window steps (transforms.windowing): the state computations `.over(...)` builds, without Spark.

The engine calls a step as `fn(message_or_frame, state, ctx)`; these tests do the same with a
`Context` they build, so they pin exactly what the engine will run.
"""

import datetime as dt

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.api import Context, StateComputation, source, state_computation
from transforms.windowing import event_time_windows, field_is, trigger_windows, wall_clock_windows
from windows import Aggregator, LateEvent, TriggerState, WindowResult, counting

MARK = "END_OF_DAY"


def collect() -> Aggregator:
    return Aggregator(create=list, add=lambda acc, m: acc + [m["v"]], add_frame=lambda acc, f: acc + f["v"].tolist(),
                      columns=("v",))


def messages(spec) -> list[dict]:
    """("a", 1) -> a line of day 1; MARK -> a marker."""
    return [{"kind": "marker", "v": MARK, "day": None} if s == MARK else {"kind": "line", "v": s[0], "day": s[1]}
            for s in spec]


def run_one_by_one(step, msgs, key="src"):
    state, out = step.state(), []
    for seq, m in enumerate(msgs, 1):
        out.extend(step.apply(m, state, Context(key, seq=seq)))
    return out, state


def run_frames(step, msgs, cuts, key="src"):
    """Feed the messages as micro-batch DataFrames split at `cuts`, as the engine's batch path does:
    only the fields the step says it reads, when it says (a columnar query carries no others)."""
    state, out = step.state(), []
    frame = pd.DataFrame(msgs, columns=list(step.reads) if step.reads is not None else ["kind", "v", "day"])
    frame["_seq"] = range(1, len(frame) + 1)
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(frame)}), len(frame)]
    for a, b in zip(bounds, bounds[1:]):
        out.extend(step.fn(frame.iloc[a:b].reset_index(drop=True), state, Context(key)))
    return out, state


def test_over_returns_a_state_computation_that_a_keyed_pipeline_takes():
    step = trigger_windows(is_marker=field_is("kind", "marker"), boundary="day").over(collect())
    assert isinstance(step, StateComputation) and step.with_context
    assert step.batch  # field names and add_frame: the batch form
    assert issubclass(step.state, TriggerState) and step.name == "trigger windows"
    pipeline = source("text").key_by("stream").to(step)
    assert pipeline.post_steps == [step]
    with pytest.raises(ValueError, match="key_by"):
        source("text").to(step)


def test_a_lambda_or_no_add_frame_means_the_one_message_form():
    by_lambda = trigger_windows(is_marker=lambda m: m["v"] == MARK, boundary="day").over(collect())
    no_frame = trigger_windows(boundary="day").over(Aggregator(create=list, add=lambda acc, m: acc + [m["v"]]))
    assert not by_lambda.batch and not no_frame.batch
    out, _ = run_one_by_one(by_lambda, messages([("a", 1), ("b", 1), MARK]))
    assert [(w.key, w.value, w.close_reason.value, w.first_seq, w.last_seq) for w in out] == [
        ("src", ["a", "b"], "marker", 1, 2)]


message = st.one_of(st.just(MARK), st.tuples(st.sampled_from("xyz"), st.integers(1, 3)))


@settings(max_examples=150, deadline=None)
@given(stream=st.lists(message, max_size=30), cuts=st.lists(st.integers(0, 30), max_size=4),
       max_count=st.one_of(st.none(), st.integers(1, 4)))
def test_the_batch_step_equals_its_one_message_form(stream, cuts, max_count):
    step = (trigger_windows(is_marker=field_is("kind", "marker"), boundary="day", max_count=max_count)
            .over(collect()).emit(lambda w: [(w.window_id, v) for v in w.value] + [w]))
    assert step.batch and not step.one_message().batch
    assert step.reads == ("kind", "day", "v")
    msgs = messages(stream)
    expected, s1 = run_one_by_one(step.one_message(), msgs)
    got, s2 = run_frames(step, msgs, cuts)
    assert got == expected
    assert (s1.open and (s1.open.value, s1.open.first_seq, s1.open.size)) == (
        s2.open and (s2.open.value, s2.open.first_seq, s2.open.size))
    assert all(w.key == "src" for w in got if isinstance(w, WindowResult))


def test_emit_maps_windows_to_rows_and_none_drops_them():
    step = trigger_windows(max_count=2).over(counting(), name="pairs")
    rows = step.emit(lambda w: {"window": w.window_id, "n": w.value} if w.first_seq > 1 else None)
    out, _ = run_one_by_one(rows.one_message(), [{"v": i} for i in range(6)], key="k")
    assert out == [{"window": "k/3-4", "n": 2}, {"window": "k/5-6", "n": 2}]
    frame = pd.DataFrame({"v": range(6), "_seq": range(1, 7)})
    assert rows.fn(frame, rows.state(), Context("k")) == out  # the batch form: the same rows
    assert rows.name == "pairs" and rows.state is step.state


def test_event_time_step_reads_the_field_routes_late_messages_and_takes_datetimes():
    step = event_time_windows(10, event_time="t", late="route").over(Aggregator(list, lambda acc, m: acc + [m["v"]]))
    assert not step.batch and step.on_timer is None
    msgs = [{"t": 1, "v": "a"}, {"t": 12, "v": "b"}, {"t": 3, "v": "late"}, {"t": 25, "v": "c"}]
    out, state = run_one_by_one(step, msgs, key="s1")
    assert [(o.start_ms, o.value, o.close_reason.value) for o in out if isinstance(o, WindowResult)] == [
        (0, ["a"], "watermark"), (10, ["b"], "watermark")]
    assert [o for o in out if isinstance(o, LateEvent)] == [LateEvent("s1", 3, 3, 12, msgs[2])]
    by_datetime = event_time_windows(60_000, event_time=lambda m: m["at"]).over(counting())
    t0 = dt.datetime(2024, 1, 1, 0, 0, 30, tzinfo=dt.timezone.utc)
    out, _ = run_one_by_one(by_datetime, [{"at": t0}, {"at": t0 + dt.timedelta(minutes=1)}])
    assert [(w.start_ms, w.value) for w in out] == [(int(t0.timestamp()) * 1000 - 30_000, 1)]


def test_wall_clock_step_closes_overdue_windows_and_on_timer_closes_the_rest():
    step = wall_clock_windows(1000).over(counting())
    assert step.on_timer is not None and not step.batch
    state = step.state()
    with pytest.raises(RuntimeError, match="on_timer"):  # a new window asks for a timer: no engine here
        step.apply("a", state, Context("k", processing_time_ms=10_250, seq=1))
    assert state.open.end_ms == 11_000
    (w,) = step.fire_timer("k", state, 11_000, Context("k", processing_time_ms=11_000))
    assert (w.key, w.value, w.close_reason.value, w.first_seq) == ("k", 1, "timer", 1)
    assert step.fire_timer("k", state, 11_000, Context("k")) == []


def test_bad_window_steps_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match="at least one of is_marker, boundary, max_count"):
        trigger_windows()
    with pytest.raises(ValueError, match="max_count must be a positive int"):
        trigger_windows(max_count=0)
    with pytest.raises(TypeError, match="is_marker=.*field name"):
        trigger_windows(is_marker=3)
    with pytest.raises(TypeError, match="windows.Aggregator"):
        trigger_windows(max_count=2).over(len)
    with pytest.raises(TypeError, match="subclass of TriggerState"):
        trigger_windows(max_count=2).over(counting(), state=dict)
    with pytest.raises(ValueError, match="late must be 'drop' or 'route'"):
        event_time_windows(10, event_time="t", late="keep")
    with pytest.raises(ValueError, match="slide_ms"):
        event_time_windows(10, 20, event_time="t")
    with pytest.raises(ValueError, match="size_ms must be positive"):
        wall_clock_windows(0)
    step = event_time_windows(10, event_time="t").over(counting())
    with pytest.raises(KeyError, match="no field 't'"):
        step.apply({"time": 1}, step.state(), Context("k", seq=1))
    with pytest.raises(TypeError, match="epoch milliseconds or a datetime"):
        step.apply({"t": "noon"}, step.state(), Context("k", seq=1))
    with pytest.raises(TypeError, match="needs its Context"):
        step.fn({"t": 1}, step.state(), None)


# -- the context in the API ----------------------------------------------------------------------------
class Seen:
    def __init__(self):
        self.keys = []


def test_state_computations_take_an_optional_context_and_timer_hooks_theirs():
    @state_computation("with ctx", state=Seen, on_timer=lambda key, state, at, ctx: [(key, at, ctx.processing_time_ms)])
    def note(msg, state, ctx):
        state.keys.append((ctx.key, ctx.seq))
        return msg

    @state_computation("without", state=Seen, on_timer=lambda key, state, at: [(key, at)])
    def plain(msg, state):
        return msg

    assert note.with_context and not plain.with_context
    state = Seen()
    assert note.apply("m", state, Context("k", seq=7)) == ["m"] and state.keys == [("k", 7)]
    assert plain.apply("m", Seen(), Context("k")) == ["m"]
    assert note.fire_timer("k", state, 5, Context("k", processing_time_ms=6)) == [("k", 5, 6)]
    assert plain.fire_timer("k", state, 5, Context("k")) == [("k", 5)]
    with pytest.raises(TypeError, match=r"must take \(message, state\) or \(message, state, ctx\), takes 4"):
        state_computation("bad", state=Seen)(lambda a, b, c, d: a)
    with pytest.raises(TypeError, match=r"on_timer must be a function of \(key, state, expiry_ms\)"):
        state_computation("bad", state=Seen, on_timer=lambda key, state: [])
