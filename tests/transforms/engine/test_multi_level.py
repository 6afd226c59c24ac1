"""Multi-level pipelines: building and planning them (and what is still refused), the re-key stage, the
engine's stages chained over micro-batches held equal to the plain-Python reference (hypothesis), and a
multi-level query killed with SIGKILL and run again: its table exact, every row once."""

import dataclasses
import os
import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from examples.words import WordCount, WordTotal, count_word, decode_text, split, split_words
from tests.conftest import land
from tests.crash import run_python, without_batch_bound
from transforms import lake
from transforms.api import (
    Application,
    Context,
    DeltaSink,
    KeyMark,
    Pipeline,
    computation,
    decoder,
    merge,
    source,
    state_computation,
)
from transforms.engine.checkpoints import explain_checkpoint_error
from transforms.engine.envelope import ENVELOPE, QUARANTINE_KEY
from transforms.engine.keyed_state import _run_key, input_order
from transforms.engine.levels import make_rekey_stage, ranks_within
from transforms.engine.plan import KEEP_KEY, QueryMode, TimeMode, plan_queries
from transforms.engine.runner import run_application
from transforms.engine.stages import make_pre_stage
from transforms.ingestion.landing import LANDING_SCHEMA
from transforms.registry import registry_of
from transforms.settings import Settings
from transforms.windowing import event_time_windows, wall_clock_windows
from windows import Aggregator, WindowResult
from windows.levels import event_time_level, reference_levels


@decoder
def reading(payload: bytes) -> dict:  # b"key,ms,value"
    k, t, v = payload.decode().split(",")
    return {"k": k, "t": int(t), "v": int(v)}


class Total:
    def __init__(self):
        self.n = 0


@state_computation("running", state=Total)
def running(m, total):
    total.n += m["v"]
    return {"k": m["k"], "n": total.n}


@state_computation("seen", state=Total)
def seen(m, total):
    total.n += 1
    return {"n": m["n"], "seen": total.n}


@computation("shout")
def shout(m):
    return m


def _plans(app):
    return plan_queries(app, Settings(app_registry=registry_of([app])))


# -- building and planning ---------------------------------------------------------------------------
def test_a_second_key_by_and_a_second_state_step_make_levels_of_one_query():
    w50 = event_time_windows(50, event_time="t").over(Aggregator(create=int, add=lambda a, m: a + m["v"]))
    w1s = event_time_windows(1000, event_time="end_ms").over(Aggregator(create=int, add=lambda a, w: a + w.value))
    again = source("r", decoder=reading).key_by("k").to(w50).key_by(lambda w: w.key[:1]).to(w1s)
    same = source("r", decoder=reading).key_by("k").to(w50).to(shout).to(w1s)
    assert [(k, steps) for k, steps in same.levels] == [("k", [w50, shout]), (None, [w1s])]
    assert again.levels[0] == ("k", [w50]) and again.levels[1][1] == [w1s] and again.post_steps == [w50]
    for pipeline in (again, same):
        (plan,) = _plans(Application("two", pipeline.to_sink(DeltaSink("out"))))
        assert plan.name == "two" and len(plan.levels) == 1 and plan.keyed  # one query, its checkpoint, its name
        (level,) = plan.levels
        assert level.name == plan.name and level.sinks == () and level.mode is QueryMode.ENVELOPE
        assert level.branches[0].post_steps == [w1s] and level.levels == ()
    (plan,) = _plans(Application("two", same.to_sink(DeltaSink("out"))))
    assert plan.levels[0].branches[0].key_fn is KEEP_KEY and pickle.loads(pickle.dumps(KEEP_KEY)) is KEEP_KEY


def test_single_level_plans_are_unchanged():
    from examples.count_windows import app as counts
    from examples.logs import app as logs
    from examples.market import app as market
    from examples.session_windows import app as visits
    from examples.words import word_count

    for app in (logs, market, word_count, visits, counts):
        for plan in _plans(app):
            assert plan.levels == ()
            for b in plan.branches:  # post_steps: everything after key_by, as before levels
                after_key = list(b.steps[[isinstance(s, KeyMark) for s in b.steps].index(True) + 1:]) if b.key_fn else []
                assert b.post_steps == after_key


