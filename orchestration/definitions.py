"""The one composition root: every asset, check, job, schedule, sensor and resource of Eventide."""

import dagster as dg

from assets import ingest, logs, market, words
from orchestration.resources import EventideSettings, SparkResource
from orchestration.sensors import PIPELINES_JOB, new_segments_sensor

# Everything that is not day-partitioned runs together: bronze, the apps, quarantine.
pipelines_job = dg.define_asset_job(
    PIPELINES_JOB,
    selection=dg.AssetSelection.all().materializable() - dg.AssetSelection.groups("daily"),
    description="Run every pipeline over what has landed (availableNow), exactly once.",
)

defs = dg.Definitions.merge(
    ingest.defs,
    words.defs,
    logs.defs,
    market.defs,
    dg.Definitions(
        jobs=[pipelines_job],
        sensors=[new_segments_sensor],
        resources={"eventide": EventideSettings(), "spark": SparkResource()},
    ),
)
