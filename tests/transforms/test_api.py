"""The application API and the engine's per-key logic, without Spark."""

import pickle
from collections import namedtuple
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
import pytest

from transforms.api import (
    DeltaSink,
    UserFunctionError,
    computation,
    computation_multi,
    merge,
    normalize_outputs,
    source,
    state_computation,
    to_record,
)
from transforms.engine.keyed_state import _run_key
from transforms.engine.plan import plan_queries
from transforms.engine.stages import make_pre_stage
from transforms.settings import Settings


@computation("double")
def double(x):
    return x * 2


@computation("drop odd")
def drop_odd(x):
    return x if x % 2 == 0 else None


@computation_multi("explode")
def explode(x):
    return [x, x]


@computation_multi("bad multi")
def bad_multi(x):
    return "not a list"


class Total:
    def __init__(self):
        self.n = 0


@state_computation("add", state=Total)
def add(x, total):
    total.n += x
    return total.n


def add_frame(df, total):
    out = []
    for _seq, x in zip(df["_seq"], df["value"]):
        total.n += x
        out.append({"value": total.n, "_seq": _seq})
    return pd.DataFrame(out)


add_batch = state_computation("add batch", state=Total, batch=True)(add_frame)


@state_computation("old style", state=Total)
def old_style(x, total):
    total.n += 1
    return (x, True)


def test_computations_return_lists():
    assert double.apply(3) == [6]
    assert drop_odd.apply(3) == []
    assert explode.apply(1) == [1, 1]
    with pytest.raises(UserFunctionError, match="bad multi.*returned str"):
        bad_multi.apply(1)


def test_wallaroo_tuple_form_and_none():
    assert old_style.apply(5, Total()) == [5]
    assert normalize_outputs("x", None) == []
    assert normalize_outputs("x", [1, None, 2]) == [1, 2]


def test_state_computation_must_take_message_and_state():
    with pytest.raises(TypeError, match="must take \\(message, state\\)"):
        state_computation("bad", state=Total)(lambda x: x)


def test_to_record():
    @dataclass
    class A:
        x: int

    N = namedtuple("N", "y")
    assert to_record(A(1)) == {"x": 1}
    assert to_record(N(2)) == {"y": 2}
    assert to_record({"z": 3}) == {"z": 3}
    assert to_record(4) == {"value": 4}


def test_pipeline_builder_rules():
    with pytest.raises(ValueError, match="key_by"):
        source("text").to(add)
    with pytest.raises(ValueError, match="must be keyed"):
        merge(source("market_data").key_by(str), source("orders"))
    p = source("text").to(double).key_by(str).to(add).to(double)
    assert p.pre_steps == [double]
    assert p.post_steps == [add, double]


def test_merged_streams_must_share_a_sequence_group():
    from transforms.api import Application, DeltaSink

    app = Application("x", merge(source("text").key_by(str).to(add), source("logs").key_by(str).to(add)).to_sink(DeltaSink("t")))
    with pytest.raises(ValueError, match="different sequence groups"):
        plan_queries(app, Settings())


def _envelopes(seqs, values, branch=0):
    return pd.DataFrame(
        {
            "kind": "msg",
            "seq": seqs,
            "part": 0,
            "branch": branch,
            "key": "k",
            "msg": [pickle.dumps(v) for v in values],
            "stream": "text",
            "receive_time": pd.Timestamp("2024-01-01", tz="UTC"),
            "connection": "c",
            "step": None,
            "reason": None,
            "payload": None,
        }
    )


def _outs(frame):
    return [pickle.loads(m) for m in frame.sort_values(["seq", "part"])["msg"]]


def test_a_keys_messages_apply_in_sequence_order_whatever_the_input_order():
    branches = (source("text").key_by(str).to(add),)
    seqs = [5, 1, 4, 2, 3]
    df = _envelopes(seqs, [s * 10 for s in seqs]).sort_values(["seq", "part"]).reset_index(drop=True)
    states = {}
    out = _run_key(df, states, branches, fail_fast=False)
    assert list(out["seq"]) == [1, 2, 3, 4, 5]
    assert _outs(out) == [10, 30, 60, 100, 150]  # running totals in sequence order
    assert next(iter(states.values())).n == 150


def test_batch_form_equals_one_message_form():
    seqs = list(range(1, 8))
    values = [3, 1, 4, 1, 5, 9, 2]
    one = _run_key(_envelopes(seqs, values), {}, (source("text").key_by(str).to(add),), False)
    batch_branch = (source("text").key_by(str).to(add_batch),)
    batch = _run_key(_envelopes(seqs, [{"value": v} for v in values]), {}, batch_branch, False)
    assert _outs(one) == [r["value"] for r in _outs(batch)]
    assert list(one["seq"]) == list(batch["seq"])


def test_a_raising_state_computation_quarantines_only_that_message():
    @state_computation("fragile", state=Total)
    def fragile(x, total):
        if x == 2:
            raise ZeroDivisionError("boom")
        total.n += x
        return total.n

    out = _run_key(_envelopes([1, 2, 3], [1, 2, 3]), {}, (source("text").key_by(str).to(fragile),), False)
    assert list(out["kind"]) == ["out", "quarantine", "out"]
    q = out[out.kind == "quarantine"].iloc[0]
    assert q.step == "fragile" and "ZeroDivisionError: boom" in q.reason
    with pytest.raises(RuntimeError, match="fragile.*EVENTIDE_FAIL_FAST"):
        _run_key(_envelopes([1, 2, 3], [1, 2, 3]), {}, (source("text").key_by(str).to(fragile),), True)


