"""`eventide run`: materialize everything through Dagster, in this process, recorded in the instance
under `EVENTIDE_HOME/dagster` (so `make ui` shows the runs)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import dagster as dg

from transforms.settings import Settings

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def dagster_instance(settings: Settings) -> dg.DagsterInstance:
    home = settings.dagster_home.absolute()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text("telemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(home)
    # Resources read settings from the environment: make sure they see the same home.
    os.environ["EVENTIDE_HOME"] = str(settings.home.absolute())
    return dg.DagsterInstance.get()


@dataclass
class RunSummary:
    ok: bool = True
    materialized: dict[str, dict] = field(default_factory=dict)
    checks: list[tuple[str, str, bool, str]] = field(default_factory=list)  # (asset, check, passed, partition)
    failures: list[str] = field(default_factory=list)


def _collect(result, summary: RunSummary, partition: str = "") -> None:
    for ev in result.get_asset_materialization_events():
        mat = ev.event_specific_data.materialization
        name = mat.asset_key.to_user_string() + (f"[{mat.partition}]" if mat.partition else "")
        summary.materialized[name] = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    for ev in result.get_asset_check_evaluations():
        summary.checks.append((ev.asset_key.to_user_string(), ev.check_name, ev.passed, partition))
    if not result.success:
        summary.ok = False
        for ev in result.all_events:
            if ev.is_failure and ev.event_specific_data is not None:
                err = getattr(ev.event_specific_data, "error", None)
                summary.failures.append(f"{ev.step_key}: {err.message.strip() if err else ev.message}")


def run_all(settings: Settings, progress: Callable[[str], None] = print, summaries: bool = True) -> RunSummary:
    from assets.logs import SUMMARY_JOB, days_to_summarize
    from orchestration.definitions import defs
    from orchestration.sensors import PIPELINES_JOB

    instance = dagster_instance(settings)
    summary = RunSummary()
    progress("running the pipelines (bronze, apps, quarantine) through Dagster ...")
    result = defs.resolve_job_def(PIPELINES_JOB).execute_in_process(instance=instance, raise_on_error=False, run_config=QUIET)
    _collect(result, summary)
    for name, meta in sorted(summary.materialized.items()):
        if "rows_added" in meta:
            progress(f"  {name}: +{meta['rows_added']} rows, {meta.get('total_rows')} in all")
    if not summary.ok or not summaries:
        return summary
    days = days_to_summarize(settings)
    if days:
        progress(f"summarizing {len(days)} day(s): {', '.join(days)}")
    job = defs.resolve_job_def(SUMMARY_JOB) if days else None
    for day in days:
        result = job.execute_in_process(instance=instance, partition_key=day, raise_on_error=False, run_config=QUIET)
        _collect(result, summary, day)
    return summary
