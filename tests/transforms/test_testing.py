"""The testing helper `run_app`: real Spark, real Delta, real TCP, and equal to the engine's own path."""

from __future__ import annotations

import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

from examples.market import MARKET_STATE_TABLE, ORDER_REJECTIONS_TABLE, ORDER_RESULTS_SINK, market_app
from examples.market_decoder import MarketData, encode_market_data, timestamp_10us
from examples.market_generate import order_payloads, read_symbols
from examples.words import word_count
from tests.tcp import Receiver
from transforms import lake
from transforms.api import (
    Application,
    DeltaSink,
    TCPSink,
    computation,
    decoder,
    encoder,
    source,
    state_computation,
)
from transforms.engine import run_application
from transforms.ingestion.framing import DEFAULT_FRAMING, iter_file_messages
from transforms.ingestion.landing import Lander
from transforms.settings import Settings
from transforms.testing import run_app

NBBO = Path(__file__).resolve().parents[2] / "data" / "wallaroo" / "market_spread" / "350-symbols_initial-nbbo-fixish.msg"


# -- (a) the bundled word count --------------------------------------------------------------------------
@pytest.mark.spark
def test_word_count_outputs_tables_and_tcp_lines(spark):
    result = run_app(word_count, {"text": ["Hello world", b"hello, again world!"]}, spark=spark)

    # part: 1000 x the word's place in its line (split) + the output's place among the count's outputs.
    assert result.outputs("word_count_updates") == [
        {"seq": 1, "part": 0, "word": "hello", "count": 1},
        {"seq": 1, "part": 1000, "word": "world", "count": 1},
        {"seq": 2, "part": 0, "word": "hello", "count": 2},
        {"seq": 2, "part": 1000, "word": "again", "count": 1},
        {"seq": 2, "part": 2000, "word": "world", "count": 2},
    ]
    assert result.outputs("word_totals") == [
        {"word": "again", "count": 1, "seq": 2, "part": 1000},
        {"word": "hello", "count": 2, "seq": 2, "part": 0},
        {"word": "world", "count": 2, "seq": 2, "part": 2000},
    ]
    # Unframed on the wire, one message per output here.
    assert result.outputs("word_count_tcp") == [b"hello => 1\n", b"world => 1\n", b"hello => 2\n",
                                                b"again => 1\n", b"world => 2\n"]
    assert result.tcp == {"word_count_tcp": result.outputs("word_count_tcp")}
    assert set(result.tables) == {"word_count_updates", "word_totals"}
    assert result.quarantine == []
    assert result.home is None  # removed after the run


# -- (b) an app of the test's own: a binary decoder, keyed state, a malformed payload ---------------------
READING = ">4sd"  # sensor id, degrees Celsius (a format string: the decoder is pickled to Spark's workers)


@dataclass
class Reading:
    sensor: str
    celsius: float


@decoder
def decode_reading(payload: bytes) -> Reading:
    sensor, celsius = struct.unpack(READING, payload)
    return Reading(sensor.decode("ascii"), celsius)


class Peak:
    def __init__(self) -> None:
        self.celsius = float("-inf")
        self.readings = 0


@state_computation("peak", state=Peak)
def peak(r: Reading, state: Peak) -> dict:
    state.readings += 1
    state.celsius = max(state.celsius, r.celsius)
    return {"sensor": r.sensor, "peak": state.celsius, "readings": state.readings}


@computation("fahrenheit")
def fahrenheit(r: Reading) -> dict:
    return {"sensor": r.sensor, "fahrenheit": r.celsius * 9 / 5 + 32}


@encoder
def encode_peak(p: dict) -> bytes:
    return f"{p['sensor']}={p['peak']}".encode()


temps = Application(
    "temps",
    source("temps", decoder=decode_reading).key_by("sensor").to(peak).to_sink(
        DeltaSink("peaks", mode="upsert", keys=("sensor",)),
        DeltaSink("peak_updates", metadata=("seq",)),
        TCPSink("peak_feed", encode_peak),  # not optional, no address: run_app gives it one
    ).named("peaks"),
    source("temps").to(fahrenheit).to_sink(DeltaSink("fahrenheit")).named("convert"),
)


def reading(sensor: str, celsius: float) -> bytes:
    return struct.pack(READING, sensor.encode(), celsius)


@pytest.mark.spark
def test_own_app_keyed_state_and_quarantine_one_pipeline(spark):
    bad = b"\x00\x01\x02"
    msgs = [reading("s001", 20.5), reading("s002", 18.0), bad, reading("s001", 19.0), reading("s001", 22.25)]
    result = run_app(temps, {"temps": msgs}, spark=spark, pipeline="peaks")

    assert result.outputs("peaks") == [
        {"sensor": "s001", "peak": 22.25, "readings": 3},
        {"sensor": "s002", "peak": 18.0, "readings": 1},
    ]
    assert result.outputs("peak_updates") == [
        {"sensor": "s001", "peak": 20.5, "readings": 1, "seq": 1},
        {"sensor": "s002", "peak": 18.0, "readings": 1, "seq": 2},
        {"sensor": "s001", "peak": 20.5, "readings": 2, "seq": 4},
        {"sensor": "s001", "peak": 22.25, "readings": 3, "seq": 5},
    ]
    assert result.outputs("peak_feed") == [b"s001=20.5", b"s002=18.0", b"s001=20.5", b"s001=22.25"]
    assert "fahrenheit" not in result.tables  # only the chosen pipeline ran
    (q,) = result.quarantine
    assert {k: q[k] for k in ("stream", "seq", "step", "payload")} == {
        "stream": "temps", "seq": 3, "step": "decoder decode_reading", "payload": bad}
    assert q["reason"].startswith(f"error: unpack requires a buffer of {struct.calcsize(READING)} bytes at test_testing.py:")


