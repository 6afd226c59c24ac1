"""Kafka as the log (EVENTIDE_LOG=kafka://...): a real broker (`eventide kafka`), real Spark, no mocks.

One broker for the module (conftest.py); each test writes its own topics (a prefix of its own)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pyarrow.compute as pc
import pytest

from examples.words import word_count
from orchestration.cli import main
from orchestration.status import compute_status, format_status
from tests.conftest import DATA
from tests.tcp import Receiver
from tests.transforms.ingestion.conftest import kafka_settings as _kafka
from transforms import lake
from transforms.engine import nothing_new, plan_queries, run_application
from transforms.ingestion import open_log
from transforms.ingestion.gateway import GatewayThread
from transforms.ingestion.kafka_log import KafkaLog, topic_name
from transforms.ingestion.log import LogUnavailable
from transforms.ingestion.sender import ingest_files, send_files
from transforms.ports import free_port
from transforms.settings import ConfigError, Settings
from transforms.streams import bronze_application

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

WORDS = DATA / "word_count" / "count_this.txt"
N = len(WORDS.read_bytes().splitlines())  # its lines: one message each


def _run_words(spark, settings: Settings, batches: dict | None = None) -> dict:
    """The word totals after a run of bronze and word count; `batches`, if given, gets each query's."""
    receiver = Receiver()
    try:
        reports = [*run_application(spark, bronze_application(settings.registry.streams["text"]), settings),
                   *run_application(spark, word_count, settings,
                                    tcp_addresses={"word_count_tcp": f"127.0.0.1:{receiver.port}"})]
    finally:
        receiver.close()
    if batches is not None:
        batches.update({r.query: r.batches for r in reports})
    totals = lake.read(settings.table_path("word_totals")).to_pylist()
    return {r["word"]: r["count"] for r in totals}


def test_topic_names_are_what_kafka_accepts():
    assert topic_name("logs") == "logs"
    assert topic_name("market_data+orders") == "market_data_orders"
    assert topic_name("text", "home1.") == "home1.text"
    assert len(topic_name("x" * 300)) == 249
    with pytest.raises(ConfigError, match="kafka://HOST:PORT"):
        Settings(log="kafka://nowhere")
    with pytest.raises(ConfigError, match="EVENTIDE_LOG"):
        Settings(log="files")


