"""The lake on real Delta tables written by delta-spark: exactly-once writes skipped by Delta itself,
MERGE, replaceWhere, the tables in Spark's catalog, upkeep, and delta-rs reading what Spark wrote."""

import time

import pyarrow as pa
import pytest

from transforms import lake

pytestmark = pytest.mark.spark


def _df(spark, **columns):
    return spark.createDataFrame(pa.table(columns))


def test_append_once_is_skipped_by_delta_on_a_replayed_batch(spark, tmp_path):
    path = tmp_path / "t"
    rows = _df(spark, x=[1, 2])
    lake.append_once(rows, path, "q@g1:t", 0)
    lake.append_once(rows, path, "q@g1:t", 1)
    version = lake.version(path)
    lake.append_once(rows, path, "q@g1:t", 1)  # the replay after a crash: Delta commits nothing
    lake.append_once(rows, path, "q@g1:t", 0)
    assert lake.version(path) == version
    lake.append_once(rows, path, "other@g1:t", 1)  # another writer has its own batches
    assert lake.count(path) == 6 and lake.committed_batch(path, "q@g1:t") == 1


def test_merge_once_upserts_and_is_skipped_by_delta_on_a_replay(spark, tmp_path):
    path = tmp_path / "m"
    lake.merge_once(_df(spark, k=["a", "b"], v=[1, 2]), path, ["k"], "q", 0)
    lake.merge_once(_df(spark, k=["b", "c"], v=[20, 30]), path, ["k"], "q", 1)
    version = lake.version(path)
    lake.merge_once(_df(spark, k=["a"], v=[99]), path, ["k"], "q", 1)  # a replay: skipped
    assert lake.version(path) == version
    lake.merge_once(_df(spark, k=["a", "d"], v=[-1, 4]), path, ["k"], "q", 2, update=False)  # insert only
    rows = sorted((r["k"], r["v"]) for r in lake.read(path).to_pylist())
    assert rows == [("a", 1), ("b", 20), ("c", 30), ("d", 4)]
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None  # unset after the MERGE


def test_replace_where_replaces_exactly_one_partition(spark, tmp_path):
    path = tmp_path / "p"
    lake.replace_where(_df(spark, day=["2004-03-07", "2004-03-08"], n=[1, 2]), path, "day = '2004-03-07'", ["day"])
    for _ in range(2):  # idempotent
        lake.replace_where(_df(spark, day=["2004-03-08"], n=[5]), path, "day = '2004-03-08'", ["day"])
    assert sorted((r["day"], r["n"]) for r in lake.read(path).to_pylist()) == [("2004-03-07", 1), ("2004-03-08", 5)]
    assert spark.read.format("delta").load(str(path)).where("day = '2004-03-08'").collect()[0].n == 5


def test_delta_rs_reads_what_delta_spark_writes(spark, tmp_path):
    """The JVM-free reads (status, show, checks) see every table delta-spark writes here: its protocol
    and table features, checkpoints (every 10 commits), auto compaction and vacuum included."""
    path = tmp_path / "f"
    for i in range(13):  # a checkpoint at version 10, then commits after it
        lake.append_once(_df(spark, day=[f"d{i % 3}"], n=[i]), path, "q", i, partition_by=["day"])
    assert list((path / "_delta_log").glob("*.checkpoint.parquet"))
    lake.upkeep(spark, tmp_path, vacuum_hours=0)
    assert lake.count(path) == 13 and lake.count(path, "day = 'd1'") == 4
    assert lake.table_files(path).files == 3  # compacted: one file per partition
    protocol = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]
    assert lake.read(path).num_rows == 13, protocol
    assert "Delta-Lake/4.4.0" in lake.engine_info(path)


def test_the_homes_tables_are_named_in_the_catalog(spark, tmp_path):
    lake_dir = tmp_path / "lake"
    lake.append_once(_df(spark, word=["a", "b"]), lake_dir / "words_demo", "q", 0)
    (lake_dir / "not_a_table").mkdir()
    assert lake.register_tables(spark, lake_dir) == ["words_demo"]
    assert spark.sql("SELECT count(*) AS n FROM words_demo").collect()[0].n == 2
    lake.append_once(_df(spark, word=["c"]), lake_dir / "words_demo", "q", 1)
    assert spark.sql("SELECT count(*) AS n FROM words_demo").collect()[0].n == 3  # the latest version


def test_a_name_registered_for_another_home_is_pointed_at_this_one(spark, tmp_path):
    first, second = tmp_path / "one" / "lake", tmp_path / "two" / "lake"
    lake.append_once(_df(spark, n=[1]), first / "shared_name", "q", 0)
    lake.append_once(_df(spark, n=[2, 3]), second / "shared_name", "q", 0)
    lake.register_tables(spark, first)
    assert spark.sql("SELECT sum(n) AS s FROM shared_name").collect()[0].s == 1
    lake.register_tables(spark, second)
    assert spark.sql("SELECT sum(n) AS s FROM shared_name").collect()[0].s == 5
    assert lake.count(first / "shared_name") == 1  # the other home's table is untouched


