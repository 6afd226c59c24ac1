"""The log app's Dagster extras: the daily return-code summary, its checks, its automation and job.

    landing_logs -> bronze_log_lines -> log_windows -> daily_return_code_summary (+ checks)

Registered through the app: `Application("logs", ..., dagster_defs="examples.logs_assets:defs")`; the
composition root (orchestration/definitions.py) merges `defs` with the app's own assets.

A summary partition (one day) is produced two ways that give the same rows:
- Declarative Automation: the summary's AutomationCondition (DayDue, judged from the tables) is
  evaluated by the automation sensor `daily_summary_automation`: a day whose window closed, or that is
  over by the clock (+ grace) with a summary that differs from bronze, is (re)done; several due days
  run as one ranged run. The daemon under `eventide ui` ticks it; `eventide run` and `eventide serve`
  ask the same tick (Dagster's evaluation, the cursor in the instance).
- a backfill (Dagster UI, or `eventide backfill`) recomputes the days from bronze.
The logic lives in examples/logs.py; this module only wires it into Dagster.
"""

import datetime as dt
import warnings

import dagster as dg
import pandas as pd

from assets.checks import check_each_partition
from assets.gx import validate_partitions
from assets.resources import EventideSettings
from assets.runs import in_backfill
from examples.logs import (
    BRONZE_TABLE,
    SUMMARY_TABLE,
    WINDOWS_TABLE,
    bronze_counts,
    is_day_over,
    line_total,
    log_app,
    stored_summaries,
    summarize_days,
    write_summaries,
)
from transforms import lake
from transforms.settings import Settings

SUMMARY_JOB = "daily_summary_job"
GROUP = log_app.name

# end_offset=1: today's partition exists too (a marker may close a day before midnight UTC).
DAILY = dg.DailyPartitionsDefinition(start_date=Settings().partitions_start, end_offset=1)

# A day is summarized when its window closes, or by the clock once it is over plus the grace: a summary
# older than a day, that grace and an hour of slack means the logs or the automation stopped. Warn after
# a day.
DAY = dt.timedelta(days=1)
SUMMARY_FRESHNESS = dg.FreshnessPolicy.time_window(
    fail_window=DAY + dt.timedelta(hours=Settings().day_grace_hours + 1), warn_window=DAY)


# -- Declarative Automation: when a day's summary is due --------------------------------------------
def valid_partition(day: dt.date) -> bool:
    return DAILY.has_partition_key(day.isoformat())


def _lines_by_day(path, sql: str, **tables) -> dict[dt.date, int]:
    return {r["day"]: r["n"] for r in lake.query(sql, **tables).to_pylist()} if lake.exists(path) else {}


def days_due(settings: Settings, now: dt.datetime) -> list[dt.date]:
    """The days whose summary is due (JVM-free: Delta logs and DataFusion), from what the tables hold,
    not from a memory of what was asked before:
    - a window closed for the day after its summary ran: the day's closed windows hold more lines than
      its summary counted (a summary counts every bronze line of its day, so the windows of lines it
      already counted never hold more);
    - the day is over by the clock (its end plus `day_grace_hours`) and its summary differs from bronze:
      no marker came, or its lines changed since (a replay, a late file).
    A day whose summary ran holds neither, so asking again requests nothing."""
    bronze, windows, summary = (settings.table_path(t) for t in (BRONZE_TABLE, WINDOWS_TABLE, SUMMARY_TABLE))
    in_bronze = _lines_by_day(bronze, "select day, count(*) as n from b where kind = 'line' and day is not null "
                                      "group by day", b=bronze)
    in_windows = _lines_by_day(windows, "select day, sum(count) as n from w group by day", w=windows)
    summarized = _lines_by_day(summary, "select day, sum(count) as n from s group by day", s=summary)
    window_closed = {d for d, n in in_windows.items() if n > summarized.get(d, 0)}
    over_and_behind = {d for d, n in in_bronze.items()
                       if n != summarized.get(d, 0) and is_day_over(d, settings.day_grace_hours, now)}
    return sorted(d for d in window_closed | over_and_behind if valid_partition(d))


class DayDue(dg.AutomationCondition):
    """Declarative Automation's form of `days_due`: true for the summary partitions that are due."""

    @property
    def name(self) -> str:
        return "day_due"

    @property
    def description(self) -> str:
        return ("a window closed for the day after its summary ran, or the day is over by the clock "
                "(plus EVENTIDE_DAY_GRACE_HOURS) and its summary differs from bronze")

    @property
    def requires_cursor(self) -> bool:
        return False  # judged from the tables alone

    def evaluate(self, context):
        due = {d.isoformat() for d in days_due(Settings(), context.evaluation_time)}
        return dg.AutomationResult(context, context.candidate_subset.compute_intersection_with_partition_keys(due))


