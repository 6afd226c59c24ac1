"""A user's app with a kafka_source, registered with EVENTIDE_APPS, through the command line as any app
(issue K, item 3): `eventide apps` names the topic, `status` shows the query's lag against the topic's end
offsets (all of it before the run, 0 after), `run` processes it through Dagster (the topic is the app's
upstream asset: no landing, no bronze), `show` gives the exact table. A real broker, real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.services import clean_env
from tests.transforms.ingestion.test_kafka_source import TIMESTAMP_MS, produce

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

EVENTIDE = str(Path(sys.executable).parent / "eventide")

KTRADES_APP = '''
import pyarrow as pa

from transforms.api import Application, DeltaSink, decoder, kafka_record, kafka_source, state_computation


@decoder(schema=pa.schema([("symbol", pa.string()), ("qty", pa.int64())]))
def decode_trade(value: bytes) -> dict:
    symbol, qty = value.decode().split(",")
    return {{"symbol": symbol, "qty": int(qty)}}


class Volume:
    def __init__(self):
        self.qty = 0


@state_computation("volume per symbol", state=Volume)
def add_trade(trade: dict, volume: Volume, ctx) -> dict:
    volume.qty += trade["qty"]
    record = kafka_record(ctx)
    return {{"symbol": trade["symbol"], "volume": volume.qty, "key": record.key, "partition": record.partition,
            "offset": record.offset, "ms": record.timestamp_ms}}


app = Application(
    "ktrades",
    kafka_source("ktrades", decoder=decode_trade, topic={topic!r}, bootstrap={servers!r})
    .key_by("connection")
    .to(add_trade)
    .to_sink(DeltaSink("ktrade_volumes", mode="upsert", keys=["symbol"])),
)
'''


def _eventide(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = clean_env()
    env.update(EVENTIDE_HOME=str(folder / "home"), EVENTIDE_APPS="ktrades_app:app")
    done = subprocess.run([EVENTIDE, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"eventide {' '.join(args)}: {done.stdout}\n{done.stderr}"
    return done


def _query(folder: Path) -> tuple[dict, dict]:
    status = json.loads(_eventide(folder, "status", "--format", "json").stdout)
    (topic,) = [g for g in status["logs"] if g["kind"] == "kafka_source"]
    (query,) = [q for q in status["queries"] if q["app"] == "ktrades"]
    return topic, query


def test_an_app_with_a_kafka_source_runs_from_the_command_line(broker, tmp_path):
    servers, topic = broker.bootstrap_servers, f"ktrades-{uuid.uuid4().hex[:6]}"
    (tmp_path / "ktrades_app.py").write_text(textwrap.dedent(KTRADES_APP.format(topic=topic, servers=servers)))
    records = [("AA", b"AA,100"), ("BB", b"BB,5"), ("AA", b"AA,20"), ("CC", b"CC,7")]
    where = produce(servers, topic, records)

    listed = _eventide(tmp_path, "apps").stdout
    assert f"streams:    ktrades  Kafka topic {topic} at {servers}  decoder decode_trade" in listed, listed
    assert "tables:     ktrade_volumes  (upsert by symbol)" in listed, listed

    source, query = _query(tmp_path)  # nothing committed: everything from the earliest offsets is to read
    ends = {str(p): 0 for p in range(2)}
    for _, partition, offset, _ in where.values():
        ends[str(partition)] = max(ends[str(partition)], offset + 1)
    assert (source["topic"], source["bootstrap"], source["end_offsets"]) == (topic, servers, ends)
    assert (query["log"], query["lag_messages"], query["processed_offsets"]) == (f"kafka:{topic}", 4, None)
    assert query["oldest_unprocessed"] is not None

    ran = _eventide(tmp_path, "run")
    assert "checks: 0 passed, 0 failed" in ran.stdout, ran.stdout

    source, query = _query(tmp_path)
    assert (query["lag_messages"], query["processed_offsets"]) == (0, ends)
    assert source["messages"] == 4

    rows = [json.loads(line) for line in _eventide(tmp_path, "show", "ktrade_volumes", "--format", "json").stdout.splitlines()]
    final = {"AA": b"AA,20", "BB": b"BB,5", "CC": b"CC,7"}  # each symbol's last record
    expected = []
    for symbol, value in final.items():
        key, partition, offset, ms = where[value]
        expected.append({"symbol": symbol, "volume": {"AA": 120, "BB": 5, "CC": 7}[symbol], "key": key,
                         "partition": partition, "offset": offset, "ms": ms})
    assert sorted(rows, key=lambda r: r["symbol"]) == expected
    assert {r["ms"] for r in rows} <= {TIMESTAMP_MS + i for i in range(len(records))}


def test_the_kafka_topic_is_the_apps_upstream_asset(tmp_path, monkeypatch):
    """In Dagster's graph the kafka_source's topic is an external asset the app's table depends on; no
    landing or bronze asset is made for the stream."""
    from orchestration.definitions import build_definitions
    from transforms.registry import load_app, registry_of
    from transforms.settings import Settings

    (tmp_path / "ktrades_app.py").write_text(textwrap.dedent(KTRADES_APP.format(topic="trades", servers="127.0.0.1:1")))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = registry_of([load_app("ktrades_app:app")])
    graph = build_definitions(registry, Settings(home=tmp_path / "home")).resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"kafka_ktrades", "ktrade_volumes"} <= keys
    assert not {"landing_ktrades", "bronze_ktrades"} & keys
    table = graph.get(next(k for k in graph.get_all_asset_keys() if k.to_user_string() == "ktrade_volumes"))
    assert {k.to_user_string() for k in table.parent_keys} == {"kafka_ktrades"}
    source = graph.get(next(k for k in graph.get_all_asset_keys() if k.to_user_string() == "kafka_ktrades"))
    assert not source.is_materializable


def test_the_pipelines_sensor_follows_an_apps_own_topic(broker, tmp_path, monkeypatch, request):
    """Under the UI's daemon the pipelines start when a kafka_source's topic grows: once per growth."""
    import dagster as dg

    from orchestration.definitions import build_definitions
    from transforms.registry import load_app, registry_of
    from transforms.settings import Settings, reset_settings

    servers, topic = broker.bootstrap_servers, f"ktrades-{uuid.uuid4().hex[:6]}"
    # A module name of its own: another test of this process imported ktrades_app with another topic.
    (tmp_path / "ktrades_sensor_app.py").write_text(textwrap.dedent(KTRADES_APP.format(topic=topic, servers=servers)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("EVENTIDE_HOME", str(tmp_path / "home"))  # what the sensor's resource reads
    monkeypatch.setenv("EVENTIDE_APPS", "ktrades_sensor_app:app")
    reset_settings()
    request.addfinalizer(reset_settings)  # the cached settings go: the next test reads its own environment
    defs = build_definitions(registry_of([load_app("ktrades_sensor_app:app")]), Settings(home=tmp_path / "home"))
    sensor = defs.resolve_sensor_def("new_segments_sensor")
    resources = {"eventide": defs.resources["eventide"]}

    def tick(cursor=None):
        with dg.build_sensor_context(resources=resources, cursor=cursor) as ctx:
            return sensor(ctx), ctx.cursor

    produce(servers, topic, [("AA", b"AA,1")])
    request, cursor = tick()
    assert isinstance(request, dg.RunRequest) and request.tags["eventide/new_segments"] == "kafka:ktrades"
    assert isinstance(tick(cursor)[0], dg.SkipReason)  # nothing new since
    produce(servers, topic, [("BB", b"BB,2")])
    assert isinstance(tick(cursor)[0], dg.RunRequest)