def test_a_later_levels_timers_give_the_query_its_clock_and_each_level_its_own_time_mode():
    ticks = wall_clock_windows(1000).over(Aggregator(create=int, add=lambda a, m: a + 1))
    (plan,) = _plans(Application("timed", source("r", decoder=reading).key_by("k").to(running).key_by("k").to(ticks)
                                 .to_sink(DeltaSink("out"))))
    assert plan.timers and plan.time_mode is TimeMode.PROCESSING_TIME  # the query runs on the clock
    assert plan.levels[0].time_mode is TimeMode.PROCESSING_TIME and plan.levels[0].timers
    (plan,) = _plans(Application("timed_first", source("r", decoder=reading).key_by("k").to(ticks).to(running)
                                 .to_sink(DeltaSink("out"))))
    assert plan.timers and not plan.levels[0].timers


def test_what_is_still_refused_says_what_to_do():
    keyed = source("r", decoder=reading).key_by("k")
    with pytest.raises(ValueError, match=r"already keyed and has no state computation since.*drop one of the key_bys"):
        keyed.key_by("t")
    with pytest.raises(ValueError, match="already keyed and has no state computation since"):
        keyed.to(shout).key_by("t")
    with pytest.raises(ValueError, match="key_by.*must come before state computation 'running'"):
        source("r", decoder=reading).to(running)
    with pytest.raises(ValueError, match=r"state computation 'seen' comes after step 'shout'.*move the step before key_by"):
        keyed.to(running).key_by("k").to(shout).to(seen)
    # Built by hand or through merge, the plan checks the same.
    by_hand = Pipeline("r", reading, (KeyMark(), running, KeyMark("k"), shout, seen), "k", (DeltaSink("out"),))
    with pytest.raises(ValueError, match="'by_hand'.*step 'shout' between key_by and state computation 'seen'"):
        _plans(Application("by_hand", by_hand))
    uneven = merge(source("a", decoder=reading).key_by("k").to(running).to(seen), source("b", decoder=reading).key_by("k"))
    with pytest.raises(ValueError, match=r"merged pipelines \['a', 'b'\] have different numbers of levels \(\[2, 1\]\)"):
        _plans(Application("uneven", uneven.to_sink(DeltaSink("out"))))


def test_merged_pipelines_chain_levels_after_the_merge():
    m = merge(source("a", decoder=reading).key_by("k"), source("b", decoder=reading).key_by("k")).to(running)
    with pytest.raises(ValueError, match=r"merge\(\.\.\.\) is already keyed and has no state computation since"):
        merge(source("a", decoder=reading).key_by("k"), source("b", decoder=reading).key_by("k")).key_by("t")
    (plan,) = _plans(Application("merged", m.key_by(lambda o: "all").to(seen).to_sink(DeltaSink("out"))))
    assert [len(b.levels) for b in plan.branches] == [2, 2]
    assert [b.stream for b in plan.levels[0].branches] == ["a", "b"]
    assert all(b.post_steps == [seen] for b in plan.levels[0].branches)


# -- the re-key stage ----------------------------------------------------------------------------------
def test_parts_are_renumbered_within_each_input_in_order():
    seq = np.array([5, 3, 5, 5, 3, -1, -1])
    part = np.array([2001, 7, 0, 2000, 7, 4, 0])
    assert ranks_within(seq, part).tolist() == [2, 0, 0, 1, 1, 1, 0]
    assert ranks_within(np.array([], dtype=np.int64), np.array([], dtype=np.int32)).tolist() == []


def _out_rows(rows):
    """Output envelopes of a level: (kind, seq, part, key, message)."""
    return pa.Table.from_pylist([
        {"kind": kind, "seq": seq, "part": part, "branch": 0, "key": key, "msg": None if m is None else pickle.dumps(m),
         "stream": "r", "receive_time": None, "connection": "c", "step": "s" if kind == "quarantine" else None,
         "reason": "why" if kind == "quarantine" else None, "payload": None}
        for kind, seq, part, key, m in rows], schema=ENVELOPE)


