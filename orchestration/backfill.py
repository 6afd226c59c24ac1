"""`eventide backfill START [END]`: rerun the daily-partitioned jobs the apps declare, day by day.

The jobs backfilled are every job of the definitions whose partitions are daily (a
`DailyPartitionsDefinition`), as an app's extras declare them (the log app's `daily_summary_job`),
or only those named. Each day runs in this process, one run per partition, recorded in the instance
under EVENTIDE_HOME/dagster with the tag `eventide/backfill` (assets.runs): an asset that computes
differently in a backfill reads it, as it reads Dagster's own `dagster/backfill` (the daily summary
then recounts the day from bronze). The blocking checks of the job's assets run with it. A
materialization may say in one line what it did: the metadata entry `outcome`, printed per day.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence

import dagster as dg

from assets.runs import EVENTIDE_BACKFILL_TAG
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
             jobs: Sequence[str] = ()) -> int:
    """Rerun days `start`..`end` of the daily jobs (all, or `jobs`); 0 if every run and check passed."""
    from orchestration.definitions import defs
    from orchestration.runner import QUIET, dagster_instance

    days = day_range(start, end)
    selected = daily_jobs(defs, jobs)
    for job in selected:
        _check_days(job, days)
    instance = dagster_instance(settings)
    backfill_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    failed = runs = 0
    for job in selected:
        progress(f"backfill {backfill_id}: {job.name}, {len(days)} day(s)")
        for day in days:
            result = job.execute_in_process(instance=instance, partition_key=day, run_config=QUIET,
                                            tags={EVENTIDE_BACKFILL_TAG: backfill_id}, raise_on_error=False)
            runs += 1
            outcomes = []
            for ev in result.get_asset_materialization_events():
                meta = ev.event_specific_data.materialization.metadata
                outcome = meta.get("outcome")
                outcomes.append(getattr(outcome, "value", None) or f"{ev.asset_key.to_user_string()} materialized")
            checks = result.get_asset_check_evaluations()
            bad = [c.check_name for c in checks if not c.passed]
            if not result.success or bad:
                failed += 1
            status = f"checks failed: {', '.join(bad)}" if bad else ("run failed" if not result.success else f"{len(checks)} checks passed")
            progress(f"  {day}: {'; '.join(outcomes) or 'nothing materialized'} ({status}; run {result.run_id[:8]})")
    progress(f"backfill {backfill_id}: {runs - failed} of {runs} run(s) done" + (f", {failed} failed" if failed else ""))
    return 1 if failed else 0
