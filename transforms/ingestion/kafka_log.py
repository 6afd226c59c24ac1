"""Kafka as the log (EVENTIDE_LOG=kafka://HOST:PORT): one topic per sequence group, one partition each.

Writing (the gateway, `eventide ingest`): a confluent-kafka producer with `acks=all` and idempotence
(no duplicates from its own retries, order kept within the partition). A message is its payload as
the value, its receive time as the timestamp, and headers `stream`, `connection` and (input the gateway
could not frame) `landing_error`. The gateway confirms a connection (0x06) only once Kafka has
acknowledged every message of it; a delivery that fails (the broker gone longer than
DELIVERY_TIMEOUT_SECONDS) closes the connection unconfirmed, and `ingest` fails naming the count.

Reading: every query reads its group's topic with Spark's Kafka source from the earliest offset, its
offsets kept in the query's checkpoint, so with Delta's idempotent writes each message reaches the
tables exactly once. A message's `seq` is its offset + 1: the group's one order, counted from 1 like the
landing log's (but per group, not across groups). `failOnDataLoss` is on and topics are created with
unlimited retention: the log is the replayable source of truth, and a query that finds messages gone
stops rather than skipping them.

Topics: the group's name with every character Kafka refuses replaced by `_` (`market_data+orders` ->
`market_data_orders`), after the prefix of `kafka://HOST:PORT/PREFIX` if there is one, created at the writer's start if missing (1 partition, the broker's default
replication factor, `retention.ms=-1`).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from pathlib import Path

import pyarrow as pa

from transforms.ingestion.log import (
    LANDING_SCHEMA,
    Log,
    LogStatus,
    LogUnavailable,
    LogWriteError,
    LogWriter,
    Progress,
    grid,
    offsets_per_trigger,
)
from transforms.settings import ConfigError, Settings, kafka_prefix, kafka_servers

log = logging.getLogger(__name__)
# librdkafka's own log lines (a broker going away is logged once per connection attempt): kept out of the
# commands' output unless the program configures logging.
_client_log = logging.getLogger(__name__ + ".librdkafka")
_client_log.addHandler(logging.NullHandler())

DELIVERY_TIMEOUT_SECONDS = 30.0  # a message not acknowledged by then fails (the broker is down for longer)
CHECK_TIMEOUT_SECONDS = 5.0  # the broker must answer within this at the start of ingest, serve and run
_TOPIC_CHARS = re.compile(r"[^a-zA-Z0-9._-]")
_HEADERS = ("stream", "connection", "landing_error")


def topic_name(group: str, prefix: str = "") -> str:
    """A sequence group's topic: `prefix` and the group's name, the characters Kafka refuses replaced by
    `_`, at most 249 of them."""
    name = _TOPIC_CHARS.sub("_", prefix + group)[:249]
    return name if name not in ("", ".", "..") else f"_{name}"


def _unreachable(servers: str, setting: str, why: object) -> LogUnavailable:
    port = servers.split(",")[0].rpartition(":")[2]
    return LogUnavailable(
        f"no Kafka broker answers at {servers} (EVENTIDE_LOG={setting}): {why}. Start one, e.g. "
        f"`eventide kafka --port {port} --dir DIR` for development, or unset EVENTIDE_LOG to use the "
        "landing folder under the home"
    )


_clients: dict[tuple[str, str], object] = {}
_clients_lock = threading.Lock()


def _client(kind: str, servers: str):
    """One AdminClient or reading Consumer per broker address and process (thread-safe use only)."""
    with _clients_lock:
        found = _clients.get((kind, servers))
        if found is None:
            from confluent_kafka import Consumer
            from confluent_kafka.admin import AdminClient

            conf = {"bootstrap.servers": servers, "logger": _client_log}
            if kind == "admin":
                found = AdminClient(conf)
            else:
                found = Consumer({**conf, "group.id": "eventide-reader", "enable.auto.commit": False,
                                  "enable.partition.eof": False})
            _clients[(kind, servers)] = found
        return found


def committed_offsets(checkpoint: Path, topic: str) -> tuple[int | None, dict[int, int] | None]:
    """(last committed batch, the next offset per partition of `topic` it leaves to read), from a query's
    checkpoint (Spark's offset log: `offsets/<batch>` holds `{"<topic>": {"<partition>": <offset>, ...}}`
    for the Kafka source); (None, None) when nothing is committed."""
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir()
                     if p.name.isdigit()) if (checkpoint / "commits").is_dir() else []
    if not commits:
        return None, None
    try:
        lines = (checkpoint / "offsets" / str(commits[-1])).read_text().splitlines()[2:]
    except OSError:
        return commits[-1], None
    for line in lines:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get(topic), dict):
            return commits[-1], {int(p): int(o) for p, o in value[topic].items()}
    return commits[-1], None


def committed_offset(checkpoint: Path, topic: str) -> tuple[int | None, int | None]:
    """committed_offsets of a one-partition topic (the log's): (last committed batch, next offset)."""
    batch, offsets = committed_offsets(checkpoint, topic)
    return batch, (offsets.get(0, 0) if offsets is not None else None)


class KafkaLog(Log):
    kind = "kafka"

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.servers = kafka_servers(settings.log)
        self.prefix = kafka_prefix(settings.log)
        self._topics: dict[str, str] | None = None

    def describe(self) -> str:
        return f"Kafka at {self.servers}"

    def topics(self) -> dict[str, str]:
        """Every registered sequence group's topic; ConfigError if two groups would share one."""
        if self._topics is None:
            topics: dict[str, str] = {}
            for group in sorted(self.settings.registry.logs):
                topic = topic_name(group, self.prefix)
                clash = [g for g, t in topics.items() if t == topic]
                if clash:
                    raise ConfigError(f"the landing logs {clash[0]!r} and {group!r} would share the Kafka topic "
                                      f"{topic!r}: rename a stream so that they differ in a letter, digit, ., _ or -")
                topics[group] = topic
            self._topics = topics
        return self._topics

    def topic(self, group: str) -> str:
        return self.topics().get(group) or topic_name(group, self.prefix)

    @property
    def max_message_bytes(self) -> int:
        # a frame at the limit plus its headers; quarantined input (a cut frame and what came with it) too
        return max(1_000_000, self.settings.max_frame_bytes + (1 << 20))

    # -- reaching the broker ---------------------------------------------------------------------------
    def check(self) -> None:
        try:
            _client("admin", self.servers).list_topics(timeout=CHECK_TIMEOUT_SECONDS)
        except Exception as e:  # KafkaException: transport failure or timeout
            raise _unreachable(self.servers, self.settings.log, _reason(e)) from None

    def ensure_topics(self, topics: list[str]) -> None:
        """Create the topics that are missing (one partition, unlimited retention); ConfigError if one
        exists with more than one partition (its messages would have no one order)."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic

        admin = _client("admin", self.servers)
        try:
            present = admin.list_topics(timeout=CHECK_TIMEOUT_SECONDS).topics
        except KafkaException as e:
            raise _unreachable(self.servers, self.settings.log, _reason(e)) from None
        missing = [t for t in topics if t not in present]
        if missing:
            config = {"retention.ms": "-1", "max.message.bytes": str(self.max_message_bytes)}
            futures = admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=-1, config=config)
                                           for t in missing], request_timeout=CHECK_TIMEOUT_SECONDS * 2)
            for topic, future in futures.items():
                try:
                    future.result(CHECK_TIMEOUT_SECONDS * 3)
                except KafkaException as e:
                    if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise LogWriteError(f"Kafka at {self.servers} did not create topic {topic!r}: "
                                            f"{_reason(e)}") from None
        for t in topics:
            meta = present.get(t)
            if meta is not None and len(meta.partitions) != 1:
                raise ConfigError(f"Kafka topic {t!r} at {self.servers} has {len(meta.partitions)} partitions: "
                                  "Eventide's log needs one (its one order); delete it or choose another broker")

    def watermarks(self, topic: str) -> tuple[int, int]:
        """(low, high) offsets of the topic's partition: high is the next offset to be written; (0, 0)
        for a topic that does not exist yet."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        consumer = _client("consumer", self.servers)
        for attempt in (1, 2):
            try:
                return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=CHECK_TIMEOUT_SECONDS,
                                                      cached=False)
            except KafkaException as e:
                if e.args[0].code() not in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION):
                    raise _unreachable(self.servers, self.settings.log, _reason(e)) from None
                if attempt == 2:
                    return 0, 0
                # The client's metadata may predate the topic (it was asked for before it existed): ask
                # the broker for the topic's metadata, then look again.
                try:
                    consumer.list_topics(topic, timeout=CHECK_TIMEOUT_SECONDS)
                except KafkaException as e2:
                    raise _unreachable(self.servers, self.settings.log, _reason(e2)) from None
        raise AssertionError("not reached")

    # -- writing ---------------------------------------------------------------------------------------
    def writer(self) -> KafkaWriter:
        self.ensure_topics(list(self.topics().values()))
        return KafkaWriter(self)

    # -- reading ---------------------------------------------------------------------------------------
    def source(self, spark, plan):
        from pyspark.sql import functions as F

        topic = self.topic(plan.group)
        self.ensure_topics([topic])
        raw = (spark.readStream.format("kafka")
               .option("kafka.bootstrap.servers", self.servers)
               .option("subscribe", topic)
               .option("startingOffsets", "earliest")
               .option("includeHeaders", "true")
               .option("failOnDataLoss", "true")
               .option("maxOffsetsPerTrigger", offsets_per_trigger(self.settings, plan.messages_as_objects))
               .load())

        def header(name: str):
            return F.expr(f"CAST(try_element_at(filter(headers, h -> h.key = '{name}'), 1).value AS STRING)")

        return raw.select(header("stream").alias("stream"), (F.col("offset") + 1).alias("seq"),
                          F.col("timestamp").alias("receive_time"), header("connection").alias("connection"),
                          F.col("value").alias("payload"), header("landing_error").alias("landing_error"))

    def is_source(self, description: str) -> bool:
        return description.startswith("Kafka")

    def caught_up(self, plan) -> bool:
        topic = self.topic(plan.group)
        _, done = committed_offset(plan.checkpoint(self.settings), topic)
        return (done or 0) >= self.watermarks(topic)[1]

    def position(self, group: str) -> int:
        return self.watermarks(self.topic(group))[1]

    def mark(self, group: str) -> str | None:
        end = self.position(group)
        return str(end) if end else None

    def reached(self, plan, position: int) -> bool:
        return (committed_offset(plan.checkpoint(self.settings), self.topic(plan.group))[1] or 0) >= position

    def _records(self, topic: str, start: int, end: int):
        """The messages of offsets [start, end) of the topic, in order."""
        from confluent_kafka import TopicPartition

        consumer = _client("consumer", self.servers)
        with _clients_lock:
            consumer.assign([TopicPartition(topic, 0, start)])
            try:
                got, deadline = [], time.monotonic() + DELIVERY_TIMEOUT_SECONDS
                while start + len(got) < end and time.monotonic() < deadline:
                    for msg in consumer.consume(min(end - start - len(got), 10_000), timeout=1.0):
                        if msg.error() is None and msg.offset() < end:
                            got.append(msg)
                return got
            finally:
                consumer.unassign()

    def read(self, group: str, columns: list[str] | None = None) -> pa.Table:
        topic = self.topic(group)
        low, high = self.watermarks(topic)
        rows = []
        for msg in self._records(topic, low, high):
            h = {k: v.decode() for k, v in (msg.headers() or []) if k in _HEADERS}
            rows.append({"stream": h.get("stream"), "seq": msg.offset() + 1, "receive_time": msg.timestamp()[1] * 1000,
                         "connection": h.get("connection"), "payload": msg.value(),
                         "landing_error": h.get("landing_error")})
        if not rows:
            table = LANDING_SCHEMA.empty_table()
        else:
            table = pa.Table.from_pylist(rows)
            table = table.set_column(2, "receive_time", table.column("receive_time").cast(pa.int64())
                                     .cast(pa.timestamp("us", tz="UTC"))).cast(LANDING_SCHEMA)
        return table if columns is None else table.select(columns)

    def payloads_for(self, group: str, seqs: list[int]) -> dict[int, bytes]:
        if not seqs:
            return {}
        wanted = set(seqs)
        msgs = self._records(self.topic(group), min(wanted) - 1, max(wanted))
        return {m.offset() + 1: m.value() for m in msgs if m.offset() + 1 in wanted}

    # -- status ----------------------------------------------------------------------------------------
    def status(self, plans: list, now: float) -> tuple[list[LogStatus], dict[str, Progress]]:
        logs, marks, unreachable = [], {}, None
        for group, streams in sorted(self.settings.registry.logs.items()):
            topic = self.topic(group)
            entry = LogStatus(log=group, streams=list(streams), kind=self.kind, topic=topic, error=unreachable)
            if unreachable is None:  # a broker that did not answer is not asked again for each topic
                try:
                    low, high = marks[group] = self.watermarks(topic)
                    entry.messages, entry.end_offset, entry.last_seq = high - low, high, high or None
                except LogUnavailable as e:
                    entry.error = unreachable = str(e)
            logs.append(entry)
        progress = {}
        for p in plans:
            batch, done = committed_offset(p.checkpoint(self.settings), self.topic(p.group))
            entry = Progress(last_committed_batch=batch, processed_offset=done, processed_last_seq=done or None)
            if p.group in marks:
                low, high = marks[p.group]
                entry.lag_messages = max(0, high - max(done or 0, low))
                if entry.lag_messages:
                    first = self._records(self.topic(p.group), max(done or 0, low), max(done or 0, low) + 1)
                    entry.oldest_unprocessed_us = first[0].timestamp()[1] * 1000 if first else None
            progress[p.name] = entry
        return logs, progress

    def format_logs(self, logs: list[LogStatus]) -> list[str]:
        lines = grid(["LOG", "TOPIC", "END OFFSET", "MESSAGES"],
                     [[g.log, g.topic, g.end_offset, None if g.error else g.messages] for g in logs], left=(0, 1))
        lines += [f"{g.log}: {g.error}" for g in logs if g.error][:1]
        return lines + ["", f"Logs in {self.describe()}. END OFFSET: the next offset the topic writes; a "
                            "message's sequence is its offset + 1. PROCESSED TO: the last sequence a query "
                            "committed (-: nothing yet)."]


