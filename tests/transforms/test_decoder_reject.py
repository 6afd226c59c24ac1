"""A decoder refuses a payload for its content by returning `Reject(reason)` (or, in a column form, a
reason in `_error`): the engine quarantines it with the reason word for word, in every decode path."""

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from transforms.api import Application, DeltaSink, Reject, UserFunctionError, computation, decoder, source
from transforms.engine.plan import DIRECT_UNUSED, QueryMode, plan_queries
from transforms.engine.stages import make_pre_stage
from transforms.ingestion.landing import LANDING_SCHEMA
from transforms.settings import Settings

SCHEMA = pa.schema([("celsius", pa.float64())])


@dataclass
class Reading:
    celsius: float


def _why_not(celsius: float) -> str | None:
    return f"expected a temperature >= -273.15, got {celsius!r}" if celsius < -273.15 else None


@decoder(schema=SCHEMA)
def reading(payload: bytes) -> Reading | Reject:
    celsius = float(payload)  # not a number: raises, and the error is the reason
    why = _why_not(celsius)
    return Reject(why) if why else Reading(celsius)


@decoder(schema=SCHEMA)
def reading_with_columns(payload: bytes) -> Reading | Reject:
    return reading.fn(payload)


@reading_with_columns.column_form
def reading_columns(payloads: pa.Array) -> pa.Table:
    celsius = pc.cast(pc.cast(payloads, pa.string()), pa.float64())
    errors = [_why_not(c) for c in celsius.to_pylist()]
    bad = pa.array([e is not None for e in errors])
    return pa.table({"celsius": pc.if_else(bad, pa.scalar(None, pa.float64()), celsius), "_error": pa.array(errors, pa.string())})


@computation("warmer")
def warmer(r: Reading) -> Reading:
    return Reading(r.celsius + 1)


def _batch(*payloads: bytes) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"stream": "text", "seq": i, "receive_time": None, "connection": "c", "payload": p, "landing_error": None}
         for i, p in enumerate(payloads, 1)],
        schema=LANDING_SCHEMA,
    )


def _stage(app: Application, mode: QueryMode, batch: pa.RecordBatch, fail_fast: bool = False) -> list[dict]:
    (plan,) = plan_queries(app, Settings())
    assert plan.mode is mode
    (out,) = list(make_pre_stage(plan, fail_fast)(iter([batch])))
    return sorted(out.to_pylist(), key=lambda r: r["seq"])


# On the registered stream `text` (plans take its landing group from the registry), with the test's decoders.
APPS = {
    "envelope (one payload at a time)": (Application("t", source("text", decoder=reading).to(warmer).to_sink(DeltaSink("t"))),
                                         QueryMode.ENVELOPE),
    "direct, no column form": (Application("t", source("text", decoder=reading).to_sink(DeltaSink("t", schema=SCHEMA))),
                               QueryMode.DIRECT),
    "direct, column form's _error": (Application("t", source("text", decoder=reading_with_columns)
                                                 .to_sink(DeltaSink("t", schema=SCHEMA))), QueryMode.DIRECT),
}


@pytest.mark.parametrize("which", list(APPS))
def test_a_rejected_payload_is_quarantined_with_its_reason_word_for_word(which):
    app, mode = APPS[which]
    rows = _stage(app, mode, _batch(b"21.5", b"-300", b"4"))
    assert [r["kind"] for r in rows] == ["out", "quarantine", "out"]
    bad = rows[1]
    assert bad["reason"] == "expected a temperature >= -273.15, got -300.0"
    assert bad["step"] == f"decoder {app.pipelines[0].decoder.name}" and bad["payload"] == b"-300"


@pytest.mark.parametrize("payloads", [[b"21.5", b"4.0", b"18.0"], [b"21.5", b"-300.0", b"4.0", b"-400.0"]])
def test_the_decoded_rows_do_not_carry_the_good_payloads_back(payloads):
    # Only quarantined rows keep their payload: the good ones' bytes would only travel back to the JVM
    # (a third of bronze's rows in bytes); if_else keeps every value's bytes behind its nulls.
    (plan,) = plan_queries(APPS["direct, column form's _error"][0], Settings())
    payloads = [p + b"0" * 1000 for p in payloads]  # long payloads: their bytes would show
    (out,) = list(make_pre_stage(plan, False)(iter([_batch(*payloads)])))
    payload = out.column("payload")
    kept = [p if p.startswith(b"-") else None for p in payloads]
    assert payload.to_pylist() == kept
    assert payload.buffers()[2] is None or payload.buffers()[2].size <= sum(len(p) for p in kept if p) + 64  # padding
    # Nor the columns only a keyed step reads: null in every row of a direct plan.
    assert not set(DIRECT_UNUSED) & set(out.schema.names) and out.schema == plan.stage_schema


def test_raising_still_quarantines_with_the_error_and_where():
    app, mode = APPS["direct, no column form"]
    (row,) = _stage(app, mode, _batch(b"warm"))
    assert row["kind"] == "quarantine" and row["reason"].startswith("ValueError: could not convert string to float")
    assert "test_decoder_reject.py:" in row["reason"]


@pytest.mark.parametrize("which", ["envelope (one payload at a time)", "direct, no column form"])
def test_fail_fast_stops_on_a_rejection_and_says_why(which):
    app, mode = APPS[which]
    with pytest.raises(RuntimeError, match=r"EVENTIDE_FAIL_FAST is on.*got -300\.0"):
        _stage(app, mode, _batch(b"1", b"-300"), fail_fast=True)


def test_a_reject_needs_a_reason():
    for bad in ("", None, 3):
        with pytest.raises(UserFunctionError, match="non-empty str"):
            Reject(bad)
