"""Sensors that need no JVM: they look at the log (transforms.ingestion.log) and Delta logs only."""


import json

import dagster as dg

from assets.resources import EventideSettings
from transforms.ingestion import open_log
from transforms.ingestion.gateway import running_gateway
from transforms.ingestion.kafka_source import KafkaTopicLog
from transforms.settings import Settings

PIPELINES_JOB = "pipelines_job"


@dg.sensor(job_name=PIPELINES_JOB, minimum_interval_seconds=Settings().sensor_interval_seconds,
           default_status=dg.DefaultSensorStatus.RUNNING)
def new_segments_sensor(context: dg.SensorEvaluationContext, eventide: EventideSettings):
    """Starts the pipelines when the log of any registered stream has grown since the last run saw it
    (the landing log: a newer closed segment; Kafka: a higher end offset), or an app's own topic
    (kafka_source) has: a higher end offset of a partition."""
    settings = eventide.get()
    live = running_gateway(settings)
    if live and live.get("queries"):
        return dg.SkipReason(f"eventide serve (pid {live['pid']}) runs the pipelines continuously")
    seen = json.loads(context.cursor) if context.cursor else {}
    log = open_log(settings)
    latest = {g: m for g in sorted(settings.registry.logs) if (m := log.mark(g)) is not None}
    for stream, origin in sorted(settings.registry.kafka_sources.items()):  # apps' own topics (kafka_source)
        if ends := KafkaTopicLog(settings, origin).end_offsets():
            latest[f"kafka:{stream}"] = json.dumps(ends, sort_keys=True)
    new = {g: m for g, m in latest.items() if m != seen.get(g)}
    if not new:
        return dg.SkipReason(f"nothing new in {log.describe()}")
    context.update_cursor(json.dumps(latest))
    return dg.RunRequest(run_key=json.dumps(latest, sort_keys=True), tags={"eventide/new_segments": ",".join(sorted(new))})
