"""Kafka as an app's source (issue K, item 3): the example of docs/kafka.md (a topic of two partitions ->
a running volume per symbol -> a Kafka sink) run as written, against a real broker (`eventide kafka`) and
real Spark: each record once, each key in its partition's order, the key, partition, offset and timestamp
a state computation gets from `kafka_record(ctx)` exactly the record's, a bad record in quarantine with its
exact bytes (also when a later step failed), and a second run reads only what is new. No mocks."""

from __future__ import annotations

import re
import time
import uuid

import pytest

from tests.conftest import REPO
from transforms import lake
from transforms.api import kafka_position
from transforms.engine import QUARANTINE_TABLE, nothing_new, plan_queries, run_application
from transforms.testing import committed_records

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def readme_example(servers: str, trades: str, volumes: str) -> dict:
    """The example of docs/kafka.md (section "Kafka as a source and a sink"), run as a script with the broker's
    address and this test's topics."""
    text = (REPO / "docs" / "kafka.md").read_text().split("## Kafka as a source and a sink", 1)[1]
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    code = code.replace("127.0.0.1:9092", servers).replace('topic="trades"', f'topic="{trades}"')
    code = code.replace('topic="volumes"', f'topic="{volumes}"')
    scope = {"__name__": "__main__"}  # a script's functions travel to Spark's workers by value
    exec(compile(code, "docs/kafka.md", "exec"), scope)
    return scope


# The records' own timestamps: this plus their index. Recent: the broker deletes records whose timestamps are
# older than its retention (7 days), and then a reader finds its offsets out of range.
TIMESTAMP_MS = (int(time.time()) - 3600) * 1000


