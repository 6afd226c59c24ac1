"""The daily summary under Declarative Automation (examples/logs_assets.py: DayDue and its automation
condition sensor), through `eventide run`, which asks the sensor's tick as the daemon's code server does
(Dagster's own evaluation of the conditions), and through `eventide serve`'s follow-ups: a day closes
when its window table says so, or by the clock after the grace period; a day whose lines changed is
redone; adjacent due days run as one ranged run with the checks riding along; asking again asks for
nothing. The automation sensor is on by default (the one path of the summaries); switched off in the
instance, as the UI's toggle does, `eventide run` leaves the summaries alone. Real Spark, Delta and Dagster."""

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import (
    InstigatorState,
    InstigatorStatus,
    InstigatorType,
    SensorInstigatorData,
)

from examples import logs_assets
from examples.logs import SUMMARY_TABLE
from orchestration.definitions import build_definitions
from orchestration.runner import _sensor_origin, dagster_instance, run_all
from orchestration.service import FollowUps
from tests.conftest import land
from tests.transforms.test_logs_app import LOG_FILES, expected_summary, log_messages
from transforms import lake

pytestmark = pytest.mark.spark

CHECKS = {"rows_are_valid", "total_matches_bronze", "reconciles_with_bronze"}
LATE_LINE = (b'dsl-80-43-113-44.access.uk.tiscali.com - - [08/Mar/2004:23:59:59 -0800] '
             b'"GET /late HTTP/1.1" 404 100\n')


def _switch(instance: dg.DagsterInstance, sensor: dg.SensorDefinition, running: bool) -> None:
    """What the UI's toggle records: a sensor's state in the instance, RUNNING or STOPPED."""
    origin = _sensor_origin(sensor.name)
    status = InstigatorStatus.RUNNING if running else InstigatorStatus.STOPPED
    state = instance.get_instigator_state(origin.get_id(), origin.get_selector().get_id())
    if state is None:
        data = SensorInstigatorData(min_interval=sensor.minimum_interval_seconds, sensor_type=sensor.sensor_type)
        instance.add_instigator_state(InstigatorState(origin, InstigatorType.SENSOR, status, data))
    else:
        instance.update_instigator_state(state.with_status(status))


def _summary(settings) -> dict[str, list[tuple[int, int]]]:
    rows = {}
    for r in lake.read(settings.table_path(SUMMARY_TABLE)).to_pylist():
        rows.setdefault(r["day"].isoformat(), []).append((r["status"], r["count"]))
    return {d: sorted(v) for d, v in sorted(rows.items())}


def _expected() -> dict[str, list[tuple[int, int]]]:
    rows = {}
    for day, status, count in expected_summary():
        rows.setdefault(day, []).append((status, count))
    return rows


def _summary_checks(summary) -> set[tuple[str, str]]:
    """(check, partition) of the summary's checks that ran and passed."""
    return {(check, day) for asset, check, passed, day in summary.checks if asset == SUMMARY_TABLE and passed}


def _run(settings) -> tuple[list[str], object]:
    said = []
    summary = run_all(settings, progress=said.append)
    assert summary.passed, (said, summary.failures, summary.check_failures)
    return said, summary


def test_declarative_automation_closes_days_by_window_or_clock_and_redoes_changed_days(spark, settings, monkeypatch):
    land(settings, "logs", log_messages(LOG_FILES[:3]))
    assert run_all(settings, progress=lambda _: None, summaries=False).passed  # bronze and log_windows only
    assert {s.name for s in build_definitions(settings.registry).sensors if s.sensor_type.name == "AUTOMATION"} \
        == {"daily_summary_automation"}  # the summary's one automation path

    # Switched off (the escape hatch): three days are due, yet nothing runs; switched on again, they do.
    instance = dagster_instance(settings)
    _switch(instance, logs_assets.daily_summary_automation, False)
    said, _ = _run(settings)
    assert "  nothing due" in said and not lake.exists(settings.table_path(SUMMARY_TABLE)), "\n".join(said)
    _switch(instance, logs_assets.daily_summary_automation, True)

    # Three closed days: one ranged run, each day's three checks with it.
    said, summary = _run(settings)
    assert "  daily_return_code_summary: 1 run(s): 2004-03-07..2004-03-09" in said, "\n".join(said)
    assert _summary_checks(summary) == {(c, d) for c in CHECKS for d in ("2004-03-07", "2004-03-08", "2004-03-09")}
    expected = _expected()
    assert _summary(settings) == {d: expected[d] for d in ("2004-03-07", "2004-03-08", "2004-03-09")}

    said, _ = _run(settings)  # nothing new: nothing due
    assert "  nothing due" in said, "\n".join(said)

    # A late line of 2004-03-08 without a marker: no window closed, so while the day is not over by the
    # clock (a grace of a century) it waits; once it is (the default grace), that day alone is redone.
    land(settings, "logs", [LATE_LINE])
    monkeypatch.setenv("EVENTIDE_DAY_GRACE_HOURS", "876000")
    said, _ = _run(settings)
    assert "  nothing due" in said, "\n".join(said)
    monkeypatch.delenv("EVENTIDE_DAY_GRACE_HOURS")
    said, summary = _run(settings)
    assert "  daily_return_code_summary: 1 run(s): 2004-03-08" in said, "\n".join(said)
    assert _summary_checks(summary) == {(c, "2004-03-08") for c in CHECKS}
    assert _summary(settings)["2004-03-08"] == sorted((s, n + (s == 404)) for s, n in expected["2004-03-08"])

    # A new day with its marker closes by its window, with the clock far away; `eventide serve` asks the
    # same sensor after its queries committed (here: the pipelines run, then serve's follow-ups).
    monkeypatch.setenv("EVENTIDE_DAY_GRACE_HOURS", "876000")
    land(settings, "logs", log_messages(LOG_FILES[3:]))
    assert run_all(settings, progress=lambda _: None, summaries=False).passed
    said = []
    follow_ups = FollowUps(settings, said.append)
    assert follow_ups.run_due() == 1
    assert said == ["daily_return_code_summary[2004-03-10] (asked by daily_summary_automation): done"], said
    assert follow_ups.run_due() == 0 and len(said) == 1
    assert _summary(settings)["2004-03-10"] == expected["2004-03-10"]