def test_ingest_into_kafka_then_run_gives_the_landing_logs_tables(spark, settings, broker, monkeypatch, tmp_path):
    landing = dataclasses.replace(settings, home=tmp_path / "landing-home", log="")
    assert ingest_files(landing, "text", [WORDS], end_of_day=True) == N + 1
    expected = _run_words(spark, landing)

    # Word count's messages travel as Python objects: a backlog is read max_messages_per_trigger at a
    # time from Kafka too (maxOffsetsPerTrigger), bronze's (columns) in one batch.
    kafka = dataclasses.replace(_kafka(settings, broker, monkeypatch), max_messages_per_trigger=10)
    assert main(["ingest", "text", str(WORDS), "--end-of-day"]) == 0
    assert not kafka.landing.exists()  # nothing under the home's landing folder
    log = open_log(kafka)
    assert isinstance(log, KafkaLog) and log.watermarks(log.topic("text")) == (0, N + 1)
    plans = plan_queries(word_count, kafka)
    assert not any(nothing_new(p, kafka) for p in plans)

    batches = {}
    assert _run_words(spark, kafka, batches) == expected
    assert batches == {"bronze_text": 1, "word_count": -(-(N + 1) // 10)}, batches
    bronze = lake.read(kafka.table_path("bronze_text"))
    assert bronze.num_rows == lake.read(landing.table_path("bronze_text")).num_rows == N + 1
    assert sorted(bronze.column("seq").to_pylist()) == list(range(1, N + 2))  # the offsets + 1, each once
    assert all(nothing_new(p, kafka) for p in plans)  # files and offsets only: nothing left to do

    # a second ingest and run: only the new messages, once, as over the landing log
    ingest_files(landing, "text", [WORDS])
    ingest_files(kafka, "text", [WORDS])
    assert _run_words(spark, kafka) == _run_words(spark, landing)
    assert lake.read(kafka.table_path("bronze_text")).num_rows == 2 * N + 1


def test_two_gateways_into_one_kafka_log_then_every_message_once(spark, settings, broker, monkeypatch, tmp_path):
    kafka = _kafka(settings, broker, monkeypatch)
    free = {s: 0 for s in kafka.registry.streams}
    one = dataclasses.replace(kafka, ports=free)
    other = dataclasses.replace(kafka, home=tmp_path / "other-gateway", ports=free)
    sent: list[int] = []
    with GatewayThread(one) as a, GatewayThread(other) as b:
        ports = [a.bound_ports["text"], b.bound_ports["text"]]
        senders = [threading.Thread(target=lambda p=p: sent.append(send_files("text", [WORDS] * 20, "127.0.0.1", p)))
                   for p in ports for _ in range(2)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(120)
    assert sent == [20 * N] * 4  # every sender got its confirmation: Kafka acknowledged all of it
    run_application(spark, bronze_application(kafka.registry.streams["text"]), kafka)
    bronze = lake.read(kafka.table_path("bronze_text"))
    assert bronze.num_rows == 4 * 20 * N
    assert sorted(bronze.column("seq").to_pylist()) == list(range(1, 4 * 20 * N + 1))
    per_connection = pc.value_counts(bronze.column("connection")).to_pylist()
    assert len(per_connection) == 4 and {c["counts"] for c in per_connection} == {20 * N}
    run_application(spark, bronze_application(kafka.registry.streams["text"]), kafka)  # nothing again
    assert lake.read(kafka.table_path("bronze_text")).num_rows == 4 * 20 * N


def test_status_shows_the_topics_end_offsets_and_each_querys_lag(spark, settings, broker, monkeypatch):
    kafka = _kafka(settings, broker, monkeypatch)
    ingest_files(kafka, "text", [WORDS])
    before = time.time()
    status = compute_status(kafka)
    (text,) = [g for g in status.logs if g.log == "text"]
    assert (text.kind, text.topic, text.end_offset, text.messages) == ("kafka", open_log(kafka).topic("text"), N, N)
    lags = {q.query: (q.lag_messages, q.processed_offset) for q in status.queries if q.log == "text"}
    assert lags == {"bronze_text": (N, None), "word_count": (N, None)}
    assert all(q.lag_seconds >= 0 and q.oldest_unprocessed for q in status.queries if q.log == "text")

    run_application(spark, bronze_application(kafka.registry.streams["text"]), kafka)
    status = compute_status(kafka, now=before + 5)
    lags = {q.query: (q.lag_messages, q.processed_offset, q.processed_last_seq)
            for q in status.queries if q.log == "text"}
    assert lags == {"bronze_text": (0, N, N), "word_count": (N, None, None)}
    table = format_status(status, settings=kafka)
    assert "END OFFSET" in table and open_log(kafka).topic("text") in table


def test_a_broker_that_is_not_there_is_a_clear_error(settings, monkeypatch, capsys):
    port = free_port()
    monkeypatch.setenv("EVENTIDE_LOG", f"kafka://127.0.0.1:{port}")
    # Each command waits for the broker this long before saying so (5 s; 1 s here, five commands).
    monkeypatch.setattr("transforms.ingestion.kafka_log.CHECK_TIMEOUT_SECONDS", 1.0)
    started = time.monotonic()
    for argv in (["ingest", "text", str(WORDS)], ["run"], ["serve"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"no Kafka broker answers at 127.0.0.1:{port}" in err, err
        assert f"eventide kafka --port {port} --dir DIR" in err and "unset EVENTIDE_LOG" in err
    assert time.monotonic() - started < 30  # a short timeout each, not a hang
    with pytest.raises(LogUnavailable):
        open_log(Settings(home=settings.home, log=f"kafka://127.0.0.1:{port}")).check()
    assert main(["status"]) == 0  # status still answers, saying what it could not read
    out = capsys.readouterr().out
    assert f"no Kafka broker answers at 127.0.0.1:{port}" in out and "bronze_text" in out



def test_the_pipelines_sensor_follows_the_kafka_log(settings, broker, monkeypatch):
    """new_segments_sensor asks the log, whatever its kind: over Kafka a grown topic starts the
    pipelines once, then the cursor (the end offset) holds until the topic grows again."""
    import dagster as dg

    from orchestration.definitions import build_definitions

    kafka = _kafka(settings, broker, monkeypatch)
    defs = build_definitions(kafka.registry)
    sensor = defs.resolve_sensor_def("new_segments_sensor")
    resources = {"eventide": defs.resources["eventide"]}
    with dg.build_sensor_context(resources=resources) as ctx:
        assert isinstance(sensor(ctx), dg.SkipReason)
    ingest_files(kafka, "text", [WORDS])
    with dg.build_sensor_context(resources=resources) as ctx:
        req = sensor(ctx)
        cursor = ctx.cursor
    assert isinstance(req, dg.RunRequest) and req.tags["eventide/new_segments"] == "text"
    assert json.loads(cursor) == {"text": str(N)}
    with dg.build_sensor_context(resources=resources, cursor=cursor) as ctx:
        assert isinstance(sensor(ctx), dg.SkipReason)
    ingest_files(kafka, "text", [WORDS])
    with dg.build_sensor_context(resources=resources, cursor=cursor) as ctx:
        assert isinstance(sensor(ctx), dg.RunRequest)