def test_the_rekey_stage_keys_each_output_and_passes_quarantine_through():
    def level_key(o):
        return {"x": "even", "y": "odd"}[o["w"]]

    (plan,) = _plans(Application("re", source("r", decoder=reading).key_by("k").to(running).key_by(level_key).to(seen)
                                 .to_sink(DeltaSink("out"))))
    rows = _out_rows([("out", 1, 3000, "a", {"w": "x"}), ("out", 1, 3001, "a", {"w": "y"}),
                      ("quarantine", 2, 0, "a", None), ("out", 4, 0, "b", {"w": "zzz"})])
    (got,) = make_rekey_stage(plan.levels[0], False)(iter(rows.to_batches()))
    out = got.to_pylist()
    assert [(r["kind"], r["seq"], r["part"], r["key"]) for r in out] == [
        ("msg", 1, 0, "even"), ("msg", 1, 1, "odd"), ("quarantine", 2, 0, QUARANTINE_KEY), ("quarantine", 4, 0, QUARANTINE_KEY)]
    assert out[3]["step"] == "key_by" and "KeyError: 'zzz'" in out[3]["reason"] and out[3]["msg"] is None
    assert out[2]["step"] == "s" and pickle.loads(out[0]["msg"]) == {"w": "x"}
    (same,) = _plans(Application("same", source("r", decoder=reading).key_by("k").to(running).to(seen)
                                 .to_sink(DeltaSink("out"))))
    (kept,) = make_rekey_stage(same.levels[0], False)(iter(rows.slice(0, 2).to_batches()))
    assert kept.column("key").to_pylist() == ["a", "a"] and kept.column("kind").to_pylist() == ["msg", "msg"]


def test_a_later_levels_close_record_passes_the_levels_before_it_and_gets_its_key_at_its_own():
    """eventide run --close-windows closes a multi-level pipeline level by level (close_windows.py)."""
    from transforms.engine.close_windows import close_connection, split_close_records

    pipeline = source("r", decoder=reading).key_by("k").to(running).to(seen).key_by("n").to(seen)
    (plan,) = _plans(Application("closing", pipeline.to_sink(DeltaSink("out"))))
    assert [close_connection(p) for p in (plan, *plan.levels)] == [
        "\x00close:closing", "\x00close:closing#1", "\x00close:closing#2"]
    records = pa.RecordBatch.from_pydict(
        {"stream": ["r"] * 3, "seq": [7, 8, 9], "receive_time": [None] * 3, "payload": [b"a", b"x", b"42"],
         "connection": [close_connection(plan, n) for n in range(3)], "landing_error": [None] * 3}, schema=LANDING_SCHEMA)
    (env,) = split_close_records(plan, lambda batches: [b for b in batches if False])(iter([records]))
    # The first level's record goes to its key; the later ones' pass it as quarantine rows pass a level.
    assert env.column("key").to_pylist() == ["a", QUARANTINE_KEY, QUARANTINE_KEY]
    assert set(env.column("kind").to_pylist()) == {"close"}
    later = pa.Table.from_batches([env.slice(1)]).select(ENVELOPE.names).cast(ENVELOPE)
    (at_1,) = make_rekey_stage(plan.levels[0], False)(iter(later.to_batches()))
    assert at_1.column("key").to_pylist() == ["x", QUARANTINE_KEY]
    (at_2,) = make_rekey_stage(plan.levels[1], False)(iter([at_1.slice(1)]))
    assert at_2.column("key").to_pylist() == ["42"] and at_2.column("kind").to_pylist() == ["close"]


