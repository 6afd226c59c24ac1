"""The log every query reads: one interface, two implementations, chosen by `EVENTIDE_LOG`.

- unset or `landing`: the embedded landing log (landing.py): one folder of immutable Parquet segments
  per sequence group under `<home>/landing`, sequence numbers stamped by the writer.
- `kafka://HOST:PORT[,HOST:PORT...][/PREFIX]`: Apache Kafka (kafka_log.py): one topic of one partition
  per sequence group (named after it, PREFIX first); a message's offset is its place in the group's
  one order.

Everything outside this package asks `open_log(settings)` and never looks at which one it got:

- writing (the gateway, `eventide ingest`, quarantine replay): `Log.writer()` -> `LogWriter`;
- reading (every query's source): `Log.source(spark, plan)`, a streaming DataFrame in the landing
  columns (LANDING_DDL: stream, seq, receive_time, connection, payload, landing_error);
- deciding without Spark whether a query has work (`Log.caught_up`), and how far it has got
  (`Log.status`, for `eventide status`);
- the log's own upkeep under `serve` (`Log.upkeep`: the landing archives what every query committed).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import pyarrow as pa

from transforms.settings import ConfigError, Settings

LANDING_DDL = (
    "stream string, seq long, receive_time timestamp, connection string, payload binary, landing_error string"
)

LANDING_SCHEMA = pa.schema(
    [
        ("stream", pa.string()),
        ("seq", pa.int64()),
        ("receive_time", pa.timestamp("us", tz="UTC")),
        ("connection", pa.string()),
        ("payload", pa.binary()),
        # Set when the gateway itself could not frame the input (oversized or partial frame).
        ("landing_error", pa.string()),
    ]
)


class LogWriteError(ConnectionError):
    """The log did not take what was written (Kafka did not acknowledge it); the message says what to do."""


class LogUnavailable(ConfigError):
    """The configured log cannot be reached at start; the message names the address and what to run."""


@dataclass
class LogStatus:
    """One log (a sequence group) as `eventide status` shows it. Landing: closed segments, their
    messages and last sequence, and the messages still in open journals. Kafka: the topic, its end
    offset (the next offset to be written) and the messages it holds; `error` when it cannot be read."""

    log: str
    streams: list[str]
    kind: str = "landing"
    segments: int = 0
    messages: int = 0
    last_seq: int | None = None
    open: int = 0
    open_last_seq: int | None = None
    topic: str | None = None
    end_offset: int | None = None
    error: str | None = None


@dataclass
class Progress:
    """How far one query has got in its log, read from its checkpoint without Spark."""

    last_committed_batch: int | None = None
    processed_segments: int = 0
    processed_last_seq: int | None = None
    lag_messages: int = 0
    oldest_unprocessed_us: int | None = None  # receive time of the oldest message not processed
    processed_offset: int | None = None  # Kafka: the next offset the query reads (None: landing)


class LogWriter(ABC):
    """Appends messages to the log. One per process and thread: not thread-safe.

    The gateway calls `sync` after each chunk it reads and `tick` every few milliseconds; it confirms a
    connection (0x06) once `unconfirmed(connection)` is 0 and `failure(connection)` is None, and closes
    it unconfirmed when `failure` says why."""

    messages_landed: int = 0

    @abstractmethod
    def append(self, stream: str, payload: bytes, connection: str = "", error: str | None = None) -> None:
        """Write one message (or, with `error`, one quarantined piece of input the gateway could not frame)."""

    def append_many(self, stream: str, payloads, connection: str = "") -> None:
        """Write messages (a list of bytes or a pyarrow binary array) in order, as `append` one by one
        would; a log may do it in bulk (files)."""
        for payload in payloads.to_pylist() if hasattr(payloads, "to_pylist") else payloads:
            self.append(stream, payload, connection)

    def append_received(self, stream: str, payloads: list[bytes], connection: str = "") -> None:
        """Write the messages of one read from a connection, in order, as `append` one by one would; a log
        may do it in one go (landing: one journal write and one receive time for all of them)."""
        for payload in payloads:
            self.append(stream, payload, connection)

    @abstractmethod
    def sync(self) -> None:
        """Cheap, after each chunk: push what was appended towards durability (landing: to the OS)."""

    @abstractmethod
    def tick(self) -> None:
        """Periodic work (landing: close due segments; Kafka: serve delivery reports)."""

    def unconfirmed(self, connection: str) -> int:
        """Messages of `connection` the log has not yet acknowledged (0: all of them are durable)."""
        return 0

    def failure(self, connection: str) -> str | None:
        """Why some message of `connection` will never be acknowledged, or None."""
        return None

    def forget(self, connection: str) -> None:
        """The connection is done: drop what is kept about it."""
        return None

    @abstractmethod
    def flush(self) -> None:
        """Make everything appended so far durable and visible to the queries; LogWriteError if it is not."""

    @abstractmethod
    def close(self) -> None:
        """Flush and release the log."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Kafka's maxOffsetsPerTrigger: a backlog is read in batches of at most this many messages.