@pytest.mark.spark
def test_fail_fast_error_propagates_and_keep_leaves_the_home(spark, tmp_path):
    settings = Settings(home=tmp_path / "ignored", fail_fast=True)
    # The engine's error as Spark reports it; run_app adds nothing around it.
    with pytest.raises(StreamingQueryException, match="decoder decode_reading") as info:
        run_app(temps, {"temps": [b"short"]}, settings=settings, spark=spark, pipeline=1)
    assert "EVENTIDE_FAIL_FAST" in str(info.value)
    assert not (tmp_path / "ignored").exists()  # the run used its own home

    result = run_app(temps, [("temps", reading("s009", 0.0))], spark=spark, pipeline="convert", keep=True)
    try:
        assert result.outputs("fahrenheit") == [{"sensor": "s009", "fahrenheit": 32.0}]
        assert lake.read(result.home / "lake" / "fahrenheit").to_pylist() == result.outputs("fahrenheit")
    finally:
        shutil.rmtree(result.home)


# -- errors before any Spark work ---------------------------------------------------------------------------
def test_bad_arguments_say_what_and_where():
    with pytest.raises(ValueError, match=r"reads no stream 'tmps' \(message 0\); it reads: temps"):
        run_app(temps, {"tmps": [b"x"]})
    with pytest.raises(TypeError, match=r"messages\['temps'\] must be a list of payloads, got bytes"):
        run_app(temps, {"temps": b"x"})
    with pytest.raises(TypeError, match="message 1 on 'temps' is a int; payloads are bytes or str"):
        run_app(temps, [("temps", b"x"), ("temps", 5)])
    with pytest.raises(TypeError, match="message 0 is 'temps'; expected a"):
        run_app(temps, ["temps"])
    with pytest.raises(ValueError, match="no pipeline named 'nope'; its pipelines: 0: 'peaks' on 'temps', 1: 'convert'"):
        run_app(temps, {}, pipeline="nope")
    with pytest.raises(ValueError, match="has 2 pipeline"):
        run_app(temps, {}, pipeline=2)


def test_a_plan_error_propagates_unchanged():
    no_sink = Application("no_sink", source("temps", decoder=decode_reading).to(fahrenheit))
    with pytest.raises(ValueError, match="pipeline 0 has no sink"):
        run_app(no_sink, {"temps": [reading("s001", 1.0)]}, spark=object())  # fails before Spark is used


# -- (c) equal to the engine's own path: the bundled market app ----------------------------------------------
def _market_messages() -> list[tuple[str, bytes]]:
    """The 350 initial quotes, then orders (some for never-seen symbols) with two quotes flipping symbols."""
    import datetime as dt

    t = dt.datetime(2016, 9, 2, 16, 0, tzinfo=dt.timezone.utc)
    orders = order_payloads(read_symbols(), 30, seed=7, unknown_share=0.1)
    msgs = [("market_data", p) for p in iter_file_messages(NBBO)]
    msgs += [("orders", p) for p in orders[:15]]
    msgs += [("market_data", encode_market_data(MarketData(s, t, 10.0, 11.0))) for s in read_symbols()[:40]]
    msgs += [("orders", p) for p in orders[15:]]
    return msgs


def _without(rows: list[dict], *cols: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in cols} for r in rows]


def _no_time(payload: bytes) -> bytes:
    return payload[:-8]  # OrderResult ends with the decision time (8 bytes)


@pytest.mark.spark
def test_market_app_equals_the_engine_run_directly(spark, settings):
    msgs = _market_messages()
    with Lander(settings) as lander:
        for stream, payload in msgs:
            lander.append(stream, payload, "test")
    receiver = Receiver()
    run_application(spark, market_app, settings, tcp_addresses={ORDER_RESULTS_SINK: receiver.address})
    engine_tcp = DEFAULT_FRAMING.split(receiver.all_bytes())
    receiver.close()
    engine_state = sorted(lake.read(settings.table_path(MARKET_STATE_TABLE)).to_pylist(), key=lambda r: r["symbol"])
    engine_rejections = sorted(lake.read(settings.table_path(ORDER_REJECTIONS_TABLE)).to_pylist(), key=lambda r: r["seq"])

    result = run_app(market_app, msgs, spark=spark)

    # Landing and decision times differ between the two runs; everything else is the same.
    state = result.outputs(MARKET_STATE_TABLE)
    assert len(state) == 350 and sum(r["reject"] for r in state) > 0
    assert _without(state, "receive_time") == _without(engine_state, "receive_time")
    rejections = result.outputs(ORDER_REJECTIONS_TABLE)
    assert 0 < len(rejections) < 30 and {r["reason"] for r in rejections} >= {"never seen"}
    assert _without(rejections, "receive_time", "decision_time") == _without(
        engine_rejections, "receive_time", "decision_time")
    assert [_no_time(p) for p in result.outputs(ORDER_RESULTS_SINK)] == [_no_time(p) for p in engine_tcp]
    assert len(engine_tcp) == len(rejections)
    # The helper's TCP messages are the encoder's 55-byte payloads, framing stripped, with the table's times.
    assert [p[-8:] for p in result.tcp[ORDER_RESULTS_SINK]] == [
        struct.pack(">Q", timestamp_10us(r["decision_time"])) for r in rejections]
    assert result.quarantine == []
