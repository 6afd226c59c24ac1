"""Test an application: run it on a few messages on real Spark and look at what it wrote.

In the spirit of Bytewax's `testing` module and Spark's `TwsTester`, but nothing is simulated:
`run_app` lands the messages in a temporary home exactly as the gateway would, runs the app with
`run_application` (the engine's own path: decoders, keyed state in RocksDB, Delta sinks, quarantine),
listens on a real TCP socket for each of its TCP sinks, and hands back what came out::

    from dataclasses import dataclass
    import struct

    from transforms.api import Application, DeltaSink, decoder, source, state_computation
    from transforms.testing import run_app

    @dataclass
    class Reading:
        sensor: str
        celsius: float

    @decoder
    def decode(payload: bytes) -> Reading:
        sensor, celsius = struct.unpack(">4sd", payload)
        return Reading(sensor.decode(), celsius)

    class Peak:
        def __init__(self):
            self.celsius = float("-inf")

    @state_computation("peak", state=Peak)
    def peak(r: Reading, state: Peak):
        state.celsius = max(state.celsius, r.celsius)
        return {"sensor": r.sensor, "peak": state.celsius}

    app = Application("peaks", source("temps", decoder=decode).key_by("sensor").to(peak)
                      .to_sink(DeltaSink("peaks", mode="upsert", keys=("sensor",))))

    def test_peaks(spark):  # any SparkSession; default: the process's shared one
        result = run_app(app, {"temps": [struct.pack(">4sd", b"s001", 20.5), b"garbage"]}, spark=spark)
        assert result.outputs("peaks") == [{"sensor": "s001", "peak": 20.5}]
        assert result.quarantine[0]["payload"] == b"garbage"

Messages: `{stream: [payload, ...]}` (each stream's payloads in order, the streams one after the
other), or `[(stream, payload), ...]` for an explicit arrival order across streams (streams merged into
one keyed state see each other's messages in that order). Payloads are bytes, or str (UTF-8), without
the Wallaroo length header.

An app defined in a test file runs the same way; its functions travel to Spark's Python workers by
value, so what they use must pickle (a `struct` format string, not a `struct.Struct`).

An app that reads a Kafka topic (`kafka_source`) or writes one (`KafkaSink`) needs a broker: pass
`kafka="HOST:PORT"` (in this repository's tests, the `broker` fixture of
tests/transforms/ingestion/conftest.py; elsewhere `transforms.kafka_broker.start_broker`, or any broker the
test may create topics on). Each kafka_source stream's messages are then produced, in the given order, to a
fresh topic of one partition there, which the app reads instead of its own (a message may be a `(key,
value)` pair: the record's key); each Kafka sink produces to a fresh topic there, and its records (as a
`read_committed` consumer sees them) are its outputs: `result.outputs(name)` the values,
`result.kafka[name]` the (key, value) pairs. The app's own topics are never touched.

Each run has its own home: fresh landing log, checkpoints, state and tables (and fresh topics), so runs
never see each other's messages. A plan error (a bad pipeline) or a user function's error under `fail_fast=True`
propagates unchanged.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from transforms import lake
from transforms.api import Application, DeltaSink, KafkaSink, KafkaTopic, Merged, Pipeline, TCPSink
from transforms.ports import LOOPBACK
from transforms.settings import Settings

CONNECTION = "run_app"  # the landing `connection` of every message run_app lands
QUARANTINE_COLUMNS = ("stream", "seq", "step", "reason", "payload")

Payload = bytes | str | tuple[bytes | str | None, bytes | str]  # a pair: (key, value) of a Kafka record
Messages = Mapping[str, Iterable[Payload]] | Iterable[tuple[str, Payload]]


@dataclass
class AppResult:
    """What a run of `run_app` wrote.

    `tables`: each Delta sink's table (append tables in output order: by `seq`, `part` when the table
    has them, else as stored; upsert tables sorted by their keys). `tcp`: each TCP sink's messages as
    its encoder produced them, in send order. `quarantine`: the messages that failed, in sequence order.
    """

    tables: dict[str, pa.Table]
    tcp: dict[str, list[bytes]]
    quarantine: list[dict]
    reports: list = field(default_factory=list)  # the engine's RunReport per query
    home: Path | None = None  # the run's home, kept only with keep=True
    kafka: dict[str, list[tuple[bytes | None, bytes]]] = field(default_factory=dict)  # Kafka sink: (key, value)s

    def outputs(self, name: str) -> list:
        """A sink's outputs by name: a Delta sink's rows (dicts), or a TCP or Kafka sink's messages (bytes)."""
        if name in self.tables:
            return self.tables[name].to_pylist()
        if name in self.tcp:
            return list(self.tcp[name])
        if name in self.kafka:
            return [value for _, value in self.kafka[name]]
        known = sorted(self.tables) + sorted(self.tcp) + sorted(self.kafka)
        raise KeyError(f"no sink {name!r} in this run; its sinks are: {', '.join(known) or 'none'}")


