"""The two write paths give the same tables: executors staging Parquet files that the driver commits
(the default) against the whole batch collected and written on the driver (the reference form).
Real Spark, real Delta, every kind of sink: appends (object, direct and inferred schemas, partitioned
by awkward values), upserts, TCP and quarantine."""

import dataclasses
import datetime as dt
import math
from pathlib import Path

import pyarrow as pa

from examples.logs import log_app
from examples.market import market_app
from examples.market_decoder import MarketData, Order, encode_market_data, encode_order, parse_order_result
from examples.words import word_count
from transforms import lake
from transforms.api import Application, DeltaSink, computation, decoder, source
from transforms.settings import Settings
from transforms.testing import run_app

DATA = Path(__file__).resolve().parents[2] / "data" / "wallaroo"
T0 = dt.datetime(2024, 1, 2, 9, 30, tzinfo=dt.timezone.utc)


def _canonical(t: pa.Table) -> list[tuple]:
    """The rows in a fixed order, without wall-clock times (each run lands and decides anew)."""
    t = t.drop_columns([c for c in ("receive_time", "decision_time") if c in t.column_names])

    def norm(v):
        return "nan" if isinstance(v, float) and math.isnan(v) else v
    return sorted(tuple(sorted((k, repr(norm(v))) for k, v in r.items())) for r in t.to_pylist())


def _both_paths(app, messages, spark, tcp_message=lambda m: m, **settings) -> tuple:
    results = [run_app(app, messages, settings=Settings(write_path=path, **settings), spark=spark, keep=True)
               for path in ("executor", "driver")]
    for name in results[1].tables:
        assert _canonical(results[0].tables[name]) == _canonical(results[1].tables[name]), name
    assert {k: [tcp_message(m) for m in v] for k, v in results[0].tcp.items()} == {
        k: [tcp_message(m) for m in v] for k, v in results[1].tcp.items()}
    assert results[0].quarantine == results[1].quarantine
    return results


@decoder(schema=pa.schema([("sensor", pa.string()), ("celsius", pa.float64())]))
def reading(payload: bytes) -> dict:
    sensor, celsius = payload.decode().split(",")
    return {"sensor": sensor, "celsius": float(celsius)}


@computation("mark hot")
def mark_hot(r: dict) -> dict:
    return {**r, "hot": r["celsius"] > 5}


def _readings() -> list[bytes]:
    return [f"{s},{i / 4}".encode() for i, s in enumerate(["a b", "x:y%/=z", "ü", "plain"] * 30)] + [b"broken"]


def test_word_count_both_paths(spark):
    lines = (DATA / "word_count" / "count_this.txt").read_text().splitlines()[:200] + [b"\xff\xfe bad utf-8"]
    executor, _ = _both_paths(word_count, {"text": lines}, spark)
    assert executor.tables["word_totals"].num_rows > 100 and executor.quarantine


def test_market_both_paths(spark):
    msgs = []
    for i in range(300):
        sym = f"S{i % 40:03d}"
        msgs.append(("market_data", encode_market_data(MarketData(sym, T0, 10.0, 10.0 + (i % 7) / 100))))
        msgs.append(("orders", encode_order(Order(1 + i % 2, i, f"O{i:05d}", sym, 100.0, 10.0, T0))))
    msgs.append(("orders", b"garbage"))
    executor, _ = _both_paths(market_app, msgs, spark,
                              tcp_message=lambda m: dataclasses.replace(parse_order_result(m), timestamp=0))
    assert executor.tables["order_rejections"].num_rows and executor.tables["market_state"].num_rows == 40


def test_log_windows_both_paths(spark):
    lines = (DATA / "log_windowing" / "day_1.log").read_bytes().splitlines()[:400] + [b"END_OF_DAY", b"not a log line"]
    executor, _ = _both_paths(log_app, {"logs": lines}, spark)
    assert executor.tables["log_windows"].num_rows


def test_direct_and_inferred_partitioned_appends_both_paths(spark):
    direct = Application("direct", source("temps", decoder=reading).to_sink(
        DeltaSink("temps_direct", schema=reading.schema, partition_by=("sensor",))))
    executor, driver = _both_paths(direct, {"temps": _readings()}, spark, spark_shuffle_partitions=3)
    assert executor.tables["temps_direct"].num_rows == 120 and len(executor.quarantine) == 1
    inferred = Application("inferred", source("temps", decoder=reading).to(mark_hot)
                           .to_sink(DeltaSink("temps_inferred", partition_by=("sensor",))))
    executor, _ = _both_paths(inferred, {"temps": _readings()}, spark)
    files = list((executor.home / "lake" / "temps_inferred").rglob("eventide-*.parquet"))
    assert files, "the executor path wrote the files itself"
    assert {p.parent.name for p in files} == {"sensor=a%20b", "sensor=x%3Ay%25%2F%3Dz", "sensor=%C3%BC", "sensor=plain"}
    assert sorted(lake.read(executor.home / "lake" / "temps_inferred", "sensor = 'x:y%/=z'").column("celsius").to_pylist())[:2] == [0.25, 1.25]


def test_a_replayed_batch_commits_nothing_twice_and_leaves_no_file(spark, tmp_path):
    """A batch whose commit was lost (the process died after the executors wrote) is replayed by Spark:
    the journal deletes the first attempt's files, and the replay commits the batch once."""
    from transforms.engine.staging import StagingJournal

    app = Application("direct", source("temps", decoder=reading).to_sink(DeltaSink("t", schema=reading.schema)))
    result = run_app(app, {"temps": _readings()}, settings=Settings(), spark=spark, keep=True)
    settings = dataclasses.replace(Settings(), home=result.home)
    table = settings.table_path("t")
    (plan_ckpt,) = list(settings.checkpoints.glob("direct/v*"))
    # What a died attempt leaves: its journal entry and files no commit refers to.
    orphan = table / "eventide-deadbeef-b0-t0-a0-x-0.parquet"
    orphan.write_bytes((next(table.glob("eventide-*.parquet"))).read_bytes())
    StagingJournal(plan_ckpt).open("deadbeef", 0, [str(table)])
    assert StagingJournal(plan_ckpt).recover() == 1 and not orphan.exists()
    assert lake.count(table) == 120

