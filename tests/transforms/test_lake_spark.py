"""`lake.to_spark`: Delta tables read by Spark's executors from their Parquet files (real Spark, real tables)."""

import datetime as dt
import json
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from transforms import lake

pytestmark = pytest.mark.spark

UTC = dt.timezone.utc


def rows(data) -> list[dict]:
    """A Spark DataFrame's or an Arrow table's rows, in a stable order (Spark's through Arrow: exact timestamps)."""
    table = data if isinstance(data, pa.Table) else data.toArrow()
    return sorted(table.to_pylist(), key=repr)


def plan(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def assert_reads_files(df) -> None:
    """The executors read Parquet files: no rows shipped from the driver (createDataFrame's LocalTableScan)."""
    text = plan(df)
    assert "FileScan parquet" in text and "LocalTableScan" not in text, text


def test_an_unpartitioned_table_reads_as_lake_read_does(spark, tmp_path):
    path = tmp_path / "t"
    first = pa.table({
        "id": [1, 2],
        "name": ["a b", None],
        "at": pa.array([dt.datetime(2004, 3, 7, 10, 0, 0, 123456, tzinfo=UTC), None], pa.timestamp("us", tz="UTC")),
        "local": pa.array([dt.datetime(2004, 3, 7, 23, 59, 59), None], pa.timestamp("us")),
        "amount": pa.array([Decimal("1.25"), None], pa.decimal128(10, 2)),
        "tags": pa.array([["x", "y"], None]),
        "point": pa.array([{"x": 1.5, "y": -2.0}, None]),
    })
    write_deltalake(path, first)
    write_deltalake(path, first.slice(0, 1).set_column(0, "id", pa.array([3])), mode="append")
    df = lake.to_spark(spark, path)
    assert df.columns == first.column_names
    assert rows(df) == rows(lake.read(path))
    assert_reads_files(df)


def test_a_table_partitioned_by_a_string_day(spark, tmp_path):
    path = tmp_path / "t"
    data = pa.table({"n": [1, 2, 3, 4], "day": ["2004-03-07", "2004-03-07", "2004-03-08", "2004-03-09"],
                     "v": ["a", "b", "c", "d"]})
    write_deltalake(path, data, partition_by=["day"])
    df = lake.to_spark(spark, path)
    assert df.columns == ["n", "day", "v"]  # the table's order, not Spark's (partition columns last)
    assert dict(df.dtypes) == {"n": "bigint", "day": "string", "v": "string"}
    assert rows(df) == rows(data)
    assert_reads_files(df)

    one_day = lake.to_spark(spark, path, where="day = '2004-03-07'")
    assert rows(one_day) == rows(lake.read(path, where="day = '2004-03-07'"))
    assert "PartitionFilters: [isnotnull(day" in plan(one_day)  # Spark prunes the files by their folders


def test_partition_values_with_dates_special_characters_and_nulls_come_back_exactly(spark, tmp_path):
    path = tmp_path / "t"
    names = ["a b", "x/y", "50%", "a=b", "it's", "[*?]{,}", "back\\slash", "%41", "ü:é#?", "日本", None]
    days = [dt.date(2004, 3, 7), dt.date(1999, 12, 31), None] * 4
    data = pa.table({"id": list(range(len(names))), "name": names, "day": days[: len(names)],
                     "x": [float(i) for i in range(len(names))]})
    write_deltalake(path, data, partition_by=["day", "name"])
    df = lake.to_spark(spark, path)
    assert df.columns == ["id", "name", "day", "x"]
    assert dict(df.dtypes)["day"] == "date"
    assert rows(df) == rows(data) == rows(lake.read(path))
    assert "FileScan parquet" in plan(df)

    # Spark decodes a folder's %XX byte by byte: non-ASCII values are read with literal columns instead, and a
    # filter on them still prunes the other partitions.
    assert [r["id"] for r in rows(lake.to_spark(spark, path, where="name = '日本'"))] == [9]
    assert [r["id"] for r in rows(lake.to_spark(spark, path, where="name in ('ü:é#?', '%41')"))] == [7, 8]
    assert {r["id"] for r in rows(lake.to_spark(spark, path, where="day is null"))} == {2, 5, 8}
    assert [r["id"] for r in rows(lake.to_spark(spark, path, where="day = date'1999-12-31' and name is null"))] == [10]


def test_date_boolean_and_integer_partitions_are_read_from_their_folders_in_one_scan(spark, tmp_path):
    path = tmp_path / "t"
    data = pa.table({
        "id": [1, 2, 3, 4],
        "day": [dt.date(2004, 3, 7), dt.date(1, 1, 1), None, dt.date(9999, 12, 31)],
        "flag": [True, False, None, True],
        "small": pa.array([-5, 0, None, 2**31 - 1], pa.int32()),
        "big": [-(2**63), 2**63 - 1, None, 0],
    })
    write_deltalake(path, data, partition_by=["day", "flag", "small", "big"])
    df = lake.to_spark(spark, path)
    assert dict(df.dtypes) == {"id": "bigint", "day": "date", "flag": "boolean", "small": "int", "big": "bigint"}
    assert rows(df) == rows(data)
    assert plan(df).count("FileScan parquet") == 1 and "Union" not in plan(df)
    one = lake.to_spark(spark, path, where="flag and small < 0")
    assert [r["id"] for r in rows(one)] == [1] and "PartitionFilters: [isnotnull(flag" in plan(one)


def test_timestamp_decimal_and_numeric_partitions(spark, tmp_path):
    path = tmp_path / "t"
    data = pa.table({
        "id": [1, 2, 3],
        "at": pa.array([dt.datetime(2004, 3, 7, 10, 0, 0, 123456, tzinfo=UTC), dt.datetime(1970, 1, 1, tzinfo=UTC),
                        None], pa.timestamp("us", tz="UTC")),
        "local": pa.array([dt.datetime(2004, 3, 7, 23, 59, 59), None, dt.datetime(2000, 1, 1)], pa.timestamp("us")),
        "amount": pa.array([Decimal("1.25"), None, Decimal("0.10")], pa.decimal128(10, 2)),
        "ratio": [0.1, None, -2.5e-7],
        "flag": [True, False, None],
        "small": pa.array([-5, 7, None], pa.int32()),
    })
    write_deltalake(path, data, partition_by=["at", "local", "amount", "ratio", "flag", "small"])
    df = lake.to_spark(spark, path)
    assert rows(df) == rows(data) == rows(lake.read(path))
    assert [r["id"] for r in rows(lake.to_spark(spark, path, where="at = timestamp'2004-03-07 10:00:00.123456Z'"))] == [1]


def test_an_empty_string_partition_value_is_null_as_the_protocol_says(spark, tmp_path):
    """delta-rs writes "" as `s=` and logs it as "", which the Delta protocol reads as null; delta-rs' own
    get_add_actions() does too (its DataFusion read, lake.read, returns "")."""
    path = tmp_path / "t"
    write_deltalake(path, pa.table({"x": [1, 2, 3], "s": ["", None, "a"]}), partition_by=["s"])
    assert rows(lake.to_spark(spark, path)) == [{"x": 1, "s": None}, {"x": 2, "s": None}, {"x": 3, "s": "a"}]


def test_a_pinned_version_reads_that_versions_files(spark, tmp_path):
    path = tmp_path / "t"
    write_deltalake(path, pa.table({"x": [1, 2], "p": ["a", "b"]}), partition_by=["p"])  # version 0
    write_deltalake(path, pa.table({"x": [3], "p": ["a"]}), mode="append")  # 1
    current = lake.to_spark(spark, path)  # pinned when made: version 1
    write_deltalake(path, pa.table({"x": [10], "p": ["c"]}), mode="overwrite")  # 2
    assert sorted(r["x"] for r in rows(lake.to_spark(spark, path, version=0))) == [1, 2]
    assert sorted(r["x"] for r in rows(lake.to_spark(spark, path, version=1))) == [1, 2, 3]
    assert sorted(r["x"] for r in rows(current)) == [1, 2, 3]
    assert rows(lake.to_spark(spark, path)) == [{"x": 10, "p": "c"}]
    assert rows(lake.to_spark(spark, path, version=1, where="x > 1 and p = 'a'")) == [{"x": 3, "p": "a"}]


def test_where_filters_on_data_columns(spark, tmp_path):
    path = tmp_path / "t"
    write_deltalake(path, pa.table({"x": [1, 2, 3], "name": ["a", "b c", None]}))
    df = lake.to_spark(spark, path, where="x >= 2 and name is not null")
    assert rows(df) == [{"x": 2, "name": "b c"}]
    assert_reads_files(df)


def test_a_table_without_files_is_an_empty_dataframe_with_its_schema(spark, tmp_path):
    path = tmp_path / "t"
    DeltaTable.create(path, pa.schema([("x", pa.int64()), ("day", pa.date32()), ("s", pa.string())]),
                      partition_by=["day"])
    df = lake.to_spark(spark, path)
    assert df.dtypes == [("x", "bigint"), ("day", "date"), ("s", "string")]
    assert df.count() == 0
    assert lake.to_spark(spark, path, where="day = date'2004-03-07'").count() == 0

    emptied = tmp_path / "emptied"
    write_deltalake(emptied, pa.table({"x": [1]}))
    DeltaTable(emptied).delete()
    assert lake.to_spark(spark, emptied).count() == 0
    assert lake.to_spark(spark, emptied, version=0).count() == 1


def _set_protocol(path, protocol: dict) -> None:
    """Rewrite version 0's protocol action (for features delta-rs does not write itself)."""
    log = path / "_delta_log" / "00000000000000000000.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps({"protocol": protocol} if "protocol" in a else a) + "\n" for a in actions))


def test_tables_needing_more_than_a_parquet_read_are_refused(tmp_path, spark):
    data = pa.table({"x": [1, 2]})
    dv = tmp_path / "dv"
    write_deltalake(dv, data, configuration={"delta.enableDeletionVectors": "true"})
    with pytest.raises(ValueError, match=r"deletion vectors.*lake\.read") as e:
        lake.to_spark(spark, dv)
    assert str(dv) in str(e.value) and "rewrite the table" in str(e.value)

    mapped = tmp_path / "mapped"
    write_deltalake(mapped, data, configuration={"delta.columnMapping.mode": "name"})
    with pytest.raises(ValueError, match=r"column mapping \(delta\.columnMapping\.mode = 'name'\)") as e:
        lake.to_spark(spark, mapped)
    assert str(mapped) in str(e.value)

    feature = tmp_path / "feature"
    write_deltalake(feature, data)
    _set_protocol(feature, {"minReaderVersion": 3, "minWriterVersion": 7,
                            "readerFeatures": ["columnMapping"], "writerFeatures": ["columnMapping"]})
    with pytest.raises(ValueError, match="column mapping"):
        lake.to_spark(spark, feature)
    _set_protocol(feature, {"minReaderVersion": 3, "minWriterVersion": 7,
                            "readerFeatures": ["typeWidening"], "writerFeatures": ["typeWidening"]})
    with pytest.raises(ValueError, match="reader feature.*'typeWidening'"):
        lake.to_spark(spark, feature)
    _set_protocol(feature, {"minReaderVersion": 3, "minWriterVersion": 7,
                            "readerFeatures": ["timestampNtz"], "writerFeatures": ["timestampNtz"]})
    assert lake.to_spark(spark, feature).count() == 2  # a feature that does not change how files are read
