"""Sensors that need no JVM: they look at the landing folders and Delta logs only."""


import json

import dagster as dg

from assets.resources import EventideSettings
from transforms.ingestion.gateway import running_gateway
from transforms.ingestion.landing import list_segments

PIPELINES_JOB = "pipelines_job"


@dg.sensor(job_name=PIPELINES_JOB, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING)
def new_segments_sensor(context: dg.SensorEvaluationContext, eventide: EventideSettings):
    """Starts the pipelines when the landing log of any registered stream has closed segments newer
    than the last run saw."""
    settings = eventide.get()
    live = running_gateway(settings)
    if live and live.get("queries"):
        return dg.SkipReason(f"eventide serve (pid {live['pid']}) runs the pipelines continuously")
    seen = json.loads(context.cursor) if context.cursor else {}
    latest = {}
    for log in sorted(settings.registry.logs):
        segs = list_segments(settings, log)
        if segs:
            latest[log] = segs[-1].name
    new = {g: n for g, n in latest.items() if n > seen.get(g, "")}
    if not new:
        return dg.SkipReason("no new closed landing segments")
    context.update_cursor(json.dumps(latest))
    return dg.RunRequest(run_key=json.dumps(latest, sort_keys=True), tags={"eventide/new_segments": ",".join(sorted(new))})