def produce(servers: str, topic: str, records: list[tuple[str, bytes]], partitions: int = 2) -> dict[bytes, tuple]:
    """Produce the records with timestamps of their own; each value's (key, partition, offset, timestamp ms)
    as Kafka acknowledged it."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": servers})
    if topic not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": servers, "acks": "all", "enable.idempotence": True})
    where = {}

    def delivered(err, msg):
        assert err is None, err
        where[msg.value()] = (msg.key().decode(), msg.partition(), msg.offset(), msg.timestamp()[1])

    for i, (key, value) in enumerate(records):
        producer.produce(topic, key=key.encode(), value=value, timestamp=TIMESTAMP_MS + i, on_delivery=delivered)
    assert producer.flush(30) == 0
    return where


def test_the_readme_example_reads_a_topic_of_two_partitions_and_writes_a_topic(spark, settings, broker):
    servers = broker.bootstrap_servers
    trades, volumes = f"trades-{uuid.uuid4().hex[:6]}", f"volumes-{uuid.uuid4().hex[:6]}"
    example = readme_example(servers, trades, volumes)
    app = example["app"]
    first = [("AA", b"AA,100"), ("BB", b"BB,5"), ("AA", b"AA,20"), ("CC", b"CC,x"), ("BB", b"BB,-1"),
             ("CC", b"CC,7"), ("AA", b"AA,1")]
    produced = produce(servers, trades, first)
    (plan,) = plan_queries(app, settings)
    assert plan.origin is not None and not nothing_new(plan, settings)
    run_application(spark, app, settings)
    assert nothing_new(plan, settings)  # the checkpoint's offsets reach the topic's end

    def volumes_by_symbol() -> dict[str, list[tuple[int, int, int]]]:
        got: dict[str, list] = {}
        for key, value in committed_records(servers, volumes):
            symbol, volume, record_key, at, ms = value.decode().split()
            assert key == symbol.encode()
            partition, offset = map(int, at.split(":"))
            got.setdefault(symbol, []).append((int(volume), partition, offset))
            records.append((record_key, partition, offset, int(ms)))
        return got

    records: list[tuple] = []
    out = volumes_by_symbol()
    assert {s: [v for v, _, _ in rows] for s, rows in out.items()} == {"AA": [100, 120, 121], "BB": [5], "CC": [7]}
    for rows in out.values():  # a key: one partition, in its offsets' order
        assert len({p for _, p, _ in rows}) == 1 and [o for _, _, o in rows] == sorted(o for _, _, o in rows)
    # kafka_record(ctx): each output's key, partition, offset and timestamp are its record's, as Kafka has them
    good = [b"AA,100", b"BB,5", b"AA,20", b"CC,7", b"AA,1"]
    assert sorted(records) == sorted(produced[v] for v in good)
    assert {r[3] for r in records} == {TIMESTAMP_MS + first.index((v.decode()[:2], v)) for v in good}

    # The bad records: the decoder's (`CC,x`) and the state computation's (`BB,-1`, quarantined after the
    # keyed step: its bytes read back from the topic), each with its exact value and its record's place.
    bad = {r["payload"]: r for r in lake.read(settings.table_path(QUARANTINE_TABLE)).to_pylist()}
    assert set(bad) == {b"CC,x", b"BB,-1"}
    assert bad[b"CC,x"]["step"] == "decoder decode_trade" and bad[b"BB,-1"]["step"] == "volume per symbol"
    assert "expected a quantity above 0, got -1" in bad[b"BB,-1"]["reason"]
    assert all(r["connection"] == r["payload"].decode()[:2] and r["stream"] == "trades" for r in bad.values())
    partition, offset = kafka_position(bad[b"BB,-1"]["seq"])
    assert partition == out["BB"][0][1] and offset > out["BB"][0][2]

    records.clear()
    more = produce(servers, trades, [("BB", b"BB,10"), ("DD", b"DD,3")])
    assert not nothing_new(plan, settings)
    run_application(spark, app, settings)  # only the new records
    out = volumes_by_symbol()
    assert {s: [v for v, _, _ in rows] for s, rows in out.items()} == {
        "AA": [100, 120, 121], "BB": [5, 15], "CC": [7], "DD": [3]}
    assert sorted(records) == sorted([*(produced[v] for v in good), *more.values()])


def test_a_kafka_source_is_not_merged_with_another_source(settings):
    from transforms.api import Application, merge

    example = readme_example("127.0.0.1:1", "a", "b")
    trades = example["kafka_source"]("trades", decoder=example["decode_trade"], topic="a", bootstrap="127.0.0.1:1")
    others = example["kafka_source"]("others", decoder=example["decode_trade"], topic="b", bootstrap="127.0.0.1:1")
    app = Application("both", merge(trades.key_by("symbol"), others.key_by("symbol")).to(example["add_trade"])
                      .to_sink(example["app"].pipelines[0].sinks[0]))
    with pytest.raises(ValueError, match="a Kafka topic has no one order with another source"):
        plan_queries(app, settings)


def test_run_app_feeds_a_kafka_source_from_a_fresh_topic_and_reads_back_the_kafka_sink(spark, broker):
    """run_app with kafka=HOST:PORT: the messages (a (key, value) pair for a keyed record) go to a fresh topic
    of one partition, the app reads that instead of its own, and the Kafka sink's committed records are its
    outputs; without a broker it says how to give one."""
    from transforms.testing import run_app

    app = readme_example("127.0.0.1:9", "not-touched-in", "not-touched-out")["app"]  # nothing listens there
    with pytest.raises(ValueError, match=r"reads stream 'trades' from Kafka topic 'not-touched-in' \(kafka_source\): "
                                         r"pass kafka='HOST:PORT'"):
        run_app(app, {"trades": ["AA,1"]}, spark=spark)

    before = time.time() * 1000
    result = run_app(app, {"trades": [("AA", "AA,100"), ("BB", b"BB,5"), ("AA", "AA,20"), ("CC", "CC,x")]},
                     spark=spark, kafka=broker.bootstrap_servers)
    after = time.time() * 1000
    got = [(key, value.decode().rsplit(" ", 1)) for key, value in result.kafka["volumes"]]
    assert [(key, text) for key, (text, _) in got] == [(b"AA", "AA 100 AA 0:0"), (b"BB", "BB 5 BB 0:1"),
                                                        (b"AA", "AA 120 AA 0:2")]
    assert all(before - 1000 <= int(ms) <= after for _, (_, ms) in got)  # the records' producer timestamps
    assert result.outputs("volumes") == [value for _, value in result.kafka["volumes"]]
    assert [(r["payload"], r["step"]) for r in result.quarantine] == [(b"CC,x", "decoder decode_trade")]