def _reason(e: Exception) -> str:
    err = e.args[0] if e.args else e
    return err.str() if hasattr(err, "str") else str(err)


class KafkaWriter(LogWriter):
    """A producer writing each stream's messages to its group's topic (see the module's docstring)."""

    def __init__(self, kafka: KafkaLog, clock=time.time):
        self.kafka, self.clock = kafka, clock
        self._topic_of: dict[str, str] = {}
        self._pending: dict[str, int] = {}  # connection -> messages not yet acknowledged
        self._failed: dict[str, tuple[str, int]] = {}  # connection -> (why its first failure, failures)
        self._fatal: str | None = None
        self._last_error: tuple[str, float] = ("", 0.0)
        self.messages_landed = 0
        self.acknowledged = 0
        self.producer = self._new_producer()

    def _new_producer(self):
        from confluent_kafka import Producer

        return Producer({
            "bootstrap.servers": self.kafka.servers,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": int(DELIVERY_TIMEOUT_SECONDS * 1000),
            "message.max.bytes": self.kafka.max_message_bytes,
            "logger": _client_log,
            "error_cb": self._on_error,
        })

    def _on_error(self, err) -> None:
        text = f"Kafka at {self.kafka.servers}: {err.str()}"
        if err.fatal():
            self._fatal = text
        last, at = self._last_error
        if err.fatal() or time.monotonic() - at > 30:  # a broker down is reported every second or so
            self._last_error = (text, time.monotonic())
            log.warning("%s", text)

    def _topic(self, stream: str) -> str:
        topic = self._topic_of.get(stream)
        if topic is None:
            topic = self._topic_of[stream] = self.kafka.topic(self.kafka.settings.group_of(stream))
        return topic

    def _restart_if_fatal(self) -> None:
        """After a fatal error (the idempotent producer cannot go on: e.g. fenced, or a sequence gap it
        cannot close) its queued messages will never be acknowledged: their connections fail, and a new
        producer takes the next messages."""
        if not self._fatal:
            return
        why, self._fatal = self._fatal, None
        for connection, n in self._pending.items():
            if n:
                self._failed.setdefault(connection, (f"the Kafka producer stopped: {why}", n))
                self._pending[connection] = 0
        old, self.producer = self.producer, self._new_producer()
        try:
            old.purge()  # its delivery reports, if ever served, find nothing pending
        except Exception:  # noqa: BLE001 - the old producer is dropped either way
            pass
        log.warning("a new Kafka producer replaces one stopped by a fatal error: %s", why)

    def append(self, stream: str, payload: bytes, connection: str = "", error: str | None = None) -> None:
        self._restart_if_fatal()
        topic = self._topic(stream)
        headers = [("stream", stream.encode()), ("connection", connection.encode())]
        if error is not None:
            headers.append(("landing_error", error.encode()))
        self._pending[connection] = self._pending.get(connection, 0) + 1

        def delivered(err, msg, connection=connection) -> None:
            if connection not in self._pending:
                return  # forgotten: the gateway closed it unconfirmed, or its client went away
            self._pending[connection] -= 1
            if err is None:
                self.acknowledged += 1
                return
            why, n = self._failed.get(connection) or (
                f"Kafka at {self.kafka.servers} did not acknowledge a message to {msg.topic()}: {err.str()}", 0)
            self._failed[connection] = (why, n + 1)

        stamp = int(self.clock() * 1000)
        while True:
            try:
                self.producer.produce(topic, value=payload, headers=headers, timestamp=stamp, on_delivery=delivered)
                break
            except BufferError:  # the producer's queue is full (the broker is slow or away): wait for room
                self.producer.poll(0.05)
            except Exception as e:  # KafkaException: e.g. a message over the size limit
                self._pending[connection] -= 1
                raise LogWriteError(f"Kafka at {self.kafka.servers} refused a message of {stream}: {_reason(e)}") from None
        self.messages_landed += 1

    def sync(self) -> None:
        self.producer.poll(0)

    def tick(self) -> None:
        self.producer.poll(0)
        self._restart_if_fatal()

    def unconfirmed(self, connection: str) -> int:
        return self._pending.get(connection, 0)

    def failure(self, connection: str) -> str | None:
        if connection in self._failed:
            return self._failed[connection][0]
        return f"the Kafka producer stopped: {self._fatal}" if self._fatal and self._pending.get(connection) else None

    def forget(self, connection: str) -> None:
        self._pending.pop(connection, None)
        self._failed.pop(connection, None)

    def flush(self) -> None:
        """Wait for every delivery report; LogWriteError if a message of a connection not yet forgotten
        failed (the gateway forgets those it closed unconfirmed) or is still unanswered."""
        left = self.producer.flush(DELIVERY_TIMEOUT_SECONDS + 5)
        failed, self._failed = self._failed, {}
        if left or failed:
            count = left + sum(n for _, n in failed.values())
            first = next(iter(failed.values()))[0] if failed else f"no answer within {DELIVERY_TIMEOUT_SECONDS + 5:g} s"
            raise LogWriteError(
                f"{count} messages were not acknowledged by Kafka at {self.kafka.servers} ({first}); "
                "some of them may be in the log: check `eventide status` before writing them again")

    def close(self) -> None:
        self.flush()
