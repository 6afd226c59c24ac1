"""A run with nothing new starts no Spark: `nothing_new` decides from the checkpoint and the landing
files, and says no whenever a run could have something to do. Real Spark for the runs in between."""

import pyarrow as pa
import pytest

from tests.conftest import land
from transforms import lake
from transforms.api import Application, DeltaSink, source, state_computation
from transforms.engine import plan_queries, run_application
from transforms.engine.runner import last_planned_batch, nothing_new
from transforms.ingestion.archive import archive_committed


def _no_spark():
    raise AssertionError("Spark was asked for although nothing was new")


def _word_count():
    from examples.words import word_count

    return word_count


@pytest.mark.spark
def test_a_query_runs_only_when_something_landed_since_its_last_commit(spark, settings):
    app = _word_count()
    (plan,) = plan_queries(app, settings)
    assert nothing_new(plan, settings)  # nothing landed, nothing run: nothing to do
    (report,) = run_application(_no_spark, app, settings)
    assert report.batches == 0 and not plan.checkpoint(settings).exists()

    land(settings, "text", [b"a b"])
    assert not nothing_new(plan, settings)
    run_application(lambda: spark, app, settings)
    assert nothing_new(plan, settings)
    (report,) = run_application(_no_spark, app, settings)
    assert report.batches == 0 and report.input_rows == 0

    land(settings, "text", [b"b c"])
    assert not nothing_new(plan, settings)
    run_application(spark, app, settings)
    assert nothing_new(plan, settings)
    totals = {r["word"]: r["count"] for r in lake.read(settings.table_path("word_totals")).to_pylist()}
    assert totals == {"a": 1, "b": 2, "c": 1}

    # Archived segments were committed by every query: still nothing new.
    assert archive_committed(settings, plan_queries(app, settings)) == {"text": 2}
    assert nothing_new(plan, settings)


@pytest.mark.spark
def test_a_planned_but_uncommitted_batch_is_replayed_not_skipped(spark, settings):
    app = _word_count()
    (plan,) = plan_queries(app, settings)
    land(settings, "text", [b"x y"])
    run_application(spark, app, settings)
    checkpoint = plan.checkpoint(settings)
    last = last_planned_batch(checkpoint)
    # As if the process died after the sinks, before Spark wrote the commit (nor its checksum file).
    for name in (str(last), f".{last}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    assert not nothing_new(plan, settings)
    run_application(spark, app, settings)  # replays the batch; the app transactions keep it once
    assert nothing_new(plan, settings)
    totals = {r["word"]: r["count"] for r in lake.read(settings.table_path("word_totals")).to_pylist()}
    assert totals == {"x": 1, "y": 1}
    assert lake.count(settings.table_path("word_count_updates")) == 2


class _Seen:
    def __init__(self):
        self.n = 0


@state_computation("count with a timer", state=_Seen, on_timer=lambda key, state, expiry, ctx: [])
def _count(msg, state, ctx):
    state.n += 1
    return None


def test_a_query_with_timers_always_runs(settings):
    """Due timers live in Spark's state store: only Spark can say none is due."""
    from examples.words import decode_text

    app = Application("timed", source("text", decoder=decode_text).key_by(lambda m: m.text).to(_count)
                      .to_sink(DeltaSink("timed_out", schema=pa.schema([("text", pa.string())]))))
    (plan,) = plan_queries(app, settings)
    assert plan.timers and not nothing_new(plan, settings)
