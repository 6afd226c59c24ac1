"""Windows into windows: the plain reference of chained levels, Wallaroo's multi_aggregation inputs
giving its expected sums and counts as one pipeline, and the engine on Spark held equal to the
reference (hypothesis, a few examples: Spark runs are slow)."""

import dataclasses
import random
import sys
import time

import pytest
from hypothesis import Phase, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from tests.conftest import DATA, REPO
from transforms.api import Context
from transforms.windowing import event_time_windows
from windows import Aggregator, CloseReason, WindowResult
from windows.levels import event_time_level, reference_event_time_windows, reference_levels

MULTI = DATA / "multi_aggregation"
total = Aggregator(create=int, add=lambda acc, m: acc + m["v"])


def brief(w: WindowResult) -> tuple:
    return (w.window_id, w.value, w.first_seq, w.last_seq, w.size)


def test_the_reference_windows_by_hand():
    # Arrival order: 3, 12, 7 (lateness 5: not late), 25 (closes [0,10) and [10,20)), 8 (late: below 20), 31.
    events = [(1, 3, {"v": 1}), (2, 12, {"v": 2}), (3, 7, {"v": 4}), (4, 25, {"v": 8}), (5, 8, {"v": 16}),
              (6, 31, {"v": 32})]
    closed, still_open = reference_event_time_windows(total, 10, "k", events, allowed_lateness_ms=5)
    assert [(i, brief(w)) for i, w in closed] == [(3, ("k/0-10", 5, 1, 3, 2)), (3, ("k/10-20", 2, 2, 2, 1))]
    assert [brief(w) for w in still_open] == [("k/20-30", 8, 4, 4, 1), ("k/30-40", 32, 6, 6, 1)]
    assert all(w.close_reason is CloseReason.WATERMARK for _, w in closed)
    sliding, _ = reference_event_time_windows(total, 10, "k", events[:4], slide_ms=5)
    # Slides of 5: 3 is in [-5,5) and [0,10), which 12 closes; 7 is late (below 12); 25 closes [5,15), [10,20).
    assert [(i, w.window_id, w.value) for i, w in sliding] == [
        (1, "k/-5-5", 1), (1, "k/0-10", 1), (3, "k/5-15", 2), (3, "k/10-20", 2)]


def test_levels_feed_each_other_in_the_order_of_the_inputs_they_answer():
    # Level 1 keyed by "k": 10 ms sums. Level 2, keyed again (one key for all): 20 ms sums of those, by start.
    msgs = [(1, {"k": "a", "t": 1, "v": 1}), (2, {"k": "b", "t": 2, "v": 10}), (3, {"k": "a", "t": 15, "v": 2}),
            (4, {"k": "b", "t": 41, "v": 20}), (5, {"k": "a", "t": 44, "v": 3})]
    sums_of = Aggregator(create=tuple, add=lambda acc, w: (*acc, (w.key, w.value)))
    levels = [event_time_level(total, 10, lambda m: m["t"], key=lambda m: m["k"]),
              event_time_level(sums_of, 20, lambda w: w.start_ms, key=lambda w: "all")]
    first = reference_levels(msgs, levels[:1])
    # a's [0,10) closes on seq 3, b's [0,10) on seq 4, a's [10,20) on seq 5: the keys interleaved by seq.
    assert [(seq, key, w.window_id, w.value) for seq, key, w in first] == [
        (3, "a", "a/0-10", 1), (4, "b", "b/0-10", 10), (5, "a", "a/10-20", 2)]
    # "all" sees them in that order (starts 0, 0, 10): its watermark stays at 10, so [0, 20) stays open.
    assert reference_levels(msgs, levels) == []
    more = msgs + [(6, {"k": "b", "t": 90, "v": 1})]  # closes b's [40,50): start 40, past [0, 20)'s end
    ((seq, key, w),) = reference_levels(more, levels)
    assert (seq, key, w.window_id, w.value) == (6, "all", "all/0-20", (("a", 1), ("b", 10), ("a", 2)))


