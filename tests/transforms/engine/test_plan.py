"""Planning without Spark: pipelines the engine cannot run fail here, naming the app; the chosen modes."""

import dataclasses

import pyarrow as pa
import pytest

from transforms.api import (
    Application,
    DeltaSink,
    KeyMark,
    Pipeline,
    computation,
    decoder,
    merge,
    source,
    state_computation,
)
from transforms.engine import run_application
from transforms.engine.plan import KEEP_KEY, QueryMode, TimeMode, plan_queries
from transforms.registry import registry_of
from transforms.settings import Settings

as_value = decoder(lambda p: {"value": int(p), "k": "a"}, schema=pa.schema([("value", pa.int64()), ("k", pa.string())]),
                   name="as_value")


class Total:
    def __init__(self):
        self.n = 0


@state_computation("first", state=Total)
def first(m, total):
    total.n += m["value"]
    return {"n": total.n}


@state_computation("second", state=Total)
def second(m, total):
    return m


@computation("shout")
def shout(m):
    return m


def _settings(tmp_path, app):
    return Settings(home=tmp_path, app_registry=registry_of([app]))


def _merged(*steps):
    m = merge(source("a", as_value).key_by("k"), source("b", as_value).key_by("k"))
    for s in steps:
        m = m.to(s)
    return Application("two_states", m.to_sink(DeltaSink("out")))


def test_two_state_computations_in_a_row_plan_as_two_levels_of_one_query(tmp_path):
    app = _merged(first, second)  # the second keeps the key: the next level (see test_multi_level.py)
    (plan,) = plan_queries(app, _settings(tmp_path, app))
    assert [b.post_steps for b in plan.branches] == [[first], [first]]
    (level,) = plan.levels
    assert [b.post_steps for b in level.branches] == [[second], [second]] and level.branches[0].key_fn is KEEP_KEY


def test_run_application_rejects_what_cannot_run_before_any_spark_work(tmp_path):
    app = _merged(shout, first)
    with pytest.raises(ValueError, match="step 'shout' between key_by and state computation 'first'"):
        run_application(None, app, _settings(tmp_path, app))


def test_a_pipeline_built_by_hand_is_checked_too(tmp_path):
    p = Pipeline("text", as_value, (KeyMark(), shout, first), "k", (DeltaSink("out"),))
    app = Application("by_hand", p)
    with pytest.raises(ValueError, match=r"'by_hand'.*step 'shout' between key_by and state computation 'first'"):
        plan_queries(app, _settings(tmp_path, app))
    before_key = Application("before_key", dataclasses.replace(p, steps=(first,), key_fn=None))
    with pytest.raises(ValueError, match="'before_key'.*state computation 'first' before key_by"):
        plan_queries(before_key, _settings(tmp_path, before_key))
    two = Application("two", dataclasses.replace(p, steps=(KeyMark(), first, shout, second)))
    (plan,) = plan_queries(two, _settings(tmp_path, two))
    assert plan.branches[0].post_steps == [first, shout] and plan.levels[0].branches[0].post_steps == [second]


def test_a_step_between_key_by_and_the_state_computation_fails_at_plan_time(tmp_path):
    app = _merged(shout, first)
    with pytest.raises(ValueError, match="step 'shout' between key_by and state computation 'first'"):
        plan_queries(app, _settings(tmp_path, app))


def test_one_state_computation_then_steps_plans(tmp_path):
    app = _merged(first, shout)
    (plan,) = plan_queries(app, _settings(tmp_path, app))
    assert plan.keyed and plan.mode is QueryMode.ENVELOPE and plan.time_mode is TimeMode.NONE


def test_modes_and_time_modes(tmp_path):
    batch = state_computation("batch", state=Total, batch=True)(lambda df, total: df)
    timed = state_computation("timed", state=Total, on_timer=lambda key, state, at: [])(lambda m, total: m)
    apps = {
        QueryMode.DIRECT: Application("direct", source("a", as_value).to_sink(DeltaSink("o", schema=as_value.schema))),
        QueryMode.COLUMNAR: Application("columnar", source("a", as_value).key_by("k").to(batch).to_sink(DeltaSink("o"))),
        QueryMode.ENVELOPE: Application("envelope", source("a", as_value).key_by("k").to(timed).to_sink(DeltaSink("o"))),
    }
    for mode, app in apps.items():
        (plan,) = plan_queries(app, _settings(tmp_path, app))
        assert plan.mode is mode, app.name
    (timed_plan,) = plan_queries(apps[QueryMode.ENVELOPE], _settings(tmp_path, apps[QueryMode.ENVELOPE]))
    assert timed_plan.time_mode is TimeMode.PROCESSING_TIME and timed_plan.time_mode.value == "ProcessingTime"
    assert timed_plan.timers


def test_a_columnar_query_carries_only_the_fields_its_window_step_reads(tmp_path):
    from transforms.windowing import field_is, trigger_windows
    from windows import Aggregator

    wide = decoder(lambda p: {}, name="wide", schema=pa.schema(
        [("kind", pa.string()), ("day", pa.string()), ("status", pa.int32()), ("path", pa.string()), ("k", pa.string())]))

    def plan_of(aggregator, key="k", **triggers):
        step = trigger_windows(**(triggers or {"is_marker": field_is("kind", "m"), "boundary": "day"})).over(aggregator)
        app = Application("w", source("a", wide).key_by(key).to(step).to_sink(DeltaSink("o")))
        (plan,) = plan_queries(app, _settings(tmp_path, app))
        assert plan.mode is QueryMode.COLUMNAR
        return plan.decoded_schema.names

    fold = {"create": int, "add": lambda a, m: a + 1, "add_frame": lambda a, f: a + len(f)}
    # The window's own fields, the aggregator's columns and the key (a decoded field here); the rest stays behind.
    assert plan_of(Aggregator(**fold, columns=("status",))) == ["kind", "day", "status", "k"]
    assert plan_of(Aggregator(**fold, columns=())) == ["kind", "day", "k"]
    assert plan_of(Aggregator(**fold, columns=()), key="stream") == ["kind", "day"]  # a landing key
    # Undeclared columns, or a trigger that is a function with a frame form of its own: every field.
    everything = ["kind", "day", "status", "path", "k"]
    assert plan_of(Aggregator(**fold)) == everything

    class Marker:
        def __call__(self, m):
            return m["kind"] == "m"

        def frame(self, f):
            return (f["kind"] == "m").to_numpy()

    assert plan_of(Aggregator(**fold, columns=()), is_marker=Marker()) == everything
    with pytest.raises(ValueError, match=r"reads field\(s\) \['bytes'\] that no decoder .* columns="):
        plan_of(Aggregator(**fold, columns=("bytes",)))
