"""Run tags an asset may read to tell how it was started."""

import dagster as dg

DAGSTER_BACKFILL_TAG = "dagster/backfill"  # on every run of a backfill launched in Dagster
EVENTIDE_BACKFILL_TAG = "eventide/backfill"  # on every run of `eventide backfill` (in-process runs)


def in_backfill(context: dg.AssetExecutionContext) -> bool:
    """True in a run of a backfill, from the Dagster UI or from `eventide backfill`."""
    tags = context.run.tags
    return DAGSTER_BACKFILL_TAG in tags or EVENTIDE_BACKFILL_TAG in tags