# -- the engine's stages over micro-batches == the reference ------------------------------------------------
class LocalQuery:
    """A plan's stages without Spark, batch after batch: the pre stage, each level's keyed step (a key's
    rows in the processors' order, `input_order`, through `_run_key`, the processors' core), the re-key
    stage between levels over the previous level's output split in `partitions` by key (as Spark's
    shuffle places a key's group). A shuffle keeps no order, so each key's rows arrive reversed: only
    the envelopes' own fields order them. States stay per level and key between batches."""

    def __init__(self, plan, partitions: int):
        self.plan, self.partitions = plan, partitions
        self.states: list[dict] = [{} for _ in range(1 + len(plan.levels))]

    def run(self, rows: list[tuple[int, bytes]]) -> pd.DataFrame:
        n = len(rows)
        landing = pa.RecordBatch.from_pydict({"stream": ["r"] * n, "seq": [s for s, _ in rows], "receive_time": [None] * n,
                                              "connection": ["c"] * n, "payload": [p for _, p in rows],
                                              "landing_error": [None] * n}, schema=LANDING_SCHEMA)
        env = pa.Table.from_batches(list(make_pre_stage(self.plan, False)(iter([landing]))), schema=ENVELOPE)
        env = self._keyed(env, self.plan, 0)
        for n, level in enumerate(self.plan.levels, 1):
            parts = [env.filter(pa.array([hash(k) % self.partitions == p for k in env.column("key").to_pylist()], pa.bool_()))
                     for p in range(self.partitions)]
            env = pa.concat_tables([pa.Table.from_batches(list(make_rekey_stage(level, False)(iter(part.to_batches()))),
                                                          schema=ENVELOPE) for part in parts])
            env = self._keyed(env, level, n)
        return env.to_pandas()

    def _keyed(self, env: pa.Table, plan, n: int) -> pa.Table:
        frames = [ENVELOPE.empty_table().to_pandas()]
        for key, rows in env.to_pandas().groupby("key", sort=False):
            rows = rows.iloc[::-1].reset_index(drop=True)
            rows = rows.take(input_order(rows)).reset_index(drop=True)
            frames.append(rows if key == QUARANTINE_KEY else _run_key(rows, self.states[n].setdefault(key, {}),
                                                                      plan.branches, False, None, Context(key)))
        return pa.Table.from_pandas(pd.concat(frames, ignore_index=True), schema=ENVELOPE, preserve_index=False)


def brief(w: WindowResult) -> tuple:
    return (w.key, w.window_id, w.value, w.first_seq, w.last_seq, w.size, str(w.close_reason))


sums = Aggregator(create=int, add=lambda acc, m: acc + m["v"])
listed = Aggregator(create=tuple, add=lambda acc, w: (*acc, (w.start_ms, w.value)))


def level_times(name):
    return {"start": lambda w: w.start_ms, "last": lambda w: w.end_ms - 1}[name]


def all_keys(w):
    return "all"


# Events of three keys: time moving on 0..12 ms a message, each some ms early (out of order, late at times).
event = st.tuples(st.sampled_from("abc"), st.integers(0, 12), st.integers(-25, 0), st.integers(1, 9))


def timed(events) -> list[tuple[str, int, int]]:
    clock, out = 0, []
    for k, step, early, v in events:
        clock += step
        out.append((k, max(0, clock + early), v))
    return out


@examples(max_examples=100, deadline=None)
@given(events=st.lists(event, min_size=20, max_size=80).map(timed), size=st.sampled_from([5, 10, 20]), lateness=st.integers(0, 30),
       times=st.lists(st.sampled_from(["start", "last"]), min_size=1, max_size=2),
       rekey=st.lists(st.booleans(), min_size=2, max_size=2), cuts=st.lists(st.integers(0, 80), max_size=5),
       partitions=st.integers(1, 3))
def test_the_engines_stages_over_micro_batches_equal_the_reference(events, size, lateness, times, rekey, cuts, partitions):
    """Level 1: per key, `size` ms sums; each next level: windows 4x larger of the previous level's
    results (each by its start or its last ms), keyed again by one key for all or keeping the key."""
    pipeline = source("r", decoder=reading).key_by("k").to(
        event_time_windows(size, event_time="t", allowed_lateness_ms=lateness).over(sums))
    levels = [event_time_level(sums, size, lambda m: m["t"], key=lambda m: m["k"], allowed_lateness_ms=lateness)]
    for n, name in enumerate(times, 1):
        step = event_time_windows(size * 4 ** n, event_time=level_times(name)).over(listed)
        pipeline = pipeline.key_by(all_keys).to(step) if rekey[n - 1] else pipeline.to(step)
        levels.append(event_time_level(listed, size * 4 ** n, level_times(name), key=all_keys if rekey[n - 1] else None))
    (plan,) = _plans(Application("levels", pipeline.to_sink(DeltaSink("out"))))
    assert len(plan.levels) == len(times)
    payloads = [(seq, f"{k},{t},{v}".encode()) for seq, (k, t, v) in enumerate(events, 1)]
    query, got = LocalQuery(plan, partitions), []
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(payloads)}), len(payloads)]
    for a, b in zip(bounds, bounds[1:]):
        out = query.run(payloads[a:b]).iloc[::-1].sort_values(["seq", "part"], kind="stable")
        assert set(out["kind"]) <= {"out"}
        got += [(s, brief(pickle.loads(m))) for s, m in zip(out["seq"], out["msg"])]
    expected = reference_levels([(s, reading(p)) for s, p in payloads], levels)
    assert got == [(s, brief(w)) for s, _, w in expected]


