"""The lake's exactly-once writes, on real Delta tables (delta-rs)."""

import pyarrow as pa
import pytest

from transforms import lake


def test_append_once_skips_a_replayed_batch(tmp_path):
    path = tmp_path / "t"
    rows = pa.table({"x": [1, 2]})
    assert lake.append_once(path, rows, "q@g1:t", 0)
    assert lake.append_once(path, rows, "q@g1:t", 1)
    assert not lake.append_once(path, rows, "q@g1:t", 1)  # the replay after a crash writes nothing
    assert not lake.append_once(path, rows, "q@g1:t", 0)
    assert lake.append_once(path, rows, "other@g1:t", 1)  # another writer has its own batches
    assert lake.count(path) == 6 and lake.committed_batch(path, "q@g1:t") == 1


def test_merge_once_keeps_the_last_row_per_key_and_skips_replays(tmp_path):
    path = tmp_path / "m"
    first = pa.table({"k": ["a", "b", "a"], "v": [1, 2, 3], "seq": [1, 2, 3]})
    assert lake.merge_once(path, first, ["k"], "q", 0, order_by=["seq"])
    assert lake.merge_once(path, pa.table({"k": ["b", "c"], "v": [20, 30], "seq": [4, 5]}), ["k"], "q", 1, order_by=["seq"])
    assert not lake.merge_once(path, pa.table({"k": ["a"], "v": [99], "seq": [6]}), ["k"], "q", 1)
    rows = sorted((r["k"], r["v"]) for r in lake.read(path).to_pylist())
    assert rows == [("a", 3), ("b", 20), ("c", 30)]


def test_replace_where_replaces_exactly_one_partition(tmp_path):
    path = tmp_path / "p"
    data = pa.table({"day": ["2004-03-07", "2004-03-08"], "n": [1, 2]})
    lake.replace_where(path, data, "day = '2004-03-07'", partition_by=["day"])
    lake.replace_where(path, pa.table({"day": ["2004-03-08"], "n": [5]}), "day = '2004-03-08'", partition_by=["day"])
    lake.replace_where(path, pa.table({"day": ["2004-03-08"], "n": [5]}), "day = '2004-03-08'", partition_by=["day"])
    assert sorted((r["day"], r["n"]) for r in lake.read(path).to_pylist()) == [("2004-03-07", 1), ("2004-03-08", 5)]


@pytest.mark.spark
def test_a_table_or_an_old_version_reads_into_spark(spark, tmp_path):
    path = tmp_path / "s"
    lake.append_once(path, pa.table({"x": [1, 2]}), "q", 0)
    lake.append_once(path, pa.table({"x": [3]}), "q", 1)
    assert lake.to_spark(spark, path).count() == 3
    assert sorted(r.x for r in lake.to_spark(spark, path, version=0).collect()) == [1, 2]