def test_the_step_chained_one_message_at_a_time_equals_the_reference_by_hand():
    """The two window steps of the multi_aggregation example, applied in plain Python (level 1's outputs
    fed to level 2), on events whose sums are worked out here by hand."""
    from examples.multi_level import last_ms, sum_of_sums

    ms50 = event_time_windows(50, event_time="ms").over(Aggregator(create=int, add=lambda acc, e: acc + e["data"]))
    s1 = event_time_windows(1000, event_time=last_ms).over(sum_of_sums)
    events = [(5000, 1), (5100, 3), (5200, 5), (5300, 1), (6050, 11), (6051, 13), (7100, 2), (8000, 1)]
    state1, state2, out = ms50.state(), s1.state(), []
    for seq, (ms, data) in enumerate(events, 1):
        for w in ms50.apply({"ms": ms, "data": data}, state1, Context("HELO", seq=seq)):
            out += s1.apply(w, state2, Context("HELO", seq=seq))
    # 50 ms windows, each closed by the next event: 1, 3, 5, 1 (last ms 5049..5349), 24 (6099), 2 (7149);
    # [8000,8050) stays open. 1 s windows by those last ms: 6099 closes [5000,6000), 10 of 4 windows of 4
    # events; 7149 closes [6000,7000), 24 of 1 window of 2 events; [7000,8000) stays open.
    assert [(w.window_id, w.value, w.size) for w in out] == [("HELO/5000-6000", (10, 4), 4), ("HELO/6000-7000", (24, 2), 1)]


# -- Wallaroo's multi_aggregation, as one pipeline, on Spark ----------------------------------------------
def _frames(data: bytes) -> list[bytes]:
    out = []
    while data:
        n = int.from_bytes(data[:4], "big")
        out.append(data[4:4 + n])
        data = data[4 + n:]
    return out


def _wallaroo_outputs(name: str) -> list[tuple[int, int, str]]:
    """(t, data, key) of each framed `t=...,data=...,key=...` line Wallaroo's sink sent."""
    lines = [f.decode().strip() for f in _frames((MULTI / name).read_bytes())]
    return [(int(f["t"]), int(f["data"]), f["key"]) for f in (dict(p.split("=") for p in line.split(",")) for line in lines)]


def test_the_docs_example_is_one_query_of_two_levels_with_wallaroos_first_sum():
    from transforms.engine.plan import KEEP_KEY, plan_queries
    from transforms.registry import registry_of
    from transforms.settings import Settings

    readme = (REPO / "docs" / "windows.md").read_text()
    code = readme.split("## Multi-level pipelines", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(code, "docs/windows.md:Multi-level pipelines", "exec"), scope)
    app = scope["app"]
    (plan,) = plan_queries(app, Settings(app_registry=registry_of([app])))
    (level,) = plan.levels
    (w50,), (w1s,) = plan.branches[0].post_steps, level.branches[0].post_steps
    assert level.branches[0].key_fn is KEEP_KEY
    state50, state1s, out = w50.state(), w1s.state(), []
    for seq, line in enumerate((MULTI / "_events1.msg").read_bytes().splitlines() + [b"71000002HELO"], 1):
        for w in w50.apply(app.pipelines[0].decoder(line), state50, Context("HELO", seq=seq)):
            out += w1s.apply(w, state1s, Context("HELO", seq=seq))
    assert [(w.window_id, w.value, w.size) for w in out] == [("HELO/5000-6000", 10, 4)]


def test_wallaroos_expected_outputs_are_what_this_test_expects():
    assert _wallaroo_outputs("_expected.msg") == [(6049, 10, "HELO")]
    assert _wallaroo_outputs("_expected1.msg") == [(6049, 10, "HELO"), (7099, 24, "HELO")]
    assert (MULTI / "_events1.msg").read_bytes().startswith((MULTI / "_events.msg").read_bytes() + b"\n")


def test_the_example_decodes_wallaroos_events_and_refuses_others():
    from examples.multi_level import decode_event
    from transforms.api import Reject

    assert decode_event(b"50000001HELO\n") == {"ms": 5000, "data": 1, "key": "HELO"}
    assert isinstance(decode_event(b"5000HELO"), Reject) and "TTTTDDDDKKKK" in decode_event(b"x").reason


