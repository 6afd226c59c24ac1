"""A user's Kafka topic as a query's source (`transforms.api.kafka_source`): read with Spark's Kafka source,
the offsets kept in the query's checkpoint, so with Delta's idempotent writes each record reaches the tables
exactly once, as with the home's log.

The records become rows in the log's columns (LANDING_DDL), so every stage after the source is the same:
`stream` the pipeline's stream, `seq` = partition << 40 | (offset + 1) (unique, increasing within a
partition; `transforms.api.kafka_position` gives both back), `receive_time` the record's timestamp,
`connection` its key as text (UTF-8), `payload` its value, `landing_error` null. Order: a micro-batch's
records are processed in `seq` order, so partition by partition; a key of the pipeline sees the records of
one partition in their order (records with one Kafka key share a partition, so keying by it keeps Kafka's
order), records of different partitions in batch order, and within a batch partition by partition.

`plan_log(settings, plan)` is what the engine asks for a plan's source: the home's log (`open_log`) for
landed streams, a `KafkaTopicLog` for a kafka_source. `topics_status` is `eventide status`'s part for these
topics: per topic its end offsets, per query the offsets its checkpoint committed and its lag.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from transforms.api import KAFKA_PARTITION_SHIFT, KafkaTopic, kafka_position
from transforms.ingestion.log import LogStatus, Progress, grid, offsets_per_trigger
from transforms.settings import Settings


def plan_log(settings: Settings, plan):
    """The log a plan reads: its kafka_source's topic, or the home's log."""
    if plan.origin is None:
        from transforms.ingestion import open_log

        return open_log(settings)
    return KafkaTopicLog(settings, plan.origin)


def committed_offsets(checkpoint: Path, topic: str) -> dict[int, int] | None:
    """The next offset per partition of `topic` that a query's last committed batch leaves to read; None
    when nothing is committed."""
    from transforms.ingestion.kafka_log import committed_offsets as checkpoint_offsets

    return checkpoint_offsets(checkpoint, topic)[1]


class KafkaTopicLog:
    """The reading side of a user's topic, as the engine asks a log: `source`, `is_source`, `caught_up`,
    `payloads_for` (the quarantine's exact payloads)."""

    kind = "kafka_source"

    def __init__(self, settings: Settings, origin: KafkaTopic):
        self.settings, self.origin = settings, origin

    def describe(self) -> str:
        return f"Kafka topic {self.origin.topic!r} at {self.origin.bootstrap}"

    def source(self, spark, plan):
        from pyspark.sql import functions as F

        (stream,) = plan.streams
        raw = (spark.readStream.format("kafka")
               .option("kafka.bootstrap.servers", self.origin.bootstrap)
               .option("subscribe", self.origin.topic)
               .option("startingOffsets", self.origin.starting_offsets)
               .option("failOnDataLoss", "true")
               .option("maxOffsetsPerTrigger", offsets_per_trigger(self.settings, plan.messages_as_objects))
               .load())
        seq = F.shiftleft(F.col("partition").cast("long"), KAFKA_PARTITION_SHIFT) + F.col("offset") + 1
        return raw.select(F.lit(stream).alias("stream"), seq.alias("seq"), F.col("timestamp").alias("receive_time"),
                          F.col("key").cast("string").alias("connection"), F.col("value").alias("payload"),
                          F.lit(None).cast("string").alias("landing_error"))

    def is_source(self, description: str) -> bool:
        return description.startswith("Kafka")

    def _consumer(self):
        from confluent_kafka import Consumer

        from transforms.ingestion.kafka_log import _client_log

        return Consumer({"bootstrap.servers": self.origin.bootstrap, "group.id": "eventide-reader",
                         "enable.auto.commit": False, "logger": _client_log})

    def end_offsets(self) -> dict[int, int]:
        """The next offset each partition of the topic will write ({} if the topic does not exist)."""
        return {p: high for p, (_, high) in self.watermarks().items()}

    def watermarks(self) -> dict[int, tuple[int, int]]:
        """(low, high) offsets of each partition of the topic: the first one kept, the next one to be written
        ({} if the topic does not exist)."""
        from confluent_kafka import TopicPartition

        from transforms.ingestion.kafka_log import CHECK_TIMEOUT_SECONDS

        consumer = self._consumer()
        try:
            meta = consumer.list_topics(self.origin.topic, timeout=CHECK_TIMEOUT_SECONDS).topics.get(self.origin.topic)
            partitions = sorted(meta.partitions) if meta is not None and meta.error is None else []
            return {p: consumer.get_watermark_offsets(TopicPartition(self.origin.topic, p),
                                                      timeout=CHECK_TIMEOUT_SECONDS, cached=False) for p in partitions}
        finally:
            consumer.close()

    def starting_offsets(self, marks: dict[int, tuple[int, int]]) -> dict[int, int]:
        """Where a query that committed nothing yet starts, per partition (its `starting_offsets`)."""
        start = self.origin.starting_offsets
        if start in ("earliest", "latest"):
            return {p: low if start == "earliest" else high for p, (low, high) in marks.items()}
        given = json.loads(start).get(self.origin.topic, {})  # Spark's JSON: -2 earliest, -1 latest
        out = {}
        for p, (low, high) in marks.items():
            o = int(given.get(str(p), -2))
            out[p] = low if o == -2 else high if o == -1 else o
        return out

    def timestamp_at(self, partition: int, offset: int) -> int | None:
        """The timestamp (ms) of the record at `offset` of `partition`, or None if it cannot be read now."""
        from confluent_kafka import TopicPartition

        from transforms.ingestion.kafka_log import CHECK_TIMEOUT_SECONDS

        consumer = self._consumer()
        try:
            consumer.assign([TopicPartition(self.origin.topic, partition, offset)])
            msg = consumer.poll(CHECK_TIMEOUT_SECONDS)
            return msg.timestamp()[1] if msg is not None and msg.error() is None else None
        finally:
            consumer.close()

    def caught_up(self, plan) -> bool:
        done = committed_offsets(plan.checkpoint(self.settings), self.origin.topic)
        if done is None:
            return False  # nothing committed: let the query start from its starting offsets
        return all(done.get(p, 0) >= end for p, end in self.end_offsets().items())

    def payloads_for(self, group: str, seqs: list[int]) -> dict[int, bytes]:
        from confluent_kafka import TopicPartition

        from transforms.ingestion.kafka_log import DELIVERY_TIMEOUT_SECONDS

        wanted = {kafka_position(s): s for s in seqs}
        found: dict[int, bytes] = {}
        consumer = self._consumer()
        try:
            for partition, offset in sorted(wanted):
                consumer.assign([TopicPartition(self.origin.topic, partition, offset)])
                deadline = time.monotonic() + DELIVERY_TIMEOUT_SECONDS
                while time.monotonic() < deadline:
                    msg = consumer.poll(1.0)
                    if msg is not None and msg.error() is None:
                        if msg.offset() == offset:
                            found[wanted[(partition, offset)]] = msg.value()
                        break
        finally:
            consumer.close()
        return found


# -- status (no Spark) -----------------------------------------------------------------------------------
@dataclass
class TopicStatus(LogStatus):
    """A kafka_source's topic as `eventide status` shows it: `end_offset` and `messages` summed over its
    partitions, each partition's end offset in `end_offsets`; `log` is the queries' group (`kafka:<topic>`)."""

    bootstrap: str | None = None
    end_offsets: dict[int, int] = field(default_factory=dict)


@dataclass
class TopicProgress(Progress):
    """How far a query reading a kafka_source has got: the next offset per partition its checkpoint committed."""

    processed_offsets: dict[int, int] | None = None


def topics_status(settings: Settings, plans: list, now: float) -> tuple[list[LogStatus], dict[str, Progress]]:
    """The topics the plans of kafka_source pipelines read, and each plan's progress (by plan name): the lag
    is what the topic holds beyond the offsets its checkpoint committed (beyond its starting offsets while it
    has committed nothing). A broker that does not answer leaves its topic's `error` set and lags at 0."""
    logs: dict[KafkaTopic, TopicStatus] = {}
    marks: dict[KafkaTopic, dict[int, tuple[int, int]]] = {}
    for p in plans:
        entry = logs.get(p.origin)
        if entry is None:
            entry = logs[p.origin] = TopicStatus(log=p.group, streams=[], kind=KafkaTopicLog.kind, topic=p.origin.topic,
                                                 bootstrap=p.origin.bootstrap)
            try:
                marks[p.origin] = found = KafkaTopicLog(settings, p.origin).watermarks()
            except Exception as e:  # noqa: BLE001 - status reports the broker's answer, whatever it is
                entry.error = f"Kafka at {p.origin.bootstrap} did not answer: {e}"
            else:
                entry.end_offsets = {q: high for q, (_, high) in found.items()}
                entry.end_offset = sum(entry.end_offsets.values())
                entry.messages = sum(high - low for low, high in found.values())
        entry.streams = sorted(set(entry.streams) | set(p.streams))
    progress: dict[str, Progress] = {}
    for p in plans:
        log = KafkaTopicLog(settings, p.origin)
        checkpoint = p.checkpoint(settings)
        done = committed_offsets(checkpoint, p.origin.topic)
        entry = progress[p.name] = TopicProgress(last_committed_batch=_last_commit(checkpoint), processed_offsets=done)
        found = marks.get(p.origin)
        if not found:
            continue
        start = done if done is not None else log.starting_offsets(found)
        behind = {q: max(0, high - max(start.get(q, low), low)) for q, (low, high) in found.items()}
        entry.lag_messages = sum(behind.values())
        oldest = [t for q, n in behind.items() if n
                  if (t := log.timestamp_at(q, max(start.get(q, found[q][0]), found[q][0]))) is not None]
        entry.oldest_unprocessed_us = min(oldest) * 1000 if oldest else None
    return list(logs.values()), progress


def _last_commit(checkpoint: Path) -> int | None:
    commits = checkpoint / "commits"
    ids = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    return max(ids, default=None)


def format_topics(logs: list[LogStatus]) -> list[str]:
    """The kafka_source topics as lines of a table, for `eventide status`."""
    rows = [[g.log, g.topic, getattr(g, "bootstrap", None), _offsets(getattr(g, "end_offsets", None) or None),
             None if g.error else g.messages] for g in logs]
    lines = grid(["SOURCE", "TOPIC", "SERVERS", "END OFFSETS", "MESSAGES"], rows, left=(0, 1, 2, 3))
    lines += [f"{g.log}: {g.error}" for g in logs if g.error]
    return lines + ["", "Topics apps read straight (kafka_source). END OFFSETS: per partition (PARTITION:OFFSET) the "
                        "next offset it writes; a query's PROCESSED TO: the next offset per partition it reads."]


def _offsets(by_partition: dict | None) -> str | None:
    if by_partition is None:
        return None
    return " ".join(f"{p}:{o}" for p, o in sorted((int(p), o) for p, o in by_partition.items())) or "(no topic)"