def test_pre_stage_quarantines_undecodable_payloads_and_landing_errors():
    import pyarrow as pa

    from transforms.api import Application, DeltaSink
    from transforms.ingestion.landing import LANDING_SCHEMA

    shout = computation("shout")(lambda line: line.text.upper())
    app = Application("t", source("text").to(shout).to_sink(DeltaSink("t")), quarantine_landing_errors=True)
    (plan,) = plan_queries(app, Settings())
    batch = pa.RecordBatch.from_pylist(
        [
            {"stream": "text", "seq": 1, "receive_time": None, "connection": "c", "payload": b"ab", "landing_error": None},
            {"stream": "text", "seq": 2, "receive_time": None, "connection": "c", "payload": b"\xff", "landing_error": None},
            {"stream": "text", "seq": 3, "receive_time": None, "connection": "c", "payload": b"x", "landing_error": "partial frame"},
        ],
        schema=LANDING_SCHEMA,
    )
    (out,) = list(make_pre_stage(plan, fail_fast=False)(iter([batch])))
    rows = sorted(out.to_pylist(), key=lambda r: r["seq"])
    assert [r["kind"] for r in rows] == ["out", "quarantine", "quarantine"]
    assert pickle.loads(rows[0]["msg"]) == "AB"
    assert rows[1]["step"] == "decoder decode_text" and "UnicodeDecodeError" in rows[1]["reason"]
    assert rows[2]["step"] == "gateway" and rows[2]["reason"] == "partial frame" and rows[2]["payload"] == b"x"


@computation("double, vectorized", batch=True)
def double_frame(frame):
    frame["value"] = frame["value"] * 2
    return frame[frame["value"] % 4 == 0]  # and drop some rows: the rest keep their `_row`


@computation("loses _row", batch=True)
def loses_row(frame):
    return frame[["value"]]


def _value_plan(*steps):
    from transforms.api import Application, DeltaSink, decoder

    as_value = decoder(lambda p: {"value": int(p)}, schema=None, name="as_value")
    pipeline = source("text", decoder=as_value)
    for step in steps:
        pipeline = pipeline.to(step)
    (plan,) = plan_queries(Application("v", pipeline.to_sink(DeltaSink("v"))), Settings())
    return plan


def _landing_batch(payloads):
    import pyarrow as pa

    from transforms.ingestion.landing import LANDING_SCHEMA

    return pa.RecordBatch.from_pylist(
        [{"stream": "text", "seq": i + 1, "receive_time": None, "connection": "c", "payload": p, "landing_error": None}
         for i, p in enumerate(payloads)], schema=LANDING_SCHEMA)


def test_batch_computation_sees_the_whole_batch_and_equals_the_one_message_form():
    one_message = computation("double")(lambda m: {"value": m["value"] * 2} if m["value"] * 2 % 4 == 0 else None)
    payloads = [b"1", b"2", b"3", b"4", b"x"]
    results = []
    for step in (double_frame, one_message):
        (out,) = list(make_pre_stage(_value_plan(step), fail_fast=False)(iter([_landing_batch(payloads)])))
        rows = sorted(out.to_pylist(), key=lambda r: r["seq"])
        results.append([(r["seq"], r["kind"], pickle.loads(r["msg"]) if r["msg"] else r["step"]) for r in rows])
    assert results[0] == results[1]
    assert results[0] == [(2, "out", {"value": 4}), (4, "out", {"value": 8}), (5, "quarantine", "decoder as_value")]


def test_a_batch_computation_that_drops_the_row_column_is_quarantined_with_a_clear_reason():
    (out,) = list(make_pre_stage(_value_plan(loses_row), fail_fast=False)(iter([_landing_batch([b"1", b"2"])])))
    rows = out.to_pylist()
    assert [r["kind"] for r in rows] == ["quarantine", "quarantine"]
    assert "must keep the `_row` column" in rows[0]["reason"]


def test_decorated_functions_of_an_importable_module_pickle_by_name(tmp_path, monkeypatch):
    """Spark's workers import the app's module; copying the function by value would also copy its
    globals, and a `struct.Struct` global cannot be copied (a user's app failed that way)."""
    import pickle
    import sys
    import textwrap

    from pyspark import cloudpickle

    (tmp_path / "binary_app.py").write_text(textwrap.dedent('''
        import struct
        import pyarrow as pa
        from transforms.api import computation, decoder

        READING = struct.Struct(">d")

        @decoder(schema=pa.schema([("x", pa.float64())]))
        def decode(payload):
            return {"x": READING.unpack(payload)[0]}

        @computation("double")
        def double(m):
            return {"x": m["x"] * READING.size}
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    import binary_app

    for fn in (binary_app.decode, binary_app.double):
        assert pickle.loads(cloudpickle.dumps(fn)) is fn
    sys.modules.pop("binary_app", None)


def test_a_delta_sinks_stats_columns_become_its_table_property_and_are_checked():
    schema = pa.schema([("day", pa.date32()), ("path", pa.string()), ("odd name", pa.int64())])
    sink = DeltaSink("t", schema=schema, metadata=("seq",), stats_columns=["day", "seq", "odd name"])
    assert sink.table_properties == {"delta.dataSkippingStatsColumns": "day,seq,`odd name`"}
    assert DeltaSink("t").table_properties == {}  # Delta's default: the first 32 columns
    with pytest.raises(ValueError, match=r"stats_columns \['nope'\] are not columns"):
        DeltaSink("t", schema=schema, stats_columns=["nope"])
    with pytest.raises(TypeError, match="list of column names"):
        DeltaSink("t", schema=schema, stats_columns="day")
