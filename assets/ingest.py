"""Landing (external), one bronze asset per registered stream, the Kafka topics apps read straight
(external: kafka_source), and the quarantine table."""

import dagster as dg

from assets.apps import application_assets
from assets.resources import EventideSettings
from transforms import lake
from transforms.api import KafkaTopic
from transforms.engine import QUARANTINE_TABLE
from transforms.registry import Registry, StreamSpec
from transforms.streams import bronze_application

GROUP = "ingest"


def landing_key(stream: str) -> dg.AssetKey:
    return dg.AssetKey(f"landing_{stream}")


def landing_spec(spec: StreamSpec) -> dg.AssetSpec:
    return dg.AssetSpec(
        landing_key(spec.name),
        group_name=GROUP,
        kinds={"parquet"},
        description=f"Closed landing segments of stream `{spec.name}` (folder `landing/{spec.log}`), "
        "written by `eventide serve` / `eventide ingest`.",
    )


def kafka_source_key(stream: str) -> dg.AssetKey:
    return dg.AssetKey(f"kafka_{stream}")


def kafka_source_spec(stream: str, topic: KafkaTopic) -> dg.AssetSpec:
    """A kafka_source's topic: written outside Eventide, read by the apps' queries (no landing, no bronze)."""
    return dg.AssetSpec(
        kafka_source_key(stream),
        group_name=GROUP,
        kinds={"kafka"},
        description=f"Kafka topic `{topic.topic}` at {topic.bootstrap}, read as stream `{stream}` (kafka_source; "
        f"starting offsets {topic.starting_offsets}).",
        metadata={"topic": topic.topic, "bootstrap": topic.bootstrap, "starting_offsets": topic.starting_offsets},
    )


def bronze_assets(spec: StreamSpec, freshness_minutes: float = 0.0) -> dg.AssetsDefinition:
    return application_assets(bronze_application(spec), [landing_key(spec.name)], GROUP, freshness_minutes)


def stream_deps(registry: Registry, streams: list[str]) -> list[dg.AssetKey]:
    """What an app reading `streams` is downstream of: their landing and their bronze tables, or the Kafka
    topic a kafka_source reads."""
    landed = [s for s in streams if s not in registry.kafka_sources]
    return ([landing_key(s) for s in landed] + [dg.AssetKey(registry.stream(s).bronze_table) for s in landed]
            + [kafka_source_key(s) for s in streams if s in registry.kafka_sources])


def quarantine_asset(registry: Registry) -> dg.AssetsDefinition:
    bronze = [dg.AssetKey(s.bronze_table) for s in registry.streams.values()]

    @dg.asset(name=QUARANTINE_TABLE, deps=bronze, group_name=GROUP, kinds={"delta"})
    def quarantine(eventide: EventideSettings) -> dg.MaterializeResult:
        """Every message no step could handle, with the query, step and reason. Written by all queries."""
        path = eventide.get().table_path(QUARANTINE_TABLE)
        if not lake.exists(path):
            return dg.MaterializeResult(metadata={"total_rows": 0})
        by = lake.query("select query, step, count(*) as n from t group by query, step order by n desc", t=path).to_pylist()
        return dg.MaterializeResult(
            metadata={
                "total_rows": sum(r["n"] for r in by),
                "by_query_and_step": dg.MetadataValue.md(
                    "| query | step | rows |\n|---|---|---|\n" + "\n".join(f"| {r['query']} | {r['step']} | {r['n']} |" for r in by)
                ),
                "delta_version": lake.version(path),
            }
        )

    return quarantine


def ingest_definitions(registry: Registry, freshness_minutes: float = 0.0) -> dg.Definitions:
    """Every registered stream's landing and bronze (stale after `freshness_minutes` without data; 0:
    no policy), and quarantine (no policy: it receives only bad input)."""
    streams = list(registry.streams.values())
    return dg.Definitions(assets=[*map(landing_spec, streams), *(bronze_assets(s, freshness_minutes) for s in streams),
                                  *(kafka_source_spec(*t) for t in registry.kafka_sources.items()),
                                  quarantine_asset(registry)])
