"""Archiving the landing: segments every query has committed leave the folder Spark lists, and the log
stays whole for everything else (a new query, recovery, readers). Real Spark, real files."""

import pyarrow as pa
import pytest

from tests.conftest import land
from transforms import lake
from transforms.api import Application, DeltaSink, source
from transforms.engine import plan_queries, run_application
from transforms.ingestion import open_log
from transforms.ingestion.archive import ROWS_FILE, archive_committed, archived_rows
from transforms.ingestion.landing import Lander, list_segments, read_landed
from transforms.streams import bronze_application

COMPACT_INTERVAL = "spark.sql.streaming.fileSource.log.compactInterval"


def _apps(settings):
    from examples.words import word_count

    return [bronze_application(settings.registry.stream("text")), word_count]


def _plans(settings, apps):
    return [p for app in apps for p in plan_queries(app, settings)]


@pytest.mark.spark
def test_committed_segments_are_archived_and_the_log_stays_whole(spark, settings):
    from examples.words import decode_text

    apps = _apps(settings)
    for text in (b"a b", b"b c", b"c d"):
        land(settings, "text", [text])  # a segment each
    assert archive_committed(settings, _plans(settings, apps)) == {}  # nothing has run: nothing moves
    run_application(spark, apps[0], settings)
    assert archive_committed(settings, _plans(settings, apps)) == {}  # word_count has not committed yet
    run_application(spark, apps[1], settings)
    assert archive_committed(settings, _plans(settings, apps)) == {"text": 3}
    assert list_segments(settings, "text", archived=False) == [] and len(list_segments(settings, "text")) == 3
    archive = settings.landing_archive / "text"
    assert archived_rows(archive) == {p.name: 1 for p in list_segments(settings, "text")}
    # `eventide status` counts the archive's messages from those counts, and reads a footer for one it lacks.
    first, second, third = (p.name for p in list_segments(settings, "text"))
    (archive / ROWS_FILE).write_text(f"{first} 7\n{second} 1\n")
    (text,) = [g for g in open_log(settings).status(_plans(settings, apps), 0.0)[0] if g.log == "text"]
    assert text.messages == 7 + 1 + 1
    assert [r["payload"] for r in read_landed(settings, "text").to_pylist()] == [b"a b", b"b c", b"c d"]

    land(settings, "text", [b"d e"])
    for app in apps:  # the live folder holds only the new segment: each query reads it once
        run_application(spark, app, settings)
    totals = {r["word"]: r["count"] for r in lake.read(settings.table_path("word_totals")).to_pylist()}
    assert totals == {"a": 1, "b": 2, "c": 2, "d": 2, "e": 1}
    assert lake.count(settings.table_path(settings.registry.stream("text").bronze_table)) == 4

    # A query that has committed nothing reads the archive too: it starts from the beginning.
    echo = Application("echo", source("text", decoder=decode_text)
                       .to_sink(DeltaSink("echo_lines", schema=pa.schema([("text", pa.string())]))))
    run_application(spark, echo, settings)
    assert sorted(r["text"] for r in lake.read(settings.table_path("echo_lines")).to_pylist()) == [
        "a b", "b c", "c d", "d e"]
    run_application(spark, echo, settings)  # and, committed, it does not read them again
    assert lake.count(settings.table_path("echo_lines")) == 4

    # Sequence numbers continue after the archived segments.
    with Lander(settings) as lander:
        assert lander.append("text", b"f") == 5


@pytest.mark.spark
def test_a_new_query_stopped_partway_through_the_archive_reads_the_rest_when_started_again(spark, settings):
    import dataclasses

    from examples.words import decode_text
    from transforms.engine.checkpoints import has_commits
    from transforms.engine.live import LiveQuery

    apps = _apps(settings)
    lines = [f"line {i}".encode() for i in range(6)]
    for line in lines:
        land(settings, "text", [line])  # a segment each
    for app in apps:
        run_application(spark, app, settings)
    assert archive_committed(settings, _plans(settings, apps)) == {"text": 6}

    # A query added later starts from the archive, one segment a batch, and is stopped after its first commit.
    echo = Application("echo", source("text", decoder=decode_text)
                       .to_sink(DeltaSink("echo_lines", schema=pa.schema([("text", pa.string())]))))
    bounded = dataclasses.replace(settings, max_files_per_trigger=1)
    (plan,) = plan_queries(echo, bounded)
    live = LiveQuery(spark, plan, bounded, {}, trigger_seconds=60)  # one batch, then a minute's wait
    try:
        import time

        deadline = time.monotonic() + 120
        while not has_commits(plan.checkpoint(bounded)) and time.monotonic() < deadline:
            live.poll()
            time.sleep(0.05)
    finally:
        live.stop()
    assert 1 <= lake.count(settings.table_path("echo_lines")) < 6

    run_application(spark, echo, settings)  # started again: it reads the rest of the archive, once
    assert sorted(r["text"] for r in lake.read(settings.table_path("echo_lines")).to_pylist()) == [
        f"line {i}" for i in range(6)]


@pytest.mark.spark
def test_a_query_forgets_the_archived_segments_it_read_and_reads_nothing_twice(spark, settings):
    import dataclasses

    from transforms.engine.checkpoints import processed_segments

    settings = dataclasses.replace(settings, max_files_per_trigger=1)  # a batch a segment
    apps = _apps(settings)[:1]  # bronze: a query that reads the log
    plans = _plans(settings, apps)
    spark.conf.set(COMPACT_INTERVAL, "3")  # Spark compacts its list of files at batches 2, 5, 8, ...
    try:
        for i in range(6):
            land(settings, "text", [f"w{i} common".encode()])
        for app in apps:
            run_application(spark, app, settings)
        assert archive_committed(settings, plans) == {"text": 6}
        compacted = [p.checkpoint(settings) / "sources" / "0" / "5.compact" for p in plans]
        assert all(len(c.read_text().splitlines()) == 1 + 6 for c in compacted)  # batches 0-5

        for i in range(6, 8):
            land(settings, "text", [f"w{i} common".encode()])
        for app in apps:  # the query's start forgets the archived segments of batches 0-3 (not the last two)
            run_application(spark, app, settings)
        for plan, c in zip(plans, compacted):
            assert c.read_text().splitlines()[0] == "v1" and len(c.read_text().splitlines()) == 1 + 2
            assert not (c.parent / ".5.compact.crc").exists()  # Hadoop's checksum of the old list went with it
            last, names = processed_segments(plan.checkpoint(settings))
            assert last == 7 and len(names) == 4  # batches 4-7
        assert lake.count(settings.table_path(settings.registry.stream("text").bronze_table)) == 8  # none twice

        # What reads the checkpoints still counts the forgotten segments as read.
        _, progress = open_log(settings).status(plans, 0.0)
        assert all(p.lag_messages == 0 and p.processed_segments == 8 and p.processed_last_seq == 8
                   for p in progress.values())
        assert all(open_log(settings).caught_up(p) for p in plans)
        every = {s.name for s in list_segments(settings, "text")}
        assert all(open_log(settings).reached(p, every) for p in plans)
        archive_committed(settings, plans)
        land(settings, "text", [b"w8 common"])  # and Spark goes on from the rewritten list
        for app in apps:
            run_application(spark, app, settings)
        assert lake.count(settings.table_path(settings.registry.stream("text").bronze_table)) == 9
    finally:
        spark.conf.unset(COMPACT_INTERVAL)