# Due, and not already being made: no run of it or of its inputs (bronze, log_windows) in progress.
SUMMARY_AUTOMATION = (
    DayDue() & ~dg.AutomationCondition.in_progress() & ~dg.AutomationCondition.any_deps_in_progress()
)


class SummaryConfig(dg.Config):
    recompute_from_bronze: bool = False
    """Ignore log_windows and count the day's lines in bronze (what a backfill does)."""


def _markdown(rows: list[dict]) -> str:
    return "| status | count |\n|---|---|\n" + "\n".join(f"| {r['status']} | {r['count']} |" for r in rows)


with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)  # backfill_policy is "beta" in Dagster 1.13
    _summary_asset = dg.asset(
        name=SUMMARY_TABLE,
        partitions_def=DAILY,
        deps=[WINDOWS_TABLE, BRONZE_TABLE],
        group_name=GROUP,
        kinds={"delta"},
        backfill_policy=dg.BackfillPolicy.single_run(),  # a backfill of many days is one run, not one per day
        freshness_policy=SUMMARY_FRESHNESS,
        automation_condition=SUMMARY_AUTOMATION,
    )


@_summary_asset
def daily_return_code_summary(
    context: dg.AssetExecutionContext, config: SummaryConfig, eventide: EventideSettings
) -> dg.MaterializeResult:
    """Lines per (day, status) of each log day of the run (one, or a backfill's range), each day's
    partition replaced atomically in Delta.

    From `log_windows` when closed windows cover every line of the day; from `bronze_log_lines` in a
    backfill, or when some lines of the day are in no closed window (no marker yet).
    """
    settings = eventide.get()
    recompute = config.recompute_from_bronze or in_backfill(context)
    days = context.partition_keys
    summaries = summarize_days(settings, days, recompute=recompute)  # the range's days in one pass
    done = list(zip(summaries, write_summaries(settings, summaries)))
    for i, (summary, replaced) in enumerate(done, 1):
        context.log.info(f"{summary.day}{f' ({i} of {len(days)})' if len(days) > 1 else ''}: {summary.rows.num_rows} "
                         f"rows from {summary.source} ({summary.reason}); {'replaced' if replaced else 'unchanged'}")
    path = settings.table_path(SUMMARY_TABLE)
    table = {"delta_version": dg.MetadataValue.int(lake.version(path) if lake.exists(path) else -1),
             "path": dg.MetadataValue.path(str(path))}
    if len(done) == 1:
        (summary, replaced), = done
        return dg.MaterializeResult(metadata={**_day_metadata(summary, replaced), **table})
    # A range: what each day did, by partition (`eventide backfill` prints it per day).
    return dg.MaterializeResult(
        metadata={
            "outcome_by_partition": dg.MetadataValue.json({str(s.day): _outcome(s, r) for s, r in done}),
            "days": dg.MetadataValue.int(len(done)),
            "replaced_days": dg.MetadataValue.int(sum(r for _, r in done)),
            "lines": dg.MetadataValue.int(sum(s.total for s, _ in done)),
            **table,
        }
    )


def _outcome(summary, replaced: bool) -> str:
    return (f"{'replaced' if replaced else 'unchanged'}, {summary.rows.num_rows} rows, "
            f"{summary.total} lines from {summary.source}")


def _day_metadata(summary, replaced: bool) -> dict:
    return {
        "outcome": _outcome(summary, replaced),  # one line on what the run did (`eventide backfill` prints it)
        "source": summary.source,
        "source_reason": summary.reason,
        "rows": dg.MetadataValue.int(summary.rows.num_rows),
        "lines": dg.MetadataValue.int(summary.total),
        "bronze_lines": dg.MetadataValue.int(summary.bronze_lines),
        "uncovered_lines": dg.MetadataValue.int(summary.uncovered_lines),
        "replaced": dg.MetadataValue.bool(replaced),
        "summary": dg.MetadataValue.md(_markdown(summary.rows.to_pylist())),
    }


# -- checks: they read the stored partitions, so they can be re-run on their own --------------------
# Each reads what it needs for all the run's days at once (one read of the summary, one Spark query of
# bronze) and then judges each day (assets.checks.check_each_partition).
def _frame(rows, day: str) -> pd.DataFrame:
    df = rows.to_pandas()
    df["day"] = df["day"].astype(str)  # GX compares plain strings reliably
    df["partition"] = day
    return df


