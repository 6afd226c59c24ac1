"""`eventide backfill START [END]`: rerun the daily-partitioned jobs the apps declare for a range of days.

The jobs backfilled are every job of the definitions whose partitions are daily (a
`DailyPartitionsDefinition`), as an app's extras declare them (the log app's `daily_summary_job`),
or only those named. The runs execute in this process: the whole range as one run when every asset of
the job has a single-run backfill policy (the daily summary has; a Dagster UI backfill then runs as
one run too), else one run per day. They are recorded in the instance under EVENTIDE_HOME/dagster with
the tag `eventide/backfill` (assets.runs): an asset that computes differently in a backfill reads it,
as it reads Dagster's own `dagster/backfill` (the daily summary then recounts each day from bronze).
The blocking checks of the job's assets run with it, per day (assets.checks.check_each_partition). A
materialization may say in one line what it did: the metadata entry `outcome`, or for a range
`outcome_by_partition` (day -> line), printed per day.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence

import dagster as dg

from assets.runs import EVENTIDE_BACKFILL_TAG
from orchestration.runner import check_evaluations
from transforms.settings import Settings


def day_range(start: str, end: str | None = None) -> list[str]:
    """Every day from `start` to `end` (inclusive) as YYYY-MM-DD; ValueError on bad input."""
    try:
        first = dt.date.fromisoformat(start)
        last = dt.date.fromisoformat(end) if end else first
    except ValueError:
        raise ValueError(f"expected days like 2004-03-08, got {start!r}" + (f" and {end!r}" if end else "")) from None
    if last < first:
        raise ValueError(f"the last day {last} is before the first day {first}")
    return [(first + dt.timedelta(days=i)).isoformat() for i in range((last - first).days + 1)]


def daily_jobs(defs: dg.Definitions, names: Sequence[str] = ()) -> list[dg.JobDefinition]:
    """The jobs partitioned by day (Dagster's implicit jobs aside), or those of `names`; ValueError if none."""
    daily = [j for j in defs.resolve_all_job_defs()
             if not j.name.startswith("__") and isinstance(j.partitions_def, dg.DailyPartitionsDefinition)]
    known = ", ".join(j.name for j in daily) or "none"
    if names:
        unknown = sorted(set(names) - {j.name for j in daily})
        if unknown:
            raise ValueError(f"no daily-partitioned job {', '.join(unknown)}; the registered apps declare: {known}")
        daily = [j for j in daily if j.name in names]
    if not daily:
        raise ValueError("no registered app declares a daily-partitioned job (Application(dagster_defs=...)), "
                         "so there is nothing to backfill")
    return daily


def _check_days(job: dg.JobDefinition, days: list[str]) -> None:
    parts = job.partitions_def
    invalid = [d for d in days if not parts.has_partition_key(d)]
    if invalid:
        raise ValueError(
            f"{job.name}: no daily partition for {', '.join(invalid)} (partitions run from "
            f"{parts.get_first_partition_key()} to {parts.get_last_partition_key()}; EVENTIDE_PARTITIONS_START sets the first)"
        )


def backfill(settings: Settings, start: str, end: str | None = None, progress: Callable[[str], None] = print,
             jobs: Sequence[str] = (), one_run: bool = True) -> int:
    """Rerun days `start`..`end` of the daily jobs (all, or `jobs`); 0 if every run and check passed.
    A job whose assets allow it runs the range as one run; any other (or with `one_run=False`, the
    benchmark's baseline), one run per day."""
    from orchestration.definitions import defs
    from orchestration.runner import QUIET, RANGE_END, RANGE_START, dagster_instance, runs_as_one

    days = day_range(start, end)
    selected = daily_jobs(defs, jobs)
    for job in selected:
        _check_days(job, days)
    instance = dagster_instance(settings)
    backfill_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    tags = {EVENTIDE_BACKFILL_TAG: backfill_id}
    failed = runs = 0
    for job in selected:
        as_one = one_run and len(days) > 1 and runs_as_one(job)
        progress(f"backfill {backfill_id}: {job.name}, {len(days)} day(s)" + (" in one run" if as_one else ""))
        if as_one:
            ranges = [(None, {**tags, RANGE_START: days[0], RANGE_END: days[-1]})]
        else:
            ranges = [(day, tags) for day in days]
        for day, run_tags in ranges:
            result = job.execute_in_process(instance=instance, partition_key=day, run_config=QUIET, tags=run_tags,
                                            raise_on_error=False)
            runs += 1
            bad_days = _report_days([day] if day else days, result, progress)
            failed += 1 if bad_days or not result.success else 0
    progress(f"backfill {backfill_id}: {runs - failed} of {runs} run(s) done" + (f", {failed} failed" if failed else ""))
    return 1 if failed else 0


def _report_days(days: list[str], result, progress: Callable[[str], None]) -> list[str]:
    """Print a line per day of a run (one day, or a range): what each materialization said it did and
    the day's checks; returns the days whose checks failed."""
    outcomes: dict[str, list[str]] = {d: [] for d in days}
    for ev in result.get_asset_materialization_events():
        materialization = ev.event_specific_data.materialization
        meta, day = materialization.metadata, materialization.partition
        said = getattr(meta.get("outcome_by_partition"), "value", {}).get(day) or getattr(meta.get("outcome"), "value", None)
        outcomes.setdefault(day, []).append(said or f"{ev.asset_key.to_user_string()} materialized")
    checks: dict[str, list] = {d: [] for d in days}
    for c in check_evaluations(result):
        checks.setdefault(c.partition or days[0], []).append(c)  # unpartitioned: reported with the first day
    bad_days = []
    for day in days:
        bad = [c.check_name for c in checks.get(day, []) if not c.passed]
        if bad:
            bad_days.append(day)
        status = (f"checks failed: {', '.join(bad)}" if bad else
                  "run failed" if not result.success else f"{len(checks.get(day, []))} checks passed")
        progress(f"  {day}: {'; '.join(outcomes.get(day, [])) or 'nothing materialized'} ({status}; run {result.run_id[:8]})")
    return bad_days
