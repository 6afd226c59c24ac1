"""`eventide serve`'s rounds of upkeep over its running queries (orchestration/service.py). Real Spark,
real landing log, real checkpoints."""

import dataclasses

import pytest

from tests.conftest import land, poll_until


@pytest.mark.spark
def test_queries_whose_file_lists_grew_restart_one_a_round_and_read_nothing_twice(spark, settings):
    """The queries of one log grow their checkpoints' lists of files together; each archiving round
    restarts at most one of them, so the others go on answering meanwhile."""
    import pyarrow as pa

    from examples.words import decode_text
    from orchestration.service import Service
    from transforms import lake
    from transforms.api import Application, DeltaSink, source
    from transforms.engine import plan_queries
    from transforms.engine.live import LiveQuery
    from transforms.ingestion import open_log

    settings = dataclasses.replace(settings, max_files_per_trigger=1, file_list_restart_mb=1e-6)  # any growth
    apps = [Application(name, source("text", decoder=decode_text)
                        .to_sink(DeltaSink(f"{name}_lines", schema=pa.schema([("text", pa.string())]))))
            for name in ("first", "second")]
    plans = [p for app in apps for p in plan_queries(app, settings)]
    said: list[str] = []
    service = Service(settings, say=said.append, dagster=False)
    spark.conf.set("spark.sql.streaming.fileSource.log.compactInterval", "3")  # lists grow at batches 2, 5, ...
    service.queries = [LiveQuery(spark, p, settings, {}, say=said.append, trigger_seconds=0.2) for p in plans]
    log = open_log(settings)
    try:
        for i in range(4):
            land(settings, "text", [f"line {i}".encode()])  # a segment, so a batch, each
        assert poll_until(service.queries, lambda: all(log.caught_up(p) for p in plans), 180), said

        def restarts() -> list[str]:
            return [line.split(":")[0] for line in said if "restarting, so that it forgets" in line]

        service._archive(plans)
        assert service.archived == 4 and restarts() == ["first"]  # one a round: the second waits
        assert all(q.running for q in service.queries)
        service._archive(plans)
        assert restarts() == ["first", "second"]
        service._archive(plans)
        assert restarts() == ["first", "second"]  # each measured from its new start
        land(settings, "text", [b"line 4"])
        tables = [settings.table_path(f"{app.name}_lines") for app in apps]
        assert poll_until(service.queries, lambda: all(lake.exists(t) and lake.count(t) == 5 for t in tables), 120), said
    finally:
        for q in service.queries:
            q.stop()
        spark.conf.unset("spark.sql.streaming.fileSource.log.compactInterval")
    for t in tables:
        assert sorted(r["text"] for r in lake.read(t).to_pylist()) == [f"line {i}" for i in range(5)]
