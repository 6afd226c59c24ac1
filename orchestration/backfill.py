"""`eventide backfill START [END]`: recompute daily summaries from bronze through Dagster.

Each day runs the daily summary job in this process (one run per partition, recorded in the
instance under EVENTIDE_HOME/dagster with the tag `eventide/backfill`), with the run config flag
`recompute_from_bronze`: the partition is replaced with the count of the day's bronze lines and its
blocking checks run. A backfill launched from the Dagster UI does the same (its runs carry the tag
`dagster/backfill`, which the asset also honours).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

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


def backfill(settings: Settings, start: str, end: str | None = None, progress: Callable[[str], None] = print) -> int:
    """Recompute the summaries of days `start`..`end` from bronze; 0 if every run and check passed."""
    from assets.logs import DAILY, EVENTIDE_BACKFILL_TAG, SUMMARY_JOB
    from orchestration.definitions import defs
    from orchestration.runner import QUIET, dagster_instance
    from transforms.apps.logs import SUMMARY_TABLE

    days = day_range(start, end)
    invalid = [d for d in days if not DAILY.has_partition_key(d)]
    if invalid:
        raise ValueError(
            f"no daily partition for {', '.join(invalid)} (partitions run from {DAILY.get_first_partition_key()} "
            f"to {DAILY.get_last_partition_key()}; EVENTIDE_PARTITIONS_START sets the first)"
        )
    instance = dagster_instance(settings)
    job = defs.resolve_job_def(SUMMARY_JOB)
    run_config = {**QUIET, "ops": {SUMMARY_TABLE: {"config": {"recompute_from_bronze": True}}}}
    backfill_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    failed = 0
    progress(f"backfill {backfill_id}: recomputing {len(days)} day(s) of {SUMMARY_TABLE} from bronze_log_lines")
    for day in days:
        result = job.execute_in_process(instance=instance, partition_key=day, run_config=run_config,
                                        tags={EVENTIDE_BACKFILL_TAG: backfill_id}, raise_on_error=False)
        meta = {}
        for ev in result.get_asset_materialization_events():
            meta = {k: getattr(v, "value", v) for k, v in ev.event_specific_data.materialization.metadata.items()}
        checks = result.get_asset_check_evaluations()
        bad = [c.check_name for c in checks if not c.passed]
        if not result.success or bad:
            failed += 1
        what = "replaced" if meta.get("replaced") else "unchanged"
        status = f"checks failed: {', '.join(bad)}" if bad else ("run failed" if not result.success else f"{len(checks)} checks passed")
        progress(f"  {day}: {what}, {meta.get('rows', 0)} rows, {meta.get('lines', 0)} lines from "
                 f"{meta.get('source', '?')} ({status}; run {result.run_id[:8]})")
    progress(f"backfill {backfill_id}: {len(days) - failed} of {len(days)} day(s) done" + (f", {failed} failed" if failed else ""))
    return 1 if failed else 0
