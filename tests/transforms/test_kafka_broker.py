"""`eventide kafka`: a real Apache Kafka broker (KRaft, from the jars `make setup` resolved), started as the
command in a subprocess, used through confluent-kafka, stopped by a signal to its PID. No mocks."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import REPO
from transforms.kafka_broker import is_formatted, start_broker
from transforms.ports import free_port
from transforms.processes import alive

EVENTIDE = os.path.join(os.path.dirname(sys.executable), "eventide")

pytestmark = pytest.mark.timeout(180)


def _create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the result: its end cancels the request
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    """Send `values` with acks=all and idempotence; every delivery must succeed; returns their offsets."""
    offsets, errors = [], []

    def delivered(err, msg):
        (errors if err else offsets).append(err or msg.offset())

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value=value, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0, "messages still undelivered after 30 s"
    assert errors == []
    return offsets


def _consume(bootstrap: str, topic: str, n: int, timeout: float = 30.0) -> tuple[list[bytes], tuple[int, int]]:
    """The first `n` values of the topic's one partition read from the beginning (a new consumer group),
    and the partition's (low, high) watermarks: the number of messages the broker holds."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{time.monotonic_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=n - len(got), timeout=1):
                if msg.error():
                    raise KafkaException(msg.error())
                got.append(msg.value())
        marks = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return got, marks
    finally:
        consumer.close()


def test_eventide_kafka_round_trips_1000_messages_in_order_and_stops_cleanly_on_sigterm(tmp_path):
    folder = tmp_path / "kafka"
    started = time.monotonic()
    broker = start_broker(folder, command=[EVENTIDE])  # the console script, as a user runs it
    try:
        ready = time.monotonic() - started
        assert broker.java_pid is not None and alive(broker.java_pid), broker.tail()
        values = [f"order-{i:04d}".encode() for i in range(1000)]
        _create_topic(broker.bootstrap_servers, "orders")
        assert _produce(broker.bootstrap_servers, "orders", values) == list(range(1000))
        got, marks = _consume(broker.bootstrap_servers, "orders", len(values))
        assert got == values  # exactly those values, in order
        assert marks == (0, 1000)  # and nothing else in the partition
        assert not (folder / "data" / ".kafka_cleanshutdown").exists()  # written only by a clean stop
    finally:
        asked = time.monotonic()
        rc = broker.stop(signal.SIGTERM, timeout=60)
        stopped_in = time.monotonic() - asked
    assert rc == 0, broker.tail()
    assert stopped_in < 30, f"eventide kafka took {stopped_in:.1f} s to stop (ready in {ready:.1f} s)"
    assert not alive(broker.java_pid), f"the broker's JVM (pid {broker.java_pid}) outlived eventide kafka"
    # Kafka writes this marker only when its log manager shut down cleanly (else the next start recovers).
    assert (folder / "data" / ".kafka_cleanshutdown").is_file(), broker.tail()
    assert "eventide kafka: stopped" in broker.log.read_text()


def test_a_restart_on_the_same_dir_keeps_the_messages_and_does_not_format_again(tmp_path):
    """Also: SIGINT stops it like SIGTERM, and a kill -9 of the command still stops its JVM cleanly."""
    folder = tmp_path / "kafka"
    values = [f"reading-{i}".encode() for i in range(100)]
    first = start_broker(folder)
    try:
        _create_topic(first.bootstrap_servers, "readings")
        _produce(first.bootstrap_servers, "readings", values)
    finally:
        rc = first.stop(signal.SIGINT, timeout=60)  # Ctrl-C stops it as cleanly as SIGTERM
    assert rc == 0, first.tail()
    assert not alive(first.java_pid)
    cluster_id = (folder / "cluster-id").read_text()
    meta = (folder / "data" / "meta.properties").read_text()
    first_log = first.log.read_text()
    assert first_log.count("eventide kafka: formatting") == 1

    second = start_broker(folder)  # on another free port: only the data is kept, not the port
    try:
        got, marks = _consume(second.bootstrap_servers, "readings", len(values))
        assert got == values and marks == (0, 100)
        assert not (folder / "data" / ".kafka_cleanshutdown").exists()  # a running broker removed it
        _produce(second.bootstrap_servers, "readings", [b"after the restart"])
        got, marks = _consume(second.bootstrap_servers, "readings", len(values) + 1)
        assert got == [*values, b"after the restart"] and marks == (0, 101)
    finally:
        # kill -9 of the command: its JVM gets SIGTERM from the kernel (parent-death signal) and still
        # shuts down cleanly instead of staying on the port and DIR.
        assert second.stop(signal.SIGKILL, timeout=60) == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while alive(second.java_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(second.java_pid), f"the JVM (pid {second.java_pid}) outlived a kill -9 of eventide kafka"
    assert (folder / "data" / ".kafka_cleanshutdown").is_file()
    assert (folder / "cluster-id").read_text() == cluster_id
    assert (folder / "data" / "meta.properties").read_text() == meta
    assert "eventide kafka: formatting" not in second.log.read_text()[len(first_log):]


def _run(*args, env=None):
    return subprocess.run([EVENTIDE, "kafka", *args], cwd=REPO, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=60)


def test_a_port_in_use_stops_with_a_message_naming_the_port(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _run("--port", str(port), "--dir", str(tmp_path / "kafka"))
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"eventide kafka: error: port {port} on 127.0.0.1 is in use" in out.stderr
    assert "pick another --port" in out.stderr
    assert not is_formatted(tmp_path / "kafka")  # checked before anything is written or started


def test_missing_jars_or_java_say_what_to_do(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    port = str(free_port())
    jars = _run("--port", port, "--dir", str(tmp_path / "k1"), env={"EVENTIDE_KAFKA_JARS": str(empty)})
    assert jars.returncode == 2
    assert f"Apache Kafka's jars are not in {empty}: run `make setup`" in jars.stderr
    java = _run("--port", port, "--dir", str(tmp_path / "k2"), env={"JAVA_HOME": str(empty), "PATH": str(empty)})
    assert java.returncode == 2
    assert f"java not found: JAVA_HOME={empty} has no bin/java and there is no java on PATH" in java.stderr
