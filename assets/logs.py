"""Log windows and daily return-code summaries (filled in by the log-window work)."""

import dagster as dg

defs = dg.Definitions()
SUMMARY_JOB = "daily_summary_job"


def days_to_summarize(settings) -> list[str]:
    """Partition keys `eventide run` should materialize after the pipelines ran."""
    return []
