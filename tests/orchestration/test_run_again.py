"""`eventide run` again with nothing new: no query starts Spark, no summary runs again (the sensors'
cursors are kept under the home); a new day then runs just that day. Real Spark, Delta and Dagster."""

import pytest

from examples.logs import SUMMARY_TABLE
from orchestration.runner import cursors_file, run_all
from tests.conftest import land
from tests.transforms.test_logs_app import LOG_FILES, expected_summary, log_messages
from transforms import lake

pytestmark = pytest.mark.spark


def _summary(settings):
    return sorted((r["day"].isoformat(), r["status"], r["count"])
                  for r in lake.read(settings.table_path(SUMMARY_TABLE)).to_pylist())


def test_a_second_run_does_nothing_and_a_new_day_runs_only_that_day(spark, settings):
    import transforms.spark

    land(settings, "logs", log_messages(LOG_FILES[:3]))
    said = []
    assert run_all(settings, progress=said.append).passed
    assert "  daily_summary_job: 1 run(s): 2004-03-07..2004-03-09" in said  # adjacent days: one run
    assert cursors_file(settings).exists()
    version = lake.version(settings.table_path(SUMMARY_TABLE))

    def no_spark(*args, **kwargs):
        raise AssertionError("a run with nothing new asked for a Spark session")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transforms.spark, "get_spark", no_spark)
        mp.setattr("assets.resources.get_spark", no_spark)
        said.clear()
        assert run_all(settings, progress=said.append).passed
    assert "  nothing due" in said and not any("run(s)" in s for s in said)
    assert lake.version(settings.table_path(SUMMARY_TABLE)) == version  # nothing rewritten

    land(settings, "logs", log_messages(LOG_FILES[3:]))
    said.clear()
    assert run_all(settings, progress=said.append).passed
    assert "  daily_summary_job: 1 run(s): 2004-03-10" in said
    assert _summary(settings) == expected_summary()
