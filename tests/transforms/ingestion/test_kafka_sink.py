"""Kafka as a sink (issue K, item 3): a batch is one Kafka transaction with a record of its batch id, so a
read_committed consumer sees every record once: a batch committed before is skipped, a writer killed in the
middle of a transaction is fenced and its records aborted. A real broker (`eventide kafka`), real Spark;
no mocks. The kill -9 of `eventide serve` is in test_kafka_sink_serve.py."""

from __future__ import annotations

import uuid

import pytest

from transforms.engine.kafka_sink import KafkaSinkError, TransactionalSink, parse_kafka_address
from transforms.engine.sinks import resolve_tcp_sinks
from transforms.ports import free_port
from transforms.settings import ConfigError
from transforms.testing import committed_records

pytestmark = pytest.mark.timeout(300)


def _sink(broker, topic: str, txn: str) -> TransactionalSink:
    return TransactionalSink(broker.bootstrap_servers, topic, txn, where=f"test sink to {topic}", switch_off="off")


def test_a_batch_committed_before_is_skipped_and_a_zombie_is_fenced(broker):
    topic, txn = f"out-{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:6]}"
    first = _sink(broker, topic, txn)
    first.start()
    assert not first.committed(0)
    first.commit(0, [(b"a", None), (b"b", b"k")])
    first.close()

    # A new writer of the same sink (the next run, or serve after a crash) knows batch 0 is in Kafka.
    second = _sink(broker, topic, txn)
    second.start()
    assert second.committed(0) and not second.committed(1)
    # It writes batch 1 half way and is killed (its producer never commits nor aborts).
    second.producer.begin_transaction()
    second.producer.produce(topic, value=b"lost")
    second.producer.flush(10)
    assert (None, b"lost") in committed_records(broker.bootstrap_servers, topic, "read_uncommitted")

    third = _sink(broker, topic, txn)  # fences the zombie: Kafka aborts its open transaction
    third.start()
    assert third.committed(0) and not third.committed(1)
    third.commit(1, [(b"c", None)])
    third.close()
    assert committed_records(broker.bootstrap_servers, topic) == [(None, b"a"), (b"k", b"b"), (None, b"c")]


def test_an_unreachable_broker_names_the_sink_the_address_and_what_to_do(monkeypatch):
    from transforms.engine import kafka_sink
    from transforms.ingestion import kafka_log

    monkeypatch.setattr(kafka_log, "CHECK_TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(kafka_sink, "START_TIMEOUT_SECONDS", 2.0)
    port = free_port()  # nothing listens there
    sink = TransactionalSink(f"127.0.0.1:{port}", "out", "t-away", where=f"Kafka sink 'answers' (q) to topic 'out' at 127.0.0.1:{port}",
                             switch_off="EVENTIDE_SINK_ANSWERS=off")
    with pytest.raises(KafkaSinkError) as e:
        sink.commit(0, [(b"x", None)])
    text = str(e.value)
    assert f"Kafka sink 'answers' (q) to topic 'out' at 127.0.0.1:{port}" in text
    assert f"eventide kafka --port {port}" in text and "EVENTIDE_SINK_ANSWERS=off" in text and "processed again" in text


def test_sink_addresses_kafka_urls_and_their_errors():
    from examples.market import ORDER_RESULTS_SINK, encode_rejection
    from transforms.api import KafkaSink, TCPSink

    tcp = TCPSink(ORDER_RESULTS_SINK, encode_rejection, framed=True, optional=True)
    kafka = KafkaSink("answers", encode_rejection, topic="answers", bootstrap="127.0.0.1:9092")
    env = {"EVENTIDE_SINK_ORDER_RESULTS": "kafka://127.0.0.1:9093/order_results"}
    assert resolve_tcp_sinks("market", [tcp, kafka], environ=env) == {
        ORDER_RESULTS_SINK: "kafka://127.0.0.1:9093/order_results", "answers": "kafka://127.0.0.1:9092/answers"}
    # The variable overrides a Kafka sink's own address, and switches it off.
    assert resolve_tcp_sinks("m", [kafka], environ={"EVENTIDE_SINK_ANSWERS": "kafka://h:1/x"}) == {"answers": "kafka://h:1/x"}
    assert resolve_tcp_sinks("m", [kafka], environ={"EVENTIDE_SINK_ANSWERS": "off"}) == {"answers": None}
    with pytest.raises(ConfigError, match=r"EVENTIDE_SINK_ORDER_RESULTS='kafka://127.0.0.1:9093' is not kafka://HOST:PORT/TOPIC"):
        resolve_tcp_sinks("market", [tcp], environ={"EVENTIDE_SINK_ORDER_RESULTS": "kafka://127.0.0.1:9093"})
    with pytest.raises(ConfigError, match=r"Kafka sink 'answers' of app 'm' has no address: set EVENTIDE_SINK_ANSWERS=kafka://"):
        resolve_tcp_sinks("m", [KafkaSink("answers", encode_rejection)], environ={})
    assert parse_kafka_address("kafka://a:1,b:2/t.x-1") == ("a:1,b:2", "t.x-1")
    assert parse_kafka_address("kafka://a:1/bad topic") is None


@pytest.mark.spark
def test_the_word_count_tcp_sink_sent_to_kafka_gives_the_tcp_bytes_once(spark, settings, broker, monkeypatch):
    """EVENTIDE_SINK_WORD_COUNT_TCP=kafka://...: each `word => count` line is one record, in the updates'
    order; a batch replayed after a crash before the query's commit (its commit file removed), and a run
    with nothing new, add nothing."""
    from examples.words import app as words
    from tests.conftest import DATA, land
    from transforms.engine import plan_queries, run_application
    from transforms.engine.checkpoints import batch_ids
    from transforms.ingestion.framing import iter_file_messages

    topic = f"words-{uuid.uuid4().hex[:6]}"
    land(settings, "text", list(iter_file_messages(DATA / "word_count" / "count_this.txt"))[:20])
    monkeypatch.setenv("EVENTIDE_SINK_WORD_COUNT_TCP", f"kafka://{broker.bootstrap_servers}/{topic}")
    run_application(spark, words, settings)
    records = committed_records(broker.bootstrap_servers, topic)
    expected = [b"%s => %d\n" % (r["word"].encode(), r["count"]) for r in _updates(settings)]
    assert len(expected) > 20 and [v for _, v in records] == expected and all(k is None for k, _ in records)

    (plan,) = plan_queries(words, settings)
    commits = plan.checkpoint(settings) / "commits"
    last = max(batch_ids(commits))
    for lost in (commits / str(last), commits / f".{last}.crc"):  # the query's commit lost: Spark runs the batch again
        lost.unlink(missing_ok=True)
    report = run_application(spark, words, settings)[0]
    assert report.batches == 1 and report.skipped_batches == 1  # every sink had it, Kafka's too
    run_application(spark, words, settings)  # nothing new
    assert committed_records(broker.bootstrap_servers, topic) == records


def _updates(settings) -> list[dict]:
    from transforms import lake

    return sorted(lake.read(settings.table_path("word_count_updates")).to_pylist(), key=lambda r: (r["seq"], r["part"]))