@dataclasses.dataclass
class Arrival:
    word: str
    count: int
    n: int  # the place it reached the one key in: the order is the result


@state_computation("arrival", state=Total)
def arrival(update: WordCount, total: Total) -> Arrival:
    total.n += 1
    return Arrival(update.word, update.count, total.n)


def _one_key(update) -> str:
    return "all"


def _fan_out(stream: str) -> Pipeline:
    """Word count's own steps (a line fans out into words, counted per word: level 1), then every count
    to one key whose result is the order it sees them in (level 2)."""
    return source(stream, decoder=decode_text).to(split).key_by(lambda w: w).to(count_word).key_by(_one_key).to(arrival)


def _fan_out_reference(lines: list[str]) -> list[tuple[int, str, Arrival]]:
    def run(step, state_type):
        def on_key(key, inputs):
            state = state_type()
            return [(i, step(m, state)) for i, (_, m) in enumerate(inputs)]
        return on_key

    messages = [(seq, w) for seq, line in enumerate(lines, 1) for w in split_words(line)]
    return reference_levels(messages, [(lambda w: w, run(count_word.fn, WordTotal)), (_one_key, run(arrival.fn, Total))])


@examples(max_examples=60, deadline=None)
@given(lines=st.lists(st.lists(st.sampled_from("abcde"), min_size=1, max_size=5).map(" ".join), min_size=1, max_size=30),
       cuts=st.lists(st.integers(0, 30), max_size=4), partitions=st.integers(1, 3))
def test_one_inputs_outputs_from_several_keys_reach_the_next_level_key_by_key(lines, cuts, partitions):
    """A line fans out into words, counted per word (level 1), then all the counts go to one key whose
    result is the order it sees them in (level 2): the outputs of one line from several words' keys
    reach it word by word (the key that produced them), whatever partitions and arrival order the
    shuffle gives, equal to the reference. Without `origin` (the producing key) they tied on (seq, part)."""
    (plan,) = _plans(Application("fan_out", _fan_out("r").to_sink(DeltaSink("out"))))
    assert len(plan.levels) == 1
    payloads = [(seq, line.encode()) for seq, line in enumerate(lines, 1)]
    query, got = LocalQuery(plan, partitions), []
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(payloads)}), len(payloads)]
    for a, b in zip(bounds, bounds[1:]):
        out = query.run(payloads[a:b])  # one key: its outputs in the order it produced them
        got += [(s, pickle.loads(m)) for s, m in zip(out["seq"], out["msg"])]
    assert got == [(s, out) for s, _, out in _fan_out_reference(lines)]


