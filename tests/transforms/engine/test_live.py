"""A query run continuously (what `eventide serve` runs): outputs without a run, a failed query is
reported and restarted with backoff, and the restart delivers exactly once. Real Spark, real sockets."""

import socket

import pytest

from tests.conftest import land, poll_until
from tests.tcp import Receiver
from transforms.engine import plan_queries
from transforms.engine.live import LiveQuery
from transforms.engine.locks import holder_of


def _closed_port() -> int:
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.spark
def test_a_failed_query_is_reported_restarted_with_backoff_and_delivers_once(spark, settings):
    from examples.words import word_count

    (plan,) = plan_queries(word_count, settings)
    port = _closed_port()
    said = []
    live = LiveQuery(spark, plan, settings, {"word_count_tcp": f"127.0.0.1:{port}"}, say=said.append,
                     trigger_seconds=0.2)
    land(settings, "text", [b"a b a"])
    try:
        # Nobody listens on the sink's port: the batch fails, the query stops, serve says so and waits.
        assert poll_until([live], lambda: live.failures >= 1, 120), said
        assert "query failed" in said[0] and "restarting in 1 s" in said[0] and not live.running
        assert holder_of(settings, plan.name)["command"] == "eventide serve"  # still its lock meanwhile
        receiver = Receiver(port)
        try:
            assert poll_until([live], lambda: len(receiver.whole_lines()) >= 3, 120), said
            land(settings, "text", [b"b"])  # and it keeps running: a later message is answered too
            assert poll_until([live], lambda: len(receiver.whole_lines()) >= 4, 60), said
            assert live.running
        finally:
            receiver.close()
    finally:
        live.stop()
    assert receiver.whole_lines() == [b"a => 1", b"b => 1", b"a => 2", b"b => 2"]
    assert holder_of(settings, plan.name) is None  # stop gave the lock back


@pytest.mark.spark
def test_a_wall_clock_window_closes_on_time_under_a_live_query_without_new_messages(spark, settings):
    import sys

    from pyspark import cloudpickle

    from tests.windows import test_wall_clock
    from transforms import lake

    cloudpickle.register_pickle_by_value(sys.modules[test_wall_clock.__name__])
    (plan,) = plan_queries(test_wall_clock.clock_app(), settings)  # 2 s processing-time windows
    assert plan.timers
    live = LiveQuery(spark, plan, settings, {}, trigger_seconds=0.2)
    assert live.trigger == "1.0 seconds"  # a query with timers runs a batch every trigger: at least 1 s
    land(settings, "text", [b"a 1", b"a 2", b"a 3"])
    path = settings.table_path("clock_windows")
    try:
        # No message after these three: the window closes by its timer within about a second of its end.
        assert poll_until([live], lambda: lake.exists(path) and lake.count(path) == 1, 60)
    finally:
        live.stop()
    (row,) = lake.read(path).to_pylist()
    assert (row["key"], row["lines"], row["reason"]) == ("a", 3, "timer")


@pytest.mark.spark
def test_a_query_whose_list_of_files_grew_is_restarted_forgets_the_archived_ones_and_reads_nothing_twice(
        spark, settings):
    import dataclasses

    import pyarrow as pa

    from examples.words import decode_text
    from transforms import lake
    from transforms.api import Application, DeltaSink, source
    from transforms.ingestion import open_log
    from transforms.ingestion.archive import archive_committed

    echo = Application("echo", source("text", decoder=decode_text)
                       .to_sink(DeltaSink("echo_lines", schema=pa.schema([("text", pa.string())]))))
    settings = dataclasses.replace(settings, max_files_per_trigger=1, file_list_restart_mb=1e-6)  # any growth
    (plan,) = plan_queries(echo, settings)
    table, compacted = settings.table_path("echo_lines"), plan.checkpoint(settings) / "sources" / "0" / "2.compact"
    said = []
    live = LiveQuery(spark, plan, settings, {}, say=said.append, trigger_seconds=0.2)
    spark.conf.set("spark.sql.streaming.fileSource.log.compactInterval", "3")  # at batches 2, 5, ...
    try:
        for i in range(4):
            land(settings, "text", [f"line {i}".encode()])  # a segment, so a batch, each
        assert poll_until([live], lambda: open_log(settings).caught_up(plan), 120), said  # 4 batches committed
        assert archive_committed(settings, [plan]) == {"text": 4}
        assert live.restart_if_file_list_grew()  # its list grew at batch 2 (Spark's compaction): restarted
        assert "echo: restarting, so that it forgets the archived segments it read" in said[-1]
        assert live.running and len(compacted.read_text().splitlines()) == 1 + 1  # batch 2's only
        assert not live.restart_if_file_list_grew()  # measured from the new start
        land(settings, "text", [b"line 4"])
        assert poll_until([live], lambda: lake.count(table) == 5, 120), said
    finally:
        live.stop()
        spark.conf.unset("spark.sql.streaming.fileSource.log.compactInterval")
    assert sorted(r["text"] for r in lake.read(table).to_pylist()) == [f"line {i}" for i in range(5)]
