"""The write path on real Spark and real Delta: appends of decoded columns and of objects with an
inferred schema, partitioned by awkward values, and a replayed batch skipped by Delta itself."""

import datetime as dt
import math
from pathlib import Path

import pyarrow as pa

from tests.conftest import land
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


@decoder(schema=pa.schema([("sensor", pa.string()), ("celsius", pa.float64())]))
def reading(payload: bytes) -> dict:
    sensor, celsius = payload.decode().split(",")
    return {"sensor": sensor, "celsius": float(celsius)}


@computation("mark hot")
def mark_hot(r: dict) -> dict:
    return {**r, "hot": r["celsius"] > 5}


def _readings() -> list[bytes]:
    return [f"{s},{i / 4}".encode() for i, s in enumerate(["a b", "x:y%/=z", "ü", "plain"] * 30)] + [b"broken"]


def test_partitioned_appends_direct_and_inferred_read_back_exactly(spark):
    """A direct plan (decoded columns straight to Delta) and an inferred schema (objects), partitioned by
    awkward values: Spark's Delta writer writes them, delta-rs and Spark read the same rows back."""
    direct = Application("direct", source("temps", decoder=reading).to_sink(
        DeltaSink("temps_direct", schema=reading.schema, partition_by=("sensor",))))
    done = run_app(direct, {"temps": _readings()}, settings=Settings(spark_shuffle_partitions=3), spark=spark, keep=True)
    assert done.tables["temps_direct"].num_rows == 120 and len(done.quarantine) == 1
    inferred = Application("inferred", source("temps", decoder=reading).to(mark_hot)
                           .to_sink(DeltaSink("temps_inferred", partition_by=("sensor",))))
    result = run_app(inferred, {"temps": _readings()}, spark=spark, keep=True)
    path = result.home / "lake" / "temps_inferred"
    assert _canonical(result.tables["temps_inferred"].drop_columns(["hot"])) == _canonical(done.tables["temps_direct"])
    assert {r["sensor"] for r in lake.read(path).to_pylist()} == {"a b", "x:y%/=z", "ü", "plain"}
    assert sorted(lake.read(path, "sensor = 'x:y%/=z'").column("celsius").to_pylist())[:2] == [0.25, 1.25]
    by_spark = spark.read.format("delta").load(str(path)).where("sensor = 'x:y%/=z'").orderBy("celsius")
    assert [r.celsius for r in by_spark.limit(2).collect()] == [0.25, 1.25]
    assert lake.engine_info(path).startswith("Apache-Spark/") and "Delta-Lake/" in lake.engine_info(path)


def test_a_replayed_batch_is_skipped_by_delta(spark, tmp_path):
    """A batch whose checkpoint commit was lost (the process died after the Delta commit) is replayed by
    Spark; Delta finds its transaction version committed and writes nothing twice."""
    from transforms.engine import plan_queries, run_application

    app = Application("direct", source("temps", decoder=reading).to_sink(DeltaSink("t", schema=reading.schema)))
    settings = Settings(home=tmp_path / "home", app_registry=_registry(app))
    land(settings, "temps", _readings())
    registry_settings = settings
    (report,) = run_application(spark, app, registry_settings)
    table = settings.table_path("t")
    version = lake.version(table)
    (plan,) = plan_queries(app, registry_settings)
    for name in ("0", ".0.crc"):
        (plan.checkpoint(settings) / "commits" / name).unlink(missing_ok=True)
    (again,) = run_application(spark, app, registry_settings)
    assert again.skipped_batches == 1 and again.rows_written == {}
    assert lake.count(table) == 120 and lake.version(table) == version


def _registry(app):
    from transforms.registry import registry_of

    return registry_of([app])