MAX_OFFSETS_PER_TRIGGER = 500_000


def messages_per_trigger(settings: Settings, messages_as_objects: bool) -> int | None:
    """The messages a micro-batch of a query may hold, or None for no such bound: a query whose messages
    travel as Python objects (envelope mode) is bounded by `max_messages_per_trigger` (0: off). Each log
    applies it in its own unit (landing.bytes_per_trigger, offsets_per_trigger)."""
    bound = settings.max_messages_per_trigger
    return bound if messages_as_objects and bound else None


def offsets_per_trigger(settings: Settings, messages_as_objects: bool) -> int:
    """A Kafka-read query's messages per micro-batch: MAX_OFFSETS_PER_TRIGGER, or the message bound
    (messages_per_trigger) if it is lower: Kafka counts offsets, one per message."""
    bound = messages_per_trigger(settings, messages_as_objects)
    return min(MAX_OFFSETS_PER_TRIGGER, bound) if bound else MAX_OFFSETS_PER_TRIGGER


class Log(ABC):
    kind: str

    def __init__(self, settings: Settings):
        self.settings = settings

    @abstractmethod
    def describe(self) -> str:
        """Where messages go, for the user ("the landing folder /x/landing", "Kafka at 127.0.0.1:9092")."""

    def check(self) -> None:
        """Raise LogUnavailable (naming the address and what to run) if the log cannot be used now."""
        return None

    @abstractmethod
    def writer(self) -> LogWriter:
        """A writer of every group's log (the landing's raises LandingBusy while another process holds it)."""

    @abstractmethod
    def source(self, spark, plan):
        """The streaming DataFrame of the plan's group, in LANDING_DDL's columns (every stream of the group)."""

    @abstractmethod
    def is_source(self, description: str) -> bool:
        """Whether a source of a query's progress report (its `description`) is this log."""

    @abstractmethod
    def caught_up(self, plan) -> bool:
        """Whether the plan's last committed batch read everything in its log (no Spark)."""

    @abstractmethod
    def position(self, group: str):
        """An opaque mark of how far the group's log has been written now, for `reached`."""

    @abstractmethod
    def mark(self, group: str) -> str | None:
        """A short text that changes whenever the group's log has grown (None: nothing in it yet), for
        a sensor's cursor: the landing's newest live segment, Kafka's end offset."""

    @abstractmethod
    def reached(self, plan, position) -> bool:
        """Whether the plan's committed batches have read everything up to `position`."""

    @abstractmethod
    def status(self, plans: list, now: float) -> tuple[list[LogStatus], dict[str, Progress]]:
        """Every registered log's status, and each plan's progress (by plan name)."""

    @abstractmethod
    def format_logs(self, logs: list[LogStatus]) -> list[str]:
        """The logs as lines of a table, for `eventide status`."""

    @abstractmethod
    def read(self, group: str, columns: list[str] | None = None):
        """Every message of the group's log so far, in order, as an Arrow table of LANDING_DDL's columns
        (only `columns`, if given)."""

    @abstractmethod
    def payloads_for(self, group: str, seqs: list[int]) -> dict[int, bytes]:
        """The payloads of these sequence numbers of the group's log."""

    def upkeep(self, plans: list) -> int:
        """The log's own upkeep under `serve` (what every query committed); returns how much it did."""
        return 0

    def source_outgrown(self, plan) -> bool:
        """Whether the plan's running query was set up to read more than it still may (the landing: it
        lists the archive, and has read all of it), so that a restart would let the log's upkeep go on."""
        return False


def grid(headers: list[str], rows: list[list], left: tuple[int, ...] = (0,)) -> list[str]:
    """Columns padded to their widest cell; the columns at `left` left-aligned, the rest (numbers) right."""
    cells = [headers] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) if i in left else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in cells]