def run_app(app: Application, messages: Messages, settings: Settings | None = None, spark=None,
            pipeline: int | str | None = None, keep: bool = False, kafka: str | None = None,
            close_windows: bool = False) -> AppResult:
    """Land `messages`, run `app` on them (all of them, trigger availableNow) and return its outputs.

    `settings`: options for the run (e.g. `fail_fast=True`); its home and registered apps are replaced
    by a temporary home and `app` itself. `spark`: the SparkSession (default: the process's shared one).
    `pipeline`: run only this pipeline of `app` (its index, or the name given with `.named(...)`).
    `keep=True`: keep the temporary home (`result.home`) to look at afterwards. `kafka`: a broker
    ("HOST:PORT") for an app with a kafka_source or a KafkaSink (see the module's docstring); without it
    such a source stops the run with a ValueError saying so. `close_windows=True`: close every open
    window at the end, as `eventide run --close-windows` does (reason `end_of_input`).
    """
    from transforms.engine import QUARANTINE_TABLE, run_application
    from transforms.registry import registry_of

    if not isinstance(app, Application):
        raise TypeError(f"run_app: expected an Application, got {type(app).__name__}")
    run_id = uuid.uuid4().hex[:8]
    app, topics = _on_fresh_topics(app, kafka, run_id)
    target = _select(app, pipeline)
    pairs = _normalize(messages, target, set(topics))
    landed = [(stream, payload) for stream, payload in pairs if stream not in topics]
    # The whole app is registered, so a stream declared by one pipeline is known to all of them.
    registry = registry_of([app])
    home = Path(tempfile.mkdtemp(prefix=f"eventide-{app.name}-"))
    base = settings if settings is not None else Settings()
    run_settings = dataclasses.replace(base, home=home, app_registry=registry, log="landing",
                                       close_windows=close_windows or base.close_windows)  # in-memory messages: the embedded log
    listeners: dict[str, _Listener] = {}
    try:
        _land(run_settings, landed)
        if topics:
            _produce(kafka, topics, [(stream, payload) for stream, payload in pairs if stream in topics])
        if spark is None:
            spark = _shared_spark(run_settings)
        listeners = {s.name: _Listener() for s in target.sinks() if isinstance(s, TCPSink)}
        sink_topics = ({s.name: f"run_app.{_topic_part(s.name)}.{run_id}" for s in target.sinks()
                        if isinstance(s, KafkaSink)} if kafka else {})
        reports = run_application(spark, _framing_every_tcp_sink(target), run_settings,
                                  tcp_addresses={**{n: lst.address for n, lst in listeners.items()},
                                                 **{n: f"kafka://{kafka}/{t}" for n, t in sink_topics.items()}})
        tcp = {n: lst.messages() for n, lst in listeners.items()}
        records = {n: committed_records(kafka, t) for n, t in sink_topics.items()}
        tables = {s.table: _read_sink(run_settings, s) for s in target.sinks() if isinstance(s, DeltaSink)}
        qpath = run_settings.table_path(QUARANTINE_TABLE)
        quarantine = []
        if lake.exists(qpath):
            rows = lake.read(qpath, columns=QUARANTINE_COLUMNS).sort_by([("seq", "ascending")])
            quarantine = rows.to_pylist()
        return AppResult(tables, tcp, quarantine, reports, home if keep else None, records)
    finally:
        for lst in listeners.values():
            lst.close()
        if not keep:
            shutil.rmtree(home, ignore_errors=True)


# -- the pieces ---------------------------------------------------------------------------------------
def _select(app: Application, pipeline: int | str | None) -> Application:
    """The app, or a sub-application with just one of its pipelines."""
    if pipeline is None:
        return app
    pipes = app.pipelines
    if isinstance(pipeline, int) and not isinstance(pipeline, bool):
        if not -len(pipes) <= pipeline < len(pipes):
            raise ValueError(f"run_app: app {app.name!r} has {len(pipes)} pipeline(s), no pipeline={pipeline}")
        chosen = pipes[pipeline]
    else:
        named = [p for p in pipes if isinstance(p, Pipeline) and p.name == pipeline]
        if not named:
            listing = ", ".join(f"{i}: {_describe(p)}" for i, p in enumerate(pipes))
            raise ValueError(f"run_app: app {app.name!r} has no pipeline named {pipeline!r}; its pipelines: "
                             f"{listing} (pass the index, or name one with .named(...))")
        chosen = named[0]
    return Application(app.name, chosen, generation=app.generation, description=app.description,
                       quarantine_landing_errors=app.quarantine_landing_errors)


