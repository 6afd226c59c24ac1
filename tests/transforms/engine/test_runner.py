"""run_application: the queries of one app run together, each from a thread of its own; one that fails
stops none of the others and its error is raised once all have ended; progress is said on the caller's
thread. Real Spark and Delta."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from tests.conftest import land
from transforms import lake
from transforms.api import Application, DeltaSink, computation, decoder, source
from transforms.engine import runner
from transforms.registry import registry_of
from transforms.settings import Settings


@decoder
def decode_number(payload: bytes) -> dict:
    return {"n": int(payload)}


@computation("explode")
def explode(m: dict) -> dict:
    raise ValueError(f"no good: {m['n']}")


@computation("double")
def double(m: dict) -> dict:
    return {"n": m["n"], "twice": 2 * m["n"]}


def two_pipelines() -> Application:
    return Application(
        "together",
        source("numbers", decoder=decode_number).to(explode).to_sink(DeltaSink("exploded")).named("first_fails"),
        source("numbers", decoder=decode_number).to(double).to_sink(DeltaSink("doubled")).named("second"),
    )


@pytest.mark.spark
def test_the_queries_of_an_app_run_together_and_one_failure_stops_none_of_the_others(spark, settings, monkeypatch):
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    app = two_pipelines()
    settings = Settings(home=settings.home, app_registry=registry_of([app]), fail_fast=True)
    land(settings, "numbers", [b"1", b"2", b"3"])

    spans: dict[str, tuple[float, float, str]] = {}
    real_run_query = runner.run_query

    def recorded(spark, plan, *args, **kwargs):  # the real run_query, its thread and span written down
        began = time.monotonic()
        try:
            return real_run_query(spark, plan, *args, **kwargs)
        finally:
            spans[plan.name] = (began, time.monotonic(), threading.current_thread().name)

    monkeypatch.setattr(runner, "run_query", recorded)
    said: list[tuple[str, str]] = []
    with pytest.raises(Exception, match="explode") as failed:
        runner.run_application(spark, app, settings, progress=lambda m: said.append((threading.current_thread().name, m)))

    assert "no good" in str(failed.value)
    # The failing query is first in plan order; the second still ran, to the end, exactly once.
    assert sorted(r["twice"] for r in lake.read(settings.table_path("doubled")).to_pylist()) == [2, 4, 6]
    assert not lake.exists(settings.table_path("exploded"))
    # Together: each from its own thread, each started before the other ended.
    (a_start, a_end, a_thread), (b_start, b_end, b_thread) = spans["together.first_fails"], spans["together.second"]
    assert {a_thread, b_thread} == {"eventide-query-together.first_fails", "eventide-query-together.second"}
    assert a_start < b_end and b_start < a_end
    # Said on the calling thread only (a Dagster step's logger belongs to its step).
    assert said and {thread for thread, _ in said} == {threading.current_thread().name}
    assert any(m.startswith("together.second: 3 messages") for _, m in said), said


def test_progress_is_said_when_a_later_batch_starts_so_nothing_is_said_twice():
    from transforms.engine.sinks import BatchDone

    now = [0.0]
    said: list[str] = []
    progress = runner.BatchProgress("q", said.append, every=5.0, clock=lambda: now[0])

    def batch(seconds: float, rows: int) -> None:
        progress.batch_starts()
        now[0] += seconds
        progress.batch_done(BatchDone("q", 0, {"t": rows, "tcp:out": 7}, [40.0, 50.0], now[0], False))

    batch(11.0, 1_000)  # one long batch: the run's closing line gives its numbers, nothing before it
    assert said == []
    batch(1.0, 10)  # starts 11 s in: the first batch is said, TCP lines not counted as rows
    assert said == ["q: 1 batch, 1,000 rows written so far, oldest message 50 s old"]
    batch(1.0, 10)  # starts 1 s after the last line: too soon
    batch(4.0, 10)
    assert said[1:] == []
    progress.batch_starts()  # 6 s after the last line
    assert said[1:] == ["q: 4 batches, 1,030 rows written so far, oldest message 50 s old"]