def _row(start_ms, data, windows, events, reason):
    return {"key": "HELO", "start_ms": start_ms, "end_ms": start_ms + 1000, "t": start_ms + 999, "data": data,
            "windows": windows, "events": events, "close_reason": reason}


@pytest.mark.spark
@pytest.mark.parametrize("events, expected", [("_events.msg", "_expected.msg"), ("_events1.msg", "_expected1.msg")])
def test_wallaroos_multi_aggregation_inputs_give_its_sums_and_counts_as_one_pipeline(spark, events, expected):
    """Wallaroo's two runs as one pipeline, each input finished and its windows closed at the end (run
    --close-windows, level by level; Wallaroo closed them when its source timed out): `_events` (4
    events) gives one 1 s sum, 10; `_events1` (the same and 2 more) also the next, 24. Sums, counts and
    the sink's lines are Wallaroo's but for `t` (the window's last ms): Eventide's windows are aligned to
    the epoch, Wallaroo's to the data (data/wallaroo/README.md), so 5999 and 6999 where Wallaroo has 6049
    and 7099."""
    from pyspark import cloudpickle

    from examples.multi_level import multi_aggregation
    from transforms.testing import run_app

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    app = multi_aggregation(idle_close_ms=None)
    result = run_app(app, {"events": (MULTI / events).read_bytes().splitlines()}, spark=spark, close_windows=True)
    rows = sorted(({k: r[k] for k in _row(0, 0, 0, 0, "")} for r in result.outputs("event_totals")),
                  key=lambda r: r["start_ms"])  # (written by two batches: the table's order is its files')
    if events == "_events.msg":  # [5300,5350) closes at the end, then [5000,6000) with it
        assert rows == [_row(5000, 10, 4, 4, "end_of_input")]
    else:  # 6050 closed [5300,5350); at the end [6050,6100) closes, whose last ms (6099) closes [5000,6000)
        assert rows == [_row(5000, 10, 4, 4, "watermark"), _row(6000, 24, 1, 2, "end_of_input")]
    wallaroo = _wallaroo_outputs(expected)
    assert [(r["data"], r["key"]) for r in rows] == [(data, key) for _, data, key in wallaroo]
    # Wallaroo's sink lines, with Eventide's t.
    assert result.outputs("event_totals_tcp") == [f"t={r['t']},data={r['data']},key={r['key']}\n".encode() for r in rows]
    assert result.quarantine == []


@pytest.mark.spark
def test_each_levels_idle_timeout_closes_its_last_windows(spark, settings):
    """As under `eventide serve` (Wallaroo's source timeout): a quiet key's last windows close by the wall
    clock, level by level: level 1's idle close emits its last 50 ms window, which level 2 folds, and level
    2's own idle timeout then closes it (each in the first run after it is due)."""
    from examples.multi_level import multi_aggregation
    from tests.conftest import land
    from transforms import lake
    from transforms.engine import plan_queries, run_application
    from transforms.registry import registry_of

    app = multi_aggregation(idle_close_ms=1_500)
    settings = dataclasses.replace(settings, app_registry=registry_of([app]))
    (plan,) = plan_queries(app, settings)
    assert plan.timers and len(plan.levels) == 1  # one query: level 2 is its second stateful operator
    land(settings, "events", (MULTI / "_events1.msg").read_bytes().splitlines())
    run_application(spark, app, settings)
    for _ in range(2):  # once per level: its idle timeout passes, the next run closes its last window
        time.sleep(1.6)
        run_application(spark, app, settings)
    rows = sorted(lake.read(settings.table_path("event_totals")).to_pylist(), key=lambda r: r["start_ms"])
    assert [{k: r[k] for k in _row(0, 0, 0, 0, "")} for r in rows] == [
        _row(5000, 10, 4, 4, "watermark"), _row(6000, 24, 1, 2, "idle")]


# -- the engine on Spark == the reference (a few examples) -------------------------------------------------
def by_start(w):
    return w.start_ms


def one_key(w):
    return "all"