@pytest.mark.spark
def test_one_inputs_outputs_from_several_keys_reach_the_next_level_key_by_key_on_spark(spark, tmp_path):
    """The same on Spark (two shuffle partitions, two micro-batches): the table equals the reference."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    app = Application("fan_out", _fan_out("lines").to_sink(DeltaSink("arrivals")))
    settings = Settings(home=tmp_path, app_registry=registry_of([app]), max_files_per_trigger=1)
    lines = ["e d c b a", "a b a", "c", "b e d a c e", "d d a"]
    land(settings, "lines", [line.encode() for line in lines[:2]])
    land(settings, "lines", [line.encode() for line in lines[2:]])
    (report,) = run_application(spark, app, settings)
    assert report.batches == 2
    got = sorted((r["n"], r["word"], r["count"]) for r in lake.read(settings.table_path("arrivals")).to_pylist())
    assert got == [(a.n, a.word, a.count) for _, _, a in _fan_out_reference(lines)]
    assert [w for _, w, _ in got][:5] == ["a", "b", "c", "d", "e"]  # the first line's words, key by key


# -- SIGKILL mid-run, then run again ---------------------------------------------------------------------
RUN = """
import sys
from transforms.settings import get_settings
from transforms.spark import get_spark
from transforms.engine import run_application
from examples.multi_level import multi_aggregation
s = get_settings()
run_application(get_spark(s), multi_aggregation(idle_close_ms=None), s)
print("COMPLETE")
"""


def _events(n_keys: int, n: int) -> list[bytes]:
    """Events of several keys, time moving on 7 ms a message: every 50 ms and 1 s window closes but the last."""
    return [f"{1000 + 7 * i:04d}{(i * 13) % 97:04d}K{i % n_keys:03d}".encode() for i in range(n)]


@pytest.mark.spark
def test_sigkill_during_a_multi_level_run_and_rerun_give_each_window_once(settings):
    from examples.multi_level import app, decode_event, last_ms, sum_of_sums, total_row

    settings = dataclasses.replace(settings, app_registry=registry_of([app]))
    payloads = _events(3, 1200)
    for start in range(0, len(payloads), 40):
        land(settings, "events", payloads[start:start + 40])  # many segments: many micro-batches to die in
    table = settings.table_path("event_totals")
    env = {**os.environ, "EVENTIDE_HOME": str(settings.home), "EVENTIDE_MAX_FILES_PER_TRIGGER": "2",
           "EVENTIDE_APPS": "examples.multi_level:app"}

    def at_version(v):
        return lambda: (lake.version(table) or -1) >= v

    outcomes = [run_python(RUN, env, at_version(2), timeout=300, poll=0.02), run_python(RUN, without_batch_bound(env), timeout=300)]
    assert outcomes == ["killed", "complete"]
    rows = sorted(lake.read(table).to_pylist(), key=lambda r: (r["key"], r["start_ms"]))
    messages = [(seq, decode_event(p)) for seq, p in enumerate(payloads, 1)]
    expected = reference_levels(messages, [event_time_level(Aggregator(create=int, add=lambda a, e: a + e["data"]), 50,
                                                            lambda e: e["ms"], key=lambda e: e["key"]),
                                           event_time_level(sum_of_sums, 1000, last_ms, emit=total_row)])
    assert rows == sorted((r for _, _, r in expected), key=lambda r: (r["key"], r["start_ms"]))
    assert len(rows) == 3 * 8 and sum(r["events"] for r in rows) < len(payloads)  # the last second stays open


@pytest.mark.spark
def test_a_level_added_to_a_started_query_is_refused_saying_what_to_do(spark, settings):
    one = Application("lv", source("r", decoder=reading).key_by("k").to(running).to_sink(DeltaSink("lv_out")))
    two = Application("lv", source("r", decoder=reading).key_by("k").to(running).key_by(lambda m: "all").to(seen)
                      .to_sink(DeltaSink("lv_out")))
    settings = dataclasses.replace(settings, app_registry=registry_of([one]))
    land(settings, "r", [f"a,{i},{i}".encode() for i in range(3)])
    run_application(spark, one, settings)
    before = lake.read(settings.table_path("lv_out")).to_pylist()
    land(settings, "r", [b"a,9,9"])
    with pytest.raises(RuntimeError) as refused:
        run_application(spark, two, settings)
    said = str(refused.value)
    assert said.startswith("query 'lv' stopped: the stateful steps of 'lv' changed since its checkpoint"), said
    assert "now has 2 level(s)" in said and "Application('lv', ..., generation=2)" in said, said
    assert lake.read(settings.table_path("lv_out")).to_pylist() == before  # nothing written by the refused run
    run_application(spark, one, settings)  # the pipeline as it was goes on from its checkpoint
    assert sorted(r["n"] for r in lake.read(settings.table_path("lv_out")).to_pylist()) == [0, 1, 3, 12]


def test_only_spark_refusing_the_checkpoints_operators_is_explained_so():
    plan = _plans(Application("lv", source("r", decoder=reading).key_by("k").to(running).to_sink(DeltaSink("t"))))[0]
    assert explain_checkpoint_error("[STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA] ...", plan).startswith(
        "the stateful steps of 'lv' changed since its checkpoint (checkpoints/lv/v1)")
    assert explain_checkpoint_error("[STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY] ...", plan) is None
