"""Archiving the landing: segments every query has committed leave the folder Spark lists, and the log
stays whole for everything else (a new query, recovery, readers). Real Spark, real files."""

import pyarrow as pa
import pytest

from tests.conftest import land
from transforms import lake
from transforms.api import Application, DeltaSink, source
from transforms.engine import plan_queries, run_application
from transforms.ingestion.archive import archive_committed
from transforms.ingestion.landing import Lander, list_segments, read_landed
from transforms.streams import bronze_application


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