def level_app(size, lateness, rekey):
    import pyarrow as pa

    from transforms.api import Application, DeltaSink, decoder, source

    @decoder
    def reading(payload: bytes) -> dict:  # b"key,ms,value"
        k, t, v = payload.decode().split(",")
        return {"k": k, "t": int(t), "v": int(v)}

    sums_of = Aggregator(create=tuple, add=lambda acc, w: (*acc, (w.key, w.start_ms, w.value)))
    outer = event_time_windows(size * 4, event_time=by_start).over(sums_of).emit(
        lambda w: {"key": w.key, "window_id": w.window_id, "value": repr(w.value), "first_seq": w.first_seq,
                   "last_seq": w.last_seq, "size": w.size})
    keyed = source("readings", decoder=reading).key_by("k").to(
        event_time_windows(size, event_time="t", allowed_lateness_ms=lateness).over(total))
    schema = pa.schema([("key", pa.string()), ("window_id", pa.string()), ("value", pa.string()),
                        ("first_seq", pa.int64()), ("last_seq", pa.int64()), ("size", pa.int64()),
                        ("seq", pa.int64()), ("part", pa.int32())])
    pipeline = keyed.key_by(one_key).to(outer) if rekey else keyed.to(outer)
    return Application("levels", pipeline.to_sink(DeltaSink("outer", schema=schema, metadata=("seq", "part"))))


def random_events(seed: int, n: int) -> list[tuple[str, int, int]]:
    """Events of keys a and b: time moving on 0..15 ms a message, each up to 20 ms early (some late)."""
    rnd, clock, out = random.Random(seed), 0, []
    for _ in range(n):
        clock += rnd.randint(0, 15)
        out.append((rnd.choice("ab"), max(0, clock - rnd.randint(0, 20)), rnd.randint(1, 9)))
    return out


@pytest.mark.spark
@examples(max_examples=3, deadline=None, phases=[Phase.generate])  # each example a Spark run: a few, rich ones
@given(seed=st.integers(0, 2**32), n=st.integers(30, 80), size=st.sampled_from([5, 10]), lateness=st.integers(0, 15),
       rekey=st.booleans(), segments=st.integers(1, 4))
def test_the_engine_equals_the_reference_on_spark(spark, tmp_path_factory, seed, n, size, lateness, rekey, segments):
    events = random_events(seed, n)
    from pyspark import cloudpickle

    from tests.conftest import land
    from transforms import lake
    from transforms.engine import run_application
    from transforms.registry import registry_of
    from transforms.settings import Settings

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    app = level_app(size, lateness, rekey)
    settings = Settings(home=tmp_path_factory.mktemp("levels"), app_registry=registry_of([app]), max_files_per_trigger=1)
    payloads = [f"{k},{t},{v}".encode() for k, t, v in events]
    step = -(-len(payloads) // segments)
    for start in range(0, len(payloads), step):  # one micro-batch per segment
        land(settings, "readings", payloads[start:start + step])
    (report,) = run_application(spark, app, settings)
    assert report.batches == -(-len(payloads) // step)
    path = settings.table_path("outer")
    got = lake.read(path).sort_by([("seq", "ascending"), ("part", "ascending")]).to_pylist() if lake.exists(path) else []
    sums_of = Aggregator(create=tuple, add=lambda acc, w: (*acc, (w.key, w.start_ms, w.value)))
    expected = reference_levels(
        [(seq, {"k": k, "t": t, "v": v}) for seq, (k, t, v) in enumerate(events, 1)],
        [event_time_level(total, size, lambda m: m["t"], key=lambda m: m["k"], allowed_lateness_ms=lateness),
         event_time_level(sums_of, size * 4, by_start, key=one_key if rekey else None)])
    assert expected  # (at least 2 for every seed of 30 events and more)
    assert [{k: v for k, v in r.items() if k != "part"} for r in got] == [
        {"key": w.key, "window_id": w.window_id, "value": repr(w.value), "first_seq": w.first_seq,
         "last_seq": w.last_seq, "size": w.size, "seq": seq} for seq, _, w in expected]