def test_vacuum_lists_a_table_in_a_few_tasks_not_ten_thousand(spark, tmp_path):
    from transforms.lake.session import FILE_LISTING_TASKS

    path = tmp_path / "f"
    for i in range(2):
        lake.append_once(_df(spark, day=["d1"], n=[i]), path, "q", i, partition_by=["day"])
    context = spark.sparkContext
    context.setJobGroup("upkeep-under-test", "upkeep")
    try:
        lake.upkeep(spark, tmp_path, vacuum_hours=0)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    tracker = context.statusTracker()
    stages = [tracker.getStageInfo(s) for j in tracker.getJobIdsForGroup("upkeep-under-test")
              for s in tracker.getJobInfo(j).stageIds]
    assert stages and max(s.numTasks for s in stages if s) <= FILE_LISTING_TASKS + 2, [s.numTasks for s in stages if s]
    assert lake.count(path) == 2 and lake.table_files(path).files == 1


def test_upkeep_leaves_a_table_whose_last_commit_is_its_upkeep_alone_for_a_while(spark, tmp_path):
    """The memory is each table's own history (its latest commit ended an upkeep, and when), so it holds
    for any caller and across a restart; a commit since, or time alone, brings the table back."""
    for name in ("a", "b"):
        for i in range(2):
            lake.append_once(_df(spark, n=[i]), tmp_path / name, "q", i)
    assert lake.last_upkeep(tmp_path / "a") is None
    ahead = [0.0]  # the clock runs ahead of the wall clock by this much

    def upkept() -> list[str]:
        return [r.table for r in lake.upkeep(spark, tmp_path, 0, revisit_after=3600, now=lambda: time.time() + ahead[0])]

    assert upkept() == ["a", "b"]
    assert abs(lake.last_upkeep(tmp_path / "a") - time.time()) < 60
    assert upkept() == []  # no commit since: nothing to compact, and no file became deletable by a commit
    lake.append_once(_df(spark, n=[2]), tmp_path / "a", "q", 2)
    assert lake.last_upkeep(tmp_path / "a") is None
    assert upkept() == ["a"]
    ahead[0] = 3600  # time alone makes old files deletable: each table again
    assert upkept() == ["a", "b"]
    assert lake.count(tmp_path / "a") == 3 and lake.count(tmp_path / "b") == 2
    assert [r.table for r in lake.upkeep(spark, tmp_path, 0)] == ["a", "b"]  # `eventide upkeep`: every table


def test_upkeep_keeps_each_tables_log_for_its_retention_and_delta_deletes_older_commits(spark, tmp_path):
    """Under `serve` a busy table gets a commit a second, and every commit lists the log's folder: upkeep
    sets the log's retention, and Delta deletes older commit files at its checkpoints (every 10 commits,
    here 2; it keeps them until the next calendar day at least, so the test ages them by two days)."""
    import json
    import os

    from deltalake import DeltaTable

    from transforms.lake.upkeep import keep_log_for

    served, kept = tmp_path / "served" / "t", tmp_path / "kept" / "t"
    for path in (served, kept):
        for i in range(3):
            lake.append_once(_df(spark, n=[i]), path, "q", i)
    lake.upkeep(spark, served.parent, 0, log_retention_hours=2.0)
    lake.upkeep(spark, kept.parent, 0)  # no retention given: Delta's 30 days
    properties = DeltaTable(str(served)).metadata().configuration
    assert properties["delta.logRetentionDuration"] == "interval 7200 seconds"
    assert properties["delta.deletedFileRetentionDuration"] == "interval 7200 seconds"  # Delta wants it no longer
    assert "delta.logRetentionDuration" not in DeltaTable(str(kept)).metadata().configuration
    assert lake.last_upkeep(served) is not None  # the retention's commit came first: the upkeep's stay last
    versions = lake.version(served)
    assert not keep_log_for(spark, served, 2.0) and lake.version(served) == versions  # set once

    two_days_ago, aged_checkpoint = time.time() - 2 * 86400, {}
    for path in (served, kept):
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")  # sooner
        for i in range(3, 5):  # a checkpoint
            lake.append_once(_df(spark, n=[i]), path, "q", i)
        aged_checkpoint[path] = json.loads((path / "_delta_log" / "_last_checkpoint").read_text())["version"]
        for k, f in enumerate(sorted((path / "_delta_log").iterdir())):  # in order: Delta adjusts equal times
            os.utime(f, (two_days_ago + k, two_days_ago + k))
        for i in range(5, 7):  # and the next, which deletes what expired before the aged one
            lake.append_once(_df(spark, n=[i]), path, "q", i)
    assert not [p for p in (served / "_delta_log").glob("*.json") if int(p.name[:20]) < aged_checkpoint[served]]
    assert aged_checkpoint[served] > 0 and (kept / "_delta_log" / f"{0:020d}.json").exists()
    for path in (served, kept):
        assert sorted(r["n"] for r in lake.read(path).to_pylist()) == list(range(7))