def _describe(p: Pipeline | Merged) -> str:
    if isinstance(p, Merged):
        return "merge(" + ", ".join(b.stream for b in p.branches) + ")"
    return f"{p.name!r} on {p.stream!r}" if p.name else f"on {p.stream!r}"


def _normalize(messages: Messages, app: Application, kafka_streams: set[str] = frozenset()) -> list[tuple[str, Any]]:
    """(stream, payload bytes) in arrival order, (stream, (key bytes | None, value bytes)) for a record of a
    kafka_source stream given as a pair; TypeError/ValueError on anything else."""
    if isinstance(messages, Mapping):
        pairs = []
        for stream, payloads in messages.items():
            if isinstance(payloads, (bytes, bytearray, str)) or not isinstance(payloads, Iterable):
                raise TypeError(f"run_app: messages[{stream!r}] must be a list of payloads, "
                                f"got {type(payloads).__name__}")
            pairs.extend((stream, p) for p in payloads)
    elif isinstance(messages, (bytes, bytearray, str)) or not isinstance(messages, Iterable):
        raise TypeError("run_app: messages are {stream: [payload, ...]} or [(stream, payload), ...], "
                        f"got {type(messages).__name__}")
    else:
        pairs = []
        for i, item in enumerate(messages):
            if not (isinstance(item, tuple) and len(item) == 2):
                raise TypeError(f"run_app: message {i} is {item!r}; expected a (stream, payload) tuple")
            pairs.append(item)
    streams = app.streams()
    out = []
    for i, (stream, payload) in enumerate(pairs):
        if stream not in streams:
            raise ValueError(f"run_app: app {app.name!r} reads no stream {stream!r} (message {i}); "
                             f"it reads: {', '.join(streams)}")
        if isinstance(payload, tuple) and stream in kafka_streams:
            if len(payload) != 2:
                raise TypeError(f"run_app: message {i} on {stream!r} is a tuple of {len(payload)}; a Kafka record is "
                                "a (key, value) pair")
            key, value = (_as_bytes(v, i, stream) if v is not None else None for v in payload)
            if value is None:
                raise TypeError(f"run_app: message {i} on {stream!r} has no value; a Kafka record is (key, value)")
            out.append((stream, (key, value)))
            continue
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        elif isinstance(payload, (bytearray, memoryview)):
            payload = bytes(payload)
        elif not isinstance(payload, bytes):
            raise TypeError(f"run_app: message {i} on {stream!r} is a {type(payload).__name__}; "
                            "payloads are bytes or str")
        out.append((stream, payload))
    return out


def _as_bytes(v, i: int, stream: str) -> bytes:
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"run_app: message {i} on {stream!r}: a Kafka record's key and value are bytes or str, "
                    f"got {type(v).__name__}")


def _topic_part(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _on_fresh_topics(app: Application, kafka: str | None, run_id: str) -> tuple[Application, dict[str, str]]:
    """The app with each kafka_source reading a fresh topic of this run on `kafka`, and those topics by
    stream; ValueError naming the stream and topic when the app reads Kafka and no broker is given."""
    sourced = [b for b in app.sources() if b.origin is not None]
    if not sourced:
        return app, {}
    if not kafka:
        b = sourced[0]
        raise ValueError(
            f"run_app: app {app.name!r} reads stream {b.stream!r} from Kafka topic {b.origin.topic!r} (kafka_source): "
            "pass kafka='HOST:PORT' of a broker run_app may create topics on (in tests, e.g. the `broker` fixture "
            "of tests/transforms/ingestion/conftest.py or transforms.kafka_broker.start_broker); the messages are "
            "produced to a fresh topic there, the app's own topic is not touched"
        )
    topics = {b.stream: f"run_app.{_topic_part(app.name)}.{b.stream}.{run_id}" for b in sourced}

    def fresh(p):
        if isinstance(p, Pipeline) and p.origin is not None:
            return dataclasses.replace(p, origin=KafkaTopic(topics[p.stream], kafka, "earliest"))
        return p

    return (Application(app.name, *map(fresh, app.pipelines), generation=app.generation, description=app.description,
                        quarantine_landing_errors=app.quarantine_landing_errors), topics)


def _produce(servers: str, topics: dict[str, str], records: list[tuple[str, Any]]) -> None:
    """Each record to its stream's topic (made here, one partition: the given order), all acknowledged."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": servers})
    for done in admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1)
                                     for t in topics.values()]).values():
        done.result(30)
    producer = Producer({"bootstrap.servers": servers, "acks": "all", "enable.idempotence": True})
    for stream, payload in records:
        key, value = payload if isinstance(payload, tuple) else (None, payload)
        producer.produce(topics[stream], key=key, value=value)
    if producer.flush(30):
        raise RuntimeError(f"run_app: Kafka at {servers} did not acknowledge every message in 30 s")


def committed_records(servers: str, topic: str, isolation: str = "read_committed") -> list[tuple[bytes | None, bytes]]:
    """Every (key, value) record of a topic a consumer with `isolation` sees (read_committed: what a Kafka
    sink committed), in offset order per partition, partitions in turn ([] if there is no such topic)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"run_app-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": isolation})
    try:
        meta = consumer.list_topics(topic, timeout=30).topics.get(topic)
        partitions = sorted(meta.partitions) if meta is not None and meta.error is None else []
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        got: dict[int, list] = {p: [] for p in partitions}
        ended: set[int] = set()
        while len(ended) < len(partitions):
            msg = consumer.poll(30.0)
            if msg is None:
                raise RuntimeError(f"run_app: Kafka sink topic {topic!r} at {servers} was not read to its end in 30 s")
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"run_app: reading Kafka sink topic {topic!r} at {servers}: {msg.error()}")
                ended.add(msg.partition())
                continue
            got[msg.partition()].append((msg.key(), msg.value()))
        return [r for p in partitions for r in got[p]]
    finally:
        consumer.close()


