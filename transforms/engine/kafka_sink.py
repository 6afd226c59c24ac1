"""A Kafka sink's writer: each micro-batch's encoded outputs as one Kafka transaction.

Delivery contract: exactly once for consumers reading with `isolation.level=read_committed`. The
writer's transactional producer has a `transactional.id` of its own (the query, its generation, the
sink and the home), so a new writer fences an old one still running (a zombie of a killed process) and
Kafka aborts what the old one left open. Every transaction holds the batch's records and one record
in the sink's progress topic (`eventide-progress.<transactional id>`, compacted, one partition, only
this writer writes it) saying which batch it is, so the two commit or abort together. At its start the
writer reads the last committed batch from there (read_committed: after `init_transactions` nothing of
its own is left open) and skips a batch it has committed before: a batch Spark replays after a crash
between this sink's commit and the query's is not produced again. A consumer reading
`read_uncommitted` (Kafka's default) also sees the records of aborted transactions: at least once.

Order: the records of a batch are produced in their inputs' order (sequence, then part). A topic of one
partition keeps that order; with several, Kafka's partitioner puts the records of one key in one
partition (in order) and records without a key anywhere.
"""

from __future__ import annotations

import json
import re
import time

from transforms.api import KafkaSink, TCPSink
from transforms.settings import KAFKA_SCHEME

START_TIMEOUT_SECONDS = 15.0  # the broker must answer the producer's start (init_transactions) within this
COMMIT_TIMEOUT_SECONDS = 60.0  # a transaction not committed by then fails the batch (it is processed again)
TRANSACTION_TIMEOUT_MS = 120_000  # Kafka aborts a transaction its producer left open this long
PROGRESS_PREFIX = "eventide-progress."
_TOPIC_CHARS = re.compile(r"[^a-zA-Z0-9._-]")


class KafkaSinkError(RuntimeError):
    """A Kafka sink could not write a batch; the message names the sink, the address and what to do.
    The batch is not committed: the query stops (serve restarts it) and processes it again."""


def parse_kafka_address(value: str) -> tuple[str, str] | None:
    """`kafka://HOST:PORT[,HOST:PORT]/TOPIC` as (servers, topic); None if it is not one."""
    if not value.startswith(KAFKA_SCHEME):
        return None
    servers, _, topic = value[len(KAFKA_SCHEME):].partition("/")
    parts = [s.strip() for s in servers.split(",")]
    for part in parts:
        host, sep, port = part.rpartition(":")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            return None
    if not topic or _TOPIC_CHARS.search(topic) or len(topic) > 249:
        return None
    return ",".join(parts), topic


def kafka_destination(sink, address: str | None):
    """The sink a writer serves: a TCP sink whose address is `kafka://HOST:PORT/TOPIC` becomes a Kafka sink
    of the same encoder (its bytes are the record values; a record is its own frame, so no framing)."""
    if isinstance(sink, TCPSink) and address and address.startswith(KAFKA_SCHEME):
        servers, topic = parse_kafka_address(address)
        return KafkaSink(sink.name, sink.encoder, topic=topic, bootstrap=servers, accepts=sink.accepts,
                         optional=sink.optional)
    return sink


