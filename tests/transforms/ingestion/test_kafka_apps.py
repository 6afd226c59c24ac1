"""Kafka as the log under the other apps and paths: the market app's two streams in one topic, and
quarantine replay through the log. A real broker (`eventide kafka`), real Spark, no mocks."""

from __future__ import annotations

import dataclasses

import pytest

from tests.tcp import Receiver
from tests.transforms.ingestion.conftest import kafka_settings as _kafka
from transforms import lake
from transforms.engine import run_application
from transforms.ingestion import open_log
from transforms.settings import Settings

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def test_quarantine_replay_lands_in_kafka_once(spark, broker, tmp_path, monkeypatch):
    """Replay writes through the log too: the replayed payload lands in the topic once, even when the
    record of the replay is lost and it runs again (the topic's `replay:` connections are the record)."""
    import shutil
    import textwrap

    import pyarrow as pa

    from tests.orchestration.test_deadletter import GAUGES, V1
    from transforms.deadletter import REPLAYS_TABLE, dead_letters, replay
    from transforms.engine.sinks import QUARANTINE_SCHEMA

    (tmp_path / "dl_gauges.py").write_text(textwrap.dedent(GAUGES.format(check=V1)))
    monkeypatch.syspath_prepend(str(tmp_path))
    kafka = _kafka(Settings(home=tmp_path / "home", apps="dl_gauges:app"), broker, monkeypatch)
    log = open_log(kafka)
    with log.writer() as writer:
        writer.append("dl_gauges", b"b,+7", "test")
    row = {"query": "dl_gauges", "stream": "dl_gauges", "seq": 1, "receive_time": None, "connection": "test",
           "step": "decoder decode_gauge", "reason": "gauge v1: expected digits, got '+7'", "payload": b"b,+7",
           "batch_id": 0}
    lake.append_once(spark.createDataFrame(pa.Table.from_pylist([row], schema=QUARANTINE_SCHEMA)),
                     kafka.table_path("quarantine"), "t", 0)

    first = replay(kafka)
    assert (first.landed, first.recorded) == ({("dl_gauges", 1): 2}, 1)
    shutil.rmtree(kafka.table_path(REPLAYS_TABLE))  # the record lost: a crash between landing and recording
    second = replay(kafka)
    assert (second.landed, second.already_landed, second.recorded) == ({}, 1, 1)
    assert log.read("dl_gauges").column("connection").to_pylist() == ["test", "replay:1"]
    assert log.payloads_for("dl_gauges", [2, 1]) == {1: b"b,+7", 2: b"b,+7"}
    assert dead_letters(kafka).num_rows == 0


def test_market_over_kafka_one_topic_for_two_streams_same_tables(spark, settings, broker, monkeypatch, tmp_path):
    """market_data and orders share state, so one order: one topic (`market_data_orders`) holds both, each
    message's stream in a header; the market app's tables equal those over the landing log."""
    from examples.market import ORDER_RESULTS_SINK
    from examples.market import app as market_app
    from tests.transforms.test_market_app import NBBO, market_state, rejections, second_segment, without
    from transforms.ingestion.framing import iter_file_messages

    messages = [("market_data", p) for p in iter_file_messages(NBBO)] + second_segment()
    results = {}
    for name, home_settings in (("landing", dataclasses.replace(settings, home=tmp_path / "landing-home", log="")),
                                ("kafka", _kafka(dataclasses.replace(settings, home=tmp_path / "kafka-home"),
                                                 broker, monkeypatch))):
        with open_log(home_settings).writer() as writer:
            for stream, payload in messages:
                writer.append(stream, payload, "test")
        receiver = Receiver()
        try:
            run_application(spark, market_app, home_settings, tcp_addresses={ORDER_RESULTS_SINK: receiver.address})
            answers = receiver.all_bytes()
        finally:
            receiver.close()
        # the same rows but for the times of receipt and decision (Kafka keeps milliseconds; later runs)
        results[name] = (without(market_state(home_settings), "receive_time"),
                         without(rejections(home_settings), "receive_time", "decision_time"), len(answers))
    log = open_log(home_settings)
    assert log.topic("market_data+orders").endswith("market_data_orders")
    assert log.watermarks(log.topic("market_data+orders"))[1] == len(messages)
    assert len(results["kafka"][0]) == 351 and len(results["kafka"][1]) > 15
    assert results["kafka"] == results["landing"]