def _land(settings: Settings, messages: list[tuple[str, bytes]]) -> None:
    from transforms.ingestion.landing import Lander

    with Lander(settings) as lander:  # closing it closes the segments: the queries see every message
        for stream, payload in messages:
            lander.append(stream, payload, CONNECTION)


_spark_home: Path | None = None


def _shared_spark(settings: Settings):
    """The process's Spark session; if this starts it, its logs go to a folder that outlives the run."""
    global _spark_home
    from transforms.spark import get_spark

    if _spark_home is None:
        _spark_home = Path(tempfile.mkdtemp(prefix="eventide-testing-spark-"))
    return get_spark(dataclasses.replace(settings, home=_spark_home))


def _framing_every_tcp_sink(app: Application) -> Application:
    """The app with each TCP sink framed: on the wire an unframed sink's messages run together, and
    the helper returns them one by one. The encoder's bytes are the same; only the header is added."""

    def framed(sinks: tuple) -> tuple:
        return tuple(dataclasses.replace(s, framed=True) if isinstance(s, TCPSink) else s for s in sinks)

    pipes = [dataclasses.replace(p, sinks=framed(p.sinks)) for p in app.pipelines]
    return Application(app.name, *pipes, generation=app.generation, description=app.description,
                       quarantine_landing_errors=app.quarantine_landing_errors)


def _read_sink(settings: Settings, sink: DeltaSink) -> pa.Table:
    path = settings.table_path(sink.table)
    if not lake.exists(path):  # no output reached it
        return sink.schema.empty_table() if sink.schema is not None else pa.table({})
    table = lake.read(path)
    if sink.mode == "upsert":
        order = list(sink.keys)
    else:
        order = [c for c in ("seq", "part") if c in table.column_names]
    return table.sort_by([(c, "ascending") for c in order]) if order and table.num_rows else table


class _Listener:
    """A TCP sink's receiver on 127.0.0.1: accepts the engine's connections one after another (one per
    query, opened on its first output, closed when the query ends) and keeps every byte."""

    def __init__(self):
        self.server = socket.create_server((LOOPBACK, 0))
        self.server.settimeout(0.1)
        self.address = f"{LOOPBACK}:{self.server.getsockname()[1]}"
        self.data = bytearray()
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, name=f"run_app-listener-{self.address}", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while True:
                try:
                    conn, _ = self.server.accept()
                except TimeoutError:
                    # The engine has closed its connections when `done` is set; one still waiting in
                    # the backlog is accepted before the timeout, so stopping here loses nothing.
                    if self.done.is_set():
                        return
                    continue
                with conn:
                    conn.settimeout(None)
                    while chunk := conn.recv(65536):
                        self.data += chunk
        except BaseException as e:  # reported by messages()
            self.error = e

    def messages(self, timeout: float = 30.0) -> list[bytes]:
        """Every message received, framing stripped (the run has ended: its connections are closed)."""
        from transforms.ingestion.framing import DEFAULT_FRAMING

        self.done.set()
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise RuntimeError(f"run_app: the TCP sink at {self.address} still has a connection open after the run")
        if self.error is not None:
            raise RuntimeError(f"run_app: receiving on {self.address} failed: {self.error}") from self.error
        return DEFAULT_FRAMING.split(bytes(self.data))

    def close(self) -> None:
        self.done.set()
        self.server.close()