with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.PreviewWarning)  # partitioned asset checks are "preview" in 1.13

    @dg.asset_check(asset=daily_return_code_summary, partitions_def=DAILY, blocking=True)
    def rows_are_valid(context: dg.AssetCheckExecutionContext, eventide: EventideSettings) -> dg.AssetCheckResult:
        """GX: status between 100 and 599, counts positive, day equals the partition, one row per status."""
        return check_each_partition(context, lambda days: _rows_are_valid(eventide.get(), days))

    @dg.asset_check(asset=daily_return_code_summary, partitions_def=DAILY, blocking=True)
    def total_matches_bronze(context: dg.AssetCheckExecutionContext, eventide: EventideSettings) -> dg.AssetCheckResult:
        """GX: the partition's total equals the number of bronze lines of that day."""
        return check_each_partition(context, lambda days: _total_matches_bronze(eventide.get(), days))

    @dg.asset_check(asset=daily_return_code_summary, partitions_def=DAILY, blocking=True)
    def reconciles_with_bronze(context: dg.AssetCheckExecutionContext, eventide: EventideSettings) -> dg.AssetCheckResult:
        """The stored partition equals its recompute from bronze, row for row."""
        return check_each_partition(context, lambda days: _reconciles_with_bronze(eventide.get(), days))


def _rows_are_valid(settings: Settings, days: list[str]) -> dict[str, dg.AssetCheckResult]:
    import great_expectations as gx  # here, not at the top: importing it takes seconds

    stored = stored_summaries(settings, days)
    return validate_partitions(
        {day: _frame(stored[dt.date.fromisoformat(day)], day) for day in days},
        f"{SUMMARY_TABLE}-rows",
        [
            gx.expectations.ExpectColumnValuesToNotBeNull(column="status"),
            gx.expectations.ExpectColumnValuesToBeBetween(column="status", min_value=100, max_value=599),
            gx.expectations.ExpectColumnValuesToBeBetween(column="count", min_value=1),
            gx.expectations.ExpectColumnPairValuesToBeEqual(column_A="day", column_B="partition"),
            gx.expectations.ExpectCompoundColumnsToBeUnique(column_list=["day", "status"]),
        ],
    )


def _total_matches_bronze(settings: Settings, days: list[str]) -> dict[str, dg.AssetCheckResult]:
    import great_expectations as gx

    stored, bronze = stored_summaries(settings, days), bronze_counts(settings, days)
    totals = {day: pd.DataFrame({"summary_total": [line_total(stored[d])], "bronze_lines": [line_total(bronze[d])]})
              for day, d in ((day, dt.date.fromisoformat(day)) for day in days)}
    return validate_partitions(
        totals,
        f"{SUMMARY_TABLE}-total",
        [gx.expectations.ExpectColumnPairValuesToBeEqual(column_A="summary_total", column_B="bronze_lines")],
    )


def _reconciles_with_bronze(settings: Settings, days: list[str]) -> dict[str, dg.AssetCheckResult]:
    stored_days, recomputed_days = stored_summaries(settings, days), bronze_counts(settings, days)
    out = {}
    for day in days:
        d = dt.date.fromisoformat(day)
        stored = {(r["status"], r["count"]) for r in stored_days[d].to_pylist()}
        recomputed = {(r["status"], r["count"]) for r in recomputed_days[d].to_pylist()}
        only_stored, only_bronze = sorted(stored - recomputed), sorted(recomputed - stored)
        out[day] = dg.AssetCheckResult(
            passed=not only_stored and not only_bronze,
            metadata={
                "partition": day,
                "rows": len(stored),
                "only_in_summary": dg.MetadataValue.json([list(r) for r in only_stored]),
                "only_in_recompute": dg.MetadataValue.json([list(r) for r in only_bronze]),
            },
        )
    return out


SUMMARY_CHECKS = [rows_are_valid, total_matches_bronze, reconciles_with_bronze]

daily_summary_job = dg.define_asset_job(
    SUMMARY_JOB,
    selection=dg.AssetSelection.assets(daily_return_code_summary),  # its checks come with it
    description="Summarize one log day (a partition) and run its blocking checks.",
)


with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)  # use_user_code_server is "beta" in Dagster 1.13
    # Evaluates SUMMARY_AUTOMATION: the one path by which days get summarized (besides backfills). The
    # daemon under `eventide ui` ticks it; `eventide run` and `eventide serve` ask the same tick, with the
    # cursor the daemon keeps in the instance. Its checks ride along with the summary, in the same run.
    daily_summary_automation = dg.AutomationConditionSensorDefinition(
        "daily_summary_automation",
        target=dg.AssetSelection.assets(daily_return_code_summary),
        use_user_code_server=True,  # DayDue reads the tables: Python the daemon cannot run by itself
        # Several due days as one backfill, which runs as one ranged run (the single-run backfill policy).
        emit_backfills=True,
        minimum_interval_seconds=Settings().sensor_interval_seconds,  # EVENTIDE_SENSOR_INTERVAL_SECONDS
        # On by default. Switched off in the UI (Automation page), `run`, `serve` and the daemon all leave
        # the summaries alone: the escape hatch while the logs are being repaired (backfills still work).
        default_status=dg.DefaultSensorStatus.RUNNING,
    )

defs = dg.Definitions(
    assets=[daily_return_code_summary],
    asset_checks=SUMMARY_CHECKS,
    jobs=[daily_summary_job],
    sensors=[daily_summary_automation],
)
