"""Window results carry their bounds, how they closed and final/partial into the Delta tables."""

import dataclasses
import sys

import pyarrow as pa
import pytest

from transforms.api import Context, to_record
from transforms.windowing import count_windows, event_time_windows, trigger_windows
from windows import LateEvent, WindowResult, counting, late_event_schema, window_result_schema


def test_the_schema_names_every_field_of_a_window_result():
    assert window_result_schema(pa.int64()).names == [f.name for f in dataclasses.fields(WindowResult)]



def test_the_late_event_schema_names_every_field_but_the_message():
    assert late_event_schema().names == [f.name for f in dataclasses.fields(LateEvent) if f.name != "message"]

def test_every_kind_s_results_fit_the_schema_with_their_bounds():
    def results(step, msgs):
        step, state = step.one_message(), step.state()
        return [o for seq, m in enumerate(msgs, 1) for o in step.apply(m, state, Context("k", seq=seq))]

    rows = [*results(trigger_windows(boundary="day").over(counting()), [{"day": "d1"}, {"day": "d2"}]),
            *results(count_windows(2).over(counting()), [{}, {}]),
            *results(event_time_windows(10, event_time="t").over(counting()), [{"t": 1}, {"t": 12}])]
    table = pa.Table.from_pylist([to_record(w) for w in rows], schema=window_result_schema(pa.int64()))
    assert table.drop_columns(["value", "size", "key"]).to_pylist() == [
        {"window_id": "k/1-1", "close_reason": "day_change", "first_seq": 1, "last_seq": 1, "boundary": "d1",
         "start_ms": None, "end_ms": None, "final": True},
        {"window_id": "k/1-2", "close_reason": "count", "first_seq": 1, "last_seq": 2, "boundary": None,
         "start_ms": None, "end_ms": None, "final": True},
        {"window_id": "k/0-10", "close_reason": "watermark", "first_seq": 1, "last_seq": 1, "boundary": None,
         "start_ms": 0, "end_ms": 10, "final": True},
    ]


# -- through Spark: the default emit (no .emit) into Delta tables ------------------------------------
def default_emit_app():
    from transforms.api import Application, DeltaSink, decoder, source

    @decoder
    def reading(payload: bytes) -> dict:  # b"sensor,ms"
        sensor, ms = payload.decode().split(",")
        return {"sensor": sensor, "ms": int(ms)}

    return Application("window_results", source("readings", decoder=reading).key_by("sensor")
                       .to(event_time_windows(10, event_time="ms").over(counting()))
                       .to_sink(DeltaSink("windows_inferred"),
                                DeltaSink("windows_typed", schema=window_result_schema(pa.int64()))))


@pytest.mark.spark
def test_the_default_emit_writes_every_field(spark):
    from pyspark import cloudpickle

    from transforms.testing import run_app

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    result = run_app(default_emit_app(), {"readings": ["s,1", "s,4", "s,13", "s,25"]}, spark=spark)
    full = [{"key": "s", "window_id": "s/0-10", "close_reason": "watermark", "value": 2, "first_seq": 1,
             "last_seq": 2, "size": 2, "boundary": None, "start_ms": 0, "end_ms": 10, "final": True},
            {"key": "s", "window_id": "s/10-20", "close_reason": "watermark", "value": 1, "first_seq": 3,
             "last_seq": 3, "size": 1, "boundary": None, "start_ms": 10, "end_ms": 20, "final": True}]
    assert result.outputs("windows_typed") == full
    # Inferred: a column None in every row so far (boundary) is not in the table yet; the rest are.
    assert [{k: v for k, v in r.items() if k not in ("seq", "part")} for r in result.outputs("windows_inferred")] == [
        {k: v for k, v in r.items() if k != "boundary"} for r in full]