class TransactionalSink:
    """The Kafka side of a Kafka sink's writer (sinks.KafkaSinkWriter): a transactional producer to
    `topic` at `servers` under `txn_id`, and the progress topic of that id (see the module)."""

    def __init__(self, servers: str, topic: str, txn_id: str, where: str, switch_off: str):
        self.servers, self.topic, self.txn_id = servers, topic, _TOPIC_CHARS.sub("_", txn_id)[:200]
        self.where, self.switch_off = where, switch_off
        self.progress_topic = PROGRESS_PREFIX + self.txn_id
        self.producer = None
        self.done: int | None = None  # the last batch committed (read at start)

    def _fail(self, what: str, why: object) -> KafkaSinkError:
        port = self.servers.split(",")[0].rpartition(":")[2]
        return KafkaSinkError(
            f"{self.where}: {what}: {_reason(why)}. The batch is not committed and is processed again: start the "
            f"broker (for development `eventide kafka --port {port} --dir DIR`), or set {self.switch_off} to "
            "switch the sink off")

    def start(self) -> None:
        """The transactional producer, once: fence any earlier writer of this id (Kafka aborts what it
        left open), then read which batch it committed last."""
        if self.producer is not None:
            return
        from confluent_kafka import KafkaException, Producer

        from transforms.ingestion.kafka_log import _client_log

        ensure_topics(self.servers, {self.topic: {}, self.progress_topic: PROGRESS_TOPIC_CONFIG}, self._fail)
        producer = Producer({
            "bootstrap.servers": self.servers,
            "transactional.id": self.txn_id,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "message.timeout.ms": int(COMMIT_TIMEOUT_SECONDS * 1000),
            "logger": _client_log,
        })
        try:
            producer.init_transactions(START_TIMEOUT_SECONDS)
        except KafkaException as e:
            raise self._fail("the transactional producer did not start", e) from None
        self.done = last_committed_batch(self.servers, self.progress_topic, self.txn_id)
        self.producer = producer

    def committed(self, batch_id: int) -> bool:
        """Whether the batch was committed before (start() first)."""
        return self.done is not None and self.done >= batch_id

    def commit(self, batch_id: int, records: list[tuple[bytes, bytes | None]]) -> None:
        """The batch's (value, key) records, in order, and its progress record as one transaction;
        KafkaSinkError (the transaction aborted) if Kafka did not commit it."""
        from confluent_kafka import KafkaException

        self.start()
        try:
            self.producer.begin_transaction()
            for value, key in records:
                self._produce(self.topic, value, key)
            progress = json.dumps({"batch": batch_id, "topic": self.topic, "records": len(records),
                                   "at": time.time()}).encode()
            self._produce(self.progress_topic, progress, self.txn_id.encode())
            self.producer.commit_transaction(COMMIT_TIMEOUT_SECONDS)
        except KafkaException as e:
            self._abort(e)
            raise self._fail(f"batch {batch_id} ({len(records)} records) was not committed", e) from None
        self.done = batch_id

    def _produce(self, topic: str, value: bytes, key: bytes | None) -> None:
        while True:
            try:
                self.producer.produce(topic, value=value, key=key)
                return
            except BufferError:  # the producer's queue is full: let it deliver
                self.producer.poll(0.05)

    def _abort(self, error) -> None:
        """After a failed transaction: abort it if Kafka allows; else drop the producer, and the next
        start fences and aborts what it left."""
        err = error.args[0] if error.args else None
        try:
            if err is not None and err.txn_requires_abort():
                self.producer.abort_transaction(START_TIMEOUT_SECONDS)
                return
        except Exception:  # noqa: BLE001 - the producer is dropped below either way
            pass
        self.producer, self.done = None, None

    def close(self) -> None:
        if self.producer is not None:
            self.producer.flush(5)
            self.producer = None


PROGRESS_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.ms": "600000", "min.cleanable.dirty.ratio": "0.1"}


def ensure_topics(servers: str, topics: dict[str, dict], fail) -> None:
    """Create the topics that are missing (one partition, the broker's replication factor, `config`);
    an existing topic is used as it is. `fail(what, why)` makes the error raised."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    from transforms.ingestion.kafka_log import CHECK_TIMEOUT_SECONDS, _client

    admin = _client("admin", servers)
    try:
        present = admin.list_topics(timeout=CHECK_TIMEOUT_SECONDS).topics
    except KafkaException as e:
        raise fail("no Kafka broker answers", e) from None
    missing = [NewTopic(t, num_partitions=1, replication_factor=-1, config=c) for t, c in topics.items() if t not in present]
    if not missing:
        return
    for topic, future in admin.create_topics(missing, request_timeout=CHECK_TIMEOUT_SECONDS * 2).items():
        try:
            future.result(CHECK_TIMEOUT_SECONDS * 3)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise fail(f"topic {topic!r} could not be created", e) from None


def last_committed_batch(servers: str, topic: str, key: str) -> int | None:
    """The batch of the last committed progress record of `key` in `topic` (read_committed, to its end),
    or None if there is none."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    from transforms.ingestion.kafka_log import DELIVERY_TIMEOUT_SECONDS, _client_log

    consumer = Consumer({"bootstrap.servers": servers, "group.id": "eventide-sink-progress",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed", "logger": _client_log})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        last, deadline = None, time.monotonic() + DELIVERY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return last
                continue
            if msg.key() == key.encode():
                last = int(json.loads(msg.value())["batch"])
        raise KafkaSinkError(f"the progress topic {topic!r} at {servers} was not read to its end within "
                             f"{DELIVERY_TIMEOUT_SECONDS:g} s; the sink cannot tell which batches it committed")
    finally:
        consumer.close()


def _reason(e: object) -> str:
    err = e.args[0] if isinstance(e, Exception) and e.args else e
    return err.str() if hasattr(err, "str") else str(err)

